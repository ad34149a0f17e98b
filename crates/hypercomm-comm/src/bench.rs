//! Collective benchmarks in the style of nccl-tests: median time per operation, algorithm and bus bandwidth.
//!
//! Ranks run as threads of this process, each with its own communicator over a shared in-memory store; on the
//! host backend they still talk through the shared-memory (or TCP) transport exactly as processes would.
//! By default ([`Placement::OneCpuEach`]) rank `i` is bound to the `i`-th CPU the process may use, as MPI and
//! nccl-tests runs bind ranks to cores: left to the scheduler, the two threads of a 2-rank run on a 2-core
//! machine sometimes share one core for a whole run (most likely the scheduler waking a thread on its waker's
//! core: two threads that take turns never look busy enough to be split again). Such a run measures the
//! scheduler, not the collective: on the development machine it shows the same figures as a run confined to one
//! core with `taskset -c 0` (small all-reduce 25-30 µs instead of 2 µs, 16 MiB at half the bandwidth).
//! Buffers are plain vectors unless [`BenchConfig::huge_pages`] asks for
//! [`huge_page_vec`](crate::host_buffer::huge_page_vec), which makes beyond-cache sizes faster where each TLB
//! miss is dear (a virtual machine).
//! `bytes` is the whole buffer as nccl-tests counts it: the all-reduce/broadcast/reduce buffer, the all-gather
//! output, the reduce-scatter input, the all-to-all buffer. `algbw = bytes / time`; `busbw = algbw * factor`
//! with nccl-tests' factors (see [`BenchOp::bus_factor`]).
//!
//! Reading the figures on the shared-memory transport:
//! - **Small operations measure waiting.** Every round ends in a barrier. A waiting rank checks about 300 times
//!   (a few µs), then keeps checking with a `sched_yield` between bursts of 64 checks for up to 500 µs, then
//!   sleeps on the segment's doorbell futex in 2 ms slices, checking its deadline, the abort flag and its peers'
//!   liveness between slices; an arriving rank wakes sleepers. It falls through to sleeping only when the rank it
//!   waits for is more than 500 µs late: a rank that has not entered the operation yet, or one that shares its
//!   core with other work. Sleeping earlier cost every slightly late round a wake-up (on a virtual machine, an
//!   idle virtual CPU is handed back to the host, and the futex wake-up reaches it tens of µs later): with 20
//!   yields before sleeping, 9-22% of a 16 MiB all-reduce's rounds waited over 20 µs.
//!   When every rank has a core of its own the peer arrives within the spin and a small all-reduce takes 1.1-1.3
//!   µs on the development machine (2026-11-24; each operation runs on the thread that waits on it, so
//!   issue-then-wait hands nothing to the progress thread; before that, two thread hand-offs made it 5–8 µs).
//!   When the ranks share cores with each other or with other jobs, the rank it waits for is often not running:
//!   spinning would only take the core that rank needs, so the waiter yields and then sleeps, and the wake-up
//!   through the futex and the scheduler costs tens of µs. That is where the 25–95 µs small-operation figures
//!   on a loaded machine came from before operations ran on the waiting thread (fewer threads now compete for the
//!   cores, so a rank falls through to sleeping far less often), and why medians of several runs are reported.
//! - **Large operations measure memory traffic, not the wire.** busbw divides nccl-tests' bus bytes by the time,
//!   which compares operations on a network. On one host the cost is the bytes read and written in memory. Once
//!   the buffers exceed the last-level cache, an in-place all-reduce of `S` bytes reads `S` and writes `S` for
//!   `2S(n-1)/n` bus bytes; an out-of-place all-gather must read `S/n` and write `S` (its output is `n` times its
//!   input) for `S(n-1)/n` bus bytes, and a reduce-scatter reads `S` and writes `S/n`. Per bus byte that is about
//!   twice the memory traffic of the all-reduce at 2 ranks, whatever the algorithm, so at 16 MiB their busbw
//!   trails all-reduce's; in cache (1 MiB) they run at or above it. `scripts/floors.c` measures each floor on
//!   the machine at hand: on the development machine (2026-11-23) the all-gather and reduce-scatter floors at
//!   16 MiB were 0.59 of the all-reduce's, and each collective ran at 0.51-0.57 of its own floor. (An ordinary
//!   store to a cold line also reads it first; outputs of 8 MiB and more are written with non-temporal stores,
//!   which do not.)
//! - **Every size waits on lines crossing between cores.** A peer's publication reaches a rank one cache line at
//!   a time, and a core keeps only so many such transfers in flight, so the transport's throughput follows the
//!   core-to-core latency. On a virtual machine that latency is the host's choice and can change by several
//!   times within a minute; [`core_to_core::round_trip`] measures it, and `hypercomm bench` reports it before
//!   and after every run. On the development machine a round trip of 370-490 ns instead of the usual 55-90
//!   marks the windows where every size runs at 1.8-3.3 GB/s, and one of about 30 ns (two virtual CPUs on one
//!   physical core, most likely) the runs where the 1-4 MiB sizes lose a quarter of their speed.
//! - **Symmetric buffers remove the staging.** With [`BenchConfig::symmetric`] (`hypercomm bench --symmetric`)
//!   the all-reduce, all-gather and reduce-scatter run in place on [`SymmetricBuffer`](crate::SymmetricBuffer)s,
//!   which the peers read (and the all-reduce writes) where they are (see [`crate::symmetric`]): no copy into a
//!   slot and out again. The in-place all-gather reads only the `S(n-1)/n` bytes it lacks and writes them once.
//!   On the development machine (2026-11-24 00:54 UTC, ten alternations, medians) 16 MiB ran all-reduce 19.74,
//!   all-gather 14.30 and reduce-scatter 11.95 GB/s busbw symmetric, against 5.82, 4.22 and 4.61 on vectors:
//!   the gather and scatter pass the all-reduce on vectors but not the symmetric one, which runs near memory
//!   speed (the README has the tables and the accounting).
//!
//! Each iteration's time is the collective alone: refilling the all-reduce's buffer between iterations (so that
//! sums stay bounded) happens after the clock stops.

pub mod core_to_core;

use std::sync::Arc;
use std::time::{Duration, Instant};

use hypercomm_store::MemoryStore;

use crate::host_buffer::PageAdvice;
use crate::{CommError, CommOptions, Communicator, ReduceOp};

/// A benchmarked collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchOp {
    /// In-place sum all-reduce.
    AllReduce,
    /// Out-of-place all-gather into one buffer.
    AllGather,
    /// Out-of-place sum reduce-scatter from one buffer.
    ReduceScatter,
    /// In-place broadcast from rank 0.
    Broadcast,
    /// In-place sum reduce to rank 0.
    Reduce,
    /// Out-of-place all-to-all with equal blocks.
    AllToAll,
}

impl BenchOp {
    /// Every benchmarked collective.
    pub const ALL: [BenchOp; 6] = [
        BenchOp::AllReduce,
        BenchOp::AllGather,
        BenchOp::ReduceScatter,
        BenchOp::Broadcast,
        BenchOp::Reduce,
        BenchOp::AllToAll,
    ];

    /// The snake-case name (`"all_reduce"`).
    pub fn name(self) -> &'static str {
        match self {
            BenchOp::AllReduce => "all_reduce",
            BenchOp::AllGather => "all_gather",
            BenchOp::ReduceScatter => "reduce_scatter",
            BenchOp::Broadcast => "broadcast",
            BenchOp::Reduce => "reduce",
            BenchOp::AllToAll => "all_to_all",
        }
    }

    /// The operation named `name`, if any.
    pub fn from_name(name: &str) -> Option<BenchOp> {
        BenchOp::ALL.into_iter().find(|o| o.name() == name)
    }

    /// Per-rank `f32` element counts `(input, output)` such that the buffer nccl-tests counts holds `bytes`
    /// (rounded down to whole elements per rank) on `n` ranks; in-place operations have no output (0).
    ///
    /// ```
    /// use hypercomm_comm::bench::BenchOp;
    ///
    /// assert_eq!(BenchOp::AllReduce.buffer_lens(4096, 4), (1024, 0));
    /// assert_eq!(BenchOp::AllGather.buffer_lens(4096, 4), (256, 1024));
    /// assert_eq!(BenchOp::ReduceScatter.buffer_lens(4096, 4), (1024, 256));
    /// ```
    pub fn buffer_lens(self, bytes: usize, n: usize) -> (usize, usize) {
        let total = bytes / 4;
        let n = n.max(1);
        match self {
            BenchOp::AllReduce | BenchOp::Broadcast | BenchOp::Reduce => (total, 0),
            BenchOp::AllGather => (total / n, total / n * n),
            BenchOp::ReduceScatter => (total / n * n, total / n),
            BenchOp::AllToAll => (total / n * n, total / n * n),
        }
    }

    /// Whether a symmetric-buffer form of the collective exists (all-reduce, all-gather, reduce-scatter), which
    /// [`BenchConfig::symmetric`] can measure.
    pub fn has_symmetric_form(self) -> bool {
        matches!(
            self,
            BenchOp::AllReduce | BenchOp::AllGather | BenchOp::ReduceScatter
        )
    }

    /// nccl-tests' bus-bandwidth factor for `n` ranks: all-reduce `2(n-1)/n`; all-gather, reduce-scatter and
    /// all-to-all `(n-1)/n`; broadcast and reduce 1.
    pub fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            BenchOp::AllReduce => 2.0 * (n - 1.0) / n,
            BenchOp::AllGather | BenchOp::ReduceScatter | BenchOp::AllToAll => (n - 1.0) / n,
            BenchOp::Broadcast | BenchOp::Reduce => 1.0,
        }
    }
}

/// One measured size.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchResult {
    /// The collective.
    pub op: BenchOp,
    /// Rank count.
    pub ranks: usize,
    /// Whole buffer size in bytes, as nccl-tests counts it.
    pub bytes: usize,
    /// `f32` elements in that buffer.
    pub count: usize,
    /// Median time of one operation, in microseconds.
    pub time_us: f64,
    /// `bytes / time`, in GB/s (10^9 bytes per second).
    pub algbw_gbps: f64,
    /// `algbw * factor`, in GB/s.
    pub busbw_gbps: f64,
    /// The transport used (`"shm"` or `"tcp"` on the host backend, `"nccl"` on the device).
    pub transport: &'static str,
}

impl BenchResult {
    /// The result for `op` on `ranks` ranks moving `elements` `f32`s (the larger of input and output) in
    /// `time_us` per operation.
    pub fn new(
        op: BenchOp,
        ranks: usize,
        elements: usize,
        time_us: f64,
        transport: &'static str,
    ) -> BenchResult {
        let bytes = 4 * elements;
        let algbw = if time_us > 0.0 {
            bytes as f64 / (time_us * 1e3)
        } else {
            0.0
        };
        BenchResult {
            op,
            ranks,
            bytes,
            count: elements,
            time_us,
            algbw_gbps: algbw,
            busbw_gbps: algbw * op.bus_factor(ranks),
            transport,
        }
    }
}

/// Where the rank threads of a benchmark run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Placement {
    /// Rank `i` is bound to the `i`-th CPU this process may run on, when there are at least as many CPUs as
    /// ranks; with more ranks than CPUs the threads float (see [`rank_cpus`]).
    #[default]
    OneCpuEach,
    /// The scheduler places the threads and may move them.
    Free,
}

/// The CPU each rank thread is bound to under `placement`: `Some(cpus)`, rank `i` on `cpus[i]`, or `None` when
/// the threads float ([`Placement::Free`], more ranks than CPUs this process may use, or an affinity mask that
/// cannot be read).
///
/// ```
/// use hypercomm_comm::bench::{Placement, rank_cpus};
///
/// assert_eq!(rank_cpus(Placement::Free, 2), None);
/// if let Some(cpus) = rank_cpus(Placement::OneCpuEach, 1) {
///     assert_eq!(cpus.len(), 1);
/// }
/// ```
pub fn rank_cpus(placement: Placement, ranks: usize) -> Option<Vec<usize>> {
    if placement == Placement::Free {
        return None;
    }
    let allowed = rustix::thread::sched_getaffinity(None).ok()?;
    let cpus: Vec<usize> = (0..rustix::thread::CpuSet::MAX_CPU)
        .filter(|&c| allowed.is_set(c))
        .take(ranks)
        .collect();
    (cpus.len() == ranks).then_some(cpus)
}

/// Binds the calling thread to `cpu` alone (the rank threads here, the probe threads of [`core_to_core`]).
fn bind_current_thread(cpu: usize) -> rustix::io::Result<()> {
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    rustix::thread::sched_setaffinity(None, &set)
}

/// Binds the calling rank thread to `cpu`.
fn bind_to(cpu: usize, comm: &str, rank: usize) -> Result<(), CommError> {
    bind_current_thread(cpu).map_err(|e| CommError::InvalidArgument {
        comm: comm.to_owned(),
        what: format!(
            "cannot bind rank {rank}'s thread to CPU {cpu}: {e} (Placement::Free skips binding)"
        ),
    })
}

/// What to measure.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// The collective.
    pub op: BenchOp,
    /// Rank count (threads).
    pub ranks: usize,
    /// Buffer sizes in bytes (rounded down to whole `f32` elements per rank).
    pub sizes: Vec<usize>,
    /// Options for the communicator (its name is used as given).
    pub options: CommOptions,
    /// Timed iterations for the smallest sizes; larger sizes use fewer, down to 5, keeping each size short.
    pub max_iters: usize,
    /// Where the rank threads run.
    pub placement: Placement,
    /// Allocate the buffers with [`huge_page_vec`](crate::host_buffer::huge_page_vec) (advised to use 2 MiB
    /// pages) instead of plain `vec!`; a kernel that refuses the advice fails the run rather than measuring
    /// ordinary pages under the wrong name.
    pub huge_pages: bool,
    /// All-reduce, all-gather and reduce-scatter: run the collective in place on a
    /// [`SymmetricBuffer`](crate::SymmetricBuffer) of the size (which the ranks read in place;
    /// [`Communicator::all_reduce_symmetric`] and its siblings) instead of on vectors (`all_reduce`,
    /// `all_gather_into`, `reduce_scatter_into`). The communicator gets a window as large as the largest size.
    pub symmetric: bool,
    /// All-gather and reduce-scatter on vectors: run in place on one buffer of the whole size
    /// ([`Communicator::all_gather`], [`Communicator::reduce_scatter`]) instead of from an input into an output
    /// (`_into`), as nccl-tests reports both. The all-reduce, broadcast and reduce always run in place.
    pub in_place: bool,
}

/// Timed iterations for a size: enough to move about 256 MiB, between 5 and `max`.
pub(crate) fn iterations(bytes: usize, max: usize) -> usize {
    ((256usize << 20) / bytes.max(1)).clamp(5, max.max(5))
}

/// Runs the benchmark; `progress` is called after each size with its result (from rank 0's thread).
pub fn run(
    config: &BenchConfig,
    progress: &(dyn Fn(&BenchResult) + Sync),
) -> Result<Vec<BenchResult>, CommError> {
    let n = config.ranks;
    let options = &comm_options(config)?;
    let store = Arc::new(MemoryStore::new());
    let cpus = rank_cpus(config.placement, n);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..n)
            .map(|me| {
                let store = Arc::clone(&store);
                let cpu = cpus.as_ref().map(|c| c[me]);
                scope.spawn(move || -> Result<Vec<BenchResult>, CommError> {
                    if let Some(cpu) = cpu {
                        bind_to(cpu, &config.options.name, me)?;
                    }
                    let comm = Communicator::world(store, n, me, options.clone())?;
                    run_rank(config, &comm, &|r| {
                        if me == 0 {
                            progress(r);
                        }
                    })
                })
            })
            .collect();
        let mut first = None;
        for (me, h) in handles.into_iter().enumerate() {
            let r = h.join().unwrap_or_else(|_| {
                Err(CommError::InvalidArgument {
                    comm: config.options.name.clone(),
                    what: format!("rank {me} panicked"),
                })
            });
            if me == 0 || r.is_err() {
                first = Some(r);
                if first.as_ref().is_some_and(Result::is_err) {
                    break;
                }
            }
        }
        first.unwrap_or_else(|| Ok(Vec::new()))
    })
}

/// One rank's part of the benchmark on `comm`, a communicator made with [`comm_options`]`(config)` (every rank
/// calls it): each size in turn, `progress` called after each with this rank's result. How ranks that are
/// processes run it: `hypercomm bench --processes` starts them through the launcher.
pub fn run_rank(
    config: &BenchConfig,
    comm: &Communicator,
    progress: &dyn Fn(&BenchResult),
) -> Result<Vec<BenchResult>, CommError> {
    let mut results = Vec::with_capacity(config.sizes.len());
    for &bytes in &config.sizes {
        let r = measure(comm, config, bytes)?;
        progress(&r);
        results.push(r);
    }
    Ok(results)
}

/// The communicator options the benchmark's ranks use: `config.options`, with a symmetric window as large as the
/// largest size when `config.symmetric`. Fails for combinations the benchmark does not measure.
pub fn comm_options(config: &BenchConfig) -> Result<CommOptions, CommError> {
    let mut options = config.options.clone();
    if config.symmetric {
        if !config.op.has_symmetric_form() || config.huge_pages {
            return Err(CommError::InvalidArgument {
                comm: options.name,
                what: format!(
                    "symmetric buffers are benchmarked for all_reduce, all_gather and reduce_scatter on \
                     their own window, not {}{}",
                    config.op.name(),
                    if config.huge_pages {
                        " with huge pages"
                    } else {
                        ""
                    }
                ),
            });
        }
        options.symmetric_bytes = config.sizes.iter().copied().max().unwrap_or(0).max(1);
    }
    if config.in_place
        && (config.symmetric || !matches!(config.op, BenchOp::AllGather | BenchOp::ReduceScatter))
    {
        return Err(CommError::InvalidArgument {
            comm: options.name,
            what: format!(
                "in place is benchmarked for all_gather and reduce_scatter on vectors, not {}{}",
                config.op.name(),
                if config.symmetric {
                    " on symmetric buffers (which are in place already)"
                } else {
                    ""
                }
            ),
        });
    }
    Ok(options)
}

/// Times one size on one rank. Every iteration starts after a barrier so that all ranks start together.
fn measure(
    comm: &Communicator,
    config: &BenchConfig,
    bytes: usize,
) -> Result<BenchResult, CommError> {
    let n = comm.size();
    let (input_len, output_len) = config.op.buffer_lens(bytes, n);
    let iters = iterations(bytes, config.max_iters);
    let times = if config.symmetric {
        time_symmetric(comm, config.op, input_len.max(output_len), iters)?
    } else {
        time_vectors(comm, config, input_len, output_len, iters)?
    };
    Ok(BenchResult::new(
        config.op,
        n,
        input_len.max(output_len),
        median(&times).unwrap_or(Duration::ZERO).as_secs_f64() * 1e6,
        comm.transport(),
    ))
}

/// The iteration times of `op` on one in-place symmetric buffer of `len` elements: the all-reduce's buffer, the
/// all-gather's output, the reduce-scatter's input.
fn time_symmetric(
    comm: &Communicator,
    op: BenchOp,
    len: usize,
    iters: usize,
) -> Result<Vec<Duration>, CommError> {
    let mut buf = Some(comm.symmetric_buffer(len, 1.0f32)?);
    time_iterations(comm, iters, |start| {
        // `buf` is always Some here: each iteration puts back what the previous one took.
        let Some(taken) = buf.take() else {
            return Ok(start.elapsed());
        };
        let mut done = match op {
            BenchOp::AllGather => comm.all_gather_symmetric(taken)?.wait()?,
            BenchOp::ReduceScatter => comm
                .reduce_scatter_symmetric(taken, ReduceOp::Sum)?
                .wait()?,
            _ => comm.all_reduce_symmetric(taken, ReduceOp::Sum)?.wait()?,
        };
        let took = start.elapsed();
        if op == BenchOp::AllReduce {
            // Keep the values bounded so that repeated sums never overflow to infinity.
            done.fill(1.0);
        }
        buf = Some(done);
        Ok(took)
    })
}

/// The iteration times of `config.op` on vectors of `input_len` and `output_len` elements (plain, or on huge
/// pages when the config asks).
fn time_vectors(
    comm: &Communicator,
    config: &BenchConfig,
    input_len: usize,
    output_len: usize,
    iters: usize,
) -> Result<Vec<Duration>, CommError> {
    let op = config.op;
    let alloc = |len: usize, value: f32| {
        if !config.huge_pages {
            return Ok(vec![value; len]);
        }
        match crate::host_buffer::huge_page_vec(len, value) {
            (_, PageAdvice::Refused { error }) => Err(CommError::InvalidArgument {
                comm: config.options.name.clone(),
                what: format!(
                    "huge-page buffers asked for, but the kernel refused the advice: {error}"
                ),
            }),
            (buf, _) => Ok(buf),
        }
    };
    if config.in_place {
        // One buffer of the whole size: the all-gather's output, the reduce-scatter's input.
        let mut buf = alloc(input_len.max(output_len), 1.0)?;
        return time_iterations(comm, iters, |start| {
            let taken = std::mem::take(&mut buf);
            buf = match op {
                BenchOp::ReduceScatter => comm.reduce_scatter(taken, ReduceOp::Sum)?.wait()?,
                _ => comm.all_gather(taken)?.wait()?,
            };
            let took = start.elapsed();
            if op == BenchOp::ReduceScatter {
                // Keep the values bounded, as for the all-reduce.
                buf.fill(1.0);
            }
            Ok(took)
        });
    }
    let mut input = alloc(input_len, 1.0)?;
    let mut output = alloc(output_len, 0.0)?;
    time_iterations(comm, iters, |start| {
        // Each operation takes the buffers and gives them back; an empty vector holds their place meanwhile.
        let (input, output) = (&mut input, &mut output);
        let (i, o) = (std::mem::take(input), std::mem::take(output));
        match op {
            BenchOp::AllReduce => {
                (*input, *output) = (comm.all_reduce(i, ReduceOp::Sum)?.wait()?, o)
            }
            BenchOp::Broadcast => (*input, *output) = (comm.broadcast(i, 0)?.wait()?, o),
            BenchOp::Reduce => (*input, *output) = (comm.reduce(i, ReduceOp::Sum, 0)?.wait()?, o),
            BenchOp::AllGather => (*input, *output) = comm.all_gather_into(i, o)?.wait()?,
            BenchOp::ReduceScatter => {
                (*input, *output) = comm.reduce_scatter_into(i, o, ReduceOp::Sum)?.wait()?
            }
            BenchOp::AllToAll => (*input, *output) = comm.all_to_all_into(i, o)?.wait()?,
        }
        let took = start.elapsed();
        if op == BenchOp::AllReduce || op == BenchOp::Reduce {
            // Keep the values bounded so that repeated sums never overflow to infinity.
            input.fill(1.0);
        }
        Ok(took)
    })
}

/// Runs `step` for some warm-up iterations and then `iters` timed ones, each after a barrier so that all ranks
/// start together; the timed iterations' durations. `step` gets the time its iteration starts and returns how
/// long its collective took, so that what it does afterwards (refilling a buffer) stays out of the figure.
fn time_iterations(
    comm: &Communicator,
    iters: usize,
    mut step: impl FnMut(Instant) -> Result<Duration, CommError>,
) -> Result<Vec<Duration>, CommError> {
    let warmup = 2.max(iters / 10);
    let mut times = Vec::with_capacity(iters);
    for i in 0..warmup + iters {
        comm.barrier()?.wait()?;
        let took = step(Instant::now())?;
        if i >= warmup {
            times.push(took);
        }
    }
    Ok(times)
}

/// The median of `values`: the middle one of an odd count, the upper of the two middle ones of an even count (so
/// always a measured value); `None` for no values. Every benchmark in the workspace reports this one.
///
/// ```
/// use hypercomm_comm::bench::median;
///
/// assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
/// assert_eq!(median(&[4, 1, 3, 2]), Some(3));
/// assert_eq!(median::<f64>(&[]), None);
/// ```
pub fn median<T: Copy + PartialOrd>(values: &[T]) -> Option<T> {
    let mut sorted = values.to_vec();
    // Timings have no NaN; were one there, it would sort as equal to its neighbours, not panic.
    sorted.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    sorted.get(sorted.len() / 2).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_takes_the_middle_or_the_upper_middle_and_survives_empty_input() {
        assert_eq!(median(&[5.0, 1.0, 9.0, 3.0, 7.0]), Some(5.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(3.0));
        assert_eq!(
            median(&[Duration::from_micros(9), Duration::from_micros(2)]),
            Some(Duration::from_micros(9))
        );
        assert_eq!(median::<u32>(&[]), None);
    }

    #[test]
    fn only_all_reduce_all_gather_and_reduce_scatter_have_a_symmetric_form() {
        let symmetric: Vec<&str> = BenchOp::ALL
            .iter()
            .filter(|o| o.has_symmetric_form())
            .map(|o| o.name())
            .collect();
        assert_eq!(symmetric, ["all_reduce", "all_gather", "reduce_scatter"]);
    }

    #[test]
    fn factors_match_nccl_tests() {
        assert_eq!(BenchOp::AllReduce.bus_factor(2), 1.0);
        assert_eq!(BenchOp::AllReduce.bus_factor(4), 1.5);
        assert_eq!(BenchOp::AllGather.bus_factor(4), 0.75);
        assert_eq!(BenchOp::Broadcast.bus_factor(8), 1.0);
        assert_eq!(
            BenchOp::from_name("reduce_scatter"),
            Some(BenchOp::ReduceScatter)
        );
    }

    fn affinity() -> Vec<usize> {
        let set = rustix::thread::sched_getaffinity(None).expect("read the affinity mask");
        (0..rustix::thread::CpuSet::MAX_CPU)
            .filter(|&c| set.is_set(c))
            .collect()
    }

    #[test]
    fn ranks_get_distinct_allowed_cpus_or_float_when_there_are_too_few() {
        let allowed = affinity();
        let cpus = rank_cpus(Placement::OneCpuEach, allowed.len()).expect("one CPU per rank");
        assert_eq!(cpus, allowed);
        assert_eq!(rank_cpus(Placement::OneCpuEach, allowed.len() + 1), None);
        assert_eq!(rank_cpus(Placement::Free, 1), None);
    }

    #[test]
    fn rank_threads_run_bound_to_their_cpu_unless_free() {
        let allowed = affinity();
        // `progress` runs on rank 0's thread, so it sees that thread's mask.
        let mask_of_rank0 = |placement| {
            let config = BenchConfig {
                op: BenchOp::AllReduce,
                ranks: 1,
                sizes: vec![8],
                options: CommOptions::named(format!("bench-place-{placement:?}")),
                max_iters: 5,
                placement,
                huge_pages: false,
                symmetric: false,
                in_place: false,
            };
            let seen = std::sync::Mutex::new(Vec::new());
            run(&config, &|_| *seen.lock().unwrap() = affinity()).unwrap();
            seen.into_inner().unwrap()
        };
        assert_eq!(mask_of_rank0(Placement::OneCpuEach), vec![allowed[0]]);
        assert_eq!(mask_of_rank0(Placement::Free), allowed);
    }

    #[test]
    fn a_tiny_run_reports_every_size() {
        let config = BenchConfig {
            op: BenchOp::AllGather,
            ranks: 2,
            sizes: vec![8, 4096],
            options: CommOptions::named("bench-test"),
            max_iters: 5,
            placement: Placement::OneCpuEach,
            huge_pages: false,
            symmetric: false,
            in_place: false,
        };
        let seen = std::sync::Mutex::new(0);
        let results = run(&config, &|_| *seen.lock().unwrap() += 1).unwrap();
        assert_eq!(
            results.iter().map(|r| r.bytes).collect::<Vec<_>>(),
            vec![8, 4096]
        );
        assert_eq!(*seen.lock().unwrap(), 2);
        assert!(
            results
                .iter()
                .all(|r| r.time_us > 0.0 && r.busbw_gbps > 0.0)
        );
        // The same sizes on symmetric buffers, and a collective that has no symmetric form.
        let symmetric = BenchConfig {
            op: BenchOp::AllReduce,
            symmetric: true,
            options: CommOptions::named("bench-test-symmetric"),
            ..config.clone()
        };
        let results = run(&symmetric, &|_| {}).unwrap();
        assert_eq!(results.len(), 2);
        // In place, for the two collectives that have both forms, and refused for the others.
        for op in [BenchOp::AllGather, BenchOp::ReduceScatter] {
            let in_place = BenchConfig {
                op,
                in_place: true,
                options: CommOptions::named(format!("bench-test-in-place-{}", op.name())),
                ..config.clone()
            };
            let results = run(&in_place, &|_| {}).unwrap();
            assert_eq!(results.len(), 2);
            assert!(results.iter().all(|r| r.time_us > 0.0));
        }
        let err = run(
            &BenchConfig {
                op: BenchOp::AllReduce,
                in_place: true,
                ..config.clone()
            },
            &|_| {},
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("reduce_scatter on vectors, not all_reduce"),
            "{err}"
        );
        let err = run(
            &BenchConfig {
                op: BenchOp::AllToAll,
                symmetric: true,
                ..config
            },
            &|_| {},
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("on their own window, not all_to_all"), "{err}");
    }
}
