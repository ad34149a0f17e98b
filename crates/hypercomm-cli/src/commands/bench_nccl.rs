//! `hypercomm bench --backend nccl`: the device benchmark (`hypercomm_bench::device`), or the reason this machine
//! cannot run it; the table, the host time per call against calling NCCL directly, the JSON and the plot.

use std::path::Path;
use std::time::Duration;

use hypercomm_bench::BenchOp;
use hypercomm_bench::device::{self, DeviceBenchConfig, OVERHEAD_BYTES};
use hypercomm_bench::provenance::Provenance;
use hypercomm_comm::device::{DeviceRuntime, placement};
use hypercomm_comm::{CommOptions, NcclOptions};

use super::bench_output::{
    op_json, plot, print_op_note, print_table_header, row, size_bar, write_json,
};
use crate::error::CliError;

/// What `--backend nccl` was asked for (the host-only flags already refused).
pub struct Settings<'a> {
    /// The collective.
    pub op: BenchOp,
    /// `-n`; one rank per visible device when absent.
    pub ranks: Option<usize>,
    /// The sizes, parsed.
    pub sizes: Vec<usize>,
    /// `--iters`.
    pub iters: usize,
    /// `--overhead-calls` (0 skips the host-overhead measurement).
    pub overhead_calls: usize,
    /// `--overhead-batches`.
    pub overhead_batches: usize,
    /// `--blocking`: blocking NCCL communicators.
    pub blocking: bool,
    /// `--seed`: the all-to-all-v's split sizes.
    pub seed: u64,
    /// Where to write the JSON.
    pub json: Option<&'a Path>,
    /// Where to draw the plot.
    pub plot: Option<&'a Path>,
}

/// Runs the device benchmark and prints, writes and draws its results.
pub fn run(settings: &Settings<'_>) -> Result<(), CliError> {
    let op = settings.op;
    // The device bench needs a GPU; say exactly what is missing rather than fall back to the host.
    let runtime = DeviceRuntime::probe_with_env(|n| std::env::var_os(n))
        .map_err(|e| CliError::Failed(format!("--backend nccl: {e}")))?;
    let ranks = settings.ranks.unwrap_or(runtime.device_count().max(1));
    let multi_rank_gpu_enabled =
        std::env::var("NCCL_MULTI_RANK_GPU_ENABLE").is_ok_and(|v| v == "1");
    // Refuse an impossible placement before printing anything.
    placement(
        ranks,
        runtime.device_count(),
        runtime.nccl().version(),
        multi_rank_gpu_enabled,
    )
    .map_err(|e| CliError::Failed(format!("--backend nccl: -n {ranks}: {e}")))?;
    let config = DeviceBenchConfig {
        op,
        ranks,
        sizes: settings.sizes.clone(),
        options: CommOptions {
            timeout: Duration::from_secs(120),
            nccl: NcclOptions {
                blocking: settings.blocking.then_some(true),
                ..Default::default()
            },
            ..CommOptions::named("bench")
        },
        max_iters: settings.iters.max(1),
        overhead_calls: settings.overhead_calls,
        overhead_batches: settings.overhead_batches,
        multi_rank_gpu_enabled,
        seed: settings.seed,
    };
    println!(
        "# hypercomm bench: {} on {} ranks (threads in one process), backend nccl {} ({}), {} communicators",
        op.name(),
        ranks,
        runtime.nccl().version(),
        runtime.nccl().origin(),
        if settings.blocking {
            "blocking"
        } else {
            "non-blocking"
        }
    );
    println!(
        "# busbw factor {:.3}; time is the median over {} batches of the mean per operation (cuda events)",
        op.bus_factor(ranks),
        device::BATCHES
    );
    print_op_note(op, settings.seed);
    print_table_header();
    let provenance = Provenance::start();
    let bar = size_bar(config.sizes.len());
    let report = device::run(runtime, &config, &|r| {
        bar.suspend(|| println!("{}", row(r)));
        bar.inc(1);
    })
    .map_err(|e| CliError::Failed(format!("--backend nccl: {e}")))?;
    bar.finish_and_clear();
    println!("# ranks on devices {:?}", report.devices);
    if let Some(o) = &report.overhead {
        println!(
            "# host time per call, {OVERHEAD_BYTES} B in-place all_reduce, median of {} batches of {} calls:",
            o.batches, o.calls
        );
        println!(
            "#   ncclAllReduce directly {:.0} ns, hypercomm all_reduce + wait {:.0} ns, extra {:.0} ns (target < 500)",
            o.raw_ns,
            o.hypercomm_ns,
            o.extra_ns()
        );
        if o.raw_in_progress > 0 {
            println!(
                "#   {} raw calls answered ncclInProgress; their time includes polling until they settled",
                o.raw_in_progress
            );
        }
    }
    if let Some(path) = settings.json {
        let overhead = report.overhead.as_ref().map(|o| {
            serde_json::json!({
                "bytes": OVERHEAD_BYTES, "calls": o.calls, "batches": o.batches,
                "raw_ns": o.raw_ns, "hypercomm_ns": o.hypercomm_ns, "extra_ns": o.extra_ns(),
                "raw_in_progress": o.raw_in_progress, "ranks": report.devices.len(),
                "blocking": settings.blocking,
            })
        });
        let mut extra: Vec<_> = overhead.map(|o| ("overhead", o)).into_iter().collect();
        extra.extend(op_json(op, settings.seed));
        write_json(path, "nccl", &report.results, &provenance, extra)?;
    }
    if let Some(path) = settings.plot {
        plot(path, &report.results, None)?;
    }
    Ok(())
}
