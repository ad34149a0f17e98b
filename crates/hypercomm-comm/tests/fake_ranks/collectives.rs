//! The collective matrix over three ranks: every element type under every reduction, every collective's data,
//! and the device operations the one face gained (the checks themselves in `device_checks`, shared with `tests/gpu`).

use std::sync::Arc;
use std::time::Duration;

use half::{bf16, f16};
use hypercomm_comm::device::Gpu;
use hypercomm_comm::{Communicator, Element, ReduceOp};

use crate::device_checks::{self, Counts, all_reduced};
use crate::fake_support::ranks;
use crate::join;

/// Small exact values: rank `r`, element `i`.
fn value(r: usize, i: usize) -> f64 {
    ((i % 5) + r + 1) as f64
}

trait Exact: Element + PartialEq + std::fmt::Debug {
    fn of(v: f64) -> Self;
}

macro_rules! exact {
    ($($t:ty),*) => {$( impl Exact for $t { fn of(v: f64) -> Self { v as $t } } )*};
}
exact!(f32, f64, i8, u8, i32, i64, u32, u64);
impl Exact for f16 {
    fn of(v: f64) -> Self {
        f16::from_f64(v)
    }
}
impl Exact for bf16 {
    fn of(v: f64) -> Self {
        bf16::from_f64(v)
    }
}

/// What NCCL's `op` gives over `n` ranks for element `i` (integer averages divide the sum, rounding down).
fn expected(op: ReduceOp, n: usize, i: usize, integer: bool) -> f64 {
    let vals: Vec<f64> = (0..n).map(|r| value(r, i)).collect();
    match op {
        ReduceOp::Sum => vals.iter().sum(),
        ReduceOp::Prod => vals.iter().product(),
        ReduceOp::Max => vals.iter().cloned().fold(f64::MIN, f64::max),
        ReduceOp::Min => vals.iter().cloned().fold(f64::MAX, f64::min),
        ReduceOp::Avg if integer => (vals.iter().sum::<f64>() / n as f64).floor(),
        ReduceOp::Avg => vals.iter().sum::<f64>() / n as f64,
        ReduceOp::PreMulSum(s) => vals.iter().map(|v| v * s.value()).sum(),
    }
}

fn check_type<T: Exact>(comm: &Communicator, gpu: &Arc<Gpu>, integer: bool) {
    let (n, r) = (comm.size(), comm.rank());
    // A factor every type holds, and for floats one that divides: both exact over these values.
    let factor = ReduceOp::pre_mul_sum(if integer { 3.0 } else { 0.25 });
    for op in ReduceOp::ALL.into_iter().chain([factor]) {
        let data: Vec<T> = (0..7).map(|i| T::of(value(r, i))).collect();
        let want: Vec<T> = (0..7).map(|i| T::of(expected(op, n, i, integer))).collect();
        assert_eq!(
            all_reduced(comm, gpu, &data, op),
            want,
            "{op:?} on {}",
            T::DTYPE
        );
    }
}

#[test]
#[ignore = "run under fake-gpu by suite_ranks_as_threads"]
fn fake_every_type_and_reduction_over_three_ranks() {
    ranks(3, |rank, gpu, store| {
        let comm = join(&gpu, &store, 3, rank, "types");
        check_type::<f32>(&comm, &gpu, false);
        check_type::<f64>(&comm, &gpu, false);
        check_type::<f16>(&comm, &gpu, false);
        check_type::<bf16>(&comm, &gpu, false);
        check_type::<i32>(&comm, &gpu, true);
        check_type::<u8>(&comm, &gpu, true);
        check_type::<i64>(&comm, &gpu, true);
        check_type::<u32>(&comm, &gpu, true);
    });
}

#[test]
#[ignore = "run under fake-gpu by suite_ranks_as_threads"]
fn fake_every_collective_moves_real_data() {
    ranks(3, |rank, gpu, store| {
        let comm = join(&gpu, &store, 3, rank, "moves");
        let mine: Vec<f32> = (0..4).map(|i| (10 * rank + i) as f32).collect();
        let of = |r: usize| -> Vec<f32> { (0..4).map(|i| (10 * r + i) as f32).collect() };
        // Broadcast from rank 1.
        let b = comm
            .broadcast(gpu.upload(&mine).unwrap(), 1)
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(b.download().unwrap(), of(1));
        // Reduce to rank 2: only the root's buffer changes.
        let b = comm
            .reduce(gpu.upload(&mine).unwrap(), ReduceOp::Sum, 2)
            .unwrap()
            .wait()
            .unwrap();
        let sum: Vec<f32> = (0..4).map(|i| (0..3).map(|r| of(r)[i]).sum()).collect();
        assert_eq!(
            b.download().unwrap(),
            if rank == 2 { sum.clone() } else { mine.clone() }
        );
        // All-gather: every rank's block, in rank order.
        let (_, all) = comm
            .all_gather_into(
                gpu.upload(&mine).unwrap(),
                gpu.alloc_zeros::<f32>(12).unwrap(),
            )
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(all.download().unwrap(), [of(0), of(1), of(2)].concat());
        // Reduce-scatter: block `rank` of the element-wise sum of every rank's 12 elements.
        let input: Vec<f32> = (0..12).map(|i| (rank * 100 + i) as f32).collect();
        let (_, out) = comm
            .reduce_scatter_into(
                gpu.upload(&input).unwrap(),
                gpu.alloc_zeros::<f32>(4).unwrap(),
                ReduceOp::Sum,
            )
            .unwrap()
            .wait()
            .unwrap();
        let want: Vec<f32> = (0..4)
            .map(|j| (0..3).map(|r| (r * 100 + rank * 4 + j) as f32).sum())
            .collect();
        assert_eq!(out.download().unwrap(), want);
        // All-to-all: block j of rank r goes to rank j, in place r.
        let input: Vec<i64> = (0..6).map(|i| (rank * 10 + i) as i64).collect();
        let (_, out) = comm
            .all_to_all_into(
                gpu.upload(&input).unwrap(),
                gpu.alloc_zeros::<i64>(6).unwrap(),
            )
            .unwrap()
            .wait()
            .unwrap();
        let want: Vec<i64> = (0..3)
            .flat_map(|r| (0..2).map(move |k| (r * 10 + rank * 2 + k) as i64))
            .collect();
        assert_eq!(out.download().unwrap(), want);
        // Send/receive along a chain 0 -> 1 -> 2 (ungrouped calls: each send waits for its receive).
        if rank > 0 {
            let got = comm
                .recv(gpu.alloc_zeros::<u32>(3).unwrap(), rank - 1, 0)
                .unwrap()
                .wait()
                .unwrap();
            assert_eq!(got.download().unwrap(), [rank as u32 - 1; 3]);
        }
        if rank < 2 {
            comm.send(gpu.upload(&[rank as u32; 3]).unwrap(), rank + 1, 0)
                .unwrap()
                .wait()
                .unwrap();
        }
    });
}

/// Runs `check` with each rank's part of the three-rank communicator `name`, rank `r` on fake device `r`.
fn on_three_ranks(name: &str, check: impl Fn(&Communicator, &Arc<Gpu>) + Sync) {
    ranks(3, |rank, gpu, store| {
        check(&join(&gpu, &store, 3, rank, name), &gpu)
    });
}

#[test]
#[ignore = "run under fake-gpu by suite_ranks_as_threads"]
fn fake_out_of_place_all_reduce_broadcast_and_reduce_on_device() {
    on_three_ranks("into", |comm, gpu| {
        device_checks::out_of_place_all_reduce_broadcast_and_reduce(comm, gpu, 6)
    });
}

#[test]
#[ignore = "run under fake-gpu by suite_ranks_as_threads"]
fn fake_in_place_all_gather_and_reduce_scatter_on_device() {
    on_three_ranks("in-place", |comm, gpu| {
        device_checks::in_place_all_gather_and_reduce_scatter(comm, gpu, 4)
    });
}

#[test]
#[ignore = "run under fake-gpu by suite_ranks_as_threads"]
fn fake_all_to_all_v_on_device_with_zero_counts() {
    // Round 0: rank s sends (s + 2d) % 3 elements to rank d: none to itself, one or two to the others. Round 1:
    // rank 2 sends and receives nothing (empty buffers, no NCCL call at all); ranks 0 and 1 send themselves and
    // each other one to four elements.
    let rounds: [Counts; 2] = [
        |s, d| (s + 2 * d) % 3,
        |s, d| if s == 2 || d == 2 { 0 } else { 1 + s + 2 * d },
    ];
    on_three_ranks("a2av", |comm, gpu| {
        device_checks::all_to_all_v_with_zero_counts(comm, gpu, &rounds)
    });
}

#[test]
#[ignore = "run under fake-gpu by suite_ranks_as_threads"]
fn fake_gather_and_scatter_on_device_from_every_root() {
    on_three_ranks("gather-scatter", |comm, gpu| {
        device_checks::gather_and_scatter_from_every_root(comm, gpu, 3)
    });
}

#[test]
#[ignore = "run under fake-gpu by suite_ranks_as_threads"]
fn fake_uneven_all_gather_and_reduce_scatter_on_device() {
    // Rank 1 contributes nothing; ranks 0 and 2 unequal blocks.
    on_three_ranks("uneven", |comm, gpu| {
        device_checks::uneven_all_gather_and_reduce_scatter(comm, gpu, |r| [3, 0, 7][r % 3])
    });
}

#[test]
#[ignore = "run under fake-gpu by suite_ranks_as_threads"]
fn fake_float8_moves_and_reduces_on_device() {
    on_three_ranks("float8", |comm, gpu| {
        device_checks::float8_moves_and_reduces(comm, gpu)
    });
}

#[test]
#[ignore = "run under fake-gpu by suite_ranks_as_threads"]
fn fake_a_barrier_waits_for_the_device_work_before_it() {
    on_three_ranks("barrier", |comm, gpu| {
        device_checks::barrier_orders_device_work(comm, gpu, 1 << 16, Duration::from_millis(300))
    });
}

#[test]
#[ignore = "run under fake-gpu by suite_ranks_as_threads"]
fn fake_what_nccl_cannot_run_is_refused_with_the_reason() {
    // Two ranks on devices 0 and 1 of three: a buffer on another device is one the machine has.
    ranks(2, |rank, gpu, store| {
        let comm = join(&gpu, &store, 2, rank, "refusals");
        device_checks::refusals(&comm, &gpu, &store, 2);
    });
}

#[test]
#[ignore = "run under fake-gpu by suite_ranks_as_threads"]
fn fake_premulsum_through_every_reducing_operation() {
    on_three_ranks("premulsum", |comm, gpu| {
        device_checks::pre_mul_sum::through_every_reduction(comm, gpu, 5)
    });
}

#[test]
#[ignore = "run under fake-gpu by suite_premulsum_operators_live_as_long_as_their_communicator"]
fn fake_premulsum_operators_are_created_once_and_released_with_the_communicator() {
    // Counted by the suite from the fake's trace: three operators a rank on the first communicator (f32 times a
    // quarter, f32 times a half, i32 times three), however often each is used, released when it is dropped; one on
    // the second, which is aborted (NCCL frees it with the communicator).
    on_three_ranks("premulsum-once", |comm, gpu| {
        let quarter = ReduceOp::pre_mul_sum(0.25);
        for _ in 0..3 {
            assert_eq!(all_reduced(comm, gpu, &[4.0f32], quarter), [3.0]);
        }
        let (_, out) = comm
            .reduce_scatter_into(
                gpu.upload(&[8.0f32; 3]).unwrap(),
                gpu.alloc_zeros::<f32>(1).unwrap(),
                quarter,
            )
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(out.download().unwrap(), [6.0]);
        let half = ReduceOp::pre_mul_sum(0.5);
        assert_eq!(all_reduced(comm, gpu, &[2.0f32], half), [3.0]);
        let three = ReduceOp::pre_mul_sum(3.0);
        assert_eq!(all_reduced(comm, gpu, &[1i32], three), [9]);
        assert_eq!(all_reduced(comm, gpu, &[1i32], three), [9]);
    });
    ranks(3, |rank, gpu, store| {
        let comm = join(&gpu, &store, 3, rank, "premulsum-aborted");
        let quarter = ReduceOp::pre_mul_sum(0.25);
        assert_eq!(all_reduced(&comm, &gpu, &[4.0f32], quarter), [3.0]);
        comm.abort();
    });
}
