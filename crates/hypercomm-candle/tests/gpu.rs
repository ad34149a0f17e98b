//! candle's CUDA tensors through NCCL on a real GPU (feature `cuda`): the tensor collectives, f8e4m3 tensors moved
//! bit for bit and reduced, and one data-parallel training step, each against the same computation on the CPU;
//! and a rank that never joins a tensor all-reduce or a gradient sync, which the others' GPU watchdog names
//! within the timeout instead of hanging.
//!
//! Without a GPU (or NCCL) every test says why it skips; with `HYPERCOMM_REQUIRE_GPU=1` a skip is a failure, so a
//! GPU run cannot pass by skipping. Two ranks run when the machine has two GPUs, or one GPU with NCCL 2.30 or
//! newer and `NCCL_MULTI_RANK_GPU_ENABLE=1`; otherwise one rank (the NCCL path all the same). The never-joins
//! tests need two ranks: with one possible they skip saying why, and under `HYPERCOMM_REQUIRE_GPU=1` they fail
//! instead, as the two-rank tests of hypercomm-comm's `gpu` binary do (run them with NCCL 2.30 or newer:
//! `scripts/gpu-validation.sh` given the 2.30.7 build sets `NCCL_MULTI_RANK_GPU_ENABLE=1`).

#[cfg(not(feature = "cuda"))]
#[test]
fn candle_cuda_tests_need_the_cuda_feature() {
    // A GPU run must build these tests with `--features cuda`; anywhere else they are skipped, and say so.
    assert!(
        std::env::var("HYPERCOMM_REQUIRE_GPU")
            .ok()
            .is_none_or(|v| v != "1"),
        "HYPERCOMM_REQUIRE_GPU=1, but this test binary was built without hypercomm-candle's feature `cuda`"
    );
    eprintln!(
        "candle cuda tests: skipping, built without the feature `cuda` (which builds candle's CUDA backend)"
    );
}

#[cfg(feature = "cuda")]
mod on_gpu {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    use candle_core::backprop::GradStore;
    use candle_core::{DType, Device, Tensor, Var};
    use candle_nn::{Linear, Module, Optimizer, SGD};
    use hypercomm_candle::{Error, GradSync, ReduceOp, TensorGroup, TensorP2p};
    use hypercomm_comm::CommError;
    use hypercomm_comm::device::{DeviceRuntime, Gpu};
    use hypercomm_grid::layout::LayoutConfig;
    use hypercomm_store::{MemoryStore, Store};
    use process_group_collection::ProcessGroupCollection;

    /// Whether this run must not skip (`HYPERCOMM_REQUIRE_GPU=1`).
    fn gpu_required() -> bool {
        std::env::var("HYPERCOMM_REQUIRE_GPU").is_ok_and(|v| v == "1")
    }

    /// How many ranks this machine can run, or `None` (after saying why) when it has no GPU or NCCL.
    fn ranks_or_skip(test: &str) -> Option<usize> {
        let why = match DeviceRuntime::probe_with_env(|n| std::env::var_os(n)) {
            Ok(rt) => {
                let multi = std::env::var("NCCL_MULTI_RANK_GPU_ENABLE").is_ok_and(|v| v == "1")
                    && rt.nccl().version() >= nccl_sys::Version::new(2, 30, 0);
                let ranks = if rt.device_count() >= 2 || multi {
                    2
                } else {
                    1
                };
                eprintln!(
                    "{test}: {ranks} rank(s), nccl {} on {} device(s)",
                    rt.nccl().version(),
                    rt.device_count()
                );
                return Some(ranks);
            }
            Err(e) => e.to_string(),
        };
        assert!(
            !gpu_required(),
            "{test}: HYPERCOMM_REQUIRE_GPU=1, but the test would skip: {why}"
        );
        eprintln!("{test}: skipping, no GPU: {why}");
        None
    }

    /// Whether this machine can run two ranks; says why not (a failure under `HYPERCOMM_REQUIRE_GPU=1`) when it
    /// cannot: a test that needs two ranks never passes a GPU run by skipping.
    fn two_ranks_or_skip(test: &str) -> bool {
        match ranks_or_skip(test) {
            None => false,
            Some(ranks) if ranks >= 2 => true,
            Some(ranks) => {
                let why = format!(
                    "it needs two ranks, and {ranks} can run here: two ranks need two GPUs, or one GPU with NCCL \
                     >= 2.30 and NCCL_MULTI_RANK_GPU_ENABLE=1 (the line above says what this machine has)"
                );
                assert!(
                    !gpu_required(),
                    "{test}: HYPERCOMM_REQUIRE_GPU=1, but the test would skip: {why}"
                );
                eprintln!("{test}: skipping: {why}");
                false
            }
        }
    }

    /// Runs `f(rank, collection, device)` on `world` threads, each with a collection over a layout with `tp`, built
    /// with the rank's GPU, and that GPU as a candle device.
    fn on_gpu_ranks<R: Send + 'static>(
        world: usize,
        tp: usize,
        f: impl Fn(usize, Arc<ProcessGroupCollection>, Device) -> R + Send + Sync + 'static,
    ) -> Vec<R> {
        on_gpu_ranks_within(world, tp, Duration::from_secs(60), f)
    }

    /// [`on_gpu_ranks`] with collections whose communicators time out after `timeout`.
    fn on_gpu_ranks_within<R: Send + 'static>(
        world: usize,
        tp: usize,
        timeout: Duration,
        f: impl Fn(usize, Arc<ProcessGroupCollection>, Device) -> R + Send + Sync + 'static,
    ) -> Vec<R> {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let f = Arc::new(f);
        let threads: Vec<_> = (0..world)
            .map(|rank| {
                let (store, f) = (Arc::clone(&store), Arc::clone(&f));
                std::thread::spawn(move || {
                    let rt = DeviceRuntime::probe_with_env(|n| std::env::var_os(n)).expect("probe");
                    let ordinal = rank % rt.device_count();
                    let gpu = Gpu::open(rt, ordinal).expect("gpu");
                    let layout = LayoutConfig::new(world).tp(tp).build().expect("layout");
                    let pgc = ProcessGroupCollection::for_layout("candle-gpu", layout)
                        .with_timeout(timeout)
                        .with_gpu(gpu)
                        .build(rank, store)
                        .expect("collection");
                    let device = Device::new_cuda(ordinal).expect("candle cuda device");
                    f(rank, Arc::new(pgc), device)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("a rank failed; its message is above"))
            .collect()
    }

    /// Rank `rank`'s sample `100·rank + i` (element `i`), on the CPU, in `dtype`.
    fn sample(rank: usize, dims: &[usize], dtype: DType) -> Tensor {
        let n: usize = dims.iter().product();
        let v: Vec<f64> = (0..n).map(|i| (100 * rank + i) as f64).collect();
        Tensor::from_vec(v, dims, &Device::Cpu)
            .and_then(|t| t.to_dtype(dtype))
            .expect("sample")
    }

    fn values(t: &Tensor) -> Vec<f64> {
        t.to_device(&Device::Cpu)
            .and_then(|t| t.to_dtype(DType::F64))
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1())
            .expect("values")
    }

    #[test]
    fn tensor_collectives_on_cuda_match_the_cpu() {
        let Some(world) = ranks_or_skip("candle cuda collectives") else {
            return;
        };
        on_gpu_ranks(world, world, move |rank, pgc, dev| {
            let tp = TensorGroup::kind(&pgc, "tp").expect("tp");
            let on = |t: Tensor| t.to_device(&dev).expect("to cuda");
            for dtype in [DType::F32, DType::BF16, DType::F64, DType::I64, DType::U8] {
                let got = tp
                    .all_reduce(&on(sample(rank, &[2, 3], dtype)), ReduceOp::Max)
                    .expect("all_reduce");
                assert!(got.device().is_cuda(), "the result stays on the gpu");
                assert_eq!(got.dtype(), dtype);
                assert_eq!(
                    values(&got),
                    values(&sample(world - 1, &[2, 3], dtype)),
                    "{dtype:?} max"
                );
            }
            let sum = tp
                .all_reduce(&on(sample(rank, &[4], DType::F32)), ReduceOp::Sum)
                .expect("sum");
            let want: Vec<f64> = (0..4)
                .map(|i| (0..world).map(|r| (100 * r + i) as f64).sum())
                .collect();
            assert_eq!(values(&sum), want);
            // A transposed (non-contiguous) CUDA tensor is reduced by its logical layout.
            let t = on(sample(rank, &[2, 3], DType::F32)).t().expect("t");
            assert!(!t.is_contiguous());
            let got = tp
                .all_reduce(&t, ReduceOp::Sum)
                .expect("all_reduce of a view");
            let want = (0..world)
                .map(|r| sample(r, &[2, 3], DType::F32).t().expect("t"))
                .reduce(|a, b| (a + b).expect("add"))
                .expect("ranks");
            assert_eq!(values(&got), values(&want));
            // all_gather along dim 1 is the concatenation of every rank's tensor.
            let got = tp
                .all_gather(&on(sample(rank, &[2, 3], DType::F32)), 1)
                .expect("all_gather");
            let parts: Vec<Tensor> = (0..world).map(|r| sample(r, &[2, 3], DType::F32)).collect();
            assert_eq!(values(&got), values(&Tensor::cat(&parts, 1).expect("cat")));
            // reduce_scatter along dim 0: this rank's rows of the sum.
            let rows = 2 * world;
            let got = tp
                .reduce_scatter(&on(sample(rank, &[rows, 3], DType::F32)), 0, ReduceOp::Sum)
                .expect("reduce_scatter");
            let total = (0..world)
                .map(|r| sample(r, &[rows, 3], DType::F64))
                .reduce(|a, b| (a + b).expect("add"))
                .expect("ranks");
            let want = total.narrow(0, rank * 2, 2).expect("narrow");
            assert_eq!(values(&got), values(&want));
            // broadcast from the last rank.
            let got = tp
                .broadcast(&on(sample(rank, &[3], DType::F64)), world - 1)
                .expect("broadcast");
            assert_eq!(values(&got), values(&sample(world - 1, &[3], DType::F64)));
        });
    }

    /// Rank `rank`'s F8E4M3 sample on the CPU: element `i` has the bits `(i + 37·rank) mod 256`, so 256 elements
    /// hold every bit pattern (NaNs and both zeros included).
    fn f8_sample(rank: usize, dims: &[usize]) -> Tensor {
        let n: usize = dims.iter().product();
        let elements: Vec<float8::F8E4M3> = (0..n)
            .map(|i| float8::F8E4M3::from_bits(((i + 37 * rank) % 256) as u8))
            .collect();
        Tensor::from_vec(elements, dims, &Device::Cpu).expect("f8 sample")
    }

    /// The bits of an F8E4M3 tensor's elements (on any device) in row-major order.
    fn f8_bits(t: &Tensor) -> Vec<u8> {
        assert_eq!(t.dtype(), DType::F8E4M3);
        t.to_device(&Device::Cpu)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<float8::F8E4M3>())
            .expect("f8 elements")
            .into_iter()
            .map(|e| e.to_bits())
            .collect()
    }

    #[test]
    fn f8e4m3_tensors_on_cuda_move_bit_for_bit_and_reduce_on_nccl() {
        let Some(world) = ranks_or_skip("candle cuda f8e4m3") else {
            return;
        };
        on_gpu_ranks(world, world, move |rank, pgc, dev| {
            let tp = TensorGroup::kind(&pgc, "tp").expect("tp");
            let on = |t: Tensor| t.to_device(&dev).expect("to cuda");
            let got = tp
                .broadcast(&on(f8_sample(rank, &[16, 16])), world - 1)
                .expect("broadcast");
            assert!(got.device().is_cuda(), "the result stays on the gpu");
            assert_eq!(f8_bits(&got), f8_bits(&f8_sample(world - 1, &[16, 16])));
            let got = tp
                .all_gather(&on(f8_sample(rank, &[8, 32])), 1)
                .expect("all_gather");
            let parts: Vec<Tensor> = (0..world).map(|r| f8_sample(r, &[8, 32])).collect();
            assert_eq!(
                f8_bits(&got),
                f8_bits(&Tensor::cat(&parts, 1).expect("cat"))
            );
            // Two rows for every rank, each rank's pair from every rank in rank order.
            let got = tp
                .all_to_all_v(
                    &on(f8_sample(rank, &[2 * world, 64])),
                    &vec![2; world],
                    &vec![2; world],
                )
                .expect("all_to_all_v");
            let want: Vec<Tensor> = (0..world)
                .map(|s| {
                    f8_sample(s, &[2 * world, 64])
                        .narrow(0, 2 * rank, 2)
                        .expect("rows")
                })
                .collect();
            assert_eq!(f8_bits(&got), f8_bits(&Tensor::cat(&want, 0).expect("cat")));
            if world > 1 {
                let (next, prev) = ((rank + 1) % world, (rank + world - 1) % world);
                let got = tp
                    .exchange(vec![
                        TensorP2p::send(&on(f8_sample(rank, &[256])), next),
                        TensorP2p::recv(256, DType::F8E4M3, &dev, prev),
                    ])
                    .expect("exchange");
                assert_eq!(f8_bits(&got[1]), f8_bits(&f8_sample(prev, &[256])));
            }
            // NCCL reduces f8e4m3 (the host refuses to): the maximum of finite values is the last rank's.
            let finite = |r: usize| {
                sample(r, &[4], DType::F32)
                    .to_dtype(DType::F8E4M3)
                    .expect("f8")
            };
            let got = tp
                .all_reduce(&on(finite(rank)), ReduceOp::Max)
                .expect("all_reduce of f8e4m3 on nccl");
            assert_eq!(f8_bits(&got), f8_bits(&finite(world - 1)));
        });
    }

    /// The fixed weights of the test's linear layer (4 outputs, 8 inputs) and its batch of 8 rows.
    fn weights_and_batch() -> (Tensor, Tensor, Tensor, Tensor) {
        let f = |n: usize, k: usize| -> Vec<f32> {
            (0..n)
                .map(|i| (((i * 7 + k * 13) % 17) as f32 - 8.0) / 16.0)
                .collect()
        };
        let w = Tensor::from_vec(f(32, 1), (4, 8), &Device::Cpu).expect("w");
        let b = Tensor::from_vec(f(4, 2), 4, &Device::Cpu).expect("b");
        let x = Tensor::from_vec(f(64, 3), (8, 8), &Device::Cpu).expect("x");
        let y = Tensor::from_vec(f(32, 4), (8, 4), &Device::Cpu).expect("y");
        (w, b, x, y)
    }

    /// The linear layer's weight and bias as variables on `dev`, and their gradients of the mean squared error on
    /// rows `first..first + rows`.
    fn backward(dev: &Device, first: usize, rows: usize) -> ([Var; 2], GradStore) {
        let (w, b, x, y) = weights_and_batch();
        let (w, b) = (
            Var::from_tensor(&w.to_device(dev).expect("w")).expect("var"),
            Var::from_tensor(&b.to_device(dev).expect("b")).expect("var"),
        );
        let x = x
            .narrow(0, first, rows)
            .and_then(|t| t.to_device(dev))
            .expect("x");
        let y = y
            .narrow(0, first, rows)
            .and_then(|t| t.to_device(dev))
            .expect("y");
        let layer = Linear::new(w.as_tensor().clone(), Some(b.as_tensor().clone()));
        let loss = layer
            .forward(&x)
            .and_then(|p| p.sub(&y))
            .and_then(|d| d.sqr())
            .and_then(|d| d.mean_all())
            .expect("loss");
        let grads: GradStore = loss.backward().expect("backward");
        ([w, b], grads)
    }

    /// One SGD step of the linear layer on rows `first..first + rows`, gradients passed through `sync` (when
    /// given) first; returns the updated weight and bias on the CPU.
    fn step(dev: &Device, first: usize, rows: usize, sync: Option<&GradSync>) -> Vec<Vec<f64>> {
        let (vars, mut grads) = backward(dev, first, rows);
        if let Some(sync) = sync {
            let stats = sync.sync(&vars, &mut grads).expect("gradient sync");
            assert_eq!(stats.elements, 36, "both gradients averaged");
            assert_eq!(stats.buckets, 2, "16-byte buckets: one per variable");
        }
        let mut sgd = SGD::new(vars.to_vec(), 0.1).expect("sgd");
        sgd.step(&grads).expect("step");
        vars.iter().map(|v| values(v.as_tensor())).collect()
    }

    #[test]
    fn one_data_parallel_step_on_cuda_matches_one_rank_on_the_cpu() {
        let Some(world) = ranks_or_skip("candle cuda dp step") else {
            return;
        };
        // The reference: one rank, the whole batch, on the CPU.
        let want = step(&Device::Cpu, 0, 8, None);
        let got = on_gpu_ranks(world, 1, move |rank, pgc, dev| {
            let dp = TensorGroup::kind(&pgc, "dp").expect("dp");
            let sync = GradSync::new(dp).with_bucket_bytes(16);
            let rows = 8 / world;
            step(&dev, rank * rows, rows, Some(&sync))
        });
        for (rank, vars) in got.iter().enumerate() {
            for (v, (g, w)) in vars.iter().zip(&want).enumerate() {
                for (a, b) in g.iter().zip(w) {
                    assert!(
                        (a - b).abs() <= 1e-5 * b.abs().max(1e-3),
                        "rank {rank} variable {v}: {a} on the gpu, {b} on the cpu"
                    );
                }
            }
        }
    }

    /// The never-joins tests' collection timeout: short, so that the watchdog's comes soon, long enough for two
    /// ranks on one GPU to create their NCCL communicators and connect them (hypercomm-comm's two-rank timeout
    /// test on a GPU uses the same).
    const NEVER_TIMEOUT: Duration = Duration::from_secs(5);

    /// What the watchdog may take past the timeout before rank 0's calls return: a tick, the ranks' comparison
    /// of their progress (half the timeout, waiting for the record rank 1 never publishes), the abort.
    const MARGIN: Duration = Duration::from_secs(5);

    /// Set when dropped: rank 0 lets rank 1 go, even when an assertion fails.
    struct Release(Arc<AtomicBool>);

    impl Drop for Release {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
        }
    }

    /// Rank 1's part: alive, its collection kept, but busy elsewhere until rank 0 is done (at most a minute).
    fn idle_until(done: &AtomicBool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !done.load(Ordering::Acquire) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Runs `read` on a thread of its own and gives its answer, waiting at most the timeout plus the margin: a read
    /// that the watchdog never ends fails the test instead of hanging it (rank 0's communicators, dropped as the
    /// test fails, are then aborted, which ends the read).
    fn bounded<R: Send + 'static>(what: &str, read: impl FnOnce() -> R + Send + 'static) -> R {
        let limit = NEVER_TIMEOUT + MARGIN;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(read());
        });
        rx.recv_timeout(limit).unwrap_or_else(|_| {
            panic!("{what} did not return within {limit:?}: nothing stopped the collective")
        })
    }

    /// `err` is what rank 0's next operation on `group` returns once the watchdog stopped the collective that
    /// rank 1 never joined: the group's communicator error, broken by the timeout, naming rank 1; and rank 0's
    /// failure domain holds the root cause: rank 1 (by its world rank), the stuck `call` on the group's NCCL
    /// communicator.
    fn names_rank_1(err: &Error, group: &TensorGroup, call: &str) {
        let Error::Comm {
            group: name,
            source,
        } = err
        else {
            panic!("not the group's communicator error: {err:?}");
        };
        assert_eq!(name, group.name(), "{err}");
        assert!(matches!(**source, CommError::Broken { .. }), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains(&format!("{}/device", group.name()))
                && text.contains("rank(s) [1] did not respond within"),
            "{text}"
        );
        // The structured blame, not only the text: the broken communicator's error carries the root cause.
        assert_eq!(source.lost_ranks(), [1], "{err}");
        let cause = group
            .comm()
            .expect("comm")
            .failure_domain()
            .root_cause()
            .expect("a recorded root cause");
        assert_eq!(
            (cause.ranks.as_slice(), cause.seen_by),
            (&[1][..], 0),
            "{cause}"
        );
        assert_eq!(cause.comm, format!("{}/device", group.name()), "{cause}");
        assert!(cause.detail.contains(call), "{cause}");
    }

    #[test]
    fn a_rank_that_never_joins_a_cuda_all_reduce_is_named_not_hung() {
        // Both ranks all-reduce a CUDA tensor (the group's first collective connects the peers); rank 1 never
        // joins the second. Rank 0's all-reduce returns at once (stream-ordered), its read to the host blocks
        // until the GPU's watchdog stops the collective past the timeout and gives the undefined values without an
        // error, and its next all-reduce is the error naming rank 1 and the group, all within the timeout plus a
        // margin; an all-reduce of a CPU tensor on the group then fails with the same cause.
        if !two_ranks_or_skip("candle cuda never joins") {
            return;
        }
        let done = Arc::new(AtomicBool::new(false));
        on_gpu_ranks_within(2, 2, NEVER_TIMEOUT, move |rank, pgc, dev| {
            // Rank 0 lets rank 1 go when it is done, or failed.
            let _release = (rank == 0).then(|| Release(Arc::clone(&done)));
            let tp = TensorGroup::kind(&pgc, "tp").expect("tp");
            let on = |t: Tensor| t.to_device(&dev).expect("to cuda");
            let first = tp
                .all_reduce(&on(sample(rank, &[4], DType::F32)), ReduceOp::Sum)
                .expect("the first all-reduce");
            assert_eq!(values(&first), [100.0, 102.0, 104.0, 106.0]);
            if rank == 1 {
                idle_until(&done);
                return;
            }
            let started = Instant::now();
            let stuck = tp
                .all_reduce(&on(sample(rank, &[4], DType::F32)), ReduceOp::Sum)
                .expect("an all-reduce ordered on candle's stream does not wait for its peer");
            let issued = started.elapsed();
            assert!(
                issued < NEVER_TIMEOUT,
                "the all-reduce held the cpu for {issued:?}"
            );
            let read = bounded("the read of the all-reduce's result", move || {
                stuck.to_vec1::<f32>()
            });
            let read_at = started.elapsed();
            eprintln!(
                "candle cuda never joins: all_reduce returned after {issued:?}, the read after {read_at:?}: {read:?}"
            );
            assert!(
                read_at >= NEVER_TIMEOUT,
                "the read returned after {read_at:?}, before the timeout: it did not wait for the all-reduce"
            );
            assert!(read_at < NEVER_TIMEOUT + MARGIN, "{read_at:?}");
            assert_eq!(
                read.expect("the read of a stopped collective's result is no error")
                    .len(),
                4
            );
            let err = tp
                .all_reduce(&on(sample(rank, &[4], DType::F32)), ReduceOp::Sum)
                .expect_err("the watchdog stopped the group");
            let took = started.elapsed();
            eprintln!("candle cuda never joins: the next all_reduce failed after {took:?}: {err}");
            assert!(took < NEVER_TIMEOUT + MARGIN, "{took:?}");
            names_rank_1(&err, &tp, "all_reduce(dtype=f32, count=4)");
            // Every communicator of the collection stopped with it: a CPU tensor, through the group's host half,
            // fails at once with the same cause.
            let host = tp
                .all_reduce(&sample(rank, &[4], DType::F32), ReduceOp::Sum)
                .expect_err("the host half is stopped too");
            assert!(
                matches!(&host, Error::Comm { group, .. } if group == tp.name())
                    && host
                        .to_string()
                        .contains("rank(s) [1] did not respond within"),
                "{host}"
            );
        });
    }

    #[test]
    fn a_rank_that_never_joins_a_gradient_sync_on_cuda_is_named_not_hung() {
        // Both ranks sync a step's gradients over dp (16-byte buckets: one all-reduce per variable, the first of
        // which connects the peers); rank 1 never joins the second sync. Rank 0's sync returns at once (the
        // buckets' all-reduces are ordered on candle's stream), reading an averaged gradient blocks until the
        // watchdog stops the first bucket's all-reduce past the timeout, and the next sync is the error naming
        // rank 1 and the group.
        if !two_ranks_or_skip("candle cuda sync never joined") {
            return;
        }
        let done = Arc::new(AtomicBool::new(false));
        on_gpu_ranks_within(2, 1, NEVER_TIMEOUT, move |rank, pgc, dev| {
            // Rank 0 lets rank 1 go when it is done, or failed.
            let _release = (rank == 0).then(|| Release(Arc::clone(&done)));
            let dp = TensorGroup::kind(&pgc, "dp").expect("dp");
            let sync = GradSync::new(dp.clone()).with_bucket_bytes(16);
            let (vars, mut grads) = backward(&dev, rank * 4, 4);
            let stats = sync.sync(&vars, &mut grads).expect("the first sync");
            assert_eq!(stats.buckets, 2);
            let averaged = grads.get(vars[1].as_tensor()).expect("gradient");
            assert_eq!(values(averaged).len(), 4, "the first sync completed");
            if rank == 1 {
                idle_until(&done);
                return;
            }
            let (vars, mut grads) = backward(&dev, 0, 4);
            let started = Instant::now();
            let stats = sync
                .sync(&vars, &mut grads)
                .expect("a sync ordered on candle's stream does not wait for its peer");
            let issued = started.elapsed();
            assert_eq!((stats.buckets, stats.elements), (2, 36));
            assert!(
                issued < NEVER_TIMEOUT,
                "the sync held the cpu for {issued:?}"
            );
            let gradient = grads.get(vars[0].as_tensor()).expect("gradient").clone();
            let read = bounded("the read of an averaged gradient", move || {
                gradient.flatten_all().and_then(|g| g.to_vec1::<f32>())
            });
            let read_at = started.elapsed();
            eprintln!(
                "candle cuda sync never joined: sync returned after {issued:?}, the read after {read_at:?}: {read:?}"
            );
            assert!(
                read_at >= NEVER_TIMEOUT,
                "the read returned after {read_at:?}, before the timeout: it did not wait for the sync"
            );
            assert!(read_at < NEVER_TIMEOUT + MARGIN, "{read_at:?}");
            assert_eq!(
                read.expect("the read of a stopped sync's gradient is no error")
                    .len(),
                32
            );
            let err = sync
                .sync(&vars, &mut grads)
                .expect_err("the watchdog stopped the group");
            let took = started.elapsed();
            eprintln!("candle cuda sync never joined: the next sync failed after {took:?}: {err}");
            assert!(took < NEVER_TIMEOUT + MARGIN, "{took:?}");
            // The first bucket (the weight's gradient, 32 elements) is the operation rank 1 never reached.
            names_rank_1(&err, &dp, "all_reduce(dtype=f32, count=32)");
        });
    }
}
