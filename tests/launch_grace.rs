//! The launcher's default grace period lets survivors report (issue #17): a rank that fails before its
//! communicators exist leaves the others waiting out their communicator timeout, and with the default grace
//! (derived from that timeout) every one of them prints its error naming the lost rank and exits by itself, rather
//! than being stopped by the launcher first.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hypercomm::comm::{CommOptions, Communicator};
use hypercomm::launch::{DEFAULT_COMM_TIMEOUT, Exit, LaunchReport, Launcher};
use hypercomm::store::{Rendezvous, Store, TcpStore};

const RANKS: usize = 4;
/// Longer than the launcher's old fixed 5 s grace, so that a grace not derived from it would cut the survivors off.
const COMM_TIMEOUT: Duration = Duration::from_secs(6);
/// Exit status of a survivor that reported its error.
const REPORTED: i32 = 17;
/// Exit status of the rank that fails.
const FAILED: i32 = 7;

/// Rank program: the last rank fails before joining; the others bootstrap a communicator with the timeout the
/// launcher told them, and report how it failed.
#[test]
#[ignore = "rank program of survivors_report_within_the_default_grace"]
fn grace_rank() {
    let Ok(rdv) = Rendezvous::from_env() else {
        return;
    };
    let timeout = rdv
        .comm_timeout
        .expect("the launcher tells every rank its communicator timeout");
    if rdv.rank == rdv.world_size - 1 {
        eprintln!("failing before joining");
        std::process::exit(FAILED);
    }
    let client = rdv.client_options().with_timeouts(timeout, timeout);
    let store: Arc<dyn Store> =
        Arc::new(TcpStore::connect(rdv.store_addr.to_string(), client).unwrap());
    let options = CommOptions {
        timeout,
        ..CommOptions::named("grace")
    };
    let start = Instant::now();
    match Communicator::world(store, rdv.world_size, rdv.rank, options) {
        Ok(_) => panic!(
            "the communicator was made without rank {}",
            rdv.world_size - 1
        ),
        Err(e) => {
            println!("REPORTED ms={} err={e}", start.elapsed().as_millis());
            std::process::exit(REPORTED);
        }
    }
}

fn launch(grace: Option<Duration>) -> LaunchReport {
    let mut launcher = Launcher::current_test("grace_rank")
        .unwrap()
        .nproc(RANKS)
        .comm_timeout(COMM_TIMEOUT)
        .timeout(Duration::from_secs(90));
    if let Some(grace) = grace {
        launcher = launcher.grace(grace);
    }
    let report = launcher.run().unwrap();
    assert!(!report.timed_out, "{}", report.summary());
    assert_eq!(
        report.first_failure,
        Some(RANKS - 1),
        "{}",
        report.summary()
    );
    assert_eq!(report.rank(RANKS - 1).unwrap().exit, Exit::Code(FAILED));
    report
}

#[test]
fn survivors_report_within_the_default_grace() {
    // The launcher's default must be the communicators' default, or the derived grace protects nothing.
    assert_eq!(DEFAULT_COMM_TIMEOUT, CommOptions::named("any").timeout);
    let report = launch(None);
    for survivor in &report.ranks[..RANKS - 1] {
        let reported: Vec<_> = survivor
            .stdout
            .iter()
            .filter(|l| l.starts_with("REPORTED"))
            .collect();
        assert!(
            survivor.exit == Exit::Code(REPORTED) && !survivor.stopped_by_launcher,
            "rank {} did not report by itself: {}\n{:?}",
            survivor.rank,
            report.summary(),
            survivor.stdout
        );
        assert!(
            reported.len() == 1 && reported[0].contains(&format!("[{}]", RANKS - 1)),
            "rank {}'s error does not name rank {}: {reported:?}",
            survivor.rank,
            RANKS - 1
        );
    }
    // The job ended when the survivors had reported, not at the end of the grace period.
    assert!(
        report.elapsed < COMM_TIMEOUT + hypercomm::launch::REPORT_MARGIN,
        "{:?}",
        report.elapsed
    );

    // The control: a grace shorter than the communicator timeout stops the survivors before they can report.
    let cut = launch(Some(Duration::from_millis(500)));
    for survivor in &cut.ranks[..RANKS - 1] {
        assert!(survivor.stopped_by_launcher, "{}", cut.summary());
        assert!(
            !survivor.stdout.iter().any(|l| l.starts_with("REPORTED")),
            "rank {} reported within 0.5 s of a 6 s timeout: {:?}",
            survivor.rank,
            survivor.stdout
        );
    }
}
