//! Multi-process tests of the TCP store. The test binary re-runs itself: the `#[ignore]`d `peer_*` tests are the
//! programs each child process runs, and do nothing useful when run by hand.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::Duration;

use hypercomm::launch::Launcher;
use hypercomm::store::{
    ClientOptions, Key, Rendezvous, Secret, ServerOptions, Store, StoreError, TcpStore,
};

const LONG: Duration = Duration::from_secs(60);

fn value_key(rank: usize) -> Key {
    Key::new("value").push(rank)
}

/// Rank program: publish a value, wait for everyone's, print them all, then meet at a counter barrier.
#[test]
#[ignore = "rank program for processes_rendezvous_and_exchange_values"]
fn peer_exchange() {
    let Ok(rdv) = Rendezvous::from_env() else {
        return;
    };
    let joined = rdv.join(rdv.client_options()).unwrap();
    let store = joined.store;
    store
        .set(
            &value_key(rdv.rank),
            format!("value-{}", rdv.rank).as_bytes(),
        )
        .unwrap();
    let keys: Vec<Key> = (0..rdv.world_size).map(value_key).collect();
    store.wait(&keys, LONG).unwrap();
    let values: Vec<String> = keys
        .iter()
        .map(|k| String::from_utf8(store.get(k, LONG).unwrap()).unwrap())
        .collect();
    println!("rank {} saw {}", rdv.rank, values.join(","));
    let arrived = store.add(&Key::new("arrived"), 1).unwrap();
    assert!((1..=rdv.world_size as i64).contains(&arrived));
    if arrived == rdv.world_size as i64 {
        store.set(&Key::new("done"), b"").unwrap();
    }
    // Rank 0's launcher-hosted store outlives every rank, but a rank-hosted one would not: leave together.
    store.wait(&[Key::new("done")], LONG).unwrap();
}

#[test]
fn processes_rendezvous_and_exchange_values() {
    let report = Launcher::current_test("peer_exchange")
        .unwrap()
        .nproc(4)
        .timeout(Duration::from_secs(120))
        .run()
        .unwrap();
    assert!(
        report.success(),
        "{}\n{:#?}",
        report.summary(),
        report.ranks
    );
    let all = "value-0,value-1,value-2,value-3";
    for outcome in &report.ranks {
        let expected = format!("rank {} saw {all}", outcome.rank);
        assert!(
            outcome.stdout.contains(&expected),
            "rank {} printed {:?}",
            outcome.rank,
            outcome.stdout
        );
    }
}

/// Rank program: connect (the server may not be up yet), then write `started` with this process's rank.
#[test]
#[ignore = "rank program for a_client_started_before_the_server_connects_once_it_is_up"]
fn peer_early_client() {
    let Ok(rdv) = Rendezvous::from_env() else {
        return;
    };
    let store = TcpStore::connect(rdv.store_addr.to_string(), rdv.client_options()).unwrap();
    store
        .set(&Key::new("started").push(rdv.rank), b"yes")
        .unwrap();
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs one peer test of this binary as a plain child process with the given environment.
fn peer(test: &str, env: &[(&str, String)]) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        test,
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
        "--quiet",
    ])
    .env_remove("HYPERCOMM_STORE_SECRET")
    .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
    .stdin(Stdio::null())
    .stdout(Stdio::null());
    cmd
}

fn rank_env(rank: usize, world: usize, addr: &str) -> Vec<(&'static str, String)> {
    vec![
        ("HYPERCOMM_RANK", rank.to_string()),
        ("HYPERCOMM_WORLD_SIZE", world.to_string()),
        ("HYPERCOMM_LOCAL_RANK", rank.to_string()),
        ("HYPERCOMM_LOCAL_WORLD_SIZE", world.to_string()),
        ("HYPERCOMM_STORE_ADDR", addr.to_string()),
    ]
}

#[test]
fn a_client_started_before_the_server_connects_once_it_is_up() {
    let addr = format!("127.0.0.1:{}", free_port());
    let mut children: Vec<_> = (0..2)
        .map(|rank| {
            peer("peer_early_client", &rank_env(rank, 2, &addr))
                .spawn()
                .unwrap()
        })
        .collect();
    // The children are already retrying against a closed port; now bring the server up.
    std::thread::sleep(Duration::from_millis(300));
    let server = TcpStore::server(&*addr, ServerOptions::default()).unwrap();
    let me = TcpStore::connect(server.local_addr(), ClientOptions::default()).unwrap();
    me.wait(
        &[
            Key::new("started").push(0usize),
            Key::new("started").push(1usize),
        ],
        LONG,
    )
    .unwrap();
    for child in &mut children {
        assert!(child.wait().unwrap().success());
    }
}

#[test]
fn a_wrong_secret_is_refused_across_processes() {
    let server = TcpStore::server(
        "127.0.0.1:0",
        ServerOptions {
            secret: Some(Secret::new("right").unwrap()),
            ..ServerOptions::default()
        },
    )
    .unwrap();
    let mut env = rank_env(0, 1, &server.local_addr().to_string());
    env.push(("HYPERCOMM_STORE_SECRET", "wrong".into()));
    let out = peer("peer_early_client", &env).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("wrong shared secret"), "{stderr}");
    let me = TcpStore::connect(
        server.local_addr(),
        ClientOptions::default().with_secret(Some(Secret::new("right").unwrap())),
    )
    .unwrap();
    assert_eq!(me.num_keys().unwrap(), 0);
}

/// Server program: host a store on a free port, print the port, and serve until killed.
#[test]
#[ignore = "server program for a_killed_server_fails_every_client_within_its_timeout"]
fn peer_server() {
    if std::env::var_os("HYPERCOMM_TEST_SERVE").is_none() {
        return;
    }
    let server = TcpStore::server("127.0.0.1:0", ServerOptions::default()).unwrap();
    println!("port {}", server.local_addr().port());
    // Serve until the parent kills this process; bounded so a leaked child cannot live forever.
    std::thread::sleep(Duration::from_secs(300));
}

#[test]
fn a_killed_server_fails_every_client_within_its_timeout() {
    let mut server = peer("peer_server", &[("HYPERCOMM_TEST_SERVE", "1".into())])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
    let port = lines
        .find_map(|line| {
            line.unwrap()
                .strip_prefix("port ")
                .map(|p| p.parse::<u16>().unwrap())
        })
        .unwrap();
    let options =
        ClientOptions::default().with_timeouts(Duration::from_secs(5), Duration::from_secs(5));
    let clients: Vec<_> = (0..4)
        .map(|_| TcpStore::connect(format!("127.0.0.1:{port}"), options.clone()).unwrap())
        .collect();
    clients[0].set(&Key::new("before"), b"1").unwrap();
    let waiters: Vec<_> = clients
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || (c.get(&Key::new("never"), Duration::from_secs(600)), c))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    server.kill().unwrap();
    server.wait().unwrap();
    for waiter in waiters {
        let (result, client) = waiter.join().unwrap();
        let err = result.unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::Disconnected { .. } | StoreError::Connect { .. }
            ),
            "{err}"
        );
        assert!(err.to_string().contains(&port.to_string()), "{err}");
        // Later calls fail too, within the client's timeouts, instead of hanging.
        assert!(client.set(&Key::new("after"), b"").is_err());
    }
}
