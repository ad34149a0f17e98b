//! `hypercomm bench --collection [--processes]`: the median per-rank time to build a full process-group
//! collection on 8 ranks, by each bootstrap, with ranks as threads of this process or as processes.
//!
//! As processes, this command launches 8 copies of itself through the launcher (the same one as `hypercomm
//! launch`, hosting a TCP store); each copy runs with `--collection-worker`, builds the collection as its rank,
//! and prints one line per build (`<strategy> <microseconds> <communicators>`), which the launcher captures.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hypercomm_bench::collection::{
    Strategy, full_layout_8, open_gpus, time_builds, time_builds_as_rank,
};
use hypercomm_bench::median;
use hypercomm_comm::device::DeviceRuntime;
use hypercomm_store::{Rendezvous, Store};

use crate::error::CliError;

/// What `--collection` was asked for.
pub struct Settings<'a> {
    /// The backend named on the command line: `host`, or `nccl` (every group also gets an NCCL communicator).
    pub backend: &'a str,
    /// Builds per strategy (per rank).
    pub repeats: usize,
    /// Ranks as processes rather than threads.
    pub processes: bool,
    /// This process is one rank of a `--processes` run.
    pub worker: bool,
    /// Where to write the results as JSON.
    pub json: Option<&'a Path>,
}

/// The ranks of the measured layout.
const RANKS: usize = 8;

/// Runs the collection benchmark (or, with `worker`, one rank of it).
pub fn run(settings: &Settings<'_>) -> Result<(), CliError> {
    if settings.repeats == 0 {
        return Err(CliError::Usage("--repeats must be at least 1".into()));
    }
    let nccl = match settings.backend {
        "host" => false,
        "nccl" => true,
        other => {
            return Err(CliError::Usage(format!(
                "backend {other:?} is not available; use host or nccl"
            )));
        }
    };
    if nccl && (settings.processes || settings.worker) {
        return Err(CliError::Usage(
            "--collection --backend nccl runs its ranks as threads (one GPU each); drop --processes".into(),
        ));
    }
    if settings.worker {
        return run_worker(settings.repeats);
    }
    let provenance = hypercomm_bench::provenance::Provenance::start();
    let layout = full_layout_8();
    let gpus = if nccl {
        Some(collection_gpus(RANKS)?)
    } else {
        None
    };
    let ranks_as = if settings.processes {
        "processes started by the launcher, TCP store"
    } else {
        "threads of one process"
    };
    let measured: Vec<(Strategy, Vec<Duration>, usize)> = if settings.processes {
        launch_workers(settings.repeats)?
    } else {
        Strategy::ALL
            .into_iter()
            .map(|strategy| {
                let (times, held) =
                    time_builds(&layout, strategy, settings.repeats, gpus.as_deref())
                        .map_err(|e| CliError::Failed(e.to_string()))?;
                Ok((strategy, times, held))
            })
            .collect::<Result<_, CliError>>()?
    };
    println!(
        "collection build, {RANKS} ranks as {ranks_as}, layout tp 2 cp 2 pp 2 ep 2 etp 1, 2 optimizer instances, hcp [2], backend {}; {} repeat(s)",
        settings.backend, settings.repeats
    );
    println!(
        "{:>8} {:>14} {:>12} {:>12} {:>12}",
        "strategy", "communicators", "median ms", "min ms", "max ms"
    );
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut results = Vec::new();
    for (strategy, times, communicators) in measured {
        let (lo, hi) = (
            times.iter().min().copied().unwrap_or_default(),
            times.iter().max().copied().unwrap_or_default(),
        );
        let med = median(&times).unwrap_or_default();
        println!(
            "{:>8} {communicators:>14} {:>12.2} {:>12.2} {:>12.2}",
            strategy.name(),
            ms(med),
            ms(lo),
            ms(hi)
        );
        results.push(serde_json::json!({
            "strategy": strategy.name(),
            "backend": settings.backend,
            "ranks": RANKS,
            "ranks_as": if settings.processes { "processes" } else { "threads" },
            "communicators_per_rank": communicators,
            "repeats": settings.repeats,
            "median_ms": ms(med),
            "min_ms": ms(lo),
            "max_ms": ms(hi),
        }));
    }
    if let Some(path) = settings.json {
        let doc = serde_json::json!({ "measured": provenance.json(), "collection": results });
        let text = serde_json::to_string_pretty(&doc)
            .map_err(|e| CliError::Failed(format!("cannot encode JSON: {e}")))?;
        std::fs::write(path, text + "\n")
            .map_err(|e| CliError::Failed(format!("cannot write {}: {e}", path.display())))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// The GPU of each of `ranks` ranks for `--collection --backend nccl`, or what is missing.
fn collection_gpus(ranks: usize) -> Result<Vec<Arc<hypercomm_comm::device::Gpu>>, CliError> {
    let failed = |why: String| CliError::Failed(format!("--collection --backend nccl: {why}"));
    let runtime = DeviceRuntime::probe_with_env(|n| std::env::var_os(n))
        .map_err(|e| failed(e.to_string()))?;
    let multi_rank = std::env::var("NCCL_MULTI_RANK_GPU_ENABLE").is_ok_and(|v| v == "1");
    open_gpus(&runtime, ranks, multi_rank).map_err(|e| failed(format!("{ranks} ranks: {e}")))
}

/// Starts the 8 worker processes and gathers every rank's build times per strategy.
fn launch_workers(repeats: usize) -> Result<Vec<(Strategy, Vec<Duration>, usize)>, CliError> {
    let report = super::launch::launch_copies(
        vec![
            "bench".to_owned(),
            "--collection".to_owned(),
            "--collection-worker".to_owned(),
            "--repeats".to_owned(),
            repeats.to_string(),
        ],
        RANKS,
        false,
        Duration::from_secs(600),
        "the collection ranks",
    )?;
    let mut measured: Vec<(Strategy, Vec<Duration>, usize)> = Strategy::ALL
        .into_iter()
        .map(|s| (s, Vec::new(), 0))
        .collect();
    for rank in &report.ranks {
        for line in &rank.stdout {
            let bad = || CliError::Failed(format!("rank {} printed {line:?}", rank.rank));
            let mut words = line.split_whitespace();
            let (Some(name), Some(micros), Some(held)) = (words.next(), words.next(), words.next())
            else {
                return Err(bad());
            };
            let entry = measured
                .iter_mut()
                .find(|(s, _, _)| s.name() == name)
                .ok_or_else(bad)?;
            entry
                .1
                .push(Duration::from_micros(micros.parse().map_err(|_| bad())?));
            entry.2 = entry.2.max(held.parse().map_err(|_| bad())?);
        }
    }
    for (strategy, times, _) in &measured {
        if times.len() != RANKS * repeats {
            return Err(CliError::Failed(format!(
                "{}: {} build times from the ranks, expected {}",
                strategy.name(),
                times.len(),
                RANKS * repeats
            )));
        }
    }
    Ok(measured)
}

/// One rank of a `--processes` run: joins the launcher's store and times its builds, one line per build.
fn run_worker(repeats: usize) -> Result<(), CliError> {
    let failed = |e: &dyn std::fmt::Display| CliError::Failed(e.to_string());
    let rendezvous = Rendezvous::from_env().map_err(|e| failed(&e))?;
    let joined = rendezvous
        .join(rendezvous.client_options())
        .map_err(|e| failed(&e))?;
    let store: Arc<dyn Store> = Arc::new(joined.store);
    let layout = full_layout_8();
    for strategy in Strategy::ALL {
        let (times, held) = time_builds_as_rank(
            &layout,
            strategy,
            repeats,
            rendezvous.rank,
            Arc::clone(&store),
        )
        .map_err(|e| failed(&e))?;
        for t in times {
            println!("{} {} {held}", strategy.name(), t.as_micros());
        }
    }
    // Keep the server alive (it lives with the launcher here, so this is None) until every rank is done.
    drop(joined.server);
    Ok(())
}
