//! Failures reported, not hung: a rank that never joins or never calls (a timeout, and an abort), two ranks on one
//! device before NCCL 2.30 (refused), an asynchronous NCCL error (both flavors broken), counts that disagree
//! between peers (reported by the receiver within the timeout).

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use hypercomm_comm::device::Gpu;
use hypercomm_comm::{CommError, Communicator, P2p, ReduceOp};
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

/// One rank's outcome of an operation whose counts disagree with its peer's: the error, if any, and how long it took.
type Outcome = (Option<String>, Duration);

/// Runs `call` on two ranks of a fresh communicator `name` (timeout `TIMEOUT`) and returns each rank's outcome.
fn mismatched(
    name: &str,
    call: impl Fn(usize, &Communicator, &Arc<Gpu>) -> Result<(), CommError> + Sync,
) -> Vec<Outcome> {
    ranks(2, |rank, gpu, store| {
        let comm = Communicator::with_gpu(
            Arc::clone(&gpu),
            store,
            vec![0, 1],
            rank,
            options(name, MISMATCH_TIMEOUT),
        )
        .unwrap();
        let started = Instant::now();
        let result = call(rank, &comm, &gpu);
        (result.err().map(|e| e.to_string()), started.elapsed())
    })
}

const MISMATCH_TIMEOUT: Duration = Duration::from_secs(3);

/// Every outcome came within the timeout plus a margin, and the receiving rank `receiver` reports an error naming
/// the communicator `what` (the fake fails the receive at once, as an asynchronous error; NCCL itself would hang,
/// and the wait's timeout would report it).
fn reported(what: &str, outcomes: &[Outcome], receiver: usize) {
    for (rank, (_, took)) in outcomes.iter().enumerate() {
        assert!(
            *took < MISMATCH_TIMEOUT + Duration::from_secs(5),
            "{what}: rank {rank} took {took:?}"
        );
    }
    let err = outcomes[receiver].0.as_deref().unwrap_or_else(|| {
        panic!("{what}: rank {receiver} received a message of the wrong size without an error")
    });
    assert!(err.contains(what), "{what}: {err}");
}

#[test]
#[ignore = "run under fake-gpu by suite_failures_are_reported_not_hung"]
fn fake_mismatched_counts_between_peers_are_reported_not_hung() {
    // A batch: rank 0 sends 8 elements where rank 1 receives 16.
    let outcomes = mismatched("mismatch-batch", |rank, comm, gpu| {
        let part = if rank == 0 {
            P2p::send(gpu.upload(&[1.0f32; 8])?, 1)
        } else {
            P2p::recv(gpu.alloc_zeros::<f32>(16)?, 0)
        };
        comm.batch(vec![part])?.wait().map(drop)
    });
    reported("mismatch-batch", &outcomes, 1);

    // All-to-all with split sizes: rank 0 sends rank 1 three elements, rank 1 expects four.
    let outcomes = mismatched("mismatch-alltoallv", |rank, comm, gpu| {
        let (send, recv) = if rank == 0 {
            (vec![1, 3], vec![1, 2])
        } else {
            (vec![2, 1], vec![4, 1])
        };
        let input = gpu.upload(&vec![1i32; send.iter().sum()])?;
        let output = gpu.alloc_zeros::<i32>(recv.iter().sum())?;
        comm.all_to_all_v(input, send, output, recv)?
            .wait()
            .map(drop)
    });
    reported("mismatch-alltoallv", &outcomes, 1);

    // All-gather with per-rank counts that the ranks state differently.
    let outcomes = mismatched("mismatch-allgatherv", |rank, comm, gpu| {
        let counts = if rank == 0 { vec![2, 3] } else { vec![2, 5] };
        let input = gpu.upload(&vec![rank as u8; counts[rank]])?;
        let output = gpu.alloc_zeros::<u8>(counts.iter().sum())?;
        comm.all_gather_v(input, output, counts)?.wait().map(drop)
    });
    reported("mismatch-allgatherv", &outcomes, 1);
}
