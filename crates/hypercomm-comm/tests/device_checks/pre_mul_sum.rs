//! Premulsum on device buffers (NCCL's `ncclRedOpCreatePreMulSum`): every reducing operation against the
//! reference, on types whose results are exact, and a factor the type cannot hold refused before NCCL sees it.

use std::sync::Arc;

use half::bf16;
use hypercomm_comm::device::Gpu;
use hypercomm_comm::{CommError, Communicator, Element, ReduceOp};

use super::{done, on_device, refused, same};

/// Rank `r`'s element `i`: small whole numbers, so that a quarter of their sums is exact in every float type here.
fn value(r: usize, i: usize) -> f64 {
    ((i % 7) + r + 1) as f64
}

/// A type the check runs on, with its conversions from the exact reference values.
trait Exact: Element {
    fn of(v: f64) -> Self;
}

impl Exact for f32 {
    fn of(v: f64) -> Self {
        v as f32
    }
}

impl Exact for bf16 {
    fn of(v: f64) -> Self {
        bf16::from_f64(v)
    }
}

impl Exact for i32 {
    fn of(v: f64) -> Self {
        v as i32
    }
}

/// `factor` times the sum over ranks of element `i`.
fn scaled_sum(n: usize, i: usize, factor: f64) -> f64 {
    (0..n).map(|r| factor * value(r, i)).sum()
}

/// all_reduce, reduce_scatter in place and into one buffer, reduce_scatter_v with a rank that gets nothing, and
/// reduce to every root, each with `factor` on `T`, blocks of `m` elements.
fn every_reduction<T: Exact>(comm: &Communicator, gpu: &Arc<Gpu>, m: usize, factor: f64) {
    let (n, rank) = (comm.size(), comm.rank());
    let op = ReduceOp::pre_mul_sum(factor);
    let what = |name: &str| format!("{name} with {op} on {} at rank {rank}", T::DTYPE);
    let mine = |len: usize| -> Vec<T> { (0..len).map(|i| T::of(value(rank, i))).collect() };
    let want = |range: std::ops::Range<usize>| -> Vec<T> {
        range.map(|i| T::of(scaled_sum(n, i, factor))).collect()
    };
    let got = done(comm.all_reduce(on_device(gpu, &mine(m)), op));
    same(&got.download().unwrap(), &want(0..m), what("all_reduce"));
    // In place: block `rank` of the buffer receives the result, the others stay as they were.
    let got = done(comm.reduce_scatter(on_device(gpu, &mine(n * m)), op))
        .download()
        .unwrap();
    same(
        &got[rank * m..(rank + 1) * m],
        &want(rank * m..(rank + 1) * m),
        what("reduce_scatter"),
    );
    let (_, out) = done(comm.reduce_scatter_into(
        on_device(gpu, &mine(n * m)),
        gpu.alloc_zeros::<T>(m).unwrap(),
        op,
    ));
    same(
        &out.download().unwrap(),
        &want(rank * m..(rank + 1) * m),
        what("reduce_scatter_into"),
    );
    // Rank r gets r * m elements: rank 0 none.
    let counts: Vec<usize> = (0..n).map(|r| r * m).collect();
    let start: usize = counts[..rank].iter().sum();
    let (_, out) = done(comm.reduce_scatter_v(
        on_device(gpu, &mine(counts.iter().sum())),
        gpu.alloc_zeros::<T>(counts[rank]).unwrap(),
        counts.clone(),
        op,
    ));
    same(
        &out.download().unwrap(),
        &want(start..start + counts[rank]),
        what("reduce_scatter_v"),
    );
    for root in 0..n {
        let got = done(comm.reduce(on_device(gpu, &mine(m)), op, root))
            .download()
            .unwrap();
        let expect = if rank == root { want(0..m) } else { mine(m) };
        same(&got, &expect, what(&format!("reduce to {root}")));
    }
}

/// Premulsum on `comm`'s device buffers: a quarter on f32 and bf16 (sharded data parallelism's reduce-scatter
/// that divides while it sums), three on i32, each through every reducing operation with `m`-element blocks; the
/// same factor on two types and two factors on one type each get their own operator. A factor i32 cannot hold is
/// refused by the call, naming it, and the communicator goes on.
pub fn through_every_reduction(comm: &Communicator, gpu: &Arc<Gpu>, m: usize) {
    every_reduction::<f32>(comm, gpu, m, 0.25);
    every_reduction::<bf16>(comm, gpu, m, 0.25);
    every_reduction::<f32>(comm, gpu, m, -2.0);
    every_reduction::<i32>(comm, gpu, m, 3.0);
    let e = refused(
        comm.all_reduce(gpu.upload(&[1i32]).unwrap(), ReduceOp::pre_mul_sum(0.5)),
        "all_reduce of i32: premulsum factor 0.5 is not a whole number",
    );
    assert!(matches!(e, CommError::InvalidArgument { .. }), "{e}");
    let sum = done(comm.all_reduce(gpu.upload(&[2i32]).unwrap(), ReduceOp::Sum));
    assert_eq!(sum.download().unwrap(), [2 * comm.size() as i32]);
}
