//! `hypercomm bench`: nccl-tests-style collective benchmarks (table, JSON, busbw plot), a front over the
//! `hypercomm-bench` crate, which measures; this module parses the arguments, prints, writes and draws.

use std::path::PathBuf;
use std::time::Duration;

use hypercomm_bench::BenchOp;
use hypercomm_bench::core_to_core;
use hypercomm_bench::cpus::{Placement, rank_cpus};
use hypercomm_bench::host::{self, BenchConfig};
use hypercomm_bench::provenance::{Provenance, load_average};
use hypercomm_bench::runs::Summary;
use hypercomm_comm::{Algorithm, CommOptions};

use super::bench_output::{
    op_json, plot, print_op_note, print_table_header, row, size_bar, write_json,
};
use crate::error::CliError;
use crate::numbers::non_negative;

/// Which backend `hypercomm bench` measures.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Backend {
    /// The host backend: shared memory on one machine, TCP across machines.
    Host,
    /// NCCL on GPUs.
    Nccl,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Host => "host",
            Backend::Nccl => "nccl",
        }
    }
}

/// The host algorithm `hypercomm bench --algorithm` forces (see `hypercomm_comm::Algorithm`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum AlgorithmArg {
    Auto,
    Latency,
    Bandwidth,
    Direct,
}

impl AlgorithmArg {
    fn algorithm(self) -> Algorithm {
        match self {
            AlgorithmArg::Auto => Algorithm::Auto,
            AlgorithmArg::Latency => Algorithm::Latency,
            AlgorithmArg::Bandwidth => Algorithm::Bandwidth,
            AlgorithmArg::Direct => Algorithm::Direct,
        }
    }

    fn name(self) -> &'static str {
        match self {
            AlgorithmArg::Auto => "auto",
            AlgorithmArg::Latency => "latency",
            AlgorithmArg::Bandwidth => "bandwidth",
            AlgorithmArg::Direct => "direct",
        }
    }
}

/// Arguments of `hypercomm bench`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Backend to measure (nccl needs a GPU; without one it reports what is missing).
    #[arg(long, value_enum, default_value_t = Backend::Host)]
    backend: Backend,
    /// Number of ranks (threads of this process, each with its own communicator, or processes with --processes).
    /// Default: 2 on the host, one per visible GPU with nccl.
    #[arg(short = 'n', long, allow_negative_numbers = true, value_parser = non_negative::<usize>)]
    ranks: Option<usize>,
    /// Collective: all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all, sendrecv (a ring: each
    /// rank sends to the next and receives from the previous in one batch), all_to_all_v (split sizes drawn from
    /// --seed).
    #[arg(long, default_value = "all_reduce")]
    op: String,
    /// all_to_all_v: the seed its split sizes are drawn from (`hypercomm_bench::split_sizes`); every rank draws
    /// the same matrix from it.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Sizes: `MIN:MAX` doubling (`8B:256MiB`) or one size; units B, KiB, MiB, GiB (K, M, G also mean 2^10...).
    #[arg(long, default_value = "8B:64MiB")]
    sizes: String,
    /// Use TCP between the ranks instead of shared memory.
    #[arg(long)]
    tcp: bool,
    /// Most timed iterations per size (large sizes use fewer, at least 5).
    #[arg(long, default_value_t = 200, allow_negative_numbers = true, value_parser = non_negative::<usize>)]
    iters: usize,
    /// Host: run the whole benchmark this many times in a row (fresh communicators each time) and report, per
    /// size, the median of the runs' medians and their spread (min-max), with the load average before and after.
    /// How small-message latency is judged on a shared machine: one run can be lucky or unlucky.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = non_negative::<usize>)]
    runs: usize,
    /// Host: let the scheduler place the rank threads instead of binding rank i to the i-th CPU this process may
    /// use (ranks float anyway when there are more ranks than CPUs). Unbound, two ranks on two cores sometimes
    /// share one core for a whole run, which then measures the scheduler.
    #[arg(long)]
    unpinned: bool,
    /// Host: allocate the benchmark's buffers with `hypercomm_comm::host_buffer::huge_page_vec`, which asks the
    /// kernel to back them with 2 MiB pages, instead of plain vectors.
    #[arg(long)]
    huge_pages: bool,
    /// Host, all_reduce / all_gather / reduce_scatter: run the collective in place on a symmetric buffer
    /// (`Communicator::all_reduce_symmetric` and its siblings), which the ranks read in place from each other's
    /// windows, instead of on vectors staged through the shared slots.
    #[arg(long)]
    symmetric: bool,
    /// Host, all_gather / reduce_scatter: run in place on one vector of the whole size (`Communicator::all_gather`,
    /// `Communicator::reduce_scatter`) instead of from an input into an output, as nccl-tests also reports.
    #[arg(long)]
    in_place: bool,
    /// Host: the algorithm family. auto chooses by size; latency and bandwidth force the staged paths through the
    /// shared slots; direct makes all_reduce, all_gather and reduce_scatter read the peers' buffers where they are
    /// (one copy by the kernel, `process_vm_readv`), which auto does where it measured faster (all_reduce 2-32
    /// MiB, all_gather 512 KiB-16 MiB, reduce_scatter 2-16 MiB) and the ranks may.
    #[arg(long, value_enum, default_value_t = AlgorithmArg::Auto)]
    algorithm: AlgorithmArg,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw busbw against size (log-scale x) as a PNG here.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Instead of collectives: time building a full process-group collection (all 22 kinds, all-gather groups on)
    /// on 8 ranks, by both bootstraps (store-keyed and split); prints the median build time per rank.
    #[arg(long)]
    collection: bool,
    /// With --backend nccl: calls per batch when timing the host cost of one call against raw NCCL (0 skips it).
    #[arg(long, default_value_t = 100, allow_negative_numbers = true, value_parser = non_negative::<usize>)]
    overhead_calls: usize,
    /// With --backend nccl: batches of each side when timing the host cost of one call.
    #[arg(long, default_value_t = 21, allow_negative_numbers = true, value_parser = non_negative::<usize>)]
    overhead_batches: usize,
    /// With --backend nccl: blocking NCCL communicators (`blocking = 1` in their config) instead of hypercomm's
    /// default, non-blocking ones polled by the backend; to compare the host cost of the two modes.
    #[arg(long)]
    blocking: bool,
    /// With --collection: how many times each strategy builds the collection.
    #[arg(long, default_value_t = 20, allow_negative_numbers = true, value_parser = non_negative::<usize>)]
    repeats: usize,
    /// Run the ranks as processes started through the launcher (`hypercomm launch`, which hosts a TCP store and binds
    /// each rank to its share of the CPUs unless --unpinned), as a training job runs them, instead of threads of
    /// this process: the host collective's -n ranks, or with --collection its 8.
    #[arg(long)]
    processes: bool,
    /// `--refit` and its settings: a weight refit against gathering and broadcasting full tensors.
    #[command(flatten)]
    refit: super::bench_refit::RefitBenchArgs,
    /// Internal: this process is one rank of a host `--processes` run.
    #[arg(long, hide = true, conflicts_with = "collection")]
    bench_worker: bool,
    /// Internal: this process is one rank of `--collection --processes`.
    #[arg(long, hide = true, requires = "collection")]
    collection_worker: bool,
}

/// Parses `8B`, `4KiB`, `256MiB`, `1G`: a number with an optional binary unit.
pub(crate) fn parse_size(text: &str) -> Result<usize, CliError> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num: usize = num
        .parse()
        .map_err(|_| CliError::Usage(format!("size {text:?} does not start with a number")))?;
    let mult: usize = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        other => {
            return Err(CliError::Usage(format!(
                "size {text:?} has unknown unit {other:?} (use B, KiB, MiB, GiB)"
            )));
        }
    };
    num.checked_mul(mult)
        .ok_or_else(|| CliError::Usage(format!("size {text:?} overflows")))
}

/// Parses `MIN:MAX` (doubling from MIN up to MAX) or a single size.
fn parse_sizes(text: &str) -> Result<Vec<usize>, CliError> {
    let (lo, hi) = match text.split_once(':') {
        Some((a, b)) => (parse_size(a)?, parse_size(b)?),
        None => {
            let s = parse_size(text)?;
            (s, s)
        }
    };
    if lo == 0 || lo > hi {
        return Err(CliError::Usage(format!(
            "sizes {text:?} must be MIN:MAX with 0 < MIN <= MAX"
        )));
    }
    let mut sizes = vec![lo];
    while let Some(next) = sizes
        .last()
        .and_then(|s| s.checked_mul(2))
        .filter(|s| *s <= hi)
    {
        sizes.push(next);
    }
    Ok(sizes)
}

/// Runs the benchmark and prints, writes and draws its results.
pub fn run(args: Args) -> Result<(), CliError> {
    if args.refit.refit {
        let bucket = parse_size(&args.refit.bucket)? as u64;
        return super::bench_refit::run_refit(&args.refit, bucket, args.json.as_deref());
    }
    if args.collection {
        return super::collection_bench::run(&super::collection_bench::Settings {
            backend: args.backend.name(),
            repeats: args.repeats,
            processes: args.processes,
            worker: args.collection_worker,
            json: args.json.as_deref(),
        });
    }
    let op = BenchOp::from_name(&args.op).ok_or_else(|| {
        let names: Vec<_> = BenchOp::ALL.iter().map(|o| o.name()).collect();
        CliError::Usage(format!(
            "op {:?} is not one of {}",
            args.op,
            names.join(", ")
        ))
    })?;
    if args.ranks == Some(0) {
        return Err(CliError::Usage("-n must be at least 1".into()));
    }
    if let Some(n) = args.ranks.filter(|&n| n < op.min_ranks()) {
        return Err(CliError::Usage(format!(
            "--op {} needs at least {} ranks, not -n {n}",
            op.name(),
            op.min_ranks()
        )));
    }
    if args.backend == Backend::Nccl {
        if args.tcp {
            return Err(CliError::Usage(
                "--tcp is a host transport; the nccl backend picks its own".into(),
            ));
        }
        if args.runs != 1 {
            return Err(CliError::Usage(
                "--runs is for the host backend; with nccl, --overhead-batches repeats the timing"
                    .into(),
            ));
        }
        if args.algorithm != AlgorithmArg::Auto || args.in_place || args.processes {
            let why = "--algorithm, --in-place and --processes are for the host backend (the nccl ranks are \
                       threads, one GPU each, and NCCL picks its own algorithms)";
            return Err(CliError::Usage(why.into()));
        }
        return super::bench_nccl::run(&super::bench_nccl::Settings {
            op,
            ranks: args.ranks,
            sizes: parse_sizes(&args.sizes)?,
            iters: args.iters,
            overhead_calls: args.overhead_calls,
            overhead_batches: args.overhead_batches,
            blocking: args.blocking,
            seed: args.seed,
            json: args.json.as_deref(),
            plot: args.plot.as_deref(),
        });
    }
    let ranks = args.ranks.unwrap_or(2);
    let sizes = parse_sizes(&args.sizes)?;
    if args.symmetric && (!op.has_symmetric_form() || args.huge_pages) {
        return Err(CliError::Usage(format!(
            "--symmetric runs all_reduce, all_gather and reduce_scatter on buffers in the communicator's \
             shared window: not with {}",
            if args.huge_pages {
                "--huge-pages".to_owned()
            } else {
                format!("--op {}", op.name())
            }
        )));
    }
    if args.in_place
        && (args.symmetric || !matches!(op, BenchOp::AllGather | BenchOp::ReduceScatter))
    {
        return Err(CliError::Usage(format!(
            "--in-place runs all_gather and reduce_scatter on one vector: not with {}",
            if args.symmetric {
                "--symmetric (in place already)".to_owned()
            } else {
                format!("--op {}", op.name())
            }
        )));
    }
    let config = BenchConfig {
        op,
        ranks,
        sizes: sizes.clone(),
        options: CommOptions {
            timeout: Duration::from_secs(120),
            force_tcp: args.tcp,
            algorithm: args.algorithm.algorithm(),
            ..CommOptions::named("bench")
        },
        max_iters: args.iters.max(1),
        placement: if args.unpinned {
            Placement::Free
        } else {
            Placement::OneCpuEach
        },
        huge_pages: args.huge_pages,
        symmetric: args.symmetric,
        in_place: args.in_place,
        seed: args.seed,
    };
    if args.bench_worker {
        return super::bench_processes::worker(&config);
    }
    let cpus = rank_cpus(config.placement, ranks);
    println!(
        "# hypercomm bench: {} on {} ranks ({}), backend host, transport {}",
        op.name(),
        ranks,
        if args.processes {
            "processes started by the launcher"
        } else {
            "threads in one process"
        },
        if args.tcp { "tcp" } else { "shm" }
    );
    println!(
        "# placement: {}{}",
        placement_text(
            config.placement,
            cpus.as_deref(),
            if args.processes {
                "processes"
            } else {
                "threads"
            }
        ),
        if args.processes && cpus.is_some() {
            " (by the launcher)"
        } else {
            ""
        }
    );
    let buffers = HostBuffers::of(&args);
    println!("# buffers: {}", buffers.described());
    println!(
        "# algorithm: {}{}",
        args.algorithm.name(),
        if args.in_place { "; in place" } else { "" }
    );
    println!(
        "# busbw factor {:.3}; time is the median of each size's iterations",
        op.bus_factor(ranks)
    );
    print_op_note(op, args.seed);
    if args.runs == 0 {
        return Err(CliError::Usage("--runs must be at least 1".into()));
    }
    let provenance = Provenance::start();
    let load_before = provenance.load_before();
    let probe_cpus = core_to_core::probe_pair(cpus.as_deref());
    let mut all_runs = Vec::with_capacity(args.runs);
    let mut trips = Vec::with_capacity(args.runs);
    for run in 0..args.runs {
        if args.runs > 1 {
            println!("# run {} of {}", run + 1, args.runs);
        }
        let before = probe(probe_cpus)?;
        print_table_header();
        let results = if args.processes {
            let results = super::bench_processes::launch(&config, worker_args(&args))?;
            for r in &results {
                println!("{}", row(r));
            }
            results
        } else {
            let bar = size_bar(sizes.len());
            let results = host::run(&config, &|r| {
                bar.suspend(|| println!("{}", row(r)));
                bar.inc(1);
            })
            .map_err(|e| CliError::Failed(e.to_string()))?;
            bar.finish_and_clear();
            results
        };
        let after = probe(probe_cpus)?;
        println!("# {}", round_trip_text(probe_cpus, before, after));
        all_runs.push(results);
        trips.push((before, after));
    }
    let load_after = load_average();
    let summary = Summary::of(&all_runs);
    if args.runs > 1 {
        println!(
            "# {} runs; load average (1 min) {} before, {} after",
            args.runs,
            show_load(load_before),
            show_load(load_after)
        );
        print!("{}", summary.table());
    }
    // The table and plot of a single run are that run; of several, each size's median run.
    let results = summary.median_results();
    if let Some(path) = &args.json {
        let placement = serde_json::json!({
            "bound": cpus.is_some(),
            "cpus": cpus,
            "requested": config.placement.name(),
        });
        let core_to_core = serde_json::json!({
            "cpus": probe_cpus.map(|(a, b)| [a, b]),
            "batches": core_to_core::PROBE_BATCHES,
            "trips_per_batch": core_to_core::TRIPS_PER_BATCH,
            "median_ns_before_and_after_each_run": trips.iter().map(|(b, a)| [b, a]).collect::<Vec<_>>(),
        });
        let mut extra = vec![
            ("placement", placement),
            ("buffers", buffers.json().into()),
            ("algorithm", args.algorithm.name().into()),
            ("in_place", args.in_place.into()),
            (
                "ranks_as",
                if args.processes {
                    "processes"
                } else {
                    "threads"
                }
                .into(),
            ),
            ("core_to_core", core_to_core),
        ];
        extra.extend(op_json(op, args.seed));
        if args.runs > 1 {
            extra.push(("runs", summary.json(load_before, load_after)));
        }
        write_json(path, "host", &results, &provenance, extra)?;
    }
    if let Some(path) = &args.plot {
        plot(path, &results, buffers.plot_note())?;
    }
    Ok(())
}

/// The buffers a host run uses, as `--huge-pages` and `--symmetric` chose them (never both), and how the table,
/// the JSON and the plot name them.
#[derive(Clone, Copy)]
enum HostBuffers {
    Plain,
    HugePages,
    Symmetric,
}

impl HostBuffers {
    fn of(args: &Args) -> HostBuffers {
        match (args.huge_pages, args.symmetric) {
            (true, _) => HostBuffers::HugePages,
            (false, true) => HostBuffers::Symmetric,
            (false, false) => HostBuffers::Plain,
        }
    }

    /// The `# buffers:` line of the table.
    fn described(self) -> &'static str {
        match self {
            HostBuffers::Plain => "plain vectors",
            HostBuffers::HugePages => "advised to use 2 MiB pages (--huge-pages)",
            HostBuffers::Symmetric => {
                "symmetric, in each rank's window of the shared segment (--symmetric)"
            }
        }
    }

    /// The JSON's `buffers` value.
    fn json(self) -> &'static str {
        match self {
            HostBuffers::Plain => "plain",
            HostBuffers::HugePages => "huge-page advice",
            HostBuffers::Symmetric => "symmetric",
        }
    }

    /// What the plot's title adds after the transport (nothing for plain vectors).
    fn plot_note(self) -> Option<&'static str> {
        match self {
            HostBuffers::Plain => None,
            HostBuffers::HugePages => Some("huge pages"),
            HostBuffers::Symmetric => Some("symmetric buffers"),
        }
    }
}

/// The median core-to-core round trip in ns between `cpus` ([`core_to_core::probe`]).
fn probe(cpus: Option<(usize, usize)>) -> Result<Option<f64>, CliError> {
    core_to_core::probe(cpus).map_err(|e| CliError::Failed(e.to_string()))
}

/// A load average for a message: two decimals, or `unknown`.
fn show_load(load: Option<f64>) -> String {
    load.map_or_else(|| "unknown".to_owned(), |l| format!("{l:.2}"))
}

fn round_trip_text(
    cpus: Option<(usize, usize)>,
    before: Option<f64>,
    after: Option<f64>,
) -> String {
    match (cpus, before, after) {
        (Some((a, b)), Some(before), Some(after)) => format!(
            "core-to-core round trip, CPUs {a} and {b}: {before:.0} ns before the run, {after:.0} ns after \
             (every shared-memory round waits on it; see `hypercomm_bench::core_to_core`)"
        ),
        _ => "core-to-core round trip: not measured (this process may use one CPU)".into(),
    }
}

/// The arguments a `--processes` rank gets after `bench --bench-worker`: the benchmark's own, so that every rank
/// builds the same configuration.
fn worker_args(args: &Args) -> Vec<String> {
    let mut out = vec![
        "--op".to_owned(),
        args.op.clone(),
        "--sizes".to_owned(),
        args.sizes.clone(),
        "--iters".to_owned(),
        args.iters.to_string(),
        "--algorithm".to_owned(),
        args.algorithm.name().to_owned(),
        "--seed".to_owned(),
        args.seed.to_string(),
    ];
    if let Some(n) = args.ranks {
        out.extend(["-n".to_owned(), n.to_string()]);
    }
    for (on, flag) in [
        (args.tcp, "--tcp"),
        (args.unpinned, "--unpinned"),
        (args.huge_pages, "--huge-pages"),
        (args.symmetric, "--symmetric"),
        (args.in_place, "--in-place"),
    ] {
        if on {
            out.push(flag.to_owned());
        }
    }
    out
}

/// Says where the ranks (`what`: threads or processes) run.
fn placement_text(placement: Placement, cpus: Option<&[usize]>, what: &str) -> String {
    match (placement, cpus) {
        (_, Some(cpus)) => {
            let list: Vec<String> = cpus.iter().map(ToString::to_string).collect();
            format!("rank i bound to CPU [{}][i]", list.join(", "))
        }
        (Placement::Free, None) => format!("{what} float (--unpinned)"),
        (Placement::OneCpuEach, None) => format!(
            "{what} float: more ranks than CPUs this process may use (or its CPU mask is unreadable)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_double_between_the_bounds() {
        assert_eq!(parse_sizes("8B:64").unwrap(), vec![8, 16, 32, 64]);
        assert_eq!(parse_sizes("1KiB:3KiB").unwrap(), vec![1024, 2048]);
        assert_eq!(parse_sizes("256MiB").unwrap(), vec![256 << 20]);
        assert!(matches!(parse_sizes("8XB:1"), Err(CliError::Usage(_))));
        assert!(matches!(parse_sizes("64:8"), Err(CliError::Usage(_))));
    }
}
