//! Bad input and failing ranks: disagreements are reported on every rank without corrupting anything, wrong
//! lengths fail before anything is sent, a stalled rank makes the others fail within the timeout naming it, and
//! shared memory never has a file name.

mod comm_support;

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use comm_support::*;
use hypercomm::comm::{
    CommError, CommOptions, Communicator, NcclOptions, ReduceOp, Step, StepHook,
};
use hypercomm::store::MemoryStore;

fn both_transports(test: impl Fn(bool)) {
    test(false);
    test(true);
}

#[test]
fn disagreeing_ranks_all_get_an_error_and_the_communicator_survives() {
    both_transports(|tcp| {
        let results = on_threads(3, options(&format!("mismatch-{tcp}"), tcp), |comm| {
            let me = comm.rank();
            let mut errors = Vec::new();
            // Count differs on rank 2.
            let len = if me == 2 { 5 } else { 4 };
            errors.push(
                comm.all_reduce(vec![1i32; len], ReduceOp::Sum)
                    .unwrap()
                    .wait()
                    .unwrap_err(),
            );
            // Element type differs on rank 1.
            let e = if me == 1 {
                comm.all_reduce(vec![1.0f32; 4], ReduceOp::Sum)
                    .unwrap()
                    .wait()
                    .map(|_| ())
            } else {
                comm.all_reduce(vec![1i32; 4], ReduceOp::Sum)
                    .unwrap()
                    .wait()
                    .map(|_| ())
            };
            errors.push(e.unwrap_err());
            // Op differs on rank 0.
            let op = if me == 0 {
                ReduceOp::Max
            } else {
                ReduceOp::Sum
            };
            errors.push(
                comm.all_reduce(vec![1u8; 4], op)
                    .unwrap()
                    .wait()
                    .unwrap_err(),
            );
            // Root differs on rank 2.
            let root = if me == 2 { 1 } else { 0 };
            errors.push(
                comm.broadcast(vec![me as u64; 3], root)
                    .unwrap()
                    .wait()
                    .unwrap_err(),
            );
            // Different collectives.
            let e = if me == 0 {
                comm.barrier().unwrap().wait()
            } else {
                comm.all_reduce(vec![0u8; 1], ReduceOp::Sum)
                    .unwrap()
                    .wait()
                    .map(|_| ())
            };
            errors.push(e.unwrap_err());
            // Afterwards the communicator still works.
            let ok = comm
                .all_reduce(vec![me as i64 + 1; 3], ReduceOp::Sum)
                .unwrap()
                .wait()
                .unwrap();
            let culprits: Vec<Vec<usize>> = errors.iter().map(|e| e.culprits().to_vec()).collect();
            (
                errors
                    .into_iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>(),
                ok,
                comm.broken(),
                culprits,
            )
        });
        for (errors, ok, broken, culprits) in &results {
            assert_eq!(errors.len(), 5);
            // The odd rank out is blamed, by the majority of three, wherever it sits (rank 0 included).
            assert_eq!(
                culprits,
                &vec![vec![2], vec![1], vec![0], vec![2], vec![0]],
                "{errors:?}"
            );
            for e in errors {
                assert!(e.contains("ranks disagree"), "{e}");
                assert!(e.contains("mismatch-"), "error names the communicator: {e}");
            }
            assert!(
                errors[0].contains("count=5") && errors[0].contains("count=4"),
                "{}",
                errors[0]
            );
            assert!(
                errors[1].contains("dtype=f32") && errors[1].contains("dtype=i32"),
                "{}",
                errors[1]
            );
            assert!(
                errors[2].contains("op=max") && errors[2].contains("op=sum"),
                "{}",
                errors[2]
            );
            assert!(
                errors[3].contains("root=1") && errors[3].contains("root=0"),
                "{}",
                errors[3]
            );
            assert!(
                errors[4].contains("barrier") && errors[4].contains("all_reduce"),
                "{}",
                errors[4]
            );
            assert_eq!(ok, &vec![6i64; 3]);
            assert_eq!(broken, &None);
        }
        // Every rank describes the disagreement identically.
        assert!(results.iter().all(|r| r.0 == results[0].0));
    });
}

#[test]
fn wrong_lengths_and_bad_roots_fail_before_anything_is_sent() {
    let results = on_threads(2, options("lengths", false), |comm| {
        let errs = [
            comm.all_gather_into(vec![1u32; 3], vec![0; 5])
                .map(|_| ())
                .unwrap_err(),
            comm.reduce_scatter(vec![1u32; 3], ReduceOp::Sum)
                .map(|_| ())
                .unwrap_err(),
            comm.all_reduce_into(vec![1u32; 3], vec![0; 2], ReduceOp::Sum)
                .map(|_| ())
                .unwrap_err(),
            comm.broadcast(vec![1u32; 3], 2).map(|_| ()).unwrap_err(),
            comm.send(vec![1u32; 3], comm.rank(), 0)
                .map(|_| ())
                .unwrap_err(),
            comm.all_to_all_v(vec![1u32; 3], vec![1, 1], vec![0; 2], vec![1, 1])
                .map(|_| ())
                .unwrap_err(),
        ];
        // Nothing was sent: the next collective pairs up normally.
        let sum = comm
            .all_reduce(vec![1u32; 2], ReduceOp::Sum)
            .unwrap()
            .wait()
            .unwrap();
        (
            errs.iter()
                .map(|e| matches!(e, CommError::InvalidArgument { .. }))
                .collect::<Vec<_>>(),
            sum,
        )
    });
    for (kinds, sum) in results {
        assert!(kinds.iter().all(|k| *k), "{kinds:?}");
        assert_eq!(sum, vec![2, 2]);
    }
}

#[test]
fn unsupported_options_are_rejected_by_name() {
    let store = Arc::new(MemoryStore::new());
    let opts = CommOptions {
        nccl: NcclOptions {
            cga_cluster_size: Some(4),
            ..NcclOptions::default()
        },
        ..CommOptions::named("knobs")
    };
    match Communicator::world(store, 1, 0, opts) {
        Err(CommError::UnsupportedOption {
            backend: "host",
            option: "cga_cluster_size",
        }) => {}
        other => panic!("expected rejection, got {other:?}"),
    }
}

#[test]
fn a_stalled_rank_fails_the_others_within_the_timeout_naming_it() {
    both_transports(|tcp| {
        let timeout = Duration::from_millis(1500);
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let done_rx = Arc::new(Mutex::new(done_rx));
        let opts = CommOptions {
            timeout,
            ..options(&format!("stall-{tcp}"), tcp)
        };
        let results = on_threads(3, opts, move |comm| {
            if comm.rank() == 2 {
                // Stall: issue nothing until the others have given up, then find the communicator aborted.
                done_rx.lock().unwrap().recv().unwrap();
                done_rx.lock().unwrap().recv().unwrap();
                let late = comm
                    .all_reduce(vec![1.0f32; 4], ReduceOp::Sum)
                    .unwrap()
                    .wait();
                // Over TCP the peers' data for this one-round operation was sent before they gave up, so the late
                // rank may still complete it correctly; a second operation finds the connections closed.
                let late = match late {
                    Ok(sum) if tcp => {
                        assert_eq!(sum, vec![3.0; 4]);
                        comm.barrier().unwrap().wait().map(|_| ())
                    }
                    other => other.map(|_| ()),
                };
                return (
                    late.unwrap_err().to_string(),
                    Duration::ZERO,
                    String::new(),
                    Vec::new(),
                );
            }
            let start = Instant::now();
            let pending = comm.all_reduce(vec![1.0f32; 4], ReduceOp::Sum).unwrap();
            let queued = comm.barrier().unwrap();
            let err = pending.wait().unwrap_err();
            let elapsed = start.elapsed();
            let queued_err = queued.wait().unwrap_err().to_string();
            let later = comm.barrier().map(|_| ()).unwrap_err().to_string();
            assert!(comm.broken().is_some());
            comm.abort();
            done_tx.send(()).unwrap();
            let lost = err.lost_ranks().to_vec();
            (
                err.to_string(),
                elapsed,
                format!("{queued_err} | {later}"),
                lost,
            )
        });
        for (rank, (err, elapsed, rest, lost)) in results.iter().enumerate().take(2) {
            assert!(err.contains(&format!("stall-{tcp}")), "rank {rank}: {err}");
            // Exactly rank 2, whether this rank timed out on it or was stopped by the other survivor's abort
            // (whose failure record names rank 2, not the aborting survivor).
            assert_eq!(lost, &vec![2], "rank {rank}: {err}");
            assert!(*elapsed < timeout * 4, "rank {rank} took {elapsed:?}");
            assert!(rest.contains("broken"), "rank {rank}: {rest}");
        }
        let late = &results[2].0;
        assert!(
            late.contains("aborted") || late.contains("died") || late.contains("broken"),
            "{late}"
        );
    });
}

#[test]
fn split_follows_nccl_semantics() {
    let results = on_threads(4, options("split", false), |comm| {
        let me = comm.rank();
        // Ranks 0..3 split by parity, rank 3 joins nothing; keys reverse the order.
        let color = if me == 3 { None } else { Some((me % 2) as u32) };
        let child = comm.split(color, -(me as i64)).unwrap();
        let info = child.as_ref().map(|c| {
            let sum = c
                .all_reduce(vec![me as u32], ReduceOp::Sum)
                .unwrap()
                .wait()
                .unwrap()[0];
            (
                c.rank(),
                c.size(),
                c.ranks().to_vec(),
                c.name().to_owned(),
                sum,
            )
        });
        // A second split of the same parent gets a fresh name and works.
        let again = comm.split(Some(0), me as i64).unwrap().unwrap();
        let total = again
            .all_reduce(vec![1u32], ReduceOp::Sum)
            .unwrap()
            .wait()
            .unwrap()[0];
        (info, again.name().to_owned(), total)
    });
    let (c0, c1, c2, c3) = (&results[0].0, &results[1].0, &results[2].0, &results[3].0);
    assert_eq!(c0.as_ref().unwrap().0, 1); // key -0 > key -2: rank 2 comes first
    assert_eq!(c2.as_ref().unwrap().0, 0);
    assert_eq!(c0.as_ref().unwrap().2, vec![2, 0]);
    assert_eq!(c0.as_ref().unwrap().4, 2);
    assert_eq!(c1.as_ref().unwrap().1, 1);
    assert_eq!(c1.as_ref().unwrap().4, 1);
    assert!(c3.is_none());
    assert_ne!(c0.as_ref().unwrap().3, results[0].1);
    assert!(results.iter().all(|r| r.2 == 4));
}

fn shm_files_of_this_process() -> Vec<String> {
    let prefix = format!("hypercomm-{}-", std::process::id());
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// A step's name, the rank that reached it, and this process's files in `/dev/shm` at that moment.
type StepSeen = (&'static str, usize, Vec<String>);

#[test]
fn shared_memory_has_no_file_name_at_any_step_of_the_bootstrap() {
    // At every step of the bootstrap, through the public hook: which step, on which rank, and what files of this
    // process /dev/shm holds at that moment.
    let seen: Arc<Mutex<Vec<StepSeen>>> = Arc::default();
    let log = Arc::clone(&seen);
    let opts = CommOptions {
        on_step: Some(StepHook::new(move |step: &Step<'_>| {
            let files = shm_files_of_this_process();
            log.lock().unwrap().push((step.name(), step.rank(), files));
        })),
        ..options("cleanup", false)
    };
    let results = on_threads(3, opts, |comm| {
        assert_eq!(comm.transport(), "shm");
        let sum = comm
            .all_reduce(vec![1u8; 100], ReduceOp::Sum)
            .unwrap()
            .wait()
            .unwrap();
        // The segment is mapped from an anonymous memory file, not from anything in a file system.
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        assert!(maps.contains("/memfd:hypercomm-segment"), "{maps}");
        sum
    });
    assert!(results.iter().all(|r| r == &vec![3u8; 100]));
    let seen = seen.lock().unwrap();
    let count = |name: &str| seen.iter().filter(|(n, _, _)| *n == name).count();
    for (name, times) in [
        ("segment_created", 1),
        ("listening", 1),
        ("record_published", 1),
        ("segment_sent", 2),
        ("record_read", 2),
        ("segment_received", 2),
        ("segment_attached", 2),
        ("arrived", 3),
        ("decided", 3),
        ("ready", 3),
    ] {
        assert_eq!(count(name), times, "step {name}: {seen:?}");
    }
    let named: Vec<_> = seen
        .iter()
        .filter(|(_, _, files)| !files.is_empty())
        .collect();
    assert!(
        named.is_empty(),
        "files in /dev/shm during the bootstrap: {named:?}"
    );
}
