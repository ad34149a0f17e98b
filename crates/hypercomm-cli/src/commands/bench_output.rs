//! What every `hypercomm bench` front prints, writes and draws: the table's rows, the progress bar, the JSON
//! document and the busbw plot.

use std::path::Path;

use hypercomm_bench::provenance::Provenance;
use hypercomm_bench::{BenchOp, BenchResult};

use crate::error::CliError;

/// The table's header line.
pub fn print_table_header() {
    println!(
        "{:>12} {:>11} {:>5} {:>11} {:>11} {:>11}",
        "size(B)", "count", "type", "time(us)", "algbw(GB/s)", "busbw(GB/s)"
    );
}

/// One size's line of the table.
pub fn row(r: &BenchResult) -> String {
    format!(
        "{:>12} {:>11} {:>5} {:>11.2} {:>11.3} {:>11.3}",
        r.bytes, r.count, "f32", r.time_us, r.algbw_gbps, r.busbw_gbps
    )
}

/// The table's line on what the point-to-point operations move (none for the collectives, whose `bytes` are
/// nccl-tests' buffers).
pub fn print_op_note(op: BenchOp, seed: u64) {
    match op {
        BenchOp::SendRecv => println!(
            "# ring: rank i sends to rank i+1 and receives from rank i-1 in one batch; size is what each rank sends"
        ),
        BenchOp::AllToAllV => println!(
            "# split sizes drawn from seed {seed} (hypercomm_bench::split_sizes); size is what each rank sends, \
             its whole input"
        ),
        _ => {}
    }
}

/// The JSON's top-level keys for `op`: the all-to-all-v's `seed`.
pub fn op_json(op: BenchOp, seed: u64) -> Vec<(&'static str, serde_json::Value)> {
    match op {
        BenchOp::AllToAllV => vec![("seed", seed.into())],
        _ => Vec::new(),
    }
}

/// A progress bar over `sizes` sizes (drawn on stderr, cleared when done).
pub fn size_bar(sizes: usize) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(sizes as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} sizes {elapsed}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar
}

/// Writes the results, where they were measured, and the `extra` top-level keys as pretty JSON at `path`.
pub fn write_json(
    path: &Path,
    backend: &str,
    results: &[BenchResult],
    provenance: &Provenance,
    extra: Vec<(&str, serde_json::Value)>,
) -> Result<(), CliError> {
    let rows: Vec<_> = results.iter().map(BenchResult::json).collect();
    let mut doc = serde_json::json!({
        "backend": backend,
        "measured": provenance.json(),
        "results": rows,
    });
    for (key, value) in extra {
        doc[key] = value;
    }
    let text = serde_json::to_string_pretty(&doc)
        .map_err(|e| CliError::Failed(format!("cannot encode results: {e}")))?;
    std::fs::write(path, text)
        .map_err(|e| CliError::Failed(format!("cannot write {}: {e}", path.display())))
}

/// Draws busbw against size as a PNG or SVG (by `path`'s extension), with no fonts needed on the machine.
/// `buffers` (`None` for the default) joins the transport in the title.
pub fn plot(path: &Path, results: &[BenchResult], buffers: Option<&str>) -> Result<(), CliError> {
    let Some(first) = results.first() else {
        return Err(CliError::Failed("no results to plot".into()));
    };
    let title = format!(
        "hypercomm {} busbw, {} ranks ({}{})",
        first.op.name(),
        first.ranks,
        first.transport,
        buffers.map(|b| format!(", {b}")).unwrap_or_default()
    );
    let points: Vec<(f64, f64)> = results
        .iter()
        .map(|r| (r.bytes.max(1) as f64, r.busbw_gbps))
        .collect();
    let scene = crate::render::plot::log_x_chart(
        &title,
        "message size (bytes, log scale)",
        "busbw (GB/s)",
        &points,
        human,
    );
    crate::render::write(&scene, path)
}

fn human(bytes: f64) -> String {
    let units = [(1u64 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (size, unit) in units {
        if bytes >= size as f64 {
            return format!("{:.0}{unit}", bytes / size as f64);
        }
    }
    format!("{bytes:.0}B")
}
