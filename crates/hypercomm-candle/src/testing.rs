//! Test support: ranks as threads of one process, each with a collection over a shared `MemoryStore`, and the
//! sample tensors the tests move between them.

use std::sync::Arc;
use std::time::Duration;

use candle_core::{DType, Device, Tensor};
use hypercomm_grid::layout::LayoutConfig;
use hypercomm_store::{MemoryStore, Store};
use process_group_collection::{GroupOptions, ProcessGroupCollection};

use crate::TensorGroup;

/// Runs `f(rank, collection)` on `world` threads, each with its rank's collection over a Megatron layout with
/// `tp` (dp = world / tp; tp varies fastest, so the tp groups are `{0, 1}, {2, 3}, ..`), and returns the results
/// in rank order.
pub(crate) fn run_ranks<R: Send + 'static>(
    world: usize,
    tp: usize,
    f: impl Fn(usize, Arc<ProcessGroupCollection>) -> R + Send + Sync + 'static,
) -> Vec<R> {
    run_ranks_with(world, tp, GroupOptions::new(), f)
}

/// [`run_ranks`] with per-kind group options (as a user's options file gives them).
pub(crate) fn run_ranks_with<R: Send + 'static>(
    world: usize,
    tp: usize,
    options: GroupOptions,
    f: impl Fn(usize, Arc<ProcessGroupCollection>) -> R + Send + Sync + 'static,
) -> Vec<R> {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let f = Arc::new(f);
    let threads: Vec<_> = (0..world)
        .map(|rank| {
            let store = Arc::clone(&store);
            let f = Arc::clone(&f);
            let options = options.clone();
            std::thread::spawn(move || {
                let layout = LayoutConfig::new(world).tp(tp).build().expect("layout");
                let pgc = ProcessGroupCollection::for_layout("t", layout)
                    .with_timeout(Duration::from_secs(30))
                    .with_options(options)
                    .build(rank, store)
                    .expect("collection");
                f(rank, Arc::new(pgc))
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|t| t.join().expect("rank thread panicked"))
        .collect()
}

/// 4 ranks in one group (`tp_dp_cp` of a tp 2 layout holds every rank, in rank order): `f(rank, group)` on each.
pub(crate) fn on_world(f: impl Fn(usize, TensorGroup) + Send + Sync + 'static) {
    run_ranks(4, 2, move |rank, pgc| {
        let world = TensorGroup::kind(&pgc, "tp_dp_cp").expect("world group");
        assert_eq!(world.rank(), rank);
        f(rank, world);
    });
}

/// Rank `rank`'s sample: `100·rank + i` for element `i`, in `dtype`.
pub(crate) fn sample(rank: usize, dims: &[usize], dtype: DType) -> Tensor {
    let n: usize = dims.iter().product();
    let values: Vec<f64> = (0..n).map(|i| (100 * rank + i) as f64).collect();
    Tensor::from_vec(values, dims, &Device::Cpu)
        .and_then(|t| t.to_dtype(dtype))
        .expect("sample")
}

/// The elements of `t` in row-major order, as f64.
pub(crate) fn values(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64)
        .and_then(|t| t.flatten_all())
        .and_then(|t| t.to_vec1())
        .expect("values")
}

/// Rank `rank`'s F8E4M3 sample: element `i` has the bits `(i + 37·rank) mod 256`, so 256 elements hold every bit
/// pattern (both zeros, both NaNs, ±448 and the subnormals among them), each rank in its own order.
pub(crate) fn f8_sample(rank: usize, dims: &[usize]) -> Tensor {
    let n: usize = dims.iter().product();
    let elements: Vec<float8::F8E4M3> = (0..n)
        .map(|i| float8::F8E4M3::from_bits(((i + 37 * rank) % 256) as u8))
        .collect();
    Tensor::from_vec(elements, dims, &Device::Cpu).expect("f8 sample")
}

/// The bits of an F8E4M3 tensor's elements in row-major order: what moving it must keep exactly (a NaN compares
/// unequal to itself, and -0 equal to 0, so values would not do).
pub(crate) fn f8_bits(t: &Tensor) -> Vec<u8> {
    assert_eq!(t.dtype(), DType::F8E4M3);
    t.flatten_all()
        .and_then(|t| t.to_vec1::<float8::F8E4M3>())
        .expect("f8 elements")
        .into_iter()
        .map(|e| e.to_bits())
        .collect()
}
