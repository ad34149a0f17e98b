//! NCCL collectives on GPUs, behind `hypercomm bench --backend nccl`.
//!
//! Two measurements:
//!
//! - **Bandwidth**, nccl-tests style: per size, operations enqueued back to back on the communicator's stream
//!   and timed with CUDA events around each batch; the time is the median of the batches' per-operation means,
//!   and bandwidth follows [`BenchOp::bus_factor`] as on the host.
//! - **Host overhead per call**: the CPU time to issue one small in-place `f32` all-reduce through
//!   [`Communicator::all_reduce`] on a device buffer (and take the buffer back with `wait_on` the communicator's
//!   own stream), against calling `ncclAllReduce` directly on the same communicator, stream and buffer
//!   ([`bare_nccl`], through [`DeviceCommunicator::with_raw_comm`]). Batches of each alternate, the stream is
//!   drained between batches (untimed), and each side reports the median over batches of its per-call time. The difference is what hypercomm adds: its locks, the buffer's stream events
//!   (cudarc's tracking) and the handle's pooled event.
//!
//! Ranks are threads of this process, one [`Gpu`] per device as [`placement`] assigns them; more ranks than
//! devices needs NCCL 2.30 or newer with `NCCL_MULTI_RANK_GPU_ENABLE=1`.

pub mod bare_nccl;

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, DriverError};
use hypercomm_comm::device::{DeviceBuffer, DeviceCommunicator, DeviceRuntime, Gpu, placement};
use hypercomm_comm::{CommError, CommOptions, Communicator, P2p, ReduceOp};
use hypercomm_store::MemoryStore;
use nccl_sys::Version;

use crate::delivery::{check_delivered, input_value};
use crate::op::{BenchOp, BenchResult, iterations, ring_peers, sent_and_received};
use crate::split_sizes::{RankCounts, rank_counts};

/// What to measure.
#[derive(Clone, Debug)]
pub struct DeviceBenchConfig {
    /// The collective.
    pub op: BenchOp,
    /// Rank count (threads of this process).
    pub ranks: usize,
    /// Buffer sizes in bytes, counted as nccl-tests does (see [`BenchOp::buffer_lens`]).
    pub sizes: Vec<usize>,
    /// Options of the communicator (its name is used as given).
    pub options: CommOptions,
    /// Most timed operations per size (large sizes use fewer, at least 5).
    pub max_iters: usize,
    /// Calls per batch of the host-overhead measurement; 0 skips it.
    pub overhead_calls: usize,
    /// Batches of each side in the host-overhead measurement.
    pub overhead_batches: usize,
    /// Whether `NCCL_MULTI_RANK_GPU_ENABLE=1` is set (read by the caller from the environment).
    pub multi_rank_gpu_enabled: bool,
    /// All-to-all-v: the seed its split sizes are drawn from
    /// ([`SplitSizes::seeded`](crate::split_sizes::SplitSizes::seeded)); the same on every rank.
    pub seed: u64,
}

/// Bytes of the all-reduce the host-overhead measurement issues (two `f32`s: the smallest useful call).
pub const OVERHEAD_BYTES: usize = 8;

/// The host-overhead measurement: medians over batches of the CPU time one call takes.
#[derive(Clone, Debug, PartialEq)]
pub struct OverheadResult {
    /// Calls per batch.
    pub calls: usize,
    /// Batches of each side.
    pub batches: usize,
    /// Median per-call time of `ncclAllReduce` called directly, in nanoseconds.
    pub raw_ns: f64,
    /// Median per-call time of [`Communicator::all_reduce`] on a device buffer plus `wait_on` its stream, in
    /// nanoseconds.
    pub hypercomm_ns: f64,
    /// Of the raw calls, how many answered `ncclInProgress` (a non-blocking communicator still settling); the
    /// raw side's time includes polling `ncclCommGetAsyncError` until they settled, as any caller must before
    /// its next call on that communicator.
    pub raw_in_progress: usize,
}

impl OverheadResult {
    /// What hypercomm adds per call, in nanoseconds (negative when noise favours it).
    pub fn extra_ns(&self) -> f64 {
        self.hypercomm_ns - self.raw_ns
    }
}

/// Everything one run measured.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceBenchReport {
    /// NCCL's version.
    pub nccl: Version,
    /// The device ordinal of each rank.
    pub devices: Vec<usize>,
    /// One result per size (rank 0's timing).
    pub results: Vec<BenchResult>,
    /// The host overhead, unless `overhead_calls` was 0.
    pub overhead: Option<OverheadResult>,
}

/// The workspace's [`median`](crate::median); 0 for no values.
fn median(values: Vec<f64>) -> f64 {
    crate::median(&values).unwrap_or(0.0)
}

/// A CUDA driver error during `what` on communicator `comm`.
fn cuda_err(comm: &str, what: &str) -> impl FnOnce(DriverError) -> CommError {
    let (comm, what) = (comm.to_owned(), what.to_owned());
    move |e| CommError::Device {
        comm,
        what: format!("{what}: {e}"),
    }
}

/// Runs the benchmark on `runtime`'s devices; `progress` is called with each size's result (rank 0's).
pub fn run(
    runtime: Arc<DeviceRuntime>,
    config: &DeviceBenchConfig,
    progress: &(dyn Fn(&BenchResult) + Sync),
) -> Result<DeviceBenchReport, CommError> {
    let nccl = runtime.nccl().version();
    if config.ranks < config.op.min_ranks() {
        return Err(CommError::InvalidArgument {
            comm: config.options.name.clone(),
            what: format!(
                "{} needs at least {} ranks, not {}",
                config.op.name(),
                config.op.min_ranks(),
                config.ranks
            ),
        });
    }
    let devices = placement(
        config.ranks,
        runtime.device_count(),
        nccl,
        config.multi_rank_gpu_enabled,
    )?;
    let mut gpus: Vec<Arc<Gpu>> = Vec::new();
    for ordinal in 0..runtime.device_count().min(config.ranks) {
        gpus.push(Gpu::open(Arc::clone(&runtime), ordinal)?);
    }
    let store = Arc::new(MemoryStore::new());
    let members: Vec<usize> = (0..config.ranks).collect();
    let outcomes: Vec<Result<RankReport, CommError>> = std::thread::scope(|scope| {
        let threads: Vec<_> = devices
            .iter()
            .enumerate()
            .map(|(me, &ordinal)| {
                let gpu = Arc::clone(&gpus[ordinal]);
                let store = Arc::clone(&store);
                let members = members.clone();
                scope.spawn(move || -> Result<RankReport, CommError> {
                    let comm =
                        Communicator::with_gpu(gpu, store, members, me, config.options.clone())?;
                    rank_main(&comm, config, if me == 0 { Some(progress) } else { None })
                })
            })
            .collect();
        threads
            .into_iter()
            .enumerate()
            .map(|(me, t)| {
                t.join().unwrap_or_else(|_| {
                    Err(CommError::InvalidArgument {
                        comm: config.options.name.clone(),
                        what: format!("benchmark rank {me} panicked"),
                    })
                })
            })
            .collect()
    });
    let mut first = None;
    for outcome in outcomes {
        let report = outcome?;
        first.get_or_insert(report);
    }
    let report = first.ok_or_else(|| CommError::InvalidArgument {
        comm: config.options.name.clone(),
        what: "no rank ran".into(),
    })?;
    Ok(DeviceBenchReport {
        nccl,
        devices,
        results: report.results,
        overhead: report.overhead,
    })
}

struct RankReport {
    results: Vec<BenchResult>,
    overhead: Option<OverheadResult>,
}

/// The NCCL flavor of a communicator made `with_gpu`.
fn device(comm: &Communicator) -> Result<&DeviceCommunicator, CommError> {
    comm.nccl().ok_or_else(|| CommError::InvalidArgument {
        comm: comm.name().to_owned(),
        what: "the device benchmark needs a communicator with a gpu".into(),
    })
}

fn rank_main(
    comm: &Communicator,
    config: &DeviceBenchConfig,
    progress: Option<&(dyn Fn(&BenchResult) + Sync)>,
) -> Result<RankReport, CommError> {
    let mut results = Vec::with_capacity(config.sizes.len());
    for &bytes in &config.sizes {
        let r = measure_size(comm, config, bytes)?;
        if let Some(p) = progress {
            p(&r);
        }
        results.push(r);
    }
    let overhead = if config.overhead_calls == 0 {
        None
    } else {
        Some(measure_overhead(
            comm,
            config.overhead_calls,
            config.overhead_batches.max(1),
        )?)
    };
    Ok(RankReport { results, overhead })
}

/// An operation's two buffers; in-place operations leave `output` alone.
struct Buffers {
    input: DeviceBuffer<f32>,
    output: DeviceBuffer<f32>,
}

/// Enqueues one `op` (the all-to-all-v with this rank's `counts`) and takes the buffers back ordered on the
/// communicator's stream (no CPU block).
fn enqueue_op(
    comm: &Communicator,
    op: BenchOp,
    counts: &RankCounts,
    b: Buffers,
) -> Result<Buffers, CommError> {
    let s = device(comm)?.stream();
    let Buffers { input, output } = b;
    let (input, output) = match op {
        BenchOp::AllReduce => (comm.all_reduce(input, ReduceOp::Sum)?.wait_on(s)?, output),
        BenchOp::Broadcast => (comm.broadcast(input, 0)?.wait_on(s)?, output),
        BenchOp::Reduce => (comm.reduce(input, ReduceOp::Sum, 0)?.wait_on(s)?, output),
        BenchOp::AllGather => comm.all_gather_into(input, output)?.wait_on(s)?,
        BenchOp::ReduceScatter => comm
            .reduce_scatter_into(input, output, ReduceOp::Sum)?
            .wait_on(s)?,
        BenchOp::AllToAll => comm.all_to_all_into(input, output)?.wait_on(s)?,
        BenchOp::SendRecv => {
            let (next, prev) = ring_peers(comm.rank(), comm.size());
            let parts = vec![P2p::send(input, next), P2p::recv(output, prev)];
            sent_and_received(comm.name(), comm.batch(parts)?.wait_on(s)?)?
        }
        BenchOp::AllToAllV => {
            let (send, recv) = (counts.send.clone(), counts.recv.clone());
            comm.all_to_all_v(input, send, output, recv)?.wait_on(s)?
        }
    };
    Ok(Buffers { input, output })
}

fn timing_event(comm: &DeviceCommunicator) -> Result<CudaEvent, CommError> {
    comm.gpu()
        .context()
        .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(cuda_err(comm.name(), "creating a timing event"))
}

/// Batches per size in the bandwidth measurement: the time reported is the median of their per-operation means.
pub const BATCHES: usize = 5;

fn measure_size(
    comm: &Communicator,
    config: &DeviceBenchConfig,
    bytes: usize,
) -> Result<BenchResult, CommError> {
    let dev = device(comm)?;
    let n = comm.size();
    let op = config.op;
    let (input_len, output_len) = op.buffer_lens(bytes, n);
    let gpu = dev.gpu();
    let (counts, output_alloc) = match op {
        BenchOp::AllToAllV => {
            let counts = rank_counts(comm, config.seed, input_len)?;
            let recv = counts.recv.iter().sum();
            (counts, recv)
        }
        _ => (RankCounts::default(), output_len),
    };
    let mut bufs = Buffers {
        input: match op {
            // Inputs that show where what arrives came from (see `delivery`).
            BenchOp::SendRecv | BenchOp::AllToAllV => {
                gpu.upload(&vec![input_value(comm.rank()); input_len])?
            }
            _ => gpu.alloc_zeros::<f32>(input_len)?,
        },
        output: gpu.alloc_zeros::<f32>(output_alloc)?,
    };
    let iters = iterations(bytes, config.max_iters);
    let per_batch = iters.div_ceil(BATCHES).max(1);
    let (start, end) = (timing_event(dev)?, timing_event(dev)?);
    let cuda = |what| cuda_err(comm.name(), what);
    for _ in 0..2.max(iters / 10) {
        bufs = enqueue_op(comm, op, &counts, bufs)?;
    }
    let mut per_op_us = Vec::with_capacity(BATCHES);
    for _ in 0..BATCHES {
        start.record(dev.stream()).map_err(cuda("recording"))?;
        for _ in 0..per_batch {
            bufs = enqueue_op(comm, op, &counts, bufs)?;
        }
        end.record(dev.stream()).map_err(cuda("recording"))?;
        wait_for(dev, &end)?;
        let ms = start.elapsed_ms(&end).map_err(cuda("reading a timer"))?;
        per_op_us.push(f64::from(ms) * 1e3 / per_batch as f64);
    }
    let received = bufs.output.download()?;
    if let Err(e) = check_delivered(comm.name(), op, comm.rank(), n, &received, &counts) {
        // The peers would otherwise wait for this rank's next operation until the timeout.
        comm.abort();
        return Err(e);
    }
    Ok(BenchResult::new(
        op,
        n,
        input_len.max(output_len),
        median(per_op_us),
        "nccl",
    ))
}

/// Waits for `event` without hanging, as work handles do: polls the event and NCCL's asynchronous error, and past
/// the communicator's timeout aborts it.
fn wait_for(comm: &DeviceCommunicator, event: &CudaEvent) -> Result<(), CommError> {
    let timeout = comm.options().timeout;
    let started = Instant::now();
    let deadline = started + timeout;
    // Bounded by the deadline.
    loop {
        let done = event
            .try_is_complete()
            .map_err(cuda_err(comm.name(), "querying a timing event"))?;
        // Work that completed may still have raised an asynchronous error.
        comm.check()?;
        if done {
            return Ok(());
        }
        if Instant::now() >= deadline {
            comm.abort();
            return Err(CommError::Timeout {
                comm: comm.name().to_owned(),
                members: comm.ranks().to_vec(),
                missing: Vec::new(),
                after: timeout,
                during: "waiting for benchmark work; the nccl communicator was aborted".into(),
                cause: None,
            });
        }
        // Untimed (the figures come from CUDA events): yield briefly, then sleep between polls.
        if started.elapsed() < Duration::from_millis(1) {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
}

fn measure_overhead(
    comm: &Communicator,
    calls: usize,
    batches: usize,
) -> Result<OverheadResult, CommError> {
    let dev = device(comm)?;
    let count = OVERHEAD_BYTES / 4;
    let mut buf = dev.gpu().alloc_zeros::<f32>(count)?;
    let drained = timing_event(dev)?;
    let drain = |comm: &DeviceCommunicator| -> Result<(), CommError> {
        drained
            .record(comm.stream())
            .map_err(cuda_err(comm.name(), "recording"))?;
        wait_for(comm, &drained)
    };
    // Warm up both paths (NCCL connects lazily on the first call).
    for _ in 0..2 {
        let _ = bare_nccl::all_reduces(dev, &mut buf, calls)?;
        drain(dev)?;
        buf = hypercomm_batch(comm, buf, calls)?.0;
        drain(dev)?;
    }
    let (mut raw, mut ours) = (Vec::with_capacity(batches), Vec::with_capacity(batches));
    let mut raw_in_progress = 0;
    for _ in 0..batches {
        let (t, pending) = bare_nccl::all_reduces(dev, &mut buf, calls)?;
        raw_in_progress += pending;
        raw.push(t.as_secs_f64() * 1e9 / calls.max(1) as f64);
        drain(dev)?;
        let (b, t) = hypercomm_batch(comm, buf, calls)?;
        buf = b;
        ours.push(t.as_secs_f64() * 1e9 / calls as f64);
        drain(dev)?;
    }
    Ok(OverheadResult {
        calls,
        batches,
        raw_ns: median(raw),
        hypercomm_ns: median(ours),
        raw_in_progress,
    })
}

/// `calls` in-place sum all-reduces of `buf` through hypercomm; returns the buffer and the CPU time taken.
fn hypercomm_batch(
    comm: &Communicator,
    mut buf: DeviceBuffer<f32>,
    calls: usize,
) -> Result<(DeviceBuffer<f32>, Duration), CommError> {
    let stream = device(comm)?.stream();
    let start = Instant::now();
    for _ in 0..calls {
        buf = comm.all_reduce(buf, ReduceOp::Sum)?.wait_on(stream)?;
    }
    Ok((buf, start.elapsed()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_reports_zero_for_no_values() {
        assert_eq!(median(vec![2.0, 1.0, 3.0]), 2.0);
        assert_eq!(median(vec![2.0, 1.0, 3.0, 4.0]), 2.5);
        assert_eq!(median(Vec::new()), 0.0);
    }

    #[test]
    fn extra_is_the_difference_of_the_medians() {
        let r = OverheadResult {
            calls: 100,
            batches: 9,
            raw_ns: 1500.0,
            hypercomm_ns: 2700.0,
            raw_in_progress: 0,
        };
        assert_eq!(r.extra_ns(), 1200.0);
    }
}
