//! Store benchmark: operations per second with 1, 8 and 64 concurrent clients, and the time for 64 local processes
//! to rendezvous (each sets its key, then waits for all 64). Prints medians.
//!
//! Run: `cargo bench --bench store`. The rendezvous processes are this bench binary itself, re-run with
//! `HYPERCOMM_BENCH_PEER=1` by the launcher.

mod support;

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use hypercomm::store::launch::Launcher;
use hypercomm::store::{ClientOptions, Key, Rendezvous, ServerOptions, Store, TcpStore};

const PEER_ENV: &str = "HYPERCOMM_BENCH_PEER";

fn main() {
    if std::env::var_os(PEER_ENV).is_some() {
        peer();
        return;
    }
    let smoke = support::smoke_run();
    let (samples, ops_per_client) = if smoke { (1, 50) } else { (7, 4000) };
    println!("store benchmark (medians of {samples} samples)");
    for clients in [1, 8, 64] {
        // Same total work at every client count, so samples take comparable time.
        let per_client = (ops_per_client * 8 / clients).max(20);
        let mut rates: Vec<f64> = (0..samples)
            .map(|_| ops_per_second(clients, per_client))
            .collect();
        rates.sort_by(f64::total_cmp);
        println!(
            "  {clients:>2} concurrent client(s): {:>9.0} ops/s (set+get pairs, loopback)",
            rates[rates.len() / 2]
        );
    }
    let procs = if smoke { 4 } else { 64 };
    let rdv_samples = if smoke { 1 } else { 5 };
    let mut times: Vec<Duration> = (0..rdv_samples).map(|_| rendezvous(procs)).collect();
    times.sort();
    println!(
        "  {procs} processes rendezvous (spawn, connect, set, wait for all, exit): {}",
        support::human(times[times.len() / 2])
    );
}

/// Total operations per second when `clients` threads, each with its own client, run `per_client` set+get pairs.
fn ops_per_second(clients: usize, per_client: usize) -> f64 {
    let server = TcpStore::server("127.0.0.1:0", ServerOptions::default()).unwrap();
    let addr = server.local_addr();
    let start = Arc::new(Barrier::new(clients + 1));
    let workers: Vec<_> = (0..clients)
        .map(|c| {
            let start = Arc::clone(&start);
            thread::spawn(move || {
                let store = TcpStore::connect(addr, ClientOptions::default()).unwrap();
                start.wait();
                for i in 0..per_client {
                    let key = Key::new("bench").push(c).push(i);
                    store.set(&key, b"0123456789abcdef").unwrap();
                    std::hint::black_box(store.try_get(&key).unwrap());
                }
            })
        })
        .collect();
    start.wait();
    let began = Instant::now();
    for w in workers {
        w.join().unwrap();
    }
    (clients * per_client * 2) as f64 / began.elapsed().as_secs_f64()
}

/// Wall time for the launcher to run `procs` peers to completion.
fn rendezvous(procs: usize) -> Duration {
    let exe = std::env::current_exe().unwrap();
    let began = Instant::now();
    let report = Launcher::new(exe)
        .env(PEER_ENV, "1")
        .nproc(procs)
        .echo(true)
        .timeout(Duration::from_secs(300))
        .run()
        .unwrap();
    let took = began.elapsed();
    assert!(report.success(), "{}", report.summary());
    took
}

/// One rendezvous process: set this rank's key, wait for every rank's.
fn peer() {
    let rdv = Rendezvous::from_env().unwrap();
    let store = TcpStore::connect(rdv.store_addr.to_string(), rdv.client_options()).unwrap();
    store.set(&Key::new("arrived").push(rdv.rank), b"").unwrap();
    let all: Vec<Key> = (0..rdv.world_size)
        .map(|r| Key::new("arrived").push(r))
        .collect();
    store.wait(&all, Duration::from_secs(120)).unwrap();
}
