//! The device backend end to end against `fake-gpu`, a stand-in CUDA driver and NCCL (single-rank,
//! synchronous, host memory), so its Rust side runs on every machine, CI included.
//!
//! Each `fake_*` test below is `#[ignore]`d and runs only in a child process that this file's `suite_*` tests
//! start under the fake (see `fake_support`). The suites check the children's exit status and, for the knobs,
//! what the fake logged. Several ranks are in `fake_ranks.rs`. What this cannot show (GPU concurrency, NCCL's own behaviour) is left to
//! the GPU run (`tests/gpu.rs`, `docs/gpu-validation.md`).

mod fake_support;

use std::sync::Arc;
use std::time::Duration;

use hypercomm_comm::bench::BenchOp;
use hypercomm_comm::device::bench::{DeviceBenchConfig, run as run_bench};
use hypercomm_comm::device::{
    DeviceBuffer, DeviceCommunicator, Gpu, Placed, ProcessGroup, StridedLayout,
};
use hypercomm_comm::{CommError, CommOptions, NcclOptions, ReduceOp};
use hypercomm_store::MemoryStore;

use fake_support::{pass_under_fake, runtime};

fn single(gpu: &Arc<Gpu>, options: CommOptions) -> DeviceCommunicator {
    DeviceCommunicator::new(
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
        "fake_process_group_routes_by_location",
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
             trafficClass=-2147483648 netName=(null) commName=knobs"
        ),
        "{log}"
    );
    assert!(
        log.contains("fake-nccl: ncclCommSplit: blocking=1 ")
            && log.contains("commName=knobs/child"),
        "{log}"
    );
    // One CTA bound: the other is NCCL's default, never the unset value NCCL refuses (H100 run, 2026-11-22).
    assert!(
        log.contains("minCTAs=3 maxCTAs=64 ") && log.contains("commName=one-bound"),
        "{log}"
    );
    assert!(!log.contains("Invalid config"), "{log}");
}

#[test]
fn suite_old_nccl_refuses_new_knobs_and_shrink() {
    pass_under_fake(
        "fake_old_nccl_refuses_what_it_lacks",
        &[("FAKE_NCCL_VERSION", "22400")],
    );
}

/// Operations timed for the driver-call count below.
const COUNTED_OPS: usize = 16;

/// The driver calls between the child's `fake-test: counting` and `fake-test: counted` lines, by name.
fn calls_between_marks(log: &str) -> std::collections::BTreeMap<String, usize> {
    let mut calls = std::collections::BTreeMap::new();
    let mut counting = false;
    for line in log.lines() {
        match line.trim() {
            "fake-test: counting" => counting = true,
            "fake-test: counted" => counting = false,
            l if counting => {
                if let Some(name) = l.strip_prefix("fake-cuda: call ") {
                    *calls.entry(name.to_owned()).or_insert(0) += 1;
                }
            }
            _ => {}
        }
    }
    calls
}

#[test]
fn suite_a_buffer_on_one_stream_costs_one_event_per_operation() {
    // hypercomm's own cost per device operation is driver calls. A buffer used call after call on one stream
    // needs none to stay ordered: the handle's event (recorded once, with cudarc's check of the current context)
    // is all. cudarc's per-use events cost two stream waits and a record more per buffer (the 2026-11-22 H100 run
    // measured 1.6-1.8 us of extra host time per call against a 0.5 us target).
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
fn suite_bench_runs_end_to_end() {
    pass_under_fake("fake_bench_reports_every_size_and_the_overhead", &[]);
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
    let buf = comm
        .all_reduce(buf, ReduceOp::Sum)
        .unwrap()
        .synchronize()
        .unwrap();
    assert_eq!(buf.download().unwrap(), data);
    let buf = comm.broadcast(buf, 0).unwrap().wait(comm.stream()).unwrap();
    let buf = comm
        .reduce(buf, ReduceOp::Max, 0)
        .unwrap()
        .synchronize()
        .unwrap();
    let out = gpu.alloc_zeros::<f32>(1000).unwrap();
    let (buf, out) = comm
        .all_gather_into(buf, out)
        .unwrap()
        .synchronize()
        .unwrap();
    assert_eq!(out.download().unwrap(), data);
    let fresh = gpu.alloc_zeros::<f32>(1000).unwrap();
    let (_, fresh) = comm
        .reduce_scatter_into(buf, fresh, ReduceOp::Avg)
        .unwrap()
        .synchronize()
        .unwrap();
    assert_eq!(fresh.download().unwrap(), data);
    let all = gpu.alloc_zeros::<f32>(1000).unwrap();
    let (_, all) = comm
        .all_to_all_into(fresh, all)
        .unwrap()
        .synchronize()
        .unwrap();
    assert_eq!(
        all.download().unwrap(),
        data,
        "all_to_all: a grouped send and receive"
    );
    let ints = gpu.upload(&[7i64, -3]).unwrap();
    let (_, out) = comm
        .all_reduce_into(ints, gpu.alloc_zeros::<i64>(2).unwrap(), ReduceOp::Min)
        .unwrap()
        .synchronize()
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
    assert!(matches!(work.synchronize(), Err(CommError::Broken { .. })));
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
    let buf = comm
        .all_reduce_strided(gpu.upload(&host).unwrap(), view, ReduceOp::Sum)
        .unwrap()
        .synchronize()
        .unwrap();
    assert_eq!(buf.download().unwrap(), host);
    // A strided one needs the pack kernel; without NVRTC that is an error saying so, not a panic.
    let strided = StridedLayout::new(1, 4, 3, 10).unwrap();
    let e = comm
        .all_reduce_strided(gpu.upload(&host).unwrap(), strided, ReduceOp::Sum)
        .err()
        .unwrap();
    assert!(e.to_string().contains("nvrtc"), "{e}");
}

#[test]
#[ignore = "run under fake-gpu by suite_collectives_events_and_errors"]
fn fake_process_group_routes_by_location() {
    let gpu = Gpu::open(runtime(), 0).unwrap();
    let pg = ProcessGroup::connect(
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
    let Placed::Host(v) = pg
        .all_reduce(Placed::Host(vec![1u32, 2]), ReduceOp::Sum)
        .unwrap()
        .synchronize()
        .unwrap()
    else {
        panic!("a host buffer came back from the device");
    };
    assert_eq!(v, [1, 2]);
    let Placed::Device(b) = pg
        .all_reduce(
            Placed::Device(gpu.upload(&[5u32, 6]).unwrap()),
            ReduceOp::Sum,
        )
        .unwrap()
        .synchronize()
        .unwrap()
    else {
        panic!("a device buffer came back on the host");
    };
    assert_eq!(b.download().unwrap(), [5, 6]);
    // A send to oneself would wait forever in NCCL (nobody posts the receive while the send waits): refused.
    let e = pg.send(Placed::Device(b), 0, 0).err().unwrap();
    assert!(e.to_string().contains("peer 0 is not another rank"), "{e}");
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
    let short = mine
        .copy_from_device(&theirs.slice(..2), &stream)
        .unwrap_err();
    assert!(
        short
            .to_string()
            .contains("2 elements of 4 bytes do not match a buffer of 3 f32 elements"),
        "{short}"
    );
    let bytes = stream.alloc_zeros::<u8>(12).unwrap();
    let wide = mine
        .copy_from_device(&bytes.slice(..), &stream)
        .unwrap_err();
    assert!(
        wide.to_string().contains("12 elements of 1 bytes"),
        "{wide}"
    );
    assert_eq!(mine.download().unwrap(), [1.5, 2.5, 3.5]);
}

#[test]
#[ignore = "run under fake-gpu by suite_collectives_events_and_errors"]
fn fake_shrink_and_split() {
    let gpu = Gpu::open(runtime(), 0).unwrap();
    let comm = single(&gpu, CommOptions::named("parent"));
    let child = comm.split(Some(3), 0).unwrap().expect("color 3 joins");
    assert_eq!((child.size(), child.rank()), (1, 0));
    assert_eq!(child.name(), "parent/split0/color3");
    assert!(comm.split(None, 0).unwrap().is_none());
    let again = comm.split(Some(3), 0).unwrap().expect("color 3 joins");
    assert_eq!(
        again.name(),
        "parent/split2/color3",
        "two splits never share a name"
    );
    assert!(
        comm.split(Some(u32::MAX), 0).is_err(),
        "colors must fit an int"
    );
    // NCCL (and the fake) refuse ncclCommShrink with nothing to exclude; excluding nobody is a copy.
    let shrunk = comm.shrink(&[], false).unwrap();
    assert_eq!(shrunk.ranks(), [0]);
    assert!(
        shrunk.name().starts_with("parent/shrink"),
        "{}",
        shrunk.name()
    );
    assert!(
        comm.shrink(&[1], false).is_err(),
        "rank 1 of a 1-rank communicator"
    );
    let own = comm
        .shrink(&[0], false)
        .map(|_| ())
        .expect_err("a rank cannot exclude itself");
    assert!(own.to_string().contains("excludes itself"), "{own}");
    let empty_abort = comm
        .shrink(&[], true)
        .map(|_| ())
        .expect_err("abort_first needs failed ranks");
    assert!(
        empty_abort.to_string().contains("abort_first"),
        "{empty_abort}"
    );
    let buf = shrunk
        .all_reduce(gpu.upload(&[2.5f64]).unwrap(), ReduceOp::Sum)
        .unwrap()
        .synchronize()
        .unwrap();
    assert_eq!(buf.download().unwrap(), [2.5]);
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
    let child = comm
        .split_with(
            Some(0),
            0,
            CommOptions {
                nccl: NcclOptions {
                    blocking: Some(true),
                    ..NcclOptions::default()
                },
                ..CommOptions::named("knobs/child")
            },
        )
        .unwrap()
        .expect("color 0 joins");
    assert_eq!(child.size(), 1);
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
    let buf = one_bound
        .all_reduce(gpu.upload(&[1.0f32]).unwrap(), ReduceOp::Sum)
        .unwrap()
        .synchronize()
        .unwrap();
    assert_eq!(buf.download().unwrap(), [1.0]);
    let e = DeviceCommunicator::new(
        Arc::clone(&gpu),
        Arc::new(MemoryStore::new()),
        vec![0],
        0,
        CommOptions {
            force_tcp: true,
            ..CommOptions::named("host-knob")
        },
    )
    .err()
    .unwrap();
    assert!(e.to_string().contains("force_tcp"), "{e}");
}

#[test]
#[ignore = "run under fake-gpu by suite_old_nccl_refuses_new_knobs_and_shrink"]
fn fake_old_nccl_refuses_what_it_lacks() {
    let rt = runtime();
    assert_eq!(rt.nccl().version(), nccl_sys::Version::new(2, 24, 0));
    let gpu = Gpu::open(rt, 0).unwrap();
    let e = DeviceCommunicator::new(
        Arc::clone(&gpu),
        Arc::new(MemoryStore::new()),
        vec![0],
        0,
        CommOptions {
            nccl: NcclOptions {
                traffic_class: Some(3),
                ..NcclOptions::default()
            },
            ..CommOptions::named("qos")
        },
    )
    .err()
    .unwrap();
    assert!(
        matches!(e, CommError::OptionNeedsNewerLibrary { .. }),
        "{e}"
    );
    let comm = single(&gpu, CommOptions::named("old"));
    let e = comm.shrink(&[], false).err().unwrap();
    assert!(matches!(e, CommError::Unavailable { .. }), "{e}");
}

#[test]
#[ignore = "run under fake-gpu by suite_bench_runs_end_to_end"]
fn fake_bench_reports_every_size_and_the_overhead() {
    let config = DeviceBenchConfig {
        op: BenchOp::AllGather,
        ranks: 1,
        sizes: vec![8, 4096, 1 << 20],
        options: CommOptions {
            timeout: Duration::from_secs(20),
            ..CommOptions::named("bench")
        },
        max_iters: 10,
        overhead_calls: 20,
        overhead_batches: 3,
        multi_rank_gpu_enabled: false,
    };
    let seen = std::sync::Mutex::new(Vec::new());
    let report = run_bench(runtime(), &config, &|r| seen.lock().unwrap().push(r.bytes)).unwrap();
    assert_eq!(*seen.lock().unwrap(), [8, 4096, 1 << 20]);
    assert_eq!(report.devices, [0]);
    assert!(
        report
            .results
            .iter()
            .all(|r| r.transport == "nccl" && r.time_us >= 0.0)
    );
    let o = report.overhead.expect("overhead measured");
    assert!(o.raw_ns > 0.0 && o.hypercomm_ns > 0.0, "{o:?}");
    let two = DeviceBenchConfig { ranks: 2, ..config };
    let e = run_bench(runtime(), &two, &|_| {}).err().unwrap();
    assert!(e.to_string().contains("nccl >= 2.30.0"), "{e}");
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
            .wait(comm.stream())
            .unwrap();
        let pair = comm
            .all_gather_into(pair.0, pair.1)
            .unwrap()
            .wait(comm.stream())
            .unwrap();
        (buf, pair)
    };
    // The first use of each buffer on the stream orders it after its upload (through cudarc's events).
    (buf, pair) = step(buf, pair);
    eprintln!("fake-test: counting");
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
            .wait(comm.stream())
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
    comm.stream().synchronize().unwrap();
    comm.check()
        .expect("no collective touched memory that was already released");
}
