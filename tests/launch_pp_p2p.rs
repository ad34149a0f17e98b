//! The user's view of separate sends and receives (issue "every parallelism"): four ranks under the launcher (what
//! `hypercomm launch` runs), a pp=4 collection, each rank sends 8 MiB to the next stage and then receives from the
//! previous one as two separate asynchronous operations, and only then waits on both. Every rank completes with
//! every byte checked, well within the communicator timeout (before, each timed out blaming its neighbour).

use std::sync::Arc;
use std::time::{Duration, Instant};

use hypercomm::grid::layout::LayoutConfig;
use hypercomm::launch::{Exit, Launcher};
use hypercomm::pgc::ProcessGroupCollection;
use hypercomm::store::{Rendezvous, Store};

const RANKS: usize = 4;
const COMM_TIMEOUT: Duration = Duration::from_secs(30);
/// u32s: 8 MiB.
const LEN: usize = 2 << 20;

fn pattern(from: usize, i: usize) -> u32 {
    (i as u32).wrapping_mul(2_654_435_761) ^ from as u32
}

/// Rank program: one pipeline ring, send then receive, then both waits.
#[test]
#[ignore = "rank program of separate_sends_and_receives_complete_around_a_pipeline"]
fn pp_rank() {
    let Ok(rdv) = Rendezvous::from_env() else {
        return;
    };
    let rank = rdv.rank;
    let joined = rdv.join(rdv.client_options()).unwrap();
    let store: Arc<dyn Store> = Arc::new(joined.store);
    let layout = LayoutConfig::new(RANKS).pp(RANKS).build().unwrap();
    let pgc = ProcessGroupCollection::for_layout("pp-ring", layout)
        .with_timeout(COMM_TIMEOUT)
        .build(rank, store)
        .unwrap();
    let pp = pgc.pp().unwrap();
    let (me, n) = (pp.rank(), pp.size());
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let start = Instant::now();
    for round in 0..3 {
        let mine: Vec<u32> = (0..LEN).map(|i| pattern(me + round, i)).collect();
        let sent = pp.send(mine, next, 0).unwrap();
        let received = pp.recv(vec![0u32; LEN], prev, 0).unwrap();
        let got = received.wait().unwrap();
        sent.wait().unwrap();
        let bad = (0..LEN).find(|&i| got[i] != pattern(prev + round, i));
        assert_eq!(
            bad, None,
            "round {round}: first wrong element from stage {prev}"
        );
    }
    println!("OK ms={}", start.elapsed().as_millis());
}

#[test]
fn separate_sends_and_receives_complete_around_a_pipeline() {
    let report = Launcher::current_test("pp_rank")
        .unwrap()
        .nproc(RANKS)
        .comm_timeout(COMM_TIMEOUT)
        .timeout(Duration::from_secs(120))
        .run()
        .unwrap();
    assert!(!report.timed_out, "{}", report.summary());
    for rank in &report.ranks {
        assert_eq!(rank.exit, Exit::Code(0), "{}", report.summary());
        let ok: Vec<_> = rank
            .stdout
            .iter()
            .filter(|l| l.starts_with("OK ms="))
            .collect();
        assert_eq!(ok.len(), 1, "rank {}: {:?}", rank.rank, rank.stdout);
        let ms: u64 = ok[0].trim_start_matches("OK ms=").trim().parse().unwrap();
        // Three rounds of 8 MiB take well under a second unloaded; a ring that does not progress takes the timeout.
        assert!(
            ms < COMM_TIMEOUT.as_millis() as u64 / 2,
            "rank {}: {ms} ms",
            rank.rank
        );
    }
}
