//! Communicators with a GPU end to end against `fake-gpu`, a stand-in CUDA driver and NCCL (single-rank,
//! synchronous, host memory), so the NCCL flavor's Rust side runs on every machine, CI included. Every operation
//! goes through the one [`Communicator`] face; [`Communicator::nccl`] reaches what only NCCL has.
//!
//! Each `fake_*` test below is `#[ignore]`d and runs only in a child process that this file's `suite_*` tests
//! start under the fake (see `fake_support`). The suites check the children's exit status and, for the knobs,
//! what the fake logged. Several ranks are in `fake_ranks/`. What this cannot show (GPU concurrency, NCCL's own
//! behaviour) is left to the GPU run (`tests/gpu/`, `docs/gpu-validation.md`).

mod device_checks;
mod fake_support;

use std::sync::Arc;
use std::time::Duration;

use hypercomm_comm::device::{DeviceBuffer, Gpu, StridedLayout};
use hypercomm_comm::{CommError, CommOptions, Communicator, NcclOptions, ReduceOp};
use hypercomm_store::MemoryStore;

use device_checks::{all_reduced, refused};
use fake_support::{nccl, pass_under_fake, runtime};

/// The one-rank communicator of `options` with `gpu` (a 20 s timeout).
fn single(gpu: &Arc<Gpu>, options: CommOptions) -> Communicator {
    Communicator::with_gpu(
        Arc::clone(gpu),
        Arc::new(MemoryStore::new()),
        vec![0],
        0,
        CommOptions {
            timeout: Duration::from_secs(20),
            ..options
        },
    )
    .unwrap()
}

#[test]
fn suite_collectives_events_and_errors() {
    for name in [
        "fake_probe_loads_the_driver_and_nccl",
        "fake_every_collective_round_trips",
        "fake_abort_fails_pending_and_later_work",
        "fake_strided_views_without_nvrtc_fail_cleanly",
        "fake_the_buffer_type_picks_the_flavor",
        "fake_shrink_and_split",
        "fake_foreign_device_memory_round_trips",
    ] {
        pass_under_fake(name, &[]);
    }
}

#[test]
fn suite_knobs_reach_ncclconfig() {
    let log = pass_under_fake("fake_knobs_are_passed_to_nccl", &[]);
    assert!(
        log.contains(
            "fake-nccl: ncclCommInitRankConfig: blocking=0 cgaClusterSize=2 minCTAs=2 maxCTAs=8 splitShare=1 \
             trafficClass=-2147483648 netName=(null) commName=knobs/device"
        ),
        "{log}"
    );
    assert!(
        log.contains("fake-nccl: ncclCommSplit: blocking=1 ")
            && log.contains("commName=knobs/split0/color0/device"),
        "{log}"
    );
    // One CTA bound: the other is NCCL's default, never the unset value NCCL refuses (H100 run, 2026-11-22).
    assert!(
        log.contains("minCTAs=3 maxCTAs=64 ") && log.contains("commName=one-bound/device"),
        "{log}"
    );
    assert!(!log.contains("Invalid config"), "{log}");
}

#[test]
fn suite_nccl_before_2_24_refuses_the_8_bit_floats() {
    pass_under_fake(
        "fake_nccl_before_2_24_refuses_the_8_bit_floats",
        &[("FAKE_NCCL_VERSION", "22300")],
    );
}

#[test]
#[ignore = "run under fake-gpu by suite_nccl_before_2_24_refuses_the_8_bit_floats"]
fn fake_nccl_before_2_24_refuses_the_8_bit_floats() {
    let gpu = Gpu::open(runtime(), 0).unwrap();
    let comm = Communicator::with_gpu(
        Arc::clone(&gpu),
        Arc::new(MemoryStore::new()),
        vec![0],
        0,
        CommOptions::named("old-fp8"),
    )
    .unwrap();
    let buf = gpu.upload(&[float8::F8E4M3::from_f32(1.0); 2]).unwrap();
    let e = comm.broadcast(buf, 0).expect_err("refused");
    let text = e.to_string();
    assert!(matches!(e, CommError::Unavailable { .. }), "{text}");
    assert!(
        text.contains("f8e4m3") && text.contains("2.24") && text.contains("2.23"),
        "{text}"
    );
    // Other types still run.
    let ok = comm
        .broadcast(gpu.upload(&[2.5f32]).unwrap(), 0)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(ok.download().unwrap(), [2.5]);
}

#[test]
fn suite_old_nccl_refuses_new_knobs_and_still_shrinks() {
    pass_under_fake(
        "fake_old_nccl_refuses_what_it_lacks",
        &[("FAKE_NCCL_VERSION", "22400")],
    );
}

/// Operations timed for the driver-call count below.
const COUNTED_OPS: usize = 16;

/// The driver calls on thread `<tid>` between the child's `fake-test: counting on thread <tid>` and `fake-test:
/// counted` lines, by name: the operations' own, not the GPU watchdog's event queries from its thread.
fn calls_between_marks(log: &str) -> std::collections::BTreeMap<String, usize> {
    let mut calls = std::collections::BTreeMap::new();
    let mut counting: Option<&str> = None;
    for line in log.lines() {
        let l = line.trim();
        if let Some(thread) = l.strip_prefix("fake-test: counting on thread ") {
            counting = Some(thread);
        } else if l == "fake-test: counted" {
            counting = None;
        } else if let (Some(thread), Some(call)) = (counting, l.strip_prefix("fake-cuda: call ")) {
            if let Some(name) = call.strip_suffix(&format!(" on thread {thread}")) {
                *calls.entry(name.to_owned()).or_insert(0) += 1;
            }
        }
    }
    calls
}

#[test]
fn suite_a_buffer_on_one_stream_costs_one_event_per_operation() {
    // hypercomm's own cost per device operation is driver calls. A buffer used call after call on one stream
    // needs none to stay ordered: the handle's event (recorded once, with cudarc's check of the current context)
    // is all. cudarc's per-use events cost two stream waits and a record more per buffer (the 2026-11-22 H100 run
    // measured 1.6-1.8 us of extra host time per call against a 0.5 us target). Only the calling thread's calls
    // count: the GPU's watchdog queries the events of operations in flight from its own thread, off their path.
    let log = pass_under_fake(
        "fake_operations_on_one_stream_are_counted",
        &[("FAKE_GPU_TRACE_CALLS", "1")],
    );
    let calls = calls_between_marks(&log);
    // In place (one buffer) and out of place (two), COUNTED_OPS each.
    let ops = 2 * COUNTED_OPS;
    assert_eq!(calls.get("cuStreamWaitEvent"), None, "{calls:?}");
    assert_eq!(calls.get("cuEventRecord"), Some(&ops), "{calls:?}");
    assert!(
        calls.values().sum::<usize>() <= 2 * ops,
        "at most an event record and a context check per operation: {calls:?}"
    );
}

#[test]
fn suite_buffers_stay_ordered_when_the_gpu_is_slow() {
    // Every stream waits 30 ms before each piece of work, so a read, copy or release that is not ordered after
    // the collective reliably comes too early (stale data, or the fake reporting freed memory in use).
    pass_under_fake(
        "fake_a_buffer_left_on_a_stream_is_ordered_before_other_uses",
        &[("FAKE_GPU_STREAM_DELAY_MS", "30")],
    );
}

#[test]
#[ignore = "run under fake-gpu by suite_collectives_events_and_errors"]
fn fake_probe_loads_the_driver_and_nccl() {
    let rt = runtime();
    assert_eq!(rt.device_count(), 1);
    assert_eq!(rt.driver().version, 13000);
    assert_eq!(rt.nccl().version(), nccl_sys::Version::new(2, 28, 9));
    assert!(Gpu::open(Arc::clone(&rt), 1).is_err(), "only one device");
}

#[test]
#[ignore = "run under fake-gpu by suite_collectives_events_and_errors"]
fn fake_every_collective_round_trips() {
    let gpu = Gpu::open(runtime(), 0).unwrap();
    // Non-blocking by default: the fake answers ncclInProgress at creation, so the polling path runs.
    let comm = single(&gpu, CommOptions::named("round-trip"));
    let data: Vec<f32> = (0..1000).map(|i| (i % 61) as f32).collect();
    let buf = gpu.upload(&data).unwrap();
    let buf = comm.all_reduce(buf, ReduceOp::Sum).unwrap().wait().unwrap();
    assert_eq!(buf.download().unwrap(), data);
    let buf = comm
        .broadcast(buf, 0)
        .unwrap()
        .wait_on(nccl(&comm).stream())
        .unwrap();
    let buf = comm.reduce(buf, ReduceOp::Max, 0).unwrap().wait().unwrap();
    let out = gpu.alloc_zeros::<f32>(1000).unwrap();
    let (buf, out) = comm.all_gather_into(buf, out).unwrap().wait().unwrap();
    assert_eq!(out.download().unwrap(), data);
    let fresh = gpu.alloc_zeros::<f32>(1000).unwrap();
    let (_, fresh) = comm
        .reduce_scatter_into(buf, fresh, ReduceOp::Avg)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(fresh.download().unwrap(), data);
    let all = gpu.alloc_zeros::<f32>(1000).unwrap();
    let (_, all) = comm.all_to_all_into(fresh, all).unwrap().wait().unwrap();
    assert_eq!(
        all.download().unwrap(),
        data,
        "all_to_all: a grouped send and receive"
    );
    let ints = gpu.upload(&[7i64, -3]).unwrap();
    let (_, out) = comm
        .all_reduce_into(ints, gpu.alloc_zeros::<i64>(2).unwrap(), ReduceOp::Min)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(out.download().unwrap(), [7, -3]);
    assert!(gpu.pooled_events() > 0, "handles give their events back");
    // Bad input is refused before NCCL sees it.
    let short = gpu.alloc_zeros::<f32>(3).unwrap();
    let e = comm
        .all_gather_into(gpu.alloc_zeros::<f32>(4).unwrap(), short)
        .err()
        .unwrap();
    assert!(matches!(e, CommError::InvalidArgument { .. }), "{e}");
    assert!(
        comm.broadcast(gpu.alloc_zeros::<u8>(1).unwrap(), 1)
            .is_err(),
        "root 1 of 1 rank"
    );
}

#[test]
#[ignore = "run under fake-gpu by suite_collectives_events_and_errors"]
fn fake_abort_fails_pending_and_later_work() {
    let gpu = Gpu::open(runtime(), 0).unwrap();
    let comm = single(&gpu, CommOptions::named("abort"));
    let work = comm
        .all_reduce(gpu.alloc_zeros::<f32>(16).unwrap(), ReduceOp::Sum)
        .unwrap();
    comm.abort();
    assert!(matches!(work.wait(), Err(CommError::Broken { .. })));
    let e = comm
        .all_reduce(gpu.alloc_zeros::<f32>(4).unwrap(), ReduceOp::Sum)
        .err()
        .unwrap();
    assert!(matches!(e, CommError::Broken { .. }), "{e}");
    assert!(comm.broken().is_some());
}

#[test]
#[ignore = "run under fake-gpu by suite_collectives_events_and_errors"]
fn fake_strided_views_without_nvrtc_fail_cleanly() {
    let gpu = Gpu::open(runtime(), 0).unwrap();
    let comm = single(&gpu, CommOptions::named("strided"));
    let host: Vec<i32> = (0..40).collect();
    // A contiguous view needs no kernel: it runs on the part of the buffer directly.
    let view = StridedLayout::new(8, 2, 10, 10).unwrap();
    assert!(view.is_contiguous());
    let buf = nccl(&comm)
        .all_reduce_strided(gpu.upload(&host).unwrap(), view, ReduceOp::Sum)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(buf.download().unwrap(), host);
    // A strided one needs the pack kernel; without NVRTC that is an error saying so, not a panic.
    let strided = StridedLayout::new(1, 4, 3, 10).unwrap();
    refused(
        nccl(&comm).all_reduce_strided(gpu.upload(&host).unwrap(), strided, ReduceOp::Sum),
        "nvrtc",
    );
}

#[test]
#[ignore = "run under fake-gpu by suite_collectives_events_and_errors"]
fn fake_the_buffer_type_picks_the_flavor() {
    let gpu = Gpu::open(runtime(), 0).unwrap();
    let comm = Communicator::connect(
        Some(Arc::clone(&gpu)),
        Arc::new(MemoryStore::new()),
        vec![0],
        0,
        CommOptions {
            nccl: NcclOptions {
                max_ctas: Some(4),
                ..NcclOptions::default()
            },
            ..CommOptions::named("pg")
        },
    )
    .unwrap();
    // The NCCL knob went to the NCCL flavor, named after the communicator.
    assert_eq!(comm.gpu().map(|g| g.ordinal()), Some(0));
    assert_eq!(nccl(&comm).name(), "pg/device");
    assert_eq!(nccl(&comm).options().nccl.max_ctas, Some(4));
    // A host vector runs on the host flavor and comes back a host vector.
    let work = comm.all_reduce(vec![1u32, 2], ReduceOp::Sum).unwrap();
    assert!(!work.is_device(), "a host vector ran on the device");
    assert_eq!(work.wait().unwrap(), [1, 2]);
    // A device buffer runs on NCCL and comes back a device buffer.
    let work = comm
        .all_reduce(gpu.upload(&[5u32, 6]).unwrap(), ReduceOp::Sum)
        .unwrap();
    assert!(work.is_device(), "a device buffer ran on the host");
    let b = work.wait().unwrap();
    assert_eq!(b.download().unwrap(), [5, 6]);
    // A send to oneself would wait forever in NCCL (nobody posts the receive while the send waits): refused.
    refused(comm.send(b, 0, 0), "peer 0 is not another rank");
}

#[test]
#[ignore = "run under fake-gpu by suite_collectives_events_and_errors"]
fn fake_foreign_device_memory_round_trips() {
    // Memory another cudarc user owns (as candle's tensors are), on a stream of its own.
    let gpu = Gpu::open(runtime(), 0).unwrap();
    let stream = gpu.context().new_stream().unwrap();
    let theirs = stream.clone_htod(&[1.5f32, 2.5, 3.5]).unwrap();
    let mut mine = gpu.alloc_zeros::<f32>(3).unwrap();
    mine.copy_from_device(&theirs.slice(..), &stream).unwrap();
    assert_eq!(mine.download().unwrap(), [1.5, 2.5, 3.5]);
    let mut back = stream.alloc_zeros::<f32>(3).unwrap();
    mine.copy_to_device(&mut back.slice_mut(..), &stream)
        .unwrap();
    assert_eq!(stream.clone_dtoh(&back).unwrap(), [1.5, 2.5, 3.5]);
    // A length or an element size that does not match is an error naming both, and nothing is copied.
    refused(
        mine.copy_from_device(&theirs.slice(..2), &stream),
        "2 elements of 4 bytes do not match a buffer of 3 f32 elements",
    );
    let bytes = stream.alloc_zeros::<u8>(12).unwrap();
    refused(
        mine.copy_from_device(&bytes.slice(..), &stream),
        "12 elements of 1 bytes",
    );
    assert_eq!(mine.download().unwrap(), [1.5, 2.5, 3.5]);
}

#[test]
#[ignore = "run under fake-gpu by suite_collectives_events_and_errors"]
fn fake_shrink_and_split() {
    let gpu = Gpu::open(runtime(), 0).unwrap();
    let comm = single(&gpu, CommOptions::named("parent"));
    // A split splits both flavors: the child has a gpu, its NCCL flavor named after it.
    let child = comm.split(Some(3), 0).unwrap().expect("color 3 joins");
    assert_eq!((child.size(), child.rank()), (1, 0));
    assert_eq!(child.name(), "parent/split0/color3");
    assert_eq!(nccl(&child).name(), "parent/split0/color3/device");
    assert_eq!((nccl(&child).size(), nccl(&child).rank()), (1, 0));
    assert!(comm.split(None, 0).unwrap().is_none());
    let again = comm.split(Some(3), 0).unwrap().expect("color 3 joins");
    assert_eq!(
        again.name(),
        "parent/split2/color3",
        "two splits never share a name"
    );
    assert_eq!(nccl(&again).name(), "parent/split2/color3/device");
    assert!(
        comm.split(Some(u32::MAX), 0).is_err(),
        "colors must fit an int"
    );
    assert_eq!(all_reduced(&child, &gpu, &[1.25f32], ReduceOp::Sum), [1.25]);
    // Excluding nobody is a copy, with a fresh NCCL communicator (no ncclCommShrink, which refuses an empty
    // exclusion list).
    let shrunk = comm.shrink(&[]).unwrap();
    assert_eq!(shrunk.ranks(), [0]);
    assert_eq!(shrunk.name(), "parent/shrink0");
    assert_eq!(nccl(&shrunk).name(), "parent/shrink0/device");
    assert_eq!(nccl(&shrunk).ranks(), [0]);
    assert!(
        comm.shrink(&[1]).is_err(),
        "rank 1 of a 1-rank communicator"
    );
    refused(comm.shrink(&[0]), "excludes itself");
    assert_eq!(all_reduced(&shrunk, &gpu, &[2.5f64], ReduceOp::Sum), [2.5]);
    // The shrunk communicator's own flavors are its own: aborting the parent leaves it working.
    comm.abort();
    assert_eq!(all_reduced(&shrunk, &gpu, &[0.5f64], ReduceOp::Sum), [0.5]);
}

#[test]
#[ignore = "run under fake-gpu by suite_knobs_reach_ncclconfig"]
fn fake_knobs_are_passed_to_nccl() {
    let gpu = Gpu::open(runtime(), 0).unwrap();
    let comm = single(
        &gpu,
        CommOptions {
            nccl: NcclOptions {
                high_priority_stream: Some(true),
                cga_cluster_size: Some(2),
                min_ctas: Some(2),
                max_ctas: Some(8),
                split_share: Some(true),
                ..NcclOptions::default()
            },
            ..CommOptions::named("knobs")
        },
    );
    // The child's own options reach its ncclCommSplit (the name is derived from the parent's).
    let child = comm
        .split_with(
            Some(0),
            0,
            CommOptions {
                nccl: NcclOptions {
                    blocking: Some(true),
                    ..NcclOptions::default()
                },
                ..CommOptions::named("ignored")
            },
        )
        .unwrap()
        .expect("color 0 joins");
    assert_eq!(child.size(), 1);
    assert_eq!(nccl(&child).name(), "knobs/split0/color0/device");
    assert_eq!(nccl(&child).options().nccl.blocking, Some(true));
    let one_bound = single(
        &gpu,
        CommOptions {
            nccl: NcclOptions {
                min_ctas: Some(3),
                ..NcclOptions::default()
            },
            ..CommOptions::named("one-bound")
        },
    );
    assert_eq!(
        all_reduced(&one_bound, &gpu, &[1.0f32], ReduceOp::Sum),
        [1.0]
    );
    // Each knob goes to the flavor that honours it: with a gpu, a host knob goes to the host flavor (the NCCL one
    // never sees it); without one, an NCCL knob is refused by name.
    let tcp = single(
        &gpu,
        CommOptions {
            force_tcp: true,
            ..CommOptions::named("host-knob")
        },
    );
    assert!(tcp.options().force_tcp);
    assert!(!nccl(&tcp).options().force_tcp);
    let nccl_knob = CommOptions {
        nccl: NcclOptions {
            max_ctas: Some(8),
            ..NcclOptions::default()
        },
        ..CommOptions::named("nccl-knob")
    };
    let e = refused(
        Communicator::new(Arc::new(MemoryStore::new()), vec![0], 0, nccl_knob),
        "max_ctas",
    );
    assert!(matches!(e, CommError::UnsupportedOption { .. }), "{e}");
}

#[test]
#[ignore = "run under fake-gpu by suite_old_nccl_refuses_new_knobs_and_still_shrinks"]
fn fake_old_nccl_refuses_what_it_lacks() {
    let rt = runtime();
    assert_eq!(rt.nccl().version(), nccl_sys::Version::new(2, 24, 0));
    let gpu = Gpu::open(rt, 0).unwrap();
    let qos = CommOptions {
        nccl: NcclOptions {
            traffic_class: Some(3),
            ..NcclOptions::default()
        },
        ..CommOptions::named("qos")
    };
    let e = Communicator::check_options(Some(&gpu), &qos).err().unwrap();
    assert!(
        matches!(e, CommError::OptionNeedsNewerLibrary { .. }),
        "{e}"
    );
    let e = Communicator::with_gpu(
        Arc::clone(&gpu),
        Arc::new(MemoryStore::new()),
        vec![0],
        0,
        qos,
    )
    .err()
    .unwrap();
    assert!(
        matches!(e, CommError::OptionNeedsNewerLibrary { .. }),
        "{e}"
    );
    // Shrink makes a fresh NCCL communicator rather than calling ncclCommShrink (NCCL 2.27), so it works here.
    let comm = single(&gpu, CommOptions::named("old"));
    let shrunk = comm.shrink(&[]).unwrap();
    assert_eq!(nccl(&shrunk).name(), "old/shrink0/device");
    assert_eq!(all_reduced(&shrunk, &gpu, &[3i64], ReduceOp::Sum), [3]);
}

#[test]
#[ignore = "run under fake-gpu by suite_a_buffer_on_one_stream_costs_one_event_per_operation"]
fn fake_operations_on_one_stream_are_counted() {
    let gpu = Gpu::open(runtime(), 0).unwrap();
    let comm = single(&gpu, CommOptions::named("per-call"));
    let mut buf = gpu.upload(&[1.0f32, 2.0]).unwrap();
    let mut pair = (
        gpu.upload(&[3.0f32]).unwrap(),
        gpu.alloc_zeros::<f32>(1).unwrap(),
    );
    // One in-place and one out-of-place operation, each waited on the communicator's stream.
    let step = |buf: DeviceBuffer<f32>, pair: (DeviceBuffer<f32>, DeviceBuffer<f32>)| {
        let buf = comm
            .all_reduce(buf, ReduceOp::Sum)
            .unwrap()
            .wait_on(nccl(&comm).stream())
            .unwrap();
        let pair = comm
            .all_gather_into(pair.0, pair.1)
            .unwrap()
            .wait_on(nccl(&comm).stream())
            .unwrap();
        (buf, pair)
    };
    // The first use of each buffer on the stream orders it after its upload (through cudarc's events). Then the
    // event pool warms up, as in a training loop's first steps: the watchdog holds each event until it has seen
    // its operation complete (once per tick), so a burst within a tick takes that many events.
    (buf, pair) = step(buf, pair);
    for _ in 0..COUNTED_OPS {
        (buf, pair) = step(buf, pair);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while gpu.pooled_events() < 2 * COUNTED_OPS && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let tid = rustix::thread::gettid().as_raw_nonzero(); // as the fake's traces name the thread
    eprintln!("fake-test: counting on thread {tid}");
    for _ in 0..COUNTED_OPS {
        (buf, pair) = step(buf, pair);
    }
    eprintln!("fake-test: counted");
    assert_eq!(buf.download().unwrap(), [1.0, 2.0]);
    assert_eq!(pair.1.download().unwrap(), [3.0]);
}

#[test]
#[ignore = "run under fake-gpu by suite_buffers_stay_ordered_when_the_gpu_is_slow"]
fn fake_a_buffer_left_on_a_stream_is_ordered_before_other_uses() {
    let gpu = Gpu::open(runtime(), 0).unwrap();
    let comm = single(&gpu, CommOptions::named("slow"));
    let data: Vec<f32> = (0..64).map(|i| i as f32).collect();
    let gather = |input, output| {
        comm.all_gather_into(input, output)
            .unwrap()
            .wait_on(nccl(&comm).stream())
            .unwrap()
    };
    // Read back on the null stream while the collective still waits on the communicator's stream.
    let (input, out) = gather(
        gpu.upload(&data).unwrap(),
        gpu.alloc_zeros::<f32>(64).unwrap(),
    );
    assert_eq!(out.download().unwrap(), data, "read back on another stream");
    // Copied out to another cudarc user's memory on its own stream, and then overwritten by a collective: the
    // copy must read the values before the overwrite, and the overwrite must come after the copy.
    let (input, out) = gather(input, out);
    let theirs_stream = gpu.context().new_stream().unwrap();
    let mut theirs = theirs_stream.alloc_zeros::<f32>(64).unwrap();
    out.copy_to_device(&mut theirs.slice_mut(..), &theirs_stream)
        .unwrap();
    let doubled: Vec<f32> = data.iter().map(|x| 2.0 * x).collect();
    let (_, out) = gather(gpu.upload(&doubled).unwrap(), out);
    assert_eq!(
        theirs_stream.clone_dtoh(&theirs).unwrap(),
        data,
        "copied out before the overwrite"
    );
    assert_eq!(
        out.download().unwrap(),
        doubled,
        "overwritten after the copy"
    );
    // Copied into on that stream (a write through cudarc), then gathered: the gather reads the copied values.
    let mut input = input;
    let tripled: Vec<f32> = data.iter().map(|x| 3.0 * x).collect();
    let theirs = theirs_stream.clone_htod(&tripled).unwrap();
    input
        .copy_from_device(&theirs.slice(..), &theirs_stream)
        .unwrap();
    let (input, out) = gather(input, out);
    assert_eq!(
        out.download().unwrap(),
        tripled,
        "a copy in on another stream, then a gather"
    );
    // Released while the collective is still queued: the memory must stay allocated until it ran.
    let (input, out) = gather(input, out);
    drop((input, out));
    nccl(&comm).stream().synchronize().unwrap();
    nccl(&comm)
        .check()
        .expect("no collective touched memory that was already released");
}
