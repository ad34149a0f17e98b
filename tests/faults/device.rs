//! The rank side of the fault suite's device cases: ranks with a (fake) GPU each, in a `tp 2, dp 2` collection
//! with a world group, whose communicators have an NCCL flavor beside the host one. The driver starts them under
//! `fake-gpu` (the stand-in CUDA driver and NCCL) with flight records going to a folder of the case's.
//!
//! Before it reports, every rank prints a `FLIGHT <communicator> issued=<n>` line for each NCCL communicator of
//! its collection, so the driver can check that each left a flight record holding its last operations.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hypercomm::comm::device::{DeviceRuntime, Gpu};
use hypercomm::comm::{CommError, Communicator, ReduceOp};
use hypercomm::grid::layout::LayoutConfig;
use hypercomm::pgc::ProcessGroupCollection;
use hypercomm::store::Store;

use crate::report::seen;

/// Prints a `FLIGHT` line for every NCCL communicator of `pgc`, then reports `result` as `tag` (and exits).
fn report<T>(
    pgc: &ProcessGroupCollection,
    tag: &str,
    start: Instant,
    result: Result<T, CommError>,
) -> ! {
    for id in pgc.groups() {
        if let Some(device) = pgc.get(id).ok().and_then(Communicator::nccl) {
            println!(
                "FLIGHT {} issued={}",
                device.name(),
                device.flight_record().issued
            );
        }
    }
    seen(tag, start, result)
}

/// Waits (bounded by `limit`) until every communicator of `pgc`, host and NCCL flavor, is stopped; panics if one
/// still works then.
fn all_stopped(pgc: &ProcessGroupCollection, me: usize, limit: Duration) {
    let deadline = Instant::now() + limit;
    for id in pgc.groups() {
        let comm = pgc.get(id).unwrap();
        let stopped =
            || comm.broken().is_some() && comm.nccl().is_none_or(|d| d.broken().is_some());
        while !stopped() {
            assert!(
                Instant::now() < deadline,
                "rank {me}: {} still works after the failure",
                comm.name()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// One device case on rank `me` of `n` (`victim` the faulty rank), each communicator timing out after `timeout`.
pub fn run(
    case: &str,
    me: usize,
    victim: usize,
    n: usize,
    timeout: Duration,
    store: Arc<dyn Store>,
) -> ! {
    let runtime = DeviceRuntime::probe_with_env(|v| std::env::var_os(v))
        .unwrap_or_else(|e| panic!("rank {me}: the fake driver and NCCL do not load: {e}"));
    let gpu = Gpu::open(runtime, me).unwrap();
    let layout = LayoutConfig::new(n).tp(2).build().unwrap();
    let pgc = ProcessGroupCollection::for_layout(format!("fault-{case}"), layout)
        .with_world_group(true)
        .with_timeout(timeout)
        .with_gpu(Arc::clone(&gpu))
        .build(me, store)
        .unwrap();
    let world = pgc.world().unwrap();
    let device = world.nccl().expect("built with a gpu");
    // A first all-reduce connects the ranks (two for the asynchronous error, which strikes at the third).
    let connect = if case == "device_async_error" { 2 } else { 1 };
    for _ in 0..connect {
        let sum = world
            .all_reduce(gpu.upload(&[1.0f32]).unwrap(), ReduceOp::Sum)
            .and_then(|w| w.wait())
            .and_then(|b| b.download());
        assert_eq!(sum.unwrap(), [n as f32]);
    }
    // The victim reports its own failure as faulty, the others what they saw.
    let tag = if me == victim { "FAULTY" } else { "SEEN" };
    let start = Instant::now();
    match case {
        "device_never_calls" => {
            if me == victim {
                // Busy elsewhere past the others' timeout, it comes back to a stopped job and learns why.
                std::thread::sleep(timeout + Duration::from_secs(3));
                let start = Instant::now();
                let back = world.barrier().and_then(|w| w.wait());
                report(&pgc, "FAULTY", start, back)
            }
            // The others only order their stream after the collective and read the result to the host, which
            // blocks behind it: only the watchdog ends that; the next call fails with its cause.
            let sum = world
                .all_reduce(gpu.upload(&[1.0f32]).unwrap(), ReduceOp::Sum)
                .and_then(|w| w.wait_on(device.stream()))
                .unwrap();
            let _ = sum.download();
            let next = world
                .all_reduce(gpu.upload(&[1.0f32]).unwrap(), ReduceOp::Sum)
                .and_then(|w| w.wait());
            all_stopped(&pgc, me, Duration::from_secs(5));
            report(&pgc, "SEEN", start, next)
        }
        "device_mismatch" => {
            // The victim calls all_gather where the others call reduce_scatter (the fake hangs on it, as NCCL's
            // kernels would, with FAKE_NCCL_MISMATCH_HANGS=1).
            let second = if me == victim {
                world.all_gather_into(
                    gpu.upload(&[1.0f32]).unwrap(),
                    gpu.alloc_zeros::<f32>(n).unwrap(),
                )
            } else {
                world.reduce_scatter_into(
                    gpu.upload(&vec![1.0f32; n]).unwrap(),
                    gpu.alloc_zeros::<f32>(1).unwrap(),
                    ReduceOp::Sum,
                )
            };
            let result = second.and_then(|w| w.wait());
            all_stopped(&pgc, me, Duration::from_secs(5));
            report(&pgc, tag, start, result)
        }
        "device_async_error" => {
            // The victim's world communicator fails asynchronously at its third operation
            // (FAKE_NCCL_FAIL_AFTER=2, FAKE_NCCL_FAIL_RANK=<victim>: only the world group has that rank). Every
            // rank only orders its stream after it; the others then all-reduce a host vector over the world group:
            // the victim's watchdog stops its whole collection, and the others learn of it through the host half.
            // With a slow fake stream (FAKE_GPU_STREAM_DELAY_MS) the error comes after the enqueue returned;
            // should it come sooner, the enqueue itself reports it.
            let third = world
                .all_reduce(gpu.upload(&[1.0f32]).unwrap(), ReduceOp::Sum)
                .and_then(|w| w.wait_on(device.stream()));
            let result = match third {
                Ok(pending) if me == victim => {
                    // The watchdog finds the error within a few polls.
                    let deadline = Instant::now() + Duration::from_secs(10);
                    while device.broken().is_none() && Instant::now() < deadline {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    drop(pending);
                    device.check().map(drop)
                }
                Err(e) if me == victim => Err(e),
                _ => world
                    .all_reduce(vec![1.0f32], ReduceOp::Sum)
                    .and_then(|w| w.wait())
                    .map(drop),
            };
            all_stopped(&pgc, me, Duration::from_secs(5));
            report(&pgc, tag, start, result)
        }
        "device_cycle" => {
            // A ring of pipeline stages, each sending to the next and then receiving from the previous as two
            // separate operations: each send waits for a receive queued behind its receiver's own send.
            let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
            let sent = world
                .send(gpu.upload(&[me as f32; 8]).unwrap(), next, 0)
                .unwrap();
            let received = world
                .recv(gpu.alloc_zeros::<f32>(8).unwrap(), prev, 0)
                .unwrap();
            let result = sent.wait();
            drop(received);
            all_stopped(&pgc, me, Duration::from_secs(5));
            report(&pgc, "SEEN", start, result)
        }
        other => panic!("unknown device fault case {other}"),
    }
}
