//! Shrink and rebuild: 8 rank processes train with tp=2, dp=4; rank 5 is SIGKILLed mid-loop; the survivors see
//! errors, shrink the world communicator to the 7 live ranks, rebuild the collection over a layout with one dp
//! replica fewer (rank 5's tp partner sits out), and finish the loop with checked results.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hypercomm::comm::{CommError, CommOptions, Communicator, ReduceOp};
use hypercomm::grid::layout::{LayoutConfig, ParallelLayout};
use hypercomm::launch::{Exit, Launcher};
use hypercomm::pgc::{ProcessGroupCollection, ShrunkLayout};
use hypercomm::store::{Rendezvous, Store};

const WORLD: usize = 8;
const VICTIM: usize = 5;
const ITERS: u64 = 6;
const KILL_AT: u64 = 2;
const TIMEOUT: Duration = Duration::from_secs(3);

/// The value rank `rank` contributes in iteration `iter`: distinct per rank and iteration, exact in f64.
fn grad(rank: usize, iter: u64, len: usize) -> Vec<f64> {
    (0..len)
        .map(|i| (rank * 1000 + i) as f64 + iter as f64 * 0.5)
        .collect()
}

/// One training-like step on `pgc` as layout rank `rank`: a dp all-reduce of gradients and a tp all-reduce of
/// activations, each checked against the sum over the layout's members.
fn step(
    pgc: &ProcessGroupCollection,
    layout: &ParallelLayout,
    rank: usize,
    iter: u64,
) -> Result<(), CommError> {
    use hypercomm::grid::layout::GroupKind;
    for (kind, comm, len) in [
        (GroupKind::Dp, pgc.dp().unwrap(), 1000),
        (GroupKind::Tp, pgc.tp().unwrap(), 10),
    ] {
        let got = comm
            .all_reduce(grad(rank, iter, len), ReduceOp::Sum)
            .and_then(|w| w.wait())?;
        let members = layout.group_of(rank, kind).unwrap().unwrap().members;
        let want: Vec<f64> = (0..len)
            .map(|i| members.iter().map(|&m| grad(m, iter, len)[i]).sum())
            .collect();
        assert_eq!(
            got, want,
            "{kind} sum wrong at iteration {iter} on rank {rank}"
        );
    }
    Ok(())
}

#[test]
#[ignore = "rank program for a_killed_rank_is_shrunk_away_and_training_goes_on"]
fn shrink_rank() {
    let Ok(rdv) = Rendezvous::from_env() else {
        return;
    };
    let me = rdv.rank;
    println!("pid {}", std::process::id());
    let store: Arc<dyn Store> = Arc::new(rdv.join(rdv.client_options()).unwrap().store);
    let layout = LayoutConfig::new(WORLD).tp(2).build().unwrap();
    let pgc = ProcessGroupCollection::for_layout("model", layout.clone())
        .with_timeout(TIMEOUT)
        .build(me, Arc::clone(&store))
        .unwrap();
    // The world communicator fails with the collection: one failure domain, so a failure in either aborts both
    // and every survivor, wherever it meets the failure, reads the same root cause.
    let options = CommOptions {
        timeout: TIMEOUT,
        failure_domain: Some(Arc::clone(pgc.tp().unwrap().failure_domain())),
        ..CommOptions::named("world")
    };
    let world = Communicator::world(Arc::clone(&store), WORLD, me, options).unwrap();
    let mut iter = 0;
    let mut failure = None;
    while iter < ITERS {
        if me == VICTIM && iter == KILL_AT {
            // Our own pid is always valid to signal; park so that this rank takes part in nothing more.
            rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL)
                .unwrap();
            std::thread::sleep(Duration::from_secs(120));
        }
        let done =
            step(&pgc, &layout, me, iter).and_then(|()| world.barrier().and_then(|w| w.wait()));
        if let Err(e) = done {
            failure = Some(e);
            break;
        }
        iter += 1;
    }
    let failure = failure.expect("a survivor must notice that rank 5 died");
    println!("rank {me} failed at iteration {iter}: {failure}");
    // The error names the dead rank by world rank, whatever group this rank met it in: ready to shrink around.
    let lost = failure.lost_ranks().to_vec();
    println!("rank {me} lost {lost:?}");
    // Recovery. Survivors notice at different times (one waits out a timeout on a peer that went to recover), so
    // the shrink gets a longer timeout than the training communicators.
    drop(pgc);
    let started = Instant::now();
    let live = world
        .shrink_with(
            &world.positions_of(&lost).unwrap(),
            CommOptions {
                timeout: Duration::from_secs(30),
                failure_domain: None,
                ..world.options().clone()
            },
        )
        .unwrap();
    world.abort();
    assert_eq!(live.size(), WORLD - 1);
    let count = live
        .all_reduce(vec![1u32], ReduceOp::Sum)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(count, vec![WORLD as u32 - 1]);
    let shrunk = ShrunkLayout::without_replicas_of(&layout, &lost).unwrap();
    let Some(new_rank) = shrunk.new_rank(me) else {
        println!("spare rank {me}");
        return;
    };
    let pgc = ProcessGroupCollection::for_layout("model/rebuild1", shrunk.layout.clone())
        .with_timeout(TIMEOUT)
        .build(new_rank, Arc::clone(&store))
        .unwrap();
    println!("rank {me} rebuilt as {new_rank} in {:?}", started.elapsed());
    for i in iter..ITERS {
        step(&pgc, &shrunk.layout, new_rank, i).unwrap();
    }
    println!("done rank {me} as {new_rank} dp={}", shrunk.layout.dp());
}

#[test]
fn a_killed_rank_is_shrunk_away_and_training_goes_on() {
    let report = Launcher::current_test("shrink_rank")
        .unwrap()
        .nproc(WORLD)
        // The survivors keep running after rank 5 dies: give them the whole recovery before any stop signal.
        .grace(Duration::from_secs(90))
        .timeout(Duration::from_secs(150))
        .run()
        .unwrap();
    let detail = format!("{}\n{:#?}", report.summary(), report.ranks);
    assert!(!report.timed_out, "{detail}");
    assert_eq!(report.first_failure, Some(VICTIM), "{detail}");
    let layout = LayoutConfig::new(WORLD).tp(2).build().unwrap();
    let shrunk = ShrunkLayout::without_replicas_of(&layout, &[VICTIM]).unwrap();
    // Nothing is left behind: no rank process, no shared-memory file of any rank.
    let pids: Vec<u32> = report
        .ranks
        .iter()
        .filter_map(|o| {
            o.stdout
                .iter()
                .find_map(|l| l.strip_prefix("pid ")?.trim().parse().ok())
        })
        .collect();
    assert_eq!(pids.len(), WORLD, "every rank prints its pid: {detail}");
    let running: Vec<u32> = pids
        .iter()
        .copied()
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("shrink_rank"))
        })
        .collect();
    assert_eq!(running, Vec::<u32>::new(), "rank processes still running");
    let prefixes: Vec<String> = pids.iter().map(|p| format!("hypercomm-{p}-")).collect();
    let left: Vec<String> = std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| prefixes.iter().any(|p| n.starts_with(p)))
        .collect();
    assert_eq!(
        left,
        Vec::<String>::new(),
        "shared-memory files left behind"
    );
    for outcome in &report.ranks {
        let out = outcome.stdout.join("\n");
        for line in &outcome.stdout {
            if line.starts_with("rank ") || line.starts_with("done") || line.starts_with("spare") {
                println!("[rank {}] {line}", outcome.rank);
            }
        }
        if outcome.rank == VICTIM {
            assert_eq!(outcome.exit, Exit::Signal(9), "{detail}");
            continue;
        }
        assert_eq!(
            outcome.exit,
            Exit::Code(0),
            "rank {}: {detail}",
            outcome.rank
        );
        assert!(
            out.contains(&format!("rank {} failed at iteration", outcome.rank)),
            "{out}"
        );
        assert!(
            out.contains(&format!("rank {} lost [{VICTIM}]", outcome.rank)),
            "every survivor names exactly the dead rank: {out}"
        );
        match shrunk.new_rank(outcome.rank) {
            None => assert!(
                out.contains(&format!("spare rank {}", outcome.rank)),
                "{out}"
            ),
            Some(n) => assert!(
                out.contains(&format!("done rank {} as {n} dp=3", outcome.rank)),
                "{out}"
            ),
        }
    }
}
