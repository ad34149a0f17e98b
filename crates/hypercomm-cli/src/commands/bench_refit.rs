//! `hypercomm bench --refit`: a weight refit between two layouts (the plan run as bucketed batches of sends and
//! receives) against gathering every full tensor on source rank 0 and broadcasting it to every destination rank,
//! same model, same ranks, same run; bytes moved, median time and GB/s of both. The measuring is in
//! `hypercomm_bench::refit`.

use std::path::Path;
use std::time::Duration;

use hypercomm_bench::provenance::Provenance;
use hypercomm_bench::refit::{Measured, RefitBenchConfig, run};
use hypercomm_refit::{PlanOptions, RefitPlan, Side, describe_layout, format_bytes, parse_layout};

use crate::error::CliError;

/// The arguments of `hypercomm bench` that measure a refit.
#[derive(clap::Args, Debug)]
pub struct RefitBenchArgs {
    /// Instead of collectives: time a weight refit from --from to --to (ranks as threads of this process, on the
    /// host backend) against gathering each full tensor on source rank 0 and broadcasting it to every destination
    /// rank.
    #[arg(long)]
    pub refit: bool,
    /// With --refit: the source (trainer) layout.
    #[arg(long, default_value = "tp=2,pp=2,dp=2", requires = "refit")]
    pub from: String,
    /// With --refit: the destination (inference) layout, its dp counting replicas.
    #[arg(long, default_value = "tp=2,dp=2", requires = "refit")]
    pub to: String,
    /// With --refit: the model, `gpt:...` or a sharding JSON file (as `hypercomm plan --refit --model`).
    #[arg(
        long,
        default_value = "gpt:layers=4,hidden=1024,vocab=32000",
        requires = "refit"
    )]
    pub model: String,
    /// With --refit: the most bytes a rank sends, and receives, per bucket (units B, KiB, MiB, GiB).
    #[arg(long, default_value = "16MiB", requires = "refit")]
    pub bucket: String,
    /// With --refit: timed refits of each method (after one warm-up of each).
    #[arg(long, default_value_t = 5, requires = "refit")]
    pub refits: usize,
}

/// Runs `hypercomm bench --refit` with buckets of `bucket` bytes (`--bucket`, parsed by the caller), writing
/// the results as JSON to `json` when given.
pub fn run_refit(args: &RefitBenchArgs, bucket: u64, json: Option<&Path>) -> Result<(), CliError> {
    if args.refits == 0 {
        return Err(CliError::Usage("--refits must be at least 1".into()));
    }
    let (from, to) = (parse_layout(&args.from)?, parse_layout(&args.to)?);
    let (model, sharding) = super::refit_model::read_model(&args.model)?;
    let plan = RefitPlan::build(
        Side::new(&from, &sharding),
        Side::new(&to, &sharding),
        PlanOptions::default().bucket_bytes(bucket),
    )?;
    let provenance = Provenance::start();
    println!(
        "# hypercomm bench --refit: {} ({} ranks) -> {} ({} ranks), {model}, {} bucket(s) of at most {}",
        describe_layout(&from),
        from.world(),
        describe_layout(&to),
        to.world(),
        plan.bucket_count(),
        format_bytes(bucket)
    );
    println!(
        "# {} rank threads of this process, host backend; each of {} refits runs the plan, then the baseline \
         (gather each full tensor on source rank 0, broadcast it to the {} destination ranks)",
        from.world() + to.world(),
        args.refits,
        to.world()
    );
    let config = RefitBenchConfig {
        plan,
        sharding,
        iters: args.refits,
        timeout: Duration::from_secs(300),
    };
    let result = run(&config).map_err(|e| CliError::Failed(e.to_string()))?;
    println!("# transport {}", result.transport);
    println!(
        "{:<10} {:>14} {:>12} {:>8}",
        "method", "bytes moved", "median(ms)", "GB/s"
    );
    for (name, m) in [("refit", &result.refit), ("baseline", &result.baseline)] {
        println!(
            "{name:<10} {:>14} {:>12.1} {:>8.3}",
            m.bytes,
            m.median() * 1e3,
            m.gbps()
        );
    }
    println!(
        "refit: {:.2}x the baseline's bytes in {:.2}x its time ({:.1}x faster)",
        result.refit.bytes as f64 / result.baseline.bytes.max(1) as f64,
        result.refit.median() / result.baseline.median().max(f64::MIN_POSITIVE),
        result.baseline.median() / result.refit.median().max(f64::MIN_POSITIVE)
    );
    if let Some(path) = json {
        let figures = |m: &Measured| {
            serde_json::json!({
                "bytes": m.bytes,
                "median_s": m.median(),
                "gbps": m.gbps(),
                "seconds": m.seconds,
            })
        };
        let doc = serde_json::json!({
            "measured": provenance.json(),
            "refit": {
                "from": args.from,
                "to": args.to,
                "model": model,
                "bucket_bytes": bucket,
                "transport": result.transport,
                "plan": figures(&result.refit),
                "baseline": figures(&result.baseline),
            },
        });
        let text =
            serde_json::to_string_pretty(&doc).map_err(|e| CliError::Failed(e.to_string()))?;
        std::fs::write(path, text)
            .map_err(|e| CliError::Failed(format!("cannot write {}: {e}", path.display())))?;
    }
    Ok(())
}
