//! The communicator's lane and engine seen from outside: when the progress thread starts and ends, which thread
//! runs a job, issue order, barriers on the calling thread, aborts, and split names.

use std::sync::Arc;

use hypercomm_store::MemoryStore;

use super::Communicator;
use crate::{CommOptions, ReduceOp};

/// How many threads of this process carry `name` (Linux truncates thread names to 15 bytes).
fn threads_named(name: &str) -> usize {
    let short = &name[..name.len().min(15)];
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks
                .filter_map(Result::ok)
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.trim_end() == short)
                })
                .count()
        })
        .unwrap_or(0)
}

/// [`threads_named`], once it reaches `at_least` or after 5 s: a new thread names itself when it first
/// runs, which may be a moment after the operation that started it (which ran on the waiting thread).
fn threads_named_soon(name: &str, at_least: usize) -> usize {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let count = threads_named(name);
        if count >= at_least || std::time::Instant::now() >= deadline {
            return count;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

#[test]
fn the_progress_thread_starts_with_the_first_operation_and_ends_with_the_communicator() {
    let store = Arc::new(MemoryStore::new());
    let comm =
        Communicator::world(store, 1, 0, CommOptions::named("lzy")).expect("one-rank communicator");
    assert_eq!(
        threads_named("hypercomm-lzy"),
        0,
        "no thread before any operation"
    );
    let sum = comm
        .all_reduce(vec![2.0f32], ReduceOp::Sum)
        .and_then(|w| w.wait())
        .expect("all-reduce");
    assert_eq!(sum, [2.0]);
    assert_eq!(
        threads_named_soon("hypercomm-lzy", 1),
        1,
        "the first operation started it"
    );
    drop(comm);
    assert_eq!(
        threads_named("hypercomm-lzy"),
        0,
        "dropping the communicator joined it"
    );
}

#[test]
fn an_idle_communicator_aborts_and_drops_without_a_thread() {
    let store = Arc::new(MemoryStore::new());
    let comm =
        Communicator::world(store, 1, 0, CommOptions::named("lzi")).expect("one-rank communicator");
    comm.abort();
    assert_eq!(threads_named("hypercomm-lzi"), 0);
    let err = comm
        .all_reduce(vec![1.0f32], ReduceOp::Sum)
        .expect_err("an aborted communicator runs nothing");
    assert!(matches!(err, crate::CommError::Broken { .. }), "{err}");
    assert_eq!(threads_named("hypercomm-lzi"), 0, "not even to fail");
}

/// Runs `f(rank, comm)` on `n` threads, each with its rank of a host communicator `name` over one store.
fn on_ranks<T: Send + 'static>(
    n: usize,
    name: &'static str,
    f: impl Fn(usize, Communicator) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let store = Arc::new(MemoryStore::new());
    let f = Arc::new(f);
    let threads: Vec<_> = (0..n)
        .map(|me| {
            let (store, f) = (Arc::clone(&store), Arc::clone(&f));
            std::thread::spawn(move || {
                let comm = Communicator::world(store, n, me, CommOptions::named(name))
                    .expect("communicator");
                f(me, comm)
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|t| t.join().expect("rank thread"))
        .collect()
}

#[test]
fn barrier_now_runs_on_the_calling_thread_and_starts_no_progress_thread() {
    let seen = on_ranks(2, "bnw", |_, comm| {
        comm.barrier_now().expect("first barrier");
        comm.barrier_now().expect("second barrier");
        // Both ranks are past their barriers here: any progress thread of theirs would still be alive.
        let idle = threads_named("hypercomm-bnw");
        comm.barrier_now().expect("third barrier");
        let sum = comm
            .all_reduce(vec![1.0f32], ReduceOp::Sum)
            .and_then(|w| w.wait())
            .expect("all-reduce");
        // The progress thread exists now; with nothing queued, this barrier still runs here.
        comm.barrier_now()
            .expect("barrier after the thread started");
        (idle, sum, threads_named_soon("hypercomm-bnw", 1) >= 1)
    });
    for (idle, sum, running) in seen {
        assert_eq!(idle, 0, "barrier_now started a progress thread");
        assert_eq!(sum, [2.0]);
        assert!(running, "the all-reduce started no progress thread");
    }
}

#[test]
fn an_operation_waited_on_when_it_is_next_runs_on_the_waiting_thread() {
    let ran_here = on_ranks(2, "inl", |_, comm| {
        (0..3)
            .map(|_| {
                let on = comm
                    .submit(|b| {
                        b.barrier()?;
                        Ok(std::thread::current().id())
                    })
                    .and_then(|w| w.wait())
                    .expect("barrier");
                on == std::thread::current().id()
            })
            .collect::<Vec<bool>>()
    });
    for seen in ran_here {
        assert_eq!(seen, [true, true, true]);
    }
}

#[test]
fn operations_nobody_waits_on_or_polls_complete_on_the_progress_thread() {
    let seen = on_ranks(2, "bgd", |_, comm| {
        let unwaited = |comm: &Communicator| {
            let work = comm
                .submit(|b| {
                    b.barrier()?;
                    Ok(std::thread::current().id())
                })
                .expect("barrier");
            // No wait and no poll for a while: only the progress thread can run it meanwhile.
            std::thread::sleep(std::time::Duration::from_millis(100));
            let completed = work.is_completed();
            (
                completed,
                work.wait().expect("barrier") != std::thread::current().id(),
            )
        };
        comm.barrier()
            .and_then(|w| w.wait())
            .expect("first barrier");
        // Quiet for longer than the busy window: the progress thread sleeps until a job wakes it.
        std::thread::sleep(std::time::Duration::from_millis(200));
        let after_quiet = unwaited(&comm);
        // Busy (a job issued just now): the progress thread naps, and a job does not wake it.
        comm.barrier().and_then(|w| w.wait()).expect("busy barrier");
        let while_busy = unwaited(&comm);
        (after_quiet, while_busy)
    });
    for (after_quiet, while_busy) in seen {
        assert_eq!(
            after_quiet,
            (true, true),
            "(completed, elsewhere) after a quiet spell"
        );
        assert_eq!(
            while_busy,
            (true, true),
            "(completed, elsewhere) while busy"
        );
    }
}

#[test]
fn waiting_on_a_later_operation_first_keeps_the_issue_order() {
    let seen = on_ranks(2, "ord", |me, comm| {
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = |step: u32| {
            let order = Arc::clone(&order);
            move |b: &mut dyn crate::backend::Backend| {
                b.barrier()?;
                super::lock(&order).push(step);
                Ok(step)
            }
        };
        let first = comm.submit(log(1)).expect("first");
        let second = comm.submit(log(2)).expect("second");
        // Rank 1 waits on the second first: it cannot run before the first, here or anywhere.
        let results = if me == 1 {
            let b = second.wait().expect("second");
            (first.wait().expect("first"), b)
        } else {
            (first.wait().expect("first"), second.wait().expect("second"))
        };
        (results, super::lock(&order).clone())
    });
    for (results, order) in seen {
        assert_eq!(results, (1, 2));
        assert_eq!(order, [1, 2]);
    }
}

#[test]
fn barrier_now_on_an_aborted_communicator_is_broken_and_tells_the_peer() {
    let seen = on_ranks(2, "bna", |me, comm| {
        if me == 0 {
            comm.abort();
            let err = comm.barrier_now().expect_err("aborted");
            return matches!(err, crate::CommError::Broken { .. });
        }
        // Rank 1 waits in its barrier until rank 0's abort reaches it, well within the 5-minute timeout.
        let start = std::time::Instant::now();
        let failed = comm.barrier_now().is_err();
        failed && start.elapsed() < std::time::Duration::from_secs(60)
    });
    assert_eq!(seen, [true, true]);
}

#[test]
fn an_abort_during_barrier_now_takes_effect_when_the_barrier_ends() {
    let seen = on_ranks(2, "bnd", |me, comm| {
        if me == 1 {
            // Let rank 0 wait in its barrier while its communicator is aborted from another thread.
            std::thread::sleep(std::time::Duration::from_millis(300));
            // Rank 0's barrier completes once this rank arrives, and its deferred abort follows at once. If
            // that abort lands before this rank has looked at the finished round, the transport refuses to
            // consume it (after an abort nothing more is consumed), so this barrier may fail too, and then
            // as aborted by rank 0; otherwise it succeeds and the abort fails the next operation. Either way
            // the abort reaches this rank promptly, not after the 5-minute timeout.
            let start = std::time::Instant::now();
            let failure = match comm.barrier_now() {
                Ok(()) => comm.barrier_now().err(),
                Err(e) => {
                    Some(e).filter(|e| matches!(e, crate::CommError::AbortedByPeer { by: 0, .. }))
                }
            };
            return failure.is_some() && start.elapsed() < std::time::Duration::from_secs(60);
        }
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(std::time::Duration::from_millis(100));
                comm.abort();
            });
            // The barrier borrowed the engine before the abort: it completes with rank 1's.
            comm.barrier_now().expect("rank 0's barrier");
        });
        matches!(comm.barrier_now(), Err(crate::CommError::Broken { .. }))
    });
    assert_eq!(seen, [true, true]);
}

#[test]
fn split_many_names_and_orders_children_as_that_many_splits_do() {
    let seen = on_ranks(4, "spm", |me, comm| {
        let named = |n: &str| CommOptions::named(n);
        // Split 0: even and odd ranks, ordered by descending rank; split 1: only ranks 0 and 3; split 2:
        // everyone in one color.
        let parity = Some((me % 2) as u32);
        let pair = [0, 3].contains(&me).then_some(7);
        let children: Vec<Option<Communicator>> = comm
            .split_many(vec![
                (parity, -(me as i64), named("a")),
                (pair, 0, named("b")),
                (Some(1), 0, named("c")),
            ])
            .expect("split_many")
            .collect::<Result<_, _>>()
            .expect("children");
        let summary: Vec<Option<(String, Vec<usize>)>> = children
            .iter()
            .map(|c| {
                c.as_ref()
                    .map(|c| (c.name().to_owned(), c.ranks().to_vec()))
            })
            .collect();
        // Each child works, and a later split is numbered after the batch.
        for child in children.iter().flatten() {
            child.barrier_now().expect("child barrier");
        }
        let later = comm.split(Some(0), 0).expect("split").expect("child");
        (summary, later.name().to_owned())
    });
    for (me, (summary, later)) in seen.into_iter().enumerate() {
        let parity = if me % 2 == 0 { vec![2, 0] } else { vec![3, 1] };
        assert_eq!(
            summary[0],
            Some((format!("spm/split0/color{}", me % 2), parity)),
            "rank {me}"
        );
        let pair = [0, 3]
            .contains(&me)
            .then(|| ("spm/split1/color7".to_owned(), vec![0, 3]));
        assert_eq!(summary[1], pair, "rank {me}");
        assert_eq!(
            summary[2],
            Some(("spm/split2/color1".to_owned(), vec![0, 1, 2, 3])),
            "rank {me}"
        );
        assert_eq!(later, "spm/split3/color0");
    }
}
