//! Failures reported, not hung: a rank that never joins or never calls (a timeout, and an abort), two ranks on one
//! device before NCCL 2.30 (refused), an asynchronous NCCL error (both flavors broken), counts that disagree
//! between peers (reported by the receiver within the timeout). And what the GPU's watchdog adds: a rank that
//! never calls while the others only order their streams and then copy to the host (named, nothing hangs), an
//! asynchronous error on one communicator of a collection (every communicator of both ranks stopped), an abort
//! from another thread while a call is inside NCCL (revoked, not freed under it); each leaves flight records.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use hypercomm_comm::device::{FLIGHT_RECORDER_DIR_ENV, Gpu, OpState};
use hypercomm_comm::{CommError, CommOptions, Communicator, NcclOptions, P2p, ReduceOp};
use hypercomm_store::{MemoryStore, Store};

use crate::device_checks;
use crate::device_checks::watchdog::{self, connected, eventually, written_record};
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

/// A fresh folder for flight records, named after `test`, inside the fake's scratch folder (removed with it).
fn flight_dir(test: &str) -> PathBuf {
    let root = std::env::var_os("FAKE_NCCL_DIR").map_or_else(std::env::temp_dir, PathBuf::from);
    let dir = root.join(format!("flight-{test}"));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

const WATCHED_TIMEOUT: Duration = Duration::from_secs(2);

#[test]
#[ignore = "run under fake-gpu by suite_the_watchdog_stops_what_would_hang"]
fn fake_a_rank_that_never_calls_is_named_while_the_others_only_order_their_streams() {
    // Three ranks connect with a first all-reduce; rank 2 never makes the second (see the check).
    let dir = flight_dir("never-calls");
    let finished = AtomicUsize::new(0);
    ranks(3, |rank, gpu, store| {
        let comm = connected(3, &gpu, store, rank, "behind", WATCHED_TIMEOUT, &dir);
        watchdog::a_rank_that_never_calls(&comm, &gpu, 2, &finished, WATCHED_TIMEOUT, &dir);
    });
}

#[test]
#[ignore = "run under fake-gpu by suite_the_watchdog_stops_what_would_hang"]
fn fake_an_asynchronous_error_stops_every_communicator_of_the_collection() {
    // FAKE_NCCL_FAIL_AFTER=2, FAKE_NCCL_FAIL_RANK=0 and a slow stream: rank 0's third operation on group a fails
    // asynchronously after its enqueue returned. Rank 0 only orders its stream after it: the watchdog finds the
    // error, records it and stops every communicator of rank 0's collection, host halves included; rank 1, stuck
    // in the same collective, learns of it through the host half of group b and stops everything too.
    // The records go where the environment says (the suite sets it; the runtime reads it when probed).
    let dir = PathBuf::from(
        std::env::var_os(FLIGHT_RECORDER_DIR_ENV)
            .expect("the suite names a folder for flight records"),
    );
    let outcomes = ranks(2, |rank, gpu, store| {
        let pgc = process_group_collection::ProcessGroupCollection::custom("wd")
            .with_explicit_groups("a", vec![vec![0, 1]])
            .with_explicit_groups("b", vec![vec![0, 1]])
            .with_timeout(Duration::from_secs(20))
            .with_gpu(Arc::clone(&gpu))
            .build(rank, store)
            .unwrap();
        let id = |k: &str| process_group_collection::GroupId::kind(k);
        let (a, b) = (pgc.get(&id("a")).unwrap(), pgc.get(&id("b")).unwrap());
        for _ in 0..2 {
            let sum = a.all_reduce(gpu.upload(&[1.0f32]).unwrap(), ReduceOp::Sum);
            assert_eq!(sum.unwrap().wait().unwrap().download().unwrap(), [2.0]);
        }
        let started = Instant::now();
        let third = a
            .all_reduce(gpu.upload(&[1.0f32]).unwrap(), ReduceOp::Sum)
            .unwrap()
            .wait_on(nccl(a).stream())
            .unwrap();
        let seen = if rank == 0 {
            assert!(
                eventually(Duration::from_secs(10), || nccl(a).broken().is_some()),
                "the watchdog did not find the asynchronous error"
            );
            nccl(a).broken().unwrap()
        } else {
            b.all_reduce(vec![1.0f32], ReduceOp::Sum)
                .and_then(|w| w.wait())
                .expect_err("rank 0 stopped group b")
                .to_string()
        };
        drop(third);
        for id in pgc.groups() {
            let comm = pgc.get(id).unwrap();
            assert!(
                eventually(Duration::from_secs(5), || comm.broken().is_some()
                    && nccl(comm).broken().is_some()),
                "rank {rank}: {} still works",
                comm.name()
            );
        }
        let record = written_record(&dir, nccl(a).name(), rank);
        (seen, started.elapsed(), record)
    });
    for (rank, (seen, took, record)) in outcomes.iter().enumerate() {
        eprintln!("watchdog-case: collection: rank {rank} stopped after {took:?}: {seen}");
        assert!(seen.contains("ncclRemoteError"), "rank {rank}: {seen}");
        assert!(*took < Duration::from_secs(15), "rank {rank}: {took:?}");
        assert_eq!(record.issued, 3, "rank {rank}");
        assert!(record.failure.is_some(), "rank {rank}");
    }
    assert_eq!(outcomes[0].2.ops[2].state, OpState::Failed);
}

#[test]
#[ignore = "run under fake-gpu by suite_the_watchdog_stops_what_would_hang"]
fn fake_an_abort_beside_a_call_inside_nccl_revokes_instead_of_freeing() {
    // Blocking NCCL communicators: rank 0's first all-reduce waits inside NCCL for rank 1 to connect, which it
    // never does. An abort from another thread may not free the communicator under that call: it revokes it
    // (NCCL 2.28), the call returns, and the communicator is freed when it has.
    let finished = AtomicUsize::new(0);
    ranks(2, |rank, gpu, store| {
        let comm = Communicator::with_gpu(
            Arc::clone(&gpu),
            store,
            vec![0, 1],
            rank,
            CommOptions {
                timeout: Duration::from_secs(30),
                nccl: NcclOptions {
                    blocking: Some(true),
                    ..NcclOptions::default()
                },
                ..CommOptions::named("revoked")
            },
        )
        .unwrap();
        if rank == 1 {
            eventually(Duration::from_secs(60), || {
                finished.load(Ordering::Acquire) == 1
            });
            return;
        }
        let started = Instant::now();
        let e = std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(300));
                nccl(&comm).abort();
            });
            comm.all_reduce(gpu.upload(&[1.0f32]).unwrap(), ReduceOp::Sum)
                .and_then(|w| w.wait())
                .expect_err("aborted")
        });
        let took = started.elapsed();
        finished.fetch_add(1, Ordering::Release);
        eprintln!("watchdog-case: revoke: the call returned after {took:?}: {e}");
        assert!(
            took < Duration::from_secs(10),
            "the call stayed inside NCCL for {took:?}: {e}"
        );
        assert!(nccl(&comm).broken().is_some());
        let record = nccl(&comm).flight_record();
        assert_eq!(record.issued, 1);
        assert_eq!(record.ops[0].state, OpState::Failed, "{record:?}");
    });
}

#[test]
#[ignore = "run under fake-gpu by suite_the_watchdog_stops_what_would_hang"]
fn fake_a_rank_that_calls_another_collective_is_named_as_the_disagreement() {
    // With FAKE_NCCL_MISMATCH_HANGS=1 the fake does what NCCL's kernels would with ranks that called different
    // collectives: nothing, until the communicator is stopped. At op #2 rank 2 calls all_gather where ranks 0 and 1
    // call reduce_scatter (see the check).
    let dir = flight_dir("disagreement");
    ranks(3, |rank, gpu, store| {
        let comm = connected(3, &gpu, store, rank, "disagree", WATCHED_TIMEOUT, &dir);
        watchdog::a_rank_that_calls_another_collective(&comm, &gpu, 2, WATCHED_TIMEOUT, &dir);
    });
}

#[test]
#[ignore = "run under fake-gpu by suite_the_watchdog_stops_what_would_hang"]
fn fake_a_ring_of_stages_that_send_before_they_receive_is_named_as_a_cycle() {
    // Four pipeline stages, each sending to the next and then receiving from the previous (see the check; the
    // fake's sends wait for their receives as NCCL's do). Every rank tells the same cycle.
    let dir = flight_dir("cycle");
    let told = ranks(4, |rank, gpu, store| {
        let comm = connected(4, &gpu, store, rank, "ring", WATCHED_TIMEOUT, &dir);
        watchdog::a_ring_that_sends_before_it_receives(&comm, &gpu, 8, WATCHED_TIMEOUT, &dir)
    });
    assert!(told.iter().all(|d| *d == told[0]), "{told:#?}");
}
