//! `hypercomm plan --refit`: plan a weight refit from a source layout (an RL trainer) to a destination layout
//! (inference engines), and print the bytes per link and per rank, the totals, and the baseline of broadcasting
//! every full tensor from source rank 0.

use std::io::Write;
use std::path::PathBuf;

use hypercomm_refit::{PlanOptions, RefitPlan, Side, Summary, explain, format_bytes, parse_layout};
use serde::Serialize;

use crate::error::CliError;
use crate::output::print_json;

/// The arguments of `hypercomm plan` that plan a refit.
#[derive(clap::Args, Debug)]
pub struct RefitArgs {
    /// Plan a weight refit between two layouts (--from, --to, --model) instead of ranking orders on a cluster.
    #[arg(
        long,
        requires_all = ["from", "to", "model"],
        conflicts_with_all = [
            "cluster", "world", "tp", "pp", "cp", "ep", "etp", "dist_opt_instances", "model_params", "layers",
            "hidden", "seq_len", "micro_batch", "micro_batches", "bytes_per_element", "top_k", "traffic", "top",
        ],
    )]
    pub refit: bool,
    /// The source (trainer) layout: `tp=2,pp=2,dp=2` (sizes tp, pp, cp, dp, ep, etp; the world is tp·pp·cp·dp).
    #[arg(long, requires = "refit")]
    pub from: Option<String>,
    /// The destination (inference) layout, its dp counting replicas: `tp=2,dp=2` is two replicas of tp 2.
    #[arg(long, requires = "refit")]
    pub to: Option<String>,
    /// The model: `gpt:layers=4,hidden=1024,vocab=32000[,ffn=..,heads=..,kv_heads=..,gated,tied,experts=..,
    /// dtype=bf16,...]` (Megatron's GPT), or a sharding JSON file (`{"layers": .., "params": [..]}`).
    #[arg(long, requires = "refit")]
    pub model: Option<String>,
    /// The most bytes a rank sends, and receives, per bucket: `64MiB` (units B, KiB, MiB, GiB).
    #[arg(long, default_value = "64MiB", requires = "refit")]
    pub bucket: String,
    /// Send every destination replica its bytes from the sources, instead of letting replicas forward.
    #[arg(long, requires = "refit")]
    pub no_forward: bool,
    /// Also write the whole plan, every transfer, as JSON to this file.
    #[arg(long, requires = "refit")]
    pub write_plan: Option<PathBuf>,
}

#[derive(Serialize)]
struct Report<'a> {
    model: &'a str,
    summary: &'a Summary,
    explanation: Vec<String>,
}

/// Runs `hypercomm plan --refit`.
pub fn run(args: &RefitArgs, json: bool) -> Result<(), CliError> {
    let missing = |flag: &str| CliError::Usage(format!("--refit needs {flag}"));
    let from = parse_layout(args.from.as_deref().ok_or_else(|| missing("--from"))?)?;
    let to = parse_layout(args.to.as_deref().ok_or_else(|| missing("--to"))?)?;
    let (model, sharding) =
        super::refit_model::read_model(args.model.as_deref().ok_or_else(|| missing("--model"))?)?;
    let bucket = super::bench::parse_size(&args.bucket)? as u64;
    let options = PlanOptions::default()
        .bucket_bytes(bucket)
        .forward(!args.no_forward);
    let plan = RefitPlan::build(
        Side::new(&from, &sharding),
        Side::new(&to, &sharding),
        options,
    )?;
    if let Some(path) = &args.write_plan {
        let file = std::fs::File::create(path).map_err(|e| {
            CliError::Usage(format!(
                "--write-plan {}: cannot create the file: {e}",
                path.display()
            ))
        })?;
        serde_json::to_writer(std::io::BufWriter::new(file), &plan).map_err(|e| {
            CliError::Failed(format!(
                "--write-plan {}: cannot write: {e}",
                path.display()
            ))
        })?;
    }
    let summary = Summary::of(&plan);
    if json {
        return print_json(&Report {
            model: &model,
            summary: &summary,
            explanation: explain(&summary),
        });
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "model: {model} ({} parameters, {})",
        sharding.params.len(),
        format_bytes(sharding.bytes()?)
    )?;
    for line in explain(&summary) {
        writeln!(out, "{line}")?;
    }
    writeln!(out)?;
    writeln!(out, "source ranks: bytes sent (balanced share)")?;
    let sources: Vec<String> = summary
        .sources
        .iter()
        .map(|s| {
            format!(
                "  {:>6}: {} ({})",
                s.rank,
                format_bytes(s.sent),
                format_bytes(s.share.round() as u64)
            )
        })
        .collect();
    write_elided(&mut out, &sources, 16)?;
    writeln!(
        out,
        "destination ranks: bytes from sources + from replicas, forwarded"
    )?;
    let destinations: Vec<String> = summary
        .destinations
        .iter()
        .map(|d| {
            format!(
                "  {:>6}: {} + {}, forwarded {}",
                d.rank,
                format_bytes(d.from_sources),
                format_bytes(d.from_replicas),
                format_bytes(d.forwarded)
            )
        })
        .collect();
    write_elided(&mut out, &destinations, 16)?;
    writeln!(out, "links: bytes (transfers)")?;
    let links: Vec<String> = summary
        .links
        .iter()
        .map(|l| {
            format!(
                "  {:>16} -> destination {:<6} {} ({})",
                l.from.to_string(),
                l.to,
                format_bytes(l.bytes),
                l.transfers
            )
        })
        .collect();
    write_elided(&mut out, &links, 32)?;
    Ok(())
}

/// Writes `lines`, keeping the first and last `shown / 2` of a longer list around a `... N more ...` line.
fn write_elided(out: &mut impl Write, lines: &[String], shown: usize) -> std::io::Result<()> {
    let half = shown / 2;
    for (i, line) in lines.iter().enumerate() {
        if lines.len() > shown && i == half {
            writeln!(out, "  ... {} more ...", lines.len() - shown)?;
        }
        if lines.len() > shown && (half..lines.len() - half).contains(&i) {
            continue;
        }
        writeln!(out, "{line}")?;
    }
    Ok(())
}
