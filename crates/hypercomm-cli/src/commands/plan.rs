//! `hypercomm plan`: rank every dimension order (and rank placement) of a layout by its communication time per step
//! on a described cluster, and explain the best few in words; with `--refit`, plan a weight refit between two
//! layouts instead (`plan_refit`).

use std::io::Write;
use std::path::PathBuf;

use hypercomm_plan::{
    Cluster, ModelShape, Ranking, Score, Traffic, TrafficKind, explain, number, search, seconds,
    verdict,
};
use serde::Serialize;

use crate::error::CliError;
use crate::numbers::non_negative;
use crate::output::print_json;

/// Arguments of `hypercomm plan`. `--world` (from the shared sizes) is required unless `--refit` is given.
#[derive(clap::Args, Debug)]
#[command(mut_arg("world", |a| a.required(false).required_unless_present("refit")))]
pub struct Args {
    /// The cluster description (JSON; see examples/clusters/).
    #[arg(long, required_unless_present = "refit")]
    cluster: Option<PathBuf>,
    #[command(flatten)]
    sizes: Option<super::sizes::SizeArgs>,
    /// Model parameters, for the default traffic (default 7e9).
    #[arg(long, allow_negative_numbers = true)]
    model_params: Option<f64>,
    /// Transformer layers (default 32).
    #[arg(long, allow_negative_numbers = true)]
    layers: Option<f64>,
    /// Hidden size (default 4096).
    #[arg(long, allow_negative_numbers = true)]
    hidden: Option<f64>,
    /// Sequence length in tokens (default 4096).
    #[arg(long, allow_negative_numbers = true)]
    seq_len: Option<f64>,
    /// Sequences per micro-batch (default 1).
    #[arg(long, allow_negative_numbers = true)]
    micro_batch: Option<f64>,
    /// Micro-batches per step (default 8).
    #[arg(long, allow_negative_numbers = true)]
    micro_batches: Option<f64>,
    /// Bytes per element (default 2).
    #[arg(long, allow_negative_numbers = true)]
    bytes_per_element: Option<f64>,
    /// Experts per token, for ep traffic (default 2).
    #[arg(long, allow_negative_numbers = true)]
    top_k: Option<f64>,
    /// Bytes per rank per step that override the model's: `tp=4e9,dp=1.5G,pp=250MB` (kinds tp, cp, ep, dp,
    /// expt_dp, pp).
    #[arg(long)]
    traffic: Option<String>,
    /// How many candidates to show.
    #[arg(long, default_value_t = 5, allow_negative_numbers = true, value_parser = non_negative::<usize>)]
    top: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    refit: super::plan_refit::RefitArgs,
}

impl Args {
    fn shape(&self) -> ModelShape {
        let d = ModelShape::default();
        ModelShape {
            params: self.model_params.unwrap_or(d.params),
            layers: self.layers.unwrap_or(d.layers),
            hidden: self.hidden.unwrap_or(d.hidden),
            seq_len: self.seq_len.unwrap_or(d.seq_len),
            micro_batch: self.micro_batch.unwrap_or(d.micro_batch),
            micro_batches: self.micro_batches.unwrap_or(d.micro_batches),
            bytes_per_element: self.bytes_per_element.unwrap_or(d.bytes_per_element),
            top_k: self.top_k.unwrap_or(d.top_k),
        }
    }
}

/// Reads and checks a cluster description; a missing or invalid file is bad input.
pub fn read_cluster(path: &std::path::Path) -> Result<Cluster, CliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::Usage(format!("cannot read cluster {}: {e}", path.display())))?;
    Ok(Cluster::from_json(&text)?)
}

#[derive(Serialize)]
struct Candidate<'a> {
    rank: usize,
    #[serde(flatten)]
    score: &'a Score,
    explanation: Vec<String>,
}

#[derive(Serialize)]
struct Plan<'a> {
    cluster: &'a str,
    devices: usize,
    world: usize,
    traffic: Traffic,
    verdict: String,
    candidates_searched: usize,
    default_rank: usize,
    candidates: Vec<Candidate<'a>>,
}

/// Runs `hypercomm plan`.
pub fn run(args: Args) -> Result<(), CliError> {
    if args.refit.refit {
        return super::plan_refit::run(&args.refit, args.json);
    }
    let (Some(cluster), Some(sizes)) = (&args.cluster, &args.sizes) else {
        return Err(CliError::Usage(
            "plan needs --cluster and --world (or --refit with --from, --to and --model)"
                .to_owned(),
        ));
    };
    let cluster = read_cluster(cluster)?;
    let config = sizes.config();
    let base = config.clone().build()?;
    let mut traffic = Traffic::from_model(&args.shape(), &base)?;
    if let Some(text) = &args.traffic {
        traffic = traffic.with_overrides(text)?;
    }
    let ranking = search(&cluster, &config, &traffic)?;
    let shown = shown(&ranking, args.top);
    if args.json {
        return print_json(&Plan {
            cluster: cluster.name(),
            devices: cluster.devices(),
            world: sizes.world,
            traffic,
            verdict: verdict(&ranking),
            candidates_searched: ranking.candidates.len(),
            default_rank: ranking.default_index + 1,
            candidates: shown
                .iter()
                .map(|&i| Candidate {
                    rank: i + 1,
                    score: &ranking.candidates[i],
                    explanation: explain(&ranking.candidates[i], &cluster),
                })
                .collect(),
        });
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "cluster: {} ({} hosts, {} GPUs)",
        cluster.name(),
        cluster.hosts().len(),
        cluster.devices()
    )?;
    writeln!(
        out,
        "layout: world {}, tp {} pp {} cp {} ep {} etp {}, dp {}",
        base.world(),
        sizes.tp,
        sizes.pp,
        sizes.cp,
        sizes.ep,
        base.etp(),
        base.dp()
    )?;
    let bytes: Vec<String> = TrafficKind::ALL
        .into_iter()
        .filter(|&k| traffic.bytes(k) > 0.0)
        .map(|k| format!("{k} {}", format_bytes(traffic.bytes(k))))
        .collect();
    writeln!(
        out,
        "traffic per rank per step: {}",
        if bytes.is_empty() {
            "none".to_owned()
        } else {
            bytes.join(", ")
        }
    )?;
    writeln!(out, "{}", verdict(&ranking))?;
    for i in shown {
        let s = &ranking.candidates[i];
        let tag = if i == ranking.default_index {
            " [Megatron default]"
        } else {
            ""
        };
        writeln!(out)?;
        writeln!(
            out,
            "#{} {} ({} placement): {} per step{tag}",
            i + 1,
            if s.order.is_empty() { "-" } else { &s.order },
            s.placement,
            seconds(s.seconds)
        )?;
        for line in explain(s, &cluster) {
            writeln!(out, "   {line}")?;
        }
    }
    Ok(())
}

/// The positions to show: the first `top`, and Megatron's default when it is not among them.
fn shown(ranking: &Ranking, top: usize) -> Vec<usize> {
    let mut shown: Vec<usize> = (0..top.min(ranking.candidates.len())).collect();
    if !shown.contains(&ranking.default_index) {
        shown.push(ranking.default_index);
    }
    shown
}

/// `17.2 GB`, `875 MB`, `12 kB`.
fn format_bytes(b: f64) -> String {
    let (value, unit) = if b >= 1e12 {
        (b / 1e12, "TB")
    } else if b >= 1e9 {
        (b / 1e9, "GB")
    } else if b >= 1e6 {
        (b / 1e6, "MB")
    } else if b >= 1e3 {
        (b / 1e3, "kB")
    } else {
        (b, "B")
    };
    format!("{} {unit}", number(value))
}
