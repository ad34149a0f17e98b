//! Host-backend collectives, nccl-tests style: the median time per operation, algorithm and bus bandwidth, per
//! size.
//!
//! Ranks run as threads of this process ([`run`]), each with its own communicator over a shared in-memory store;
//! they still talk through the shared-memory (or TCP) transport exactly as processes would. Ranks that are
//! processes each call [`run_rank`] on a communicator of their own (`hypercomm bench --processes` starts them
//! through the launcher). By default ([`Placement::OneCpuEach`]) rank `i` is bound to the `i`-th CPU the process
//! may use (see [`cpus`](crate::cpus) for why). Buffers are plain vectors unless [`BenchConfig::huge_pages`] asks
//! for [`huge_page_vec`], or [`BenchConfig::symmetric`] for [`SymmetricBuffer`](hypercomm_comm::SymmetricBuffer)s.
//! Each iteration's time is the collective alone, started after a barrier so that all ranks start together;
//! refilling the all-reduce's buffer between iterations (so that sums stay bounded) happens after the clock stops.
//!
//! Reading the figures on the shared-memory transport:
//! - **Small operations measure waiting.** Every round ends in a barrier. A waiting rank spins, then yields
//!   between bursts of checks, then sleeps on the segment's doorbell futex, checking its deadline, the abort flag
//!   and its peers' liveness between slices; an arriving rank wakes sleepers. It falls through to sleeping only
//!   when the rank it waits for is late by more than the yielding phase: a rank that has not entered the operation
//!   yet, or one that shares its core with other work. When every rank has a core of its own the peer arrives
//!   within the spin and a small all-reduce takes about a microsecond; when ranks share cores, the rank waited for
//!   is often not running, and the wake-up through the futex and the scheduler costs tens of microseconds. That is
//!   why `hypercomm bench --runs` reports the median of several runs.
//! - **Large operations measure memory traffic, not the wire.** busbw divides nccl-tests' bus bytes by the time,
//!   which compares operations on a network. On one host the cost is the bytes read and written in memory. Once
//!   the buffers exceed the last-level cache, an in-place all-reduce of `S` bytes reads `S` and writes `S` for
//!   `2S(n-1)/n` bus bytes; an out-of-place all-gather must read `S/n` and write `S` (its output is `n` times its
//!   input) for `S(n-1)/n` bus bytes, and a reduce-scatter reads `S` and writes `S/n`. Per bus byte that is about
//!   twice the memory traffic of the all-reduce at 2 ranks, whatever the algorithm, so beyond the cache their busbw
//!   trails all-reduce's; in cache they run at or above it. `scripts/floors.c` measures each floor on the machine
//!   at hand.
//! - **Every size waits on lines crossing between cores.** A peer's publication reaches a rank one cache line at
//!   a time, and a core keeps only so many such transfers in flight, so the transport's throughput follows the
//!   core-to-core latency, which [`core_to_core`](crate::core_to_core) measures and `hypercomm bench` reports
//!   before and after every run.
//! - **Symmetric buffers remove the staging.** With [`BenchConfig::symmetric`] (`hypercomm bench --symmetric`)
//!   the all-reduce, all-gather and reduce-scatter run in place on symmetric buffers, which the peers read (and
//!   the all-reduce writes) where they are (see [`hypercomm_comm::symmetric`]): no copy into a slot and out again.
//!   The in-place all-gather reads only the `S(n-1)/n` bytes it lacks and writes them once.
//!
//! The figures themselves, with the command, machine and date of each, are in `docs/perf/`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hypercomm_comm::host_buffer::{PageAdvice, huge_page_vec};
use hypercomm_comm::{CommError, CommOptions, Communicator, P2p, ReduceOp};
use hypercomm_store::MemoryStore;

use crate::cpus::{Placement, bind_current_thread, rank_cpus};
use crate::delivery::{check_delivered, input_value};
use crate::op::{BenchOp, BenchResult, iterations, ring_peers, sent_and_received};
use crate::split_sizes::{RankCounts, rank_counts};
use crate::stats::median;

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
    /// Allocate the buffers with [`huge_page_vec`] (advised to use 2 MiB pages) instead of plain `vec!`; a kernel
    /// that refuses the advice fails the run rather than measuring ordinary pages under the wrong name.
    pub huge_pages: bool,
    /// All-reduce, all-gather and reduce-scatter: run the collective in place on a
    /// [`SymmetricBuffer`](hypercomm_comm::SymmetricBuffer) of the size (which the ranks read in place;
    /// [`Communicator::all_reduce_symmetric`] and its siblings) instead of on vectors (`all_reduce`,
    /// `all_gather_into`, `reduce_scatter_into`). The communicator gets a window as large as the largest size.
    pub symmetric: bool,
    /// All-gather and reduce-scatter on vectors: run in place on one buffer of the whole size
    /// ([`Communicator::all_gather`], [`Communicator::reduce_scatter`]) instead of from an input into an output
    /// (`_into`), as nccl-tests reports both. The all-reduce, broadcast and reduce always run in place.
    pub in_place: bool,
    /// All-to-all-v: the seed its split sizes are drawn from
    /// ([`SplitSizes::seeded`](crate::split_sizes::SplitSizes::seeded)); the same on every rank.
    pub seed: u64,
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
    if config.ranks < config.op.min_ranks() {
        return Err(CommError::InvalidArgument {
            comm: options.name,
            what: format!(
                "{} needs at least {} ranks, not {}",
                config.op.name(),
                config.op.min_ranks(),
                config.ranks
            ),
        });
    }
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

/// A vector of `len` elements of `value`: plain, or on huge pages when `config` asks.
fn alloc(config: &BenchConfig, len: usize, value: f32) -> Result<Vec<f32>, CommError> {
    if !config.huge_pages {
        return Ok(vec![value; len]);
    }
    match huge_page_vec(len, value) {
        (_, PageAdvice::Refused { error }) => Err(CommError::InvalidArgument {
            comm: config.options.name.clone(),
            what: format!(
                "huge-page buffers asked for, but the kernel refused the advice: {error}"
            ),
        }),
        (buf, _) => Ok(buf),
    }
}

/// The iteration times of `config.op` on vectors of `input_len` and `output_len` elements (plain, or on huge
/// pages when the config asks); the all-to-all-v's output is this rank's column of the split sizes instead.
fn time_vectors(
    comm: &Communicator,
    config: &BenchConfig,
    input_len: usize,
    output_len: usize,
    iters: usize,
) -> Result<Vec<Duration>, CommError> {
    let op = config.op;
    let alloc = |len: usize, value: f32| alloc(config, len, value);
    let (next, prev) = ring_peers(comm.rank(), comm.size());
    let counts = match op {
        BenchOp::AllToAllV => rank_counts(comm, config.seed, input_len)?,
        _ => RankCounts::default(),
    };
    let output_len = match op {
        BenchOp::AllToAllV => counts.recv.iter().sum(),
        _ => output_len,
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
    // The point-to-point operations' inputs hold the rank's value, so that what arrives shows where it came from.
    let value = match op {
        BenchOp::SendRecv | BenchOp::AllToAllV => input_value(comm.rank()),
        _ => 1.0,
    };
    let mut input = alloc(input_len, value)?;
    let mut output = alloc(output_len, 0.0)?;
    let times = time_iterations(comm, iters, |start| {
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
            BenchOp::SendRecv => {
                let parts = vec![P2p::send(i, next), P2p::recv(o, prev)];
                (*input, *output) = sent_and_received(comm.name(), comm.batch(parts)?.wait()?)?
            }
            BenchOp::AllToAllV => {
                let (send, recv) = (counts.send.clone(), counts.recv.clone());
                (*input, *output) = comm.all_to_all_v(i, send, o, recv)?.wait()?
            }
        }
        let took = start.elapsed();
        if op == BenchOp::AllReduce || op == BenchOp::Reduce {
            // Keep the values bounded so that repeated sums never overflow to infinity.
            input.fill(1.0);
        }
        Ok(took)
    })?;
    let (rank, n) = (comm.rank(), comm.size());
    if let Err(e) = check_delivered(comm.name(), op, rank, n, &output, &counts) {
        // The peers would otherwise wait for this rank in the next size's barrier until the timeout.
        comm.abort();
        return Err(e);
    }
    Ok(times)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn affinity() -> Vec<usize> {
        crate::cpus::allowed_cpus()
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
                seed: 1,
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
            seed: 1,
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

    #[test]
    fn sendrecv_and_all_to_all_v_run_and_check_what_they_delivered() {
        let config = |op: BenchOp, ranks: usize| BenchConfig {
            op,
            ranks,
            // 4 B is one element: an all-to-all-v row of two ranks then holds a zero count.
            sizes: vec![4, 4096, 1 << 20],
            options: CommOptions::named(format!("bench-test-{}-{ranks}", op.name())),
            max_iters: 5,
            placement: Placement::OneCpuEach,
            huge_pages: false,
            symmetric: false,
            in_place: false,
            seed: 7,
        };
        for (op, ranks) in [
            (BenchOp::SendRecv, 2),
            (BenchOp::SendRecv, 3),
            (BenchOp::AllToAllV, 2),
            (BenchOp::AllToAllV, 3),
        ] {
            let results = run(&config(op, ranks), &|_| {}).unwrap();
            assert_eq!(
                results.iter().map(|r| r.bytes).collect::<Vec<_>>(),
                [4, 4096, 1 << 20],
                "{op:?} on {ranks}"
            );
            let factor = op.bus_factor(ranks);
            assert!(
                results.iter().all(|r| r.time_us > 0.0
                    && r.op == op
                    && (r.busbw_gbps - r.algbw_gbps * factor).abs() < 1e-9),
                "{results:?}"
            );
        }
        let err = run(&config(BenchOp::SendRecv, 1), &|_| {})
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("sendrecv needs at least 2 ranks, not 1"),
            "{err}"
        );
    }
}
