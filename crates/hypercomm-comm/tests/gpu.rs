//! Device-backend tests that need a GPU, a CUDA 13 driver and NCCL. Without them each test prints why it skips
//! and passes, so this target runs everywhere; on the GPU machine it is the validation run described in
//! `docs/gpu-validation.md` (run with `--nocapture` to see the skips and `NCCL_DEBUG=INFO` for the knobs).
//!
//! With `HYPERCOMM_REQUIRE_GPU=1` (which `scripts/gpu-validation.sh` sets) a GPU run cannot pass by skipping:
//! every skip is a failure that says what was missing. A GPU that the probe finds but that cannot be opened is a
//! failure in any case.
//!
//! Also here: compiling the kernels with NVRTC through cudarc, which needs only libnvrtc (no GPU).

mod fake_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use hypercomm_comm::device::{
    DeviceCommunicator, DeviceRuntime, Gpu, Placed, ProcessGroup, StridedLayout,
};
use hypercomm_comm::{CommError, CommOptions, NcclOptions, ReduceOp};
use hypercomm_store::{MemoryStore, Store};
use nccl_sys::SearchConfig;

/// Whether this run must not skip (`HYPERCOMM_REQUIRE_GPU=1`).
fn gpu_required() -> bool {
    std::env::var("HYPERCOMM_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// Says why `test` skips, or fails it when the run requires a GPU.
fn skip(test: &str, why: impl std::fmt::Display) {
    assert!(
        !gpu_required(),
        "{test}: HYPERCOMM_REQUIRE_GPU=1, but the test would skip: {why}"
    );
    eprintln!("{test}: skipping: {why}");
}

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
            // The probe found a device: failing to open it is a failure, not a reason to skip.
            Some(Gpu::open(rt, 0).unwrap_or_else(|e| panic!("{test}: opening gpu 0: {e}")))
        }
        Err(e) => {
            assert!(matches!(e, CommError::Unavailable { .. }), "{e:?}");
            skip(test, e);
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
        skip(
            "nvrtc",
            "libnvrtc not found (put libnvrtc.so.13's folder on LD_LIBRARY_PATH)",
        );
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
    // Two communicators over the same rank, as an all-gather group and its twin: each has its own stream, so an
    // all-gather on one and a reduce-scatter on the other run at the same time. Timing events recorded on each
    // stream right before and after its operation show the two intervals intersect; were the operations
    // serialised (one stream, or one made to wait for the other), they would not.
    let a = single(&gpu, "ag", CommOptions::named("x"));
    let b = single(&gpu, "rs", CommOptions::named("x"));
    assert_ne!(a.stream().cu_stream(), b.stream().cu_stream());
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
    origin.record(a.stream()).unwrap();
    b.stream().wait(&origin).unwrap();
    start_a.record(a.stream()).unwrap();
    let w1 = a.all_gather_into(i1, o1).unwrap();
    end_a.record(a.stream()).unwrap();
    start_b.record(b.stream()).unwrap();
    let w2 = b.reduce_scatter_into(i2, o2, ReduceOp::Sum).unwrap();
    end_b.record(b.stream()).unwrap();
    w1.synchronize().unwrap();
    w2.synchronize().unwrap();
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
            .wait(&other)
            .unwrap();
        assert!(
            output.download().unwrap() == host,
            "round {round}: the download ran before the all-gather"
        );
    }
}

/// Two device handles for a two-rank communicator: two GPUs, or one GPU twice where NCCL allows several ranks on
/// one device (2.30 or newer with `NCCL_MULTI_RANK_GPU_ENABLE=1`). `None`, after saying why, otherwise.
fn two_ranks_or_skip(test: &str) -> Option<[Arc<Gpu>; 2]> {
    let gpu = gpu_or_skip(test)?;
    let runtime = Arc::clone(gpu.runtime());
    if runtime.device_count() >= 2 {
        return Some([gpu, Gpu::open(runtime, 1).unwrap()]);
    }
    let version = runtime.nccl().version();
    let enabled = std::env::var("NCCL_MULTI_RANK_GPU_ENABLE").is_ok_and(|v| v == "1");
    if version >= nccl_sys::Version::new(2, 30, 0) && enabled {
        return Some([Arc::clone(&gpu), gpu]);
    }
    skip(
        test,
        format!(
            "two ranks need two GPUs, or one GPU with NCCL >= 2.30 and NCCL_MULTI_RANK_GPU_ENABLE=1 (found {} \
             device(s), nccl {version}, NCCL_MULTI_RANK_GPU_ENABLE {})",
            runtime.device_count(),
            if enabled { "set" } else { "unset" }
        ),
    );
    None
}

#[test]
fn two_ranks_run_every_collective() {
    let Some(gpus) = two_ranks_or_skip("two ranks") else {
        return;
    };
    let store = Arc::new(MemoryStore::new());
    let m = 1000usize;
    let value = |x: usize| x as f32;
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..2)
            .map(|r| {
                let gpu = Arc::clone(&gpus[r]);
                let store = Arc::clone(&store);
                scope.spawn(move || {
                    let comm = DeviceCommunicator::new(
                        Arc::clone(&gpu),
                        store,
                        vec![0, 1],
                        r,
                        CommOptions {
                            timeout: Duration::from_secs(60),
                            ..CommOptions::named("pair")
                        },
                    )
                    .unwrap();
                    let up = |v: Vec<f32>| gpu.upload(&v).unwrap();
                    // all_reduce: (i % 61) + r summed over both ranks.
                    let buf = up((0..m).map(|i| value(i % 61 + r)).collect());
                    let buf = comm
                        .all_reduce(buf, ReduceOp::Sum)
                        .unwrap()
                        .synchronize()
                        .unwrap();
                    let want: Vec<f32> = (0..m).map(|i| value(2 * (i % 61) + 1)).collect();
                    assert_eq!(buf.download().unwrap(), want, "all_reduce on rank {r}");
                    // broadcast from rank 1.
                    let buf = up((0..m).map(|i| value(i + 7 * r)).collect());
                    let buf = comm.broadcast(buf, 1).unwrap().synchronize().unwrap();
                    let want: Vec<f32> = (0..m).map(|i| value(i + 7)).collect();
                    assert_eq!(buf.download().unwrap(), want, "broadcast on rank {r}");
                    // all_gather: rank p contributes p * 1000 + i.
                    let input = up((0..m).map(|i| value(r * 1000 + i)).collect());
                    let output = gpu.alloc_zeros::<f32>(2 * m).unwrap();
                    let (_, out) = comm
                        .all_gather_into(input, output)
                        .unwrap()
                        .synchronize()
                        .unwrap();
                    let want: Vec<f32> =
                        (0..2 * m).map(|j| value((j / m) * 1000 + j % m)).collect();
                    assert_eq!(out.download().unwrap(), want, "all_gather on rank {r}");
                    // reduce_scatter: block b of rank p holds p + 10 * b + i; rank r receives block r summed.
                    let input = up((0..2 * m)
                        .map(|j| value(r + 10 * (j / m) + j % m))
                        .collect());
                    let output = gpu.alloc_zeros::<f32>(m).unwrap();
                    let (_, out) = comm
                        .reduce_scatter_into(input, output, ReduceOp::Sum)
                        .unwrap()
                        .synchronize()
                        .unwrap();
                    let want: Vec<f32> = (0..m).map(|i| value(1 + 2 * (10 * r + i))).collect();
                    assert_eq!(out.download().unwrap(), want, "reduce_scatter on rank {r}");
                    // all_to_all: block p of rank q holds 100 q + 10 p + i; rank r's block p comes from rank p.
                    let input = up((0..2 * m)
                        .map(|j| value(100 * r + 10 * (j / m) + j % m))
                        .collect());
                    let output = gpu.alloc_zeros::<f32>(2 * m).unwrap();
                    let (_, out) = comm
                        .all_to_all_into(input, output)
                        .unwrap()
                        .synchronize()
                        .unwrap();
                    let want: Vec<f32> = (0..2 * m)
                        .map(|j| value(100 * (j / m) + 10 * r + j % m))
                        .collect();
                    assert_eq!(out.download().unwrap(), want, "all_to_all on rank {r}");
                    // send / recv: rank 0 sends its pattern to rank 1.
                    if r == 0 {
                        let buf = up((0..m).map(|i| value(3 * i)).collect());
                        let _ = comm.send(buf, 1).unwrap().synchronize().unwrap();
                    } else {
                        let buf = gpu.alloc_zeros::<f32>(m).unwrap();
                        let buf = comm.recv(buf, 0).unwrap().synchronize().unwrap();
                        let want: Vec<f32> = (0..m).map(|i| value(3 * i)).collect();
                        assert_eq!(buf.download().unwrap(), want, "recv on rank 1");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("a rank failed; its message is above");
        }
    });
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

#[test]
fn a_process_group_runs_host_buffers_on_the_host_and_device_buffers_on_nccl() {
    let Some(gpu) = gpu_or_skip("process group") else {
        return;
    };
    let pg = ProcessGroup::connect(
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
    assert_eq!(pg.device().map(|d| d.name()), Some("pg/device"));
    let host = pg
        .all_reduce(Placed::Host(vec![1.5f32, 2.5]), ReduceOp::Sum)
        .unwrap()
        .synchronize()
        .unwrap();
    assert!(matches!(host, Placed::Host(v) if v == [1.5, 2.5]));
    let dev = gpu.upload(&[4i32, 5, 6]).unwrap();
    let out = pg
        .all_reduce(Placed::Device(dev), ReduceOp::Max)
        .unwrap()
        .synchronize()
        .unwrap();
    let Placed::Device(dev) = out else {
        panic!("a device buffer came back on the host");
    };
    assert_eq!(dev.download().unwrap(), [4, 5, 6]);
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
        let buf = comm
            .all_reduce(gpu.upload(&[3.0f32, 4.0]).unwrap(), ReduceOp::Sum)
            .unwrap()
            .synchronize()
            .unwrap();
        assert_eq!(buf.download().unwrap(), [3.0, 4.0], "{lo:?}/{hi:?}");
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
        let buf = child
            .all_reduce(gpu.upload(&[round as i32; 5]).unwrap(), ReduceOp::Max)
            .unwrap()
            .synchronize()
            .unwrap();
        assert_eq!(buf.download().unwrap(), [round as i32; 5]);
    }
    assert!(parent.split(None, 0).unwrap().is_none());
    if parent
        .gpu()
        .runtime()
        .nccl()
        .require(nccl_sys::Function::CommShrink)
        .is_err()
    {
        skip(
            "non-blocking shrink",
            "ncclCommShrink needs NCCL 2.27 or newer",
        );
        return;
    }
    let shrunk = parent.shrink(&[], false).unwrap();
    let buf = shrunk
        .all_reduce(gpu.upload(&[2.5f64]).unwrap(), ReduceOp::Sum)
        .unwrap()
        .synchronize()
        .unwrap();
    assert_eq!(buf.download().unwrap(), [2.5]);
}

#[test]
fn a_rank_that_never_joins_is_a_timeout_that_aborts() {
    // A two-rank communicator whose second rank never comes: creation must end in a timeout naming the
    // communicator (after aborting it), not hang. Runs on one GPU with any NCCL, since rank 1 never runs.
    let Some(gpu) = gpu_or_skip("never joins") else {
        return;
    };
    let started = Instant::now();
    let e = DeviceCommunicator::new(
        gpu,
        Arc::new(MemoryStore::new()),
        vec![0, 1],
        0,
        CommOptions {
            timeout: Duration::from_secs(10),
            ..CommOptions::named("lonely")
        },
    )
    .expect_err("rank 1 never joins");
    eprintln!("never joins: {e} after {:?}", started.elapsed());
    assert!(matches!(e, CommError::Timeout { .. }), "{e}");
    assert!(started.elapsed() < Duration::from_secs(60));
}

/// Runs `f(rank, gpu, store)` for two ranks on threads (see [`two_ranks_or_skip`]).
fn on_two_ranks(test: &str, f: impl Fn(usize, Arc<Gpu>, Arc<dyn Store>) + Sync) {
    let Some(gpus) = two_ranks_or_skip(test) else {
        return;
    };
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..2)
            .map(|r| {
                let (gpu, store, f) = (Arc::clone(&gpus[r]), Arc::clone(&store), &f);
                scope.spawn(move || f(r, gpu, store))
            })
            .collect();
        for t in threads {
            t.join().expect("a rank failed; its message is above");
        }
    });
}

fn pair(gpu: &Arc<Gpu>, store: &Arc<dyn Store>, rank: usize, name: &str) -> DeviceCommunicator {
    DeviceCommunicator::new(
        Arc::clone(gpu),
        Arc::clone(store),
        vec![0, 1],
        rank,
        CommOptions {
            timeout: Duration::from_secs(60),
            ..CommOptions::named(name)
        },
    )
    .unwrap()
}

#[test]
fn two_ranks_overlap_all_gather_and_reduce_scatter_on_twin_communicators() {
    // As Megatron's dp_cp and dp_cp_ag: the ranks issue the two operations in opposite orders. On one
    // communicator (one stream) that deadlocks; on twins each stream progresses on its own.
    on_two_ranks("two-rank overlap", |rank, gpu, store| {
        let dp = pair(&gpu, &store, rank, "dp_cp");
        let ag = pair(&gpu, &store, rank, "dp_cp_ag");
        // First in the same order on both ranks. NCCL (2.22 and later) connects a communicator's peers on its
        // first collective, whose enqueue settles only when every rank has reached it, and an enqueue returns only
        // once settled: opposite first operations leave each rank waiting in its first enqueue for the other,
        // until the timeout (seen on an H100 with NCCL 2.30.7, 2026-11-23).
        ag.all_gather_into(
            gpu.upload(&[0f32]).unwrap(),
            gpu.alloc_zeros::<f32>(2).unwrap(),
        )
        .unwrap()
        .synchronize()
        .unwrap();
        dp.reduce_scatter_into(
            gpu.upload(&[0f32; 2]).unwrap(),
            gpu.alloc_zeros::<f32>(1).unwrap(),
            ReduceOp::Sum,
        )
        .unwrap()
        .synchronize()
        .unwrap();
        let n = 1 << 20;
        for round in 0..10 {
            let shard = vec![(rank * 10 + round) as f32; n];
            let grads: Vec<f32> = (0..2 * n)
                .map(|i| ((i % 7) + rank + round) as f32)
                .collect();
            let gather = || {
                ag.all_gather_into(gpu.upload(&shard).unwrap(), gpu.alloc_zeros(2 * n).unwrap())
                    .unwrap()
            };
            let scatter = || {
                dp.reduce_scatter_into(
                    gpu.upload(&grads).unwrap(),
                    gpu.alloc_zeros(n).unwrap(),
                    ReduceOp::Sum,
                )
                .unwrap()
            };
            let (g, s) = if rank == 0 {
                let g = gather();
                (g, scatter())
            } else {
                let s = scatter();
                (gather(), s)
            };
            let (_, gathered) = g.synchronize().unwrap();
            let (_, reduced) = s.synchronize().unwrap();
            let gathered = gathered.download().unwrap();
            assert!(gathered[..n].iter().all(|&v| v == round as f32));
            assert!(gathered[n..].iter().all(|&v| v == (10 + round) as f32));
            let want: Vec<f32> = (0..n)
                .map(|j| {
                    (0..2)
                        .map(|r| (((rank * n + j) % 7) + r + round) as f32)
                        .sum()
                })
                .collect();
            assert!(reduced.download().unwrap() == want, "round {round}");
        }
    });
}

#[test]
fn two_ranks_split_a_nonblocking_communicator() {
    on_two_ranks("two-rank split", |rank, gpu, store| {
        let parent = pair(&gpu, &store, rank, "parent");
        // Both ranks in one child, the order reversed by key.
        let child = parent
            .split(Some(1), -(rank as i64))
            .unwrap()
            .expect("color 1");
        assert_eq!((child.size(), child.rank()), (2, 1 - rank));
        let (_, all) = child
            .all_gather_into(
                gpu.upload(&[rank as u32]).unwrap(),
                gpu.alloc_zeros(2).unwrap(),
            )
            .unwrap()
            .synchronize()
            .unwrap();
        assert_eq!(all.download().unwrap(), [1, 0]);
    });
}

#[test]
fn two_ranks_one_that_never_calls_is_a_timeout_that_aborts() {
    on_two_ranks("two-rank timeout", |rank, gpu, store| {
        let comm = DeviceCommunicator::new(
            Arc::clone(&gpu),
            store,
            vec![0, 1],
            rank,
            CommOptions {
                timeout: Duration::from_secs(5),
                ..CommOptions::named("stuck")
            },
        )
        .unwrap();
        if rank == 0 {
            let started = Instant::now();
            // The timeout comes from the enqueue itself where NCCL connects the peers on the first collective
            // (2.22 and later): it settles only when rank 1 arrives. From the wait otherwise.
            let e = comm
                .all_reduce(gpu.upload(&[1.0f32; 1024]).unwrap(), ReduceOp::Sum)
                .and_then(|work| work.synchronize())
                .expect_err("rank 1 never calls");
            eprintln!("two-rank timeout: {e} after {:?}", started.elapsed());
            assert!(matches!(e, CommError::Timeout { .. }), "{e}");
            assert!(comm.broken().is_some());
        }
        // Rank 1 keeps its communicator until rank 0 has given up, then drops it (rank 0's aborted).
        std::thread::sleep(Duration::from_secs(if rank == 1 { 8 } else { 0 }));
    });
}

/// Every group of `pgc` this rank is in: its NCCL communicator's members are the layout's, and an all-reduce of
/// the global rank sums over them.
fn check_device_collection(
    pgc: &process_group_collection::ProcessGroupCollection,
    gpu: &Arc<Gpu>,
    rank: usize,
) -> usize {
    let mut checked = 0;
    for id in pgc.groups().cloned().collect::<Vec<_>>() {
        let Ok(m) = pgc.membership(&id) else { continue };
        let device = pgc.device(&id).unwrap();
        assert_eq!(device.ranks(), m.members, "{id}");
        let buf = device
            .all_reduce(gpu.upload(&[rank as f32; 256]).unwrap(), ReduceOp::Sum)
            .unwrap()
            .synchronize()
            .unwrap();
        let want = m.members.iter().sum::<usize>() as f32;
        assert!(buf.download().unwrap().iter().all(|&v| v == want), "{id}");
        checked += 1;
    }
    checked
}

#[test]
fn a_collection_with_a_gpu_gives_every_group_an_nccl_communicator() {
    // One rank: every kind of a one-rank layout (and the all-gather twin), with per-kind knobs; any NCCL.
    let Some(gpu) = gpu_or_skip("device collection") else {
        return;
    };
    let layout = hypercomm_grid::layout::LayoutConfig::new(1)
        .build()
        .unwrap();
    let options = process_group_collection::GroupOptions::from_json(
        r#"{"tp": {"max_ctas": 4}, "dp_cp": {"high_priority_stream": true}}"#,
    )
    .unwrap();
    let pgc = process_group_collection::ProcessGroupCollection::for_layout("one", layout)
        .with_all_gather_groups(true)
        .with_options(options)
        .with_timeout(Duration::from_secs(60))
        .with_gpu(Arc::clone(&gpu))
        .build(0, Arc::new(MemoryStore::new()))
        .unwrap();
    let checked = check_device_collection(&pgc, &gpu, 0);
    assert!(checked >= 15, "{checked} groups");
}

#[test]
fn two_ranks_build_a_device_collection_both_ways() {
    on_two_ranks("two-rank device collection", |rank, gpu, store| {
        let layout = || {
            hypercomm_grid::layout::LayoutConfig::new(2)
                .tp(2)
                .build()
                .unwrap()
        };
        let build = || {
            process_group_collection::ProcessGroupCollection::for_layout("pair", layout())
                .with_all_gather_groups(true)
                .with_timeout(Duration::from_secs(60))
                .with_gpu(Arc::clone(&gpu))
        };
        let pgc = build().build(rank, Arc::clone(&store)).unwrap();
        assert!(check_device_collection(&pgc, &gpu, rank) >= 15);
        drop(pgc);
        let world = ProcessGroup::connect(
            Some(Arc::clone(&gpu)),
            store,
            vec![0, 1],
            rank,
            CommOptions {
                timeout: Duration::from_secs(60),
                ..CommOptions::named("world")
            },
        )
        .unwrap();
        let by_split =
            process_group_collection::ProcessGroupCollection::for_layout("split", layout())
                .with_all_gather_groups(true)
                .with_timeout(Duration::from_secs(60))
                .with_gpu(Arc::clone(&gpu))
                .build_by_split_group(&world)
                .unwrap();
        assert!(check_device_collection(&by_split, &gpu, rank) >= 15);
    });
}

/// The tests of this binary that need kernels, which the fake GPU cannot run (it has no NVRTC or PTX loader).
const NEEDS_KERNELS: [&str; 2] = [
    "kernels_compile_with_nvrtc_when_present",
    "strided_views_and_fill_verify_kernels",
];

#[test]
fn the_gpu_tests_pass_under_the_fake_gpu() {
    // Every test above, run again in a child process under fake-gpu with two fake devices and
    // HYPERCOMM_REQUIRE_GPU=1, so no test can pass by skipping: the tests' own logic is checked in CI before a
    // GPU run spends its time on them. (On the GPU machine the fake is not bundled, and this says so.)
    if std::env::var_os(fake_support::UNDER_FAKE).is_some() {
        return;
    }
    let lib = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("libfake_gpu.so")));
    if !lib.is_some_and(|l| l.exists()) {
        eprintln!(
            "under the fake gpu: libfake_gpu.so is not beside this binary (a bundle): nothing to run"
        );
        return;
    }
    let dir = fake_support::FakeDir::new("gpu-tests");
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    fake_support::with_fake_env(
        &mut cmd,
        &dir,
        &[
            ("FAKE_GPU_DEVICES", "2"),
            ("FAKE_NCCL_TIMEOUT_SECS", "20"),
            ("HYPERCOMM_REQUIRE_GPU", "1"),
        ],
    );
    // The whole binary, less what needs kernels and this test itself.
    cmd.args([
        "--test-threads=1",
        "--skip",
        "the_gpu_tests_pass_under_the_fake_gpu",
    ]);
    for t in NEEDS_KERNELS {
        cmd.args(["--skip", t]);
    }
    let out = cmd.output().expect("run this binary again");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("0 failed"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("test two_ranks_run_every_collective ... ok"),
        "{stdout}"
    );
}
