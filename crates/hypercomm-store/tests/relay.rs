//! The per-node relay: ranks of a node reach the central store through it, identical waits of many ranks become
//! one upstream wait, a dead relay fails only its node's ranks (naming the node), and a dead central store is
//! reported through every relay. Ranks started by the launcher with its relay on: `hypercomm-launch`'s
//! `tests/relay.rs`.

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use hypercomm_store::{
    ClientOptions, Key, Rendezvous, Secret, ServerOptions, Store, StoreError, StoreRelay, TcpStore,
    TcpStoreServer,
};

const LONG: Duration = Duration::from_secs(60);
const RANKS_PER_NODE: usize = 8;

fn central() -> TcpStoreServer {
    TcpStoreServer::bind("127.0.0.1:0", ServerOptions::default()).unwrap()
}

fn relay(central: &TcpStoreServer, node: usize) -> StoreRelay {
    StoreRelay::start(
        "127.0.0.1:0",
        central.local_addr(),
        node,
        ServerOptions::default(),
        ClientOptions::default(),
    )
    .unwrap()
}

/// A rank of `node` as `hypercomm launch` would start it: the environment names the relay.
fn rank_via(relay: &StoreRelay, central: &TcpStoreServer, rank: usize) -> TcpStore {
    let vars = [
        ("HYPERCOMM_RANK", rank.to_string()),
        ("HYPERCOMM_WORLD_SIZE", "64".to_owned()),
        ("HYPERCOMM_LOCAL_RANK", (rank % RANKS_PER_NODE).to_string()),
        ("HYPERCOMM_LOCAL_WORLD_SIZE", RANKS_PER_NODE.to_string()),
        ("HYPERCOMM_NODE_RANK", relay.node().to_string()),
        ("HYPERCOMM_STORE_ADDR", central.local_addr().to_string()),
        ("HYPERCOMM_STORE_RELAY", relay.local_addr().to_string()),
    ];
    let rdv = Rendezvous::from_vars(&|name: &str| {
        vars.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.clone())
    })
    .unwrap();
    let options =
        ClientOptions::default().with_timeouts(Duration::from_secs(2), Duration::from_secs(5));
    rdv.join(options).unwrap().store
}

fn wait_for(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + LONG;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn every_operation_goes_through_the_relay() {
    let central = central();
    let relay = relay(&central, 0);
    let rank = TcpStore::connect(relay.local_addr(), ClientOptions::default()).unwrap();
    let direct = TcpStore::connect(central.local_addr(), ClientOptions::default()).unwrap();
    let key = Key::new("k").push(1u64);
    rank.set(&key, b"v").unwrap();
    assert_eq!(direct.try_get(&key).unwrap().unwrap(), b"v");
    assert_eq!(rank.get(&key, LONG).unwrap(), b"v");
    rank.wait(std::slice::from_ref(&key), LONG).unwrap();
    assert_eq!(rank.add(&Key::new("n"), 3).unwrap(), 3);
    assert!(matches!(
        rank.add(&key, 1),
        Err(StoreError::NotACounter { .. })
    ));
    assert!(rank.compare_set(&key, Some(b"v"), b"w").unwrap().swapped);
    assert_eq!(rank.num_keys().unwrap(), 2);
    assert!(rank.delete(&key).unwrap());
    let err = rank
        .wait(
            &[Key::new("n"), Key::new("absent")],
            Duration::from_millis(100),
        )
        .unwrap_err();
    match err {
        StoreError::Timeout { missing, .. } => assert_eq!(missing, vec![Key::new("absent")]),
        other => panic!("expected a timeout naming the missing key, got {other}"),
    }
    assert!(relay.requests() >= 9 && relay.upstream_calls() == relay.requests());
}

#[test]
fn identical_waits_of_a_node_become_one_upstream_wait() {
    let central = central();
    let relay = Arc::new(relay(&central, 4));
    let start = Arc::new(Barrier::new(RANKS_PER_NODE));
    let ranks: Vec<_> = (0..RANKS_PER_NODE)
        .map(|r| {
            let (relay, start) = (Arc::clone(&relay), Arc::clone(&start));
            let addr = relay.local_addr();
            thread::spawn(move || {
                let store = TcpStore::connect(addr, ClientOptions::default()).unwrap();
                start.wait();
                let value = store.get(&Key::new("bootstrap"), LONG).unwrap();
                (r, value)
            })
        })
        .collect();
    wait_for("every rank's get reached the relay", || {
        relay.requests() == RANKS_PER_NODE as u64
    });
    wait_for("the upstream get is parked", || central.waiting() == 1);
    // All eight gets share one upstream call, and one parked request on the central store.
    assert_eq!(relay.upstream_calls(), 1);
    thread::sleep(Duration::from_millis(50));
    assert_eq!(central.waiting(), 1);
    TcpStore::connect(central.local_addr(), ClientOptions::default())
        .unwrap()
        .set(&Key::new("bootstrap"), b"unique id")
        .unwrap();
    for rank in ranks {
        let (_, value) = rank.join().unwrap();
        assert_eq!(value, b"unique id");
    }
    // The central store saw this node as a handful of connections, not eight ranks' worth.
    assert!(
        central.connections() <= 5,
        "{} connections",
        central.connections()
    );
}

#[test]
fn a_dead_relay_fails_only_its_node_and_names_it() {
    let central = central();
    let mut relay_1 = relay(&central, 1);
    let relay_2 = relay(&central, 2);
    let on_1 = rank_via(&relay_1, &central, 8);
    let on_2 = rank_via(&relay_2, &central, 16);
    on_1.set(&Key::new("before"), b"1").unwrap();
    relay_1.shutdown();
    let err = on_1
        .get(&Key::new("before"), Duration::from_secs(1))
        .unwrap_err();
    assert!(err.to_string().contains("relay of node 1"), "{err}");
    assert_eq!(on_2.get(&Key::new("before"), LONG).unwrap(), b"1");
}

#[test]
fn a_dead_central_store_is_reported_through_the_relay() {
    let mut central = central();
    let central_addr = central.local_addr().to_string();
    let relay = relay(&central, 3);
    let rank = rank_via(&relay, &central, 24);
    rank.set(&Key::new("a"), b"").unwrap();
    central.shutdown();
    let err = rank.set(&Key::new("b"), b"").unwrap_err();
    let text = err.to_string();
    assert!(text.contains("relay of node 3"), "{text}");
    assert!(text.contains(&central_addr), "{text}");
}

#[test]
fn relays_check_the_secret_on_both_sides() {
    let secret = Secret::new("job secret").unwrap();
    let options = ServerOptions {
        secret: Some(secret.clone()),
        ..ServerOptions::default()
    };
    let central = TcpStoreServer::bind("127.0.0.1:0", options.clone()).unwrap();
    let with = ClientOptions::default().with_secret(Some(secret.clone()));
    // A relay without the job's secret starts (it connects upstream on first use), and the first request
    // through it fails, naming the node and the refusal.
    let unauthorised = StoreRelay::start(
        "127.0.0.1:0",
        central.local_addr(),
        5,
        options.clone(),
        ClientOptions::default(),
    )
    .unwrap();
    let rank = TcpStore::connect(unauthorised.local_addr(), with.clone()).unwrap();
    let err = rank.set(&Key::new("x"), b"").unwrap_err().to_string();
    assert!(
        err.contains("relay of node 5") && err.contains("authentication"),
        "{err}"
    );

    let relay = StoreRelay::start(
        "127.0.0.1:0",
        central.local_addr(),
        0,
        options,
        with.clone(),
    )
    .unwrap();
    let quick = ClientOptions::default().with_timeouts(Duration::from_secs(1), LONG);
    assert!(matches!(
        TcpStore::connect(relay.local_addr(), quick).unwrap_err(),
        StoreError::Auth { .. }
    ));
    let rank = TcpStore::connect(relay.local_addr(), with).unwrap();
    rank.set(&Key::new("guarded"), b"ok").unwrap();
}

#[test]
fn a_relay_started_before_the_central_store_waits_for_it() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let relay = StoreRelay::start(
        "127.0.0.1:0",
        addr.as_str(),
        6,
        ServerOptions::default(),
        ClientOptions::default(),
    )
    .unwrap();
    let rank = TcpStore::connect(relay.local_addr(), ClientOptions::default()).unwrap();
    let setter = thread::spawn(move || rank.set(&Key::new("early"), b"1"));
    thread::sleep(Duration::from_millis(200));
    let central = TcpStoreServer::bind(addr.as_str(), ServerOptions::default()).unwrap();
    setter.join().unwrap().unwrap();
    let direct = TcpStore::connect(central.local_addr(), ClientOptions::default()).unwrap();
    assert_eq!(direct.try_get(&Key::new("early")).unwrap().unwrap(), b"1");
}
