//! Failures reported, not hung: a rank that never joins or never calls (a timeout, and an abort), two ranks on one
//! device before NCCL 2.30 (refused), an asynchronous NCCL error (both flavors broken).

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use hypercomm_comm::device::Gpu;
use hypercomm_comm::{CommError, Communicator, ReduceOp};
use hypercomm_store::{MemoryStore, Store};

use crate::device_checks;
use crate::fake_support::{nccl, ranks, runtime};
use crate::options;

#[test]
#[ignore = "run under fake-gpu by suite_failures_are_reported_not_hung"]
fn fake_a_rank_that_never_joins_is_a_timeout() {
    let gpu = Gpu::open(runtime(), 0).unwrap();
    let started = Instant::now();
    let e = Communicator::with_gpu(
        Arc::clone(&gpu),
        Arc::new(MemoryStore::new()),
        vec![0, 1],
        0,
        options("lonely", Duration::from_secs(2)),
    )
    .expect_err("rank 1 never joins");
    assert!(matches!(e, CommError::Timeout { .. }), "{e}");
    assert!(e.to_string().contains("lonely"), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    // Rank 1 joins the host flavor (a communicator without a gpu) but never the NCCL one: rank 0's creation of
    // the NCCL communicator is the timeout, naming the NCCL flavor.
    device_checks::a_rank_that_never_joins_the_device(
        gpu,
        "lonely-device",
        Duration::from_secs(2),
        Duration::from_secs(20),
    );
}

#[test]
#[ignore = "run under fake-gpu by suite_failures_are_reported_not_hung"]
fn fake_a_rank_that_never_calls_is_a_timeout_that_aborts() {
    let done = Barrier::new(2);
    ranks(2, |rank, gpu, store| {
        let comm = Communicator::with_gpu(
            Arc::clone(&gpu),
            store,
            vec![0, 1],
            rank,
            options("stuck", Duration::from_secs(2)),
        )
        .unwrap();
        if rank == 0 {
            let started = Instant::now();
            // From the enqueue, which connects the peers on the first collective and settles only when rank 1
            // arrives (NCCL's runtime connection), or from the wait where the peers are connected already.
            let e = comm
                .all_reduce(gpu.upload(&[1.0f32]).unwrap(), ReduceOp::Sum)
                .and_then(|work| work.wait())
                .expect_err("rank 1 never calls");
            assert!(matches!(e, CommError::Timeout { .. }), "{e}");
            assert!(started.elapsed() < Duration::from_secs(20));
            // The NCCL flavor is broken, and through the failure domain both flavors share, the face too.
            assert!(nccl(&comm).broken().is_some());
            assert!(comm.broken().is_some());
            let later = comm
                .all_reduce(gpu.upload(&[1.0f32]).unwrap(), ReduceOp::Sum)
                .err()
                .unwrap();
            assert!(matches!(later, CommError::Broken { .. }), "{later}");
            let host = comm.all_reduce(vec![1.0f32], ReduceOp::Sum).err().unwrap();
            assert!(matches!(host, CommError::Broken { .. }), "{host}");
        }
        done.wait();
    });
}

#[test]
#[ignore = "run under fake-gpu by suite_failures_are_reported_not_hung"]
fn fake_two_ranks_on_one_device_need_nccl_2_30() {
    let rt = runtime();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let results: Vec<Result<Communicator, CommError>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|rank| {
                let (gpu, store) = (Gpu::open(Arc::clone(&rt), 0).unwrap(), Arc::clone(&store));
                s.spawn(move || {
                    Communicator::with_gpu(
                        gpu,
                        store,
                        vec![0, 1],
                        rank,
                        options("dup", Duration::from_secs(10)),
                    )
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in results {
        let e = r.expect_err("nccl 2.28 refuses two ranks on one device");
        assert!(matches!(e, CommError::Device { .. }), "{e}");
        assert!(e.to_string().contains("dup/device"), "{e}");
    }
}

#[test]
#[ignore = "run under fake-gpu by suite_failures_are_reported_not_hung"]
fn fake_an_asynchronous_error_breaks_the_communicator() {
    // FAKE_NCCL_FAIL_AFTER=2: the third operation fails asynchronously, as a lost peer would.
    let gpu = Gpu::open(runtime(), 0).unwrap();
    let comm = Communicator::with_gpu(
        Arc::clone(&gpu),
        Arc::new(MemoryStore::new()),
        vec![0],
        0,
        options("failing", Duration::from_secs(10)),
    )
    .unwrap();
    for _ in 0..2 {
        comm.all_reduce(gpu.upload(&[1u8]).unwrap(), ReduceOp::Max)
            .unwrap()
            .wait()
            .unwrap();
    }
    let pending = comm.all_reduce(gpu.upload(&[1u8]).unwrap(), ReduceOp::Max);
    let e = match pending {
        Ok(work) => work.wait().expect_err("the third operation fails"),
        Err(e) => e,
    };
    assert!(e.to_string().contains("ncclRemoteError"), "{e}");
    assert!(nccl(&comm).broken().is_some());
    assert!(nccl(&comm).check().is_err());
    // Both flavors share a failure domain: the NCCL flavor's failure broke the face too.
    assert!(comm.broken().is_some());
}
