//! Store benchmark, on loopback. Prints medians of:
//!
//! - set+get throughput with 1, 8, 64 and [`MANY`] concurrent clients (threads, each with its own client);
//! - accepting [`MANY`] authenticated connections: connections per second, and the server's threads and memory
//!   per idle connection once they are all open (the server runs in a child process, so its numbers are its own);
//! - one `get` per client on a key nobody has written, [`MANY`] clients: time from the `set` to the last release;
//! - a whole-job rendezvous of [`MANY`] client connections: each connects, sets its key, adds to an arrival
//!   counter, and waits for the key the last arrival writes;
//! - the same rendezvous of half as many clients through one relay per 8 clients (one per node of 8 ranks), and
//!   how many connections the central store held;
//! - 64 local processes rendezvousing through the launcher (spawn, connect, set, wait for all, exit).
//!
//! Run: `cargo bench --bench store`. [`MANY`] connections need about twice as many open files in this process
//! (both ends live here), so the bench raises its own soft `RLIMIT_NOFILE` to the hard limit, and says so. The
//! child processes are this bench binary itself, re-run with [`PEER_ENV`] or [`SERVER_ENV`] set.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use hypercomm::launch::Launcher;
use hypercomm::store::{
    ClientOptions, Key, Rendezvous, SECRET_ENV, Secret, ServerOptions, Store, StoreRelay, TcpStore,
};
use hypercomm_bench::harness::{human, smoke_run};
use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

const PEER_ENV: &str = "HYPERCOMM_BENCH_PEER";
const SERVER_ENV: &str = "HYPERCOMM_BENCH_SERVER";
/// The many-clients figure the issue asks for.
const MANY: usize = 8000;
const LONG: Duration = Duration::from_secs(300);
/// Stack for each client thread: a client call needs little, and thousands of threads share two cores.
const CLIENT_STACK: usize = 128 * 1024;

fn main() {
    if std::env::var_os(PEER_ENV).is_some() {
        peer();
        return;
    }
    if std::env::var_os(SERVER_ENV).is_some() {
        serve();
        return;
    }
    let smoke = smoke_run();
    let (samples, many_samples, ops_per_client) = if smoke { (1, 1, 50) } else { (7, 3, 4000) };
    println!(
        "store benchmark (medians of {samples} samples; {many_samples} for the many-client figures)"
    );
    let many = if smoke { 200 } else { many_within_open_files() };
    for clients in [1, 8, 64, many] {
        // Same total work at 1 to 64 clients, so samples take comparable time; at least 20 pairs per client.
        let per_client = (ops_per_client * 8 / clients).max(20);
        let n = if clients == many {
            many_samples
        } else {
            samples
        };
        let rates = median(
            (0..n)
                .map(|_| ops_per_second(clients, per_client))
                .collect(),
        );
        println!(
            "  {clients:>5} concurrent client(s): {:>9.0} ops/s (set+get pairs)",
            rates
        );
    }
    let accepts: Vec<Accepted> = (0..many_samples).map(|_| accept_many(many)).collect();
    println!(
        "  accept {many} authenticated connections: {:.0} connections/s; server then has {} threads, {:.1} KiB \
         more resident memory per idle connection",
        median(accepts.iter().map(|a| a.per_second).collect()),
        median(accepts.iter().map(|a| a.server_threads as f64).collect()),
        median(
            accepts
                .iter()
                .map(|a| a.bytes_per_connection / 1024.0)
                .collect()
        ),
    );
    let releases = median_duration((0..many_samples).map(|_| release_waiters(many)).collect());
    println!(
        "  one key released to {many} waiting clients: {} from the set to the last release",
        human(releases)
    );
    let job = median_duration((0..many_samples).map(|_| whole_job(many)).collect());
    println!(
        "  whole-job rendezvous, {many} client connections (connect, set, add, wait for the last arrival): {}",
        human(job)
    );
    let relayed: Vec<(Duration, usize)> = (0..many_samples)
        .map(|_| whole_job_relayed(many / 2))
        .collect();
    println!(
        "  the same through one relay per 8 clients, {} clients and {} relays: {}; the central store then held {} \
         connections",
        many / 2,
        (many / 2).div_ceil(8),
        human(median_duration(relayed.iter().map(|r| r.0).collect())),
        median(relayed.iter().map(|r| r.1 as f64).collect()),
    );
    let procs = if smoke { 4 } else { 64 };
    let rdv_samples = if smoke { 1 } else { 5 };
    let times = median_duration((0..rdv_samples).map(|_| rendezvous(procs)).collect());
    println!(
        "  {procs} processes rendezvous (spawn, connect, set, wait for all, exit): {}",
        human(times)
    );
}

fn median(values: Vec<f64>) -> f64 {
    hypercomm_bench::median(&values).unwrap_or(f64::NAN)
}

fn median_duration(values: Vec<Duration>) -> Duration {
    hypercomm_bench::median(&values).unwrap_or_default()
}

/// Raises this process's soft open-file limit to its hard limit (children inherit it) and returns how many
/// clients fit: [`MANY`], or fewer when the hard limit is too low for both ends of every connection.
fn many_within_open_files() -> usize {
    let limit = getrlimit(Resource::Nofile);
    let raised = Rlimit {
        current: limit.maximum,
        maximum: limit.maximum,
    };
    if let Err(e) = setrlimit(Resource::Nofile, raised) {
        println!("  (cannot raise the open-file limit: {e})");
    }
    let soft = getrlimit(Resource::Nofile).current;
    println!(
        "  open-file limit of this bench (soft, raised to the hard limit): {}",
        soft.map_or_else(|| "unlimited".to_owned(), |n| n.to_string())
    );
    // Both ends of each connection, plus room for the rest of the process.
    let fits = soft.map_or(MANY, |n| {
        usize::try_from(n.saturating_sub(512) / 2).unwrap_or(MANY)
    });
    if fits < MANY {
        println!("  (only {fits} clients fit under that limit; measuring with {fits})");
    }
    MANY.min(fits)
}

/// Starts `n` threads, each with its own connected client, waiting at a barrier; `work` runs in each after it.
fn client_threads<T: Send + 'static>(
    n: usize,
    connect: impl Fn() -> TcpStore + Send + Sync + 'static,
    work: impl Fn(usize, &TcpStore) -> T + Send + Sync + 'static,
) -> (Arc<Barrier>, Vec<thread::JoinHandle<T>>) {
    let start = Arc::new(Barrier::new(n + 1));
    let connect = Arc::new(connect);
    let work = Arc::new(work);
    let handles = (0..n)
        .map(|c| {
            let (start, connect, work) =
                (Arc::clone(&start), Arc::clone(&connect), Arc::clone(&work));
            thread::Builder::new()
                .stack_size(CLIENT_STACK)
                .spawn(move || {
                    let store = connect();
                    start.wait();
                    work(c, &store)
                })
                .unwrap()
        })
        .collect();
    (start, handles)
}

fn long_options() -> ClientOptions {
    ClientOptions::default().with_timeouts(LONG, LONG)
}

/// Total operations per second when `clients` threads, each with its own client, run `per_client` set+get pairs.
fn ops_per_second(clients: usize, per_client: usize) -> f64 {
    let server = TcpStore::server("127.0.0.1:0", ServerOptions::default()).unwrap();
    let addr = server.local_addr();
    let (start, workers) = client_threads(
        clients,
        move || TcpStore::connect(addr, long_options()).unwrap(),
        move |c, store| {
            for i in 0..per_client {
                let key = Key::new("bench").push(c).push(i);
                store.set(&key, b"0123456789abcdef").unwrap();
                std::hint::black_box(store.try_get(&key).unwrap());
            }
        },
    );
    start.wait();
    let began = Instant::now();
    for w in workers {
        w.join().unwrap();
    }
    (clients * per_client * 2) as f64 / began.elapsed().as_secs_f64()
}

/// A store server in a child process (this binary with [`SERVER_ENV`]), with a secret.
struct ChildServer {
    child: Child,
    addr: String,
    secret: Secret,
}

impl ChildServer {
    fn start() -> ChildServer {
        let secret = Secret::new("store-bench-secret").unwrap();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .env(SERVER_ENV, "1")
            .env(SECRET_ENV, "store-bench-secret")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line.trim().to_owned();
        assert!(addr.starts_with("127.0.0.1:"), "child server said {line:?}");
        ChildServer {
            child,
            addr,
            secret,
        }
    }

    fn options(&self) -> ClientOptions {
        long_options().with_secret(Some(self.secret.clone()))
    }

    /// How many file descriptors the child has open (each client connection is one).
    fn open_files(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .map(|dir| dir.count())
            .unwrap_or(0)
    }

    /// The child's thread count and resident memory in bytes, from `/proc/PID/status`.
    fn threads_and_rss(&self) -> (usize, f64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let field = |name: &str| -> f64 {
            let line = status.lines().find(|l| l.starts_with(name)).unwrap();
            line.split_whitespace().nth(1).unwrap().parse().unwrap()
        };
        (field("Threads:") as usize, field("VmRSS:") * 1024.0)
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        // Closing its standard input stops the child; give it ten seconds, then kill it.
        drop(self.child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(10);
        while matches!(self.child.try_wait(), Ok(None)) {
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return;
            }
            thread::sleep(Duration::from_millis(10));
        }
    }
}

/// The child server: serve on a free loopback port, print the address, stop when standard input closes.
fn serve() {
    let secret = Secret::from_env().unwrap();
    let server = TcpStore::server(
        "127.0.0.1:0",
        ServerOptions {
            secret,
            ..ServerOptions::default()
        },
    )
    .unwrap();
    println!("{}", server.local_addr());
    let (done, closed) = mpsc::channel();
    thread::spawn(move || {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        let _ = done.send(());
    });
    let _ = closed.recv_timeout(Duration::from_secs(3600));
}

struct Accepted {
    per_second: f64,
    server_threads: usize,
    bytes_per_connection: f64,
}

/// Opens `n` authenticated connections to a fresh child server from four threads, as fast as they go.
fn accept_many(n: usize) -> Accepted {
    const CONNECTORS: usize = 4;
    let server = ChildServer::start();
    let (_, rss_before) = server.threads_and_rss();
    let began = Instant::now();
    let connectors: Vec<_> = (0..CONNECTORS)
        .map(|k| {
            let (addr, options) = (server.addr.clone(), server.options());
            let count = n / CONNECTORS + usize::from(k < n % CONNECTORS);
            thread::spawn(move || {
                (0..count)
                    .map(|_| TcpStore::connect(addr.as_str(), options.clone()).unwrap())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let clients: Vec<TcpStore> = connectors
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    let took = began.elapsed();
    // Every client finished its handshake, so the server holds every connection now.
    let (threads, rss_after) = server.threads_and_rss();
    assert_eq!(clients.len(), n);
    drop(clients);
    Accepted {
        per_second: n as f64 / took.as_secs_f64(),
        server_threads: threads,
        bytes_per_connection: (rss_after - rss_before) / n as f64,
    }
}

/// `n` clients each `get` a key nobody has written; the time from writing it to the last client's release.
fn release_waiters(n: usize) -> Duration {
    let server = TcpStore::server("127.0.0.1:0", ServerOptions::default()).unwrap();
    let addr = server.local_addr();
    let (start, waiters) = client_threads(
        n,
        move || TcpStore::connect(addr, long_options()).unwrap(),
        |_, store| {
            assert_eq!(store.get(&Key::new("go"), LONG).unwrap(), b"now");
            Instant::now()
        },
    );
    start.wait();
    let deadline = Instant::now() + LONG;
    // Bounded by the deadline: every client parks its get within it or the bench fails.
    while server.waiting() < n {
        assert!(
            Instant::now() < deadline,
            "only {} of {n} gets parked",
            server.waiting()
        );
        thread::sleep(Duration::from_millis(5));
    }
    let setter = TcpStore::connect(addr, long_options()).unwrap();
    let set_at = Instant::now();
    setter.set(&Key::new("go"), b"now").unwrap();
    let last = waiters
        .into_iter()
        .map(|w| w.join().unwrap())
        .max()
        .unwrap();
    last.duration_since(set_at)
}

/// `n` clients of a child server with a secret each connect, set their key and count themselves in; the last to
/// arrive writes `complete`, which everyone waits for. (Waiting on all `n` keys instead costs `n` squared: at
/// 8,000 ranks, 8,000 requests of 8,000 keys each, about 1.3 GB of frames and 64 million keys held at once.)
fn whole_job(n: usize) -> Duration {
    let server = ChildServer::start();
    let (addr, options) = (server.addr.clone(), server.options());
    let start = Arc::new(Barrier::new(n + 1));
    let ranks: Vec<_> = (0..n)
        .map(|rank| {
            let (addr, options, start) = (addr.clone(), options.clone(), Arc::clone(&start));
            thread::Builder::new()
                .stack_size(CLIENT_STACK)
                .spawn(move || {
                    start.wait();
                    let store = TcpStore::connect(addr.as_str(), options).unwrap();
                    store.set(&Key::new("arrived").push(rank), b"").unwrap();
                    let count = store.add(&Key::new("arrivals"), 1).unwrap();
                    if count == n as i64 {
                        store.set(&Key::new("complete"), b"").unwrap();
                    }
                    store.wait(&[Key::new("complete")], LONG).unwrap();
                })
                .unwrap()
        })
        .collect();
    start.wait();
    let began = Instant::now();
    for rank in ranks {
        rank.join().unwrap();
    }
    began.elapsed()
}

/// [`whole_job`] with `n` clients reaching the central store through one relay per 8 clients (as `hypercomm
/// launch` runs one per node of 8 ranks), all in this process. Returns the time and the central store's client
/// connections at the end.
fn whole_job_relayed(n: usize) -> (Duration, usize) {
    const PER_NODE: usize = 8;
    let server = ChildServer::start();
    let open_before = server.open_files();
    let job_secret = Some(server.secret.clone());
    let relays: Vec<StoreRelay> = (0..n.div_ceil(PER_NODE))
        .map(|node| {
            let options = ServerOptions {
                secret: job_secret.clone(),
                ..ServerOptions::default()
            };
            StoreRelay::start(
                "127.0.0.1:0",
                server.addr.as_str(),
                node,
                options,
                server.options(),
            )
            .unwrap()
        })
        .collect();
    let options = server.options();
    let start = Arc::new(Barrier::new(n + 1));
    let ranks: Vec<_> = (0..n)
        .map(|rank| {
            let (addr, options, start) = (
                relays[rank / PER_NODE].local_addr(),
                options.clone(),
                Arc::clone(&start),
            );
            thread::Builder::new()
                .stack_size(CLIENT_STACK)
                .spawn(move || {
                    start.wait();
                    let store = TcpStore::connect(addr, options).unwrap();
                    store.set(&Key::new("arrived").push(rank), b"").unwrap();
                    let count = store.add(&Key::new("arrivals"), 1).unwrap();
                    if count == n as i64 {
                        store.set(&Key::new("complete"), b"").unwrap();
                    }
                    store.wait(&[Key::new("complete")], LONG).unwrap();
                })
                .unwrap()
        })
        .collect();
    start.wait();
    let began = Instant::now();
    for rank in ranks {
        rank.join().unwrap();
    }
    let took = began.elapsed();
    let central = server.open_files().saturating_sub(open_before);
    drop(relays);
    (took, central)
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
