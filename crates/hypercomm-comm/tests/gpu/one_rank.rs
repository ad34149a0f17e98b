//! One rank on one GPU: every collective on every element type, a premulsum's scaling, the knobs, splits and
//! shrinks of a non-blocking communicator, twin communicators overlapping on their own streams, results reaching
//! other streams through buffer events, host and device buffers on one face, abort, and a peer that never joins.

use std::sync::Arc;
use std::time::Duration;

use hypercomm_comm::{CommError, CommOptions, Communicator, NcclOptions, ReduceOp};
use hypercomm_store::MemoryStore;

use crate::device_checks::{self, all_reduced};
use crate::fake_support::nccl;
use crate::{gpu_or_skip, single};

macro_rules! every_type {
    ($gpu:expr, $comm:expr, $($t:ty),*) => {$(
        {
            let data: Vec<$t> = (0..1000u32).map(|i| <$t>::from_f64_lossy(f64::from(i % 61))).collect();
            let buf = $gpu.upload(&data).unwrap();
            let buf = $comm.all_reduce(buf, ReduceOp::Sum).unwrap().wait().unwrap();
            assert_eq!(buf.download().unwrap(), data, "all_reduce {}", stringify!($t));
            let buf = $comm.broadcast(buf, 0).unwrap().wait().unwrap();
            let buf = $comm.reduce(buf, ReduceOp::Max, 0).unwrap().wait().unwrap();
            assert_eq!(buf.download().unwrap(), data, "broadcast/reduce {}", stringify!($t));
            let out = $gpu.alloc_zeros::<$t>(data.len()).unwrap();
            let (buf, out) = $comm.all_gather_into(buf, out).unwrap().wait().unwrap();
            assert_eq!(out.download().unwrap(), data, "all_gather {}", stringify!($t));
            let (_, out) = $comm.reduce_scatter_into(buf, out, ReduceOp::Sum).unwrap().wait().unwrap();
            assert_eq!(out.download().unwrap(), data, "reduce_scatter {}", stringify!($t));
            let fresh = $gpu.alloc_zeros::<$t>(data.len()).unwrap();
            let (_, all) = $comm.all_to_all_into(out, fresh).unwrap().wait().unwrap();
            assert_eq!(all.download().unwrap(), data, "all_to_all {}", stringify!($t));
        }
    )*};
}

/// Exact conversion of small integers into every element type.
trait FromSmall {
    fn from_f64_lossy(v: f64) -> Self;
}
macro_rules! from_small {
    ($($t:ty),*) => {$( impl FromSmall for $t { fn from_f64_lossy(v: f64) -> Self { v as $t } } )*};
}
from_small!(f32, f64, i8, u8, i32, i64, u32, u64);
impl FromSmall for half::f16 {
    fn from_f64_lossy(v: f64) -> Self {
        half::f16::from_f64(v)
    }
}
impl FromSmall for half::bf16 {
    fn from_f64_lossy(v: f64) -> Self {
        half::bf16::from_f64(v)
    }
}

#[test]
fn every_collective_and_type_on_a_single_rank() {
    let Some(gpu) = gpu_or_skip("collectives") else {
        return;
    };
    let comm = single(&gpu, "single", CommOptions::named("x"));
    every_type!(
        gpu,
        comm,
        f32,
        f64,
        half::f16,
        half::bf16,
        i8,
        u8,
        i32,
        i64,
        u32,
        u64
    );
    assert!(gpu.pooled_events() > 0, "events go back to the pool");
}

#[test]
fn premulsum_on_a_single_rank() {
    // NCCL runs a one-rank reduction as a copy, but a premulsum must still scale: the input times the factor.
    let Some(gpu) = gpu_or_skip("premulsum") else {
        return;
    };
    let comm = single(&gpu, "premulsum", CommOptions::named("x"));
    device_checks::pre_mul_sum::through_every_reduction(&comm, &gpu, 1000);
}

#[test]
fn knobs_are_applied_and_split_works() {
    let Some(gpu) = gpu_or_skip("knobs") else {
        return;
    };
    let opts = CommOptions {
        nccl: NcclOptions {
            high_priority_stream: Some(true),
            cga_cluster_size: Some(2),
            min_ctas: Some(2),
            max_ctas: Some(8),
            blocking: Some(false),
            split_share: Some(true),
            ..NcclOptions::default()
        },
        ..CommOptions::named("x")
    };
    let comm = single(&gpu, "knobs", opts);
    let child = comm.split(Some(0), 0).unwrap().expect("color 0 joins");
    assert_eq!(child.size(), 1);
    let buf = gpu.upload(&[1.0f32, 2.0]).unwrap();
    let buf = child
        .all_reduce(buf, ReduceOp::Avg)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(buf.download().unwrap(), [1.0, 2.0]);
    assert!(comm.split(None, 0).unwrap().is_none());
}

#[test]
fn two_communicators_on_two_streams_overlap() {
    let Some(gpu) = gpu_or_skip("overlap") else {
        return;
    };
    // Two communicators over the same rank, as an all-gather group and its twin: each has its own stream, so an
    // all-gather on one and a reduce-scatter on the other run at the same time. Timing events recorded on each
    // stream right before and after its operation show the two intervals intersect; were the operations
    // serialised (one stream, or one made to wait for the other), they would not.
    let a = single(&gpu, "ag", CommOptions::named("x"));
    let b = single(&gpu, "rs", CommOptions::named("x"));
    let (sa, sb) = (nccl(&a).stream(), nccl(&b).stream());
    assert_ne!(sa.cu_stream(), sb.cu_stream());
    let n = 64 << 20;
    let alloc = || gpu.alloc_zeros::<f32>(n).unwrap();
    let (i1, o1, i2, o2) = (alloc(), alloc(), alloc(), alloc());
    let timing = || {
        gpu.context()
            .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .unwrap()
    };
    let (origin, start_a, end_a, start_b, end_b) =
        (timing(), timing(), timing(), timing(), timing());
    origin.record(sa).unwrap();
    sb.wait(&origin).unwrap();
    start_a.record(sa).unwrap();
    let w1 = a.all_gather_into(i1, o1).unwrap();
    end_a.record(sa).unwrap();
    start_b.record(sb).unwrap();
    let w2 = b.reduce_scatter_into(i2, o2, ReduceOp::Sum).unwrap();
    end_b.record(sb).unwrap();
    w1.wait().unwrap();
    w2.wait().unwrap();
    let at = |e: &cudarc::driver::CudaEvent| origin.elapsed_ms(e).unwrap();
    let (sa, ea, sb, eb) = (at(&start_a), at(&end_a), at(&start_b), at(&end_b));
    eprintln!(
        "overlap: all_gather {sa:.3}..{ea:.3} ms, reduce_scatter {sb:.3}..{eb:.3} ms after the origin event"
    );
    assert!(ea > sa && eb > sb, "each operation takes time");
    assert!(
        sb < ea && sa < eb,
        "the operations did not overlap: all_gather {sa}..{ea} ms, reduce_scatter {sb}..{eb} ms"
    );
}

#[test]
fn results_reach_other_streams_through_buffer_events() {
    let Some(gpu) = gpu_or_skip("buffer events") else {
        return;
    };
    // The handle is waited on by an unrelated stream, never synchronised: the download (on the default stream)
    // must still see the all-gather's output, through the write event the operation recorded on the buffer.
    let comm = single(&gpu, "events", CommOptions::named("x"));
    let other = gpu.context().new_stream().unwrap();
    let n = 16 << 20;
    let host: Vec<f32> = (0..n).map(|i| (i % 61) as f32).collect();
    for round in 0..5 {
        let input = gpu.upload(&host).unwrap();
        let output = gpu.alloc_zeros::<f32>(n).unwrap();
        let (_, output) = comm
            .all_gather_into(input, output)
            .unwrap()
            .wait_on(&other)
            .unwrap();
        assert!(
            output.download().unwrap() == host,
            "round {round}: the download ran before the all-gather"
        );
    }
}

#[test]
fn abort_fails_pending_and_later_work() {
    let Some(gpu) = gpu_or_skip("abort") else {
        return;
    };
    let comm = single(&gpu, "abort", CommOptions::named("x"));
    let buf = gpu.alloc_zeros::<f32>(1 << 20).unwrap();
    let work = comm.all_reduce(buf, ReduceOp::Sum).unwrap();
    comm.abort();
    assert!(matches!(work.wait(), Err(CommError::Broken { .. })));
    let again = gpu.alloc_zeros::<f32>(4).unwrap();
    assert!(matches!(
        comm.all_reduce(again, ReduceOp::Sum),
        Err(CommError::Broken { .. })
    ));
}

#[test]
fn a_communicator_with_a_gpu_runs_host_buffers_on_the_host_and_device_buffers_on_nccl() {
    let Some(gpu) = gpu_or_skip("one face") else {
        return;
    };
    let comm = Communicator::connect(
        Some(Arc::clone(&gpu)),
        Arc::new(MemoryStore::new()),
        vec![0],
        0,
        CommOptions {
            timeout: Duration::from_secs(60),
            nccl: NcclOptions {
                min_ctas: Some(1),
                ..NcclOptions::default()
            },
            ..CommOptions::named("pg")
        },
    )
    .unwrap();
    assert_eq!(comm.nccl().map(|d| d.name()), Some("pg/device"));
    let work = comm.all_reduce(vec![1.5f32, 2.5], ReduceOp::Sum).unwrap();
    assert!(!work.is_device(), "a host vector ran on the device");
    assert_eq!(work.wait().unwrap(), [1.5, 2.5]);
    let dev = gpu.upload(&[4i32, 5, 6]).unwrap();
    let work = comm.all_reduce(dev, ReduceOp::Max).unwrap();
    assert!(work.is_device(), "a device buffer ran on the host");
    assert_eq!(work.wait().unwrap().download().unwrap(), [4, 5, 6]);
}

#[test]
fn one_cta_bound_creates_a_working_communicator() {
    // The H100 run of 2026-11-22: NCCL refused min_ctas alone ("Invalid config min/max channels attribute value
    // 1/-2147483648"). hypercomm now fills the other bound with NCCL's default.
    let Some(gpu) = gpu_or_skip("one cta bound") else {
        return;
    };
    for (lo, hi) in [(Some(1), None), (Some(4), None), (None, Some(2))] {
        let opts = CommOptions {
            nccl: NcclOptions {
                min_ctas: lo,
                max_ctas: hi,
                ..NcclOptions::default()
            },
            ..CommOptions::named("x")
        };
        let comm = single(&gpu, &format!("ctas-{lo:?}-{hi:?}"), opts);
        assert_eq!(
            all_reduced(&comm, &gpu, &[3.0f32, 4.0], ReduceOp::Sum),
            [3.0, 4.0],
            "{lo:?}/{hi:?}"
        );
    }
}

#[test]
fn split_and_shrink_of_a_nonblocking_communicator_give_working_children() {
    // The H100 run of 2026-11-22: a non-blocking parent's split returned no child, because NCCL writes the child
    // only when the split completes. Shrink takes the same path.
    let Some(gpu) = gpu_or_skip("non-blocking split") else {
        return;
    };
    let parent = single(
        &gpu,
        "nb-parent",
        CommOptions {
            nccl: NcclOptions {
                blocking: Some(false),
                ..NcclOptions::default()
            },
            ..CommOptions::named("x")
        },
    );
    for round in 0..3 {
        let child = parent
            .split(Some(round), 0)
            .unwrap()
            .expect("a color gives a child");
        assert_eq!(
            nccl(&child).name(),
            format!("nb-parent/split{round}/color{round}/device")
        );
        let data = [round as i32; 5];
        assert_eq!(all_reduced(&child, &gpu, &data, ReduceOp::Max), data);
    }
    assert!(parent.split(None, 0).unwrap().is_none());
    // The shrunk communicator gets a fresh NCCL communicator (not ncclCommShrink): any NCCL.
    let shrunk = parent.shrink(&[]).unwrap();
    assert_eq!(shrunk.name(), "nb-parent/shrink0");
    assert_eq!(nccl(&shrunk).name(), "nb-parent/shrink0/device");
    assert_eq!(all_reduced(&shrunk, &gpu, &[2.5f64], ReduceOp::Sum), [2.5]);
}

#[test]
fn a_rank_that_never_joins_is_a_timeout_that_aborts() {
    // A two-rank communicator whose second rank joins its host flavor (it has no gpu) but never its NCCL one:
    // creating the NCCL communicator must end in a timeout naming it (after aborting it), not hang. Runs on one
    // GPU with any NCCL, since rank 1 never runs NCCL.
    let Some(gpu) = gpu_or_skip("never joins") else {
        return;
    };
    device_checks::a_rank_that_never_joins_the_device(
        gpu,
        "lonely",
        Duration::from_secs(10),
        Duration::from_secs(60),
    );
}
