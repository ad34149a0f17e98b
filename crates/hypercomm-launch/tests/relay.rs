//! Ranks started by the launcher with its relay on (as on a job of several nodes) rendezvous through the node's
//! [`StoreRelay`](hypercomm_store::StoreRelay). The relay itself is tested in `hypercomm-store`'s `tests/relay.rs`.

use std::time::Duration;

use hypercomm_launch::Launcher;
use hypercomm_store::{Key, Rendezvous, Store};

const LONG: Duration = Duration::from_secs(60);

/// Rank program for `launched_ranks_rendezvous_through_the_relay`.
#[test]
#[ignore = "rank program for launched_ranks_rendezvous_through_the_relay"]
fn rank_through_relay() {
    let Ok(rdv) = Rendezvous::from_env() else {
        return;
    };
    let store = rdv.join(rdv.client_options()).unwrap().store;
    store.set(&Key::new("arrived").push(rdv.rank), b"").unwrap();
    let all: Vec<Key> = (0..rdv.world_size)
        .map(|r| Key::new("arrived").push(r))
        .collect();
    store.wait(&all, LONG).unwrap();
    println!("joined through {}", store.addr());
}

#[test]
fn launched_ranks_rendezvous_through_the_relay() {
    let report = Launcher::current_test("rank_through_relay")
        .unwrap()
        .nproc(4)
        .relay(true)
        .timeout(LONG)
        .run()
        .unwrap();
    assert!(report.success(), "{}", report.summary());
    for rank in &report.ranks {
        assert!(
            rank.stdout
                .iter()
                .any(|l| l.contains("joined through the relay of node 0")),
            "rank {}: {:?}",
            rank.rank,
            rank.stdout
        );
    }
}
