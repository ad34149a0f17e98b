//! Device-backend tests that need a GPU, a CUDA 13 driver and NCCL. Without them each test prints why it skips
//! and passes, so this target runs everywhere; on the GPU machine it is the validation run described in
//! `docs/gpu-validation.md` (run with `--nocapture` to see the skips and `NCCL_DEBUG=INFO` for the knobs).
//!
//! Also here: compiling the kernels with NVRTC through cudarc, which needs only libnvrtc (no GPU).

use std::sync::Arc;
use std::time::Duration;

use hypercomm_comm::device::{DeviceCommunicator, DeviceRuntime, Gpu, StridedLayout};
use hypercomm_comm::{CommError, CommOptions, ReduceOp};
use hypercomm_store::MemoryStore;
use nccl_sys::SearchConfig;

fn gpu_or_skip(test: &str) -> Option<Arc<Gpu>> {
    // Reads (never writes) the process environment: this is about the machine's real setup.
    match DeviceRuntime::probe(&SearchConfig::from_env(|n| std::env::var_os(n))) {
        Ok(rt) => {
            eprintln!(
                "{test}: nccl {} from {}, driver {:?}",
                rt.nccl().version(),
                rt.nccl().origin(),
                rt.driver()
            );
            match Gpu::open(rt, 0) {
                Ok(g) => Some(g),
                Err(e) => {
                    eprintln!("{test}: skipping: {e}");
                    None
                }
            }
        }
        Err(e) => {
            assert!(matches!(e, CommError::Unavailable { .. }), "{e:?}");
            eprintln!("{test}: skipping: {e}");
            None
        }
    }
}

fn single(gpu: &Arc<Gpu>, name: &str, options: CommOptions) -> DeviceCommunicator {
    let options = CommOptions {
        name: name.into(),
        timeout: Duration::from_secs(60),
        ..options
    };
    DeviceCommunicator::new(
        Arc::clone(gpu),
        Arc::new(MemoryStore::new()),
        vec![0],
        0,
        options,
    )
    .unwrap()
}

#[test]
fn kernels_compile_with_nvrtc_when_present() {
    // SAFETY: only tries to dlopen libnvrtc; nothing is called unless it opens.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        eprintln!("skipping: libnvrtc not found (put libnvrtc.so.13's folder on LD_LIBRARY_PATH)");
        return;
    }
    for source in hypercomm_kernels::ALL {
        let opts = cudarc::nvrtc::CompileOptions {
            options: vec!["--gpu-architecture=compute_90".into()],
            name: Some(source.name.into()),
            ..Default::default()
        };
        let ptx = cudarc::nvrtc::compile_ptx_with_opts(source.text, opts)
            .unwrap_or_else(|e| panic!("{} does not compile: {e:?}", source.name));
        let text = ptx.to_src();
        for k in source.kernels {
            assert!(
                text.contains(&format!(".entry {k}(")),
                "{} lacks {k}",
                source.name
            );
        }
    }
}

#[test]
fn probe_is_unavailable_not_a_panic_without_a_gpu() {
    let _ = gpu_or_skip("probe");
}

macro_rules! every_type {
    ($gpu:expr, $comm:expr, $($t:ty),*) => {$(
        {
            let data: Vec<$t> = (0..1000u32).map(|i| <$t>::from_f64_lossy(f64::from(i % 61))).collect();
            let buf = $gpu.upload(&data).unwrap();
            let buf = $comm.all_reduce(buf, ReduceOp::Sum).unwrap().synchronize().unwrap();
            assert_eq!(buf.download().unwrap(), data, "all_reduce {}", stringify!($t));
            let buf = $comm.broadcast(buf, 0).unwrap().synchronize().unwrap();
            let buf = $comm.reduce(buf, ReduceOp::Max, 0).unwrap().synchronize().unwrap();
            assert_eq!(buf.download().unwrap(), data, "broadcast/reduce {}", stringify!($t));
            let out = $gpu.alloc_zeros::<$t>(data.len()).unwrap();
            let (buf, out) = $comm.all_gather_into(buf, out).unwrap().synchronize().unwrap();
            assert_eq!(out.download().unwrap(), data, "all_gather {}", stringify!($t));
            let (_, out) = $comm.reduce_scatter_into(buf, out, ReduceOp::Sum).unwrap().synchronize().unwrap();
            assert_eq!(out.download().unwrap(), data, "reduce_scatter {}", stringify!($t));
            let fresh = $gpu.alloc_zeros::<$t>(data.len()).unwrap();
            let (_, all) = $comm.all_to_all_into(out, fresh).unwrap().synchronize().unwrap();
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
fn knobs_are_applied_and_split_works() {
    let Some(gpu) = gpu_or_skip("knobs") else {
        return;
    };
    let opts = CommOptions {
        high_priority_stream: Some(true),
        cga_cluster_size: Some(2),
        min_ctas: Some(2),
        max_ctas: Some(8),
        blocking: Some(false),
        split_share: Some(true),
        ..CommOptions::named("x")
    };
    let comm = single(&gpu, "knobs", opts);
    let child = comm.split(Some(0), 0).unwrap().expect("color 0 joins");
    assert_eq!(child.size(), 1);
    let buf = gpu.upload(&[1.0f32, 2.0]).unwrap();
    let buf = child
        .all_reduce(buf, ReduceOp::Avg)
        .unwrap()
        .synchronize()
        .unwrap();
    assert_eq!(buf.download().unwrap(), [1.0, 2.0]);
    assert!(comm.split(None, 0).unwrap().is_none());
}

#[test]
fn two_communicators_on_two_streams_overlap() {
    let Some(gpu) = gpu_or_skip("overlap") else {
        return;
    };
    let a = single(&gpu, "ag", CommOptions::named("x"));
    let b = single(&gpu, "rs", CommOptions::named("x"));
    let n = 64 << 20;
    let (i1, o1) = (
        gpu.alloc_zeros::<f32>(n).unwrap(),
        gpu.alloc_zeros::<f32>(n).unwrap(),
    );
    let (i2, o2) = (
        gpu.alloc_zeros::<f32>(n).unwrap(),
        gpu.alloc_zeros::<f32>(n).unwrap(),
    );
    let t = std::time::Instant::now();
    let w1 = a.all_gather_into(i1, o1).unwrap();
    let w2 = b.reduce_scatter_into(i2, o2, ReduceOp::Sum).unwrap();
    w1.synchronize().unwrap();
    w2.synchronize().unwrap();
    eprintln!(
        "overlap: both done in {:?} (compare with nsys for the overlap itself)",
        t.elapsed()
    );
}

#[test]
fn strided_views_and_fill_verify_kernels() {
    let Some(gpu) = gpu_or_skip("kernels") else {
        return;
    };
    let comm = single(&gpu, "strided", CommOptions::named("x"));
    let mut buf = gpu.alloc_zeros::<i32>(4000).unwrap();
    comm.fill_pattern(&mut buf, 1, 3).unwrap();
    assert_eq!(comm.verify_pattern(&buf, 1, 3).unwrap(), (0, None));
    let (bad, first) = comm.verify_pattern(&buf, 1, 4).unwrap();
    assert_eq!((bad, first), (4000, Some(0)));
    // Columns 1..4 of a 100 x 40 matrix: reduced through staging, written back into the view only.
    let host: Vec<f32> = (0..4000).map(|i| i as f32).collect();
    let view = StridedLayout::new(1, 100, 3, 40).unwrap();
    let dev = gpu.upload(&host).unwrap();
    let dev = comm
        .all_reduce_strided(dev, view, ReduceOp::Sum)
        .unwrap()
        .synchronize()
        .unwrap();
    assert_eq!(
        dev.download().unwrap(),
        host,
        "single rank: the view is unchanged, nothing else touched"
    );
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
    assert!(matches!(work.synchronize(), Err(CommError::Broken { .. })));
    let again = gpu.alloc_zeros::<f32>(4).unwrap();
    assert!(matches!(
        comm.all_reduce(again, ReduceOp::Sum),
        Err(CommError::Broken { .. })
    ));
}
