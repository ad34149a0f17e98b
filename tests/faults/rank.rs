//! The rank side of the fault suite: what each process does in each case. Run by the launcher as the
//! `#[ignore]`d test `rank::fault_rank`; does nothing without `HC_FAULT_CASE`.
//!
//! Every rank prints `pid <pid>` first, then reports what it saw (`report`). Any other outcome panics (exit
//! status 101), which the driver reports. The device cases' ranks are in `device`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hypercomm::comm::{CommOptions, Communicator, ReduceOp};
use hypercomm::grid::layout::LayoutConfig;
use hypercomm::pgc::{BuildStep, CollectionError, GroupId, ProcessGroupCollection};
use hypercomm::store::{ClientOptions, Key, Rendezvous, Secret, Store, TcpStore};
use rustix::process::{Signal, getpid, kill_process};

use crate::device;
use crate::report::seen;

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} must be set for a fault rank"))
}

/// Sends `signal` to this process and never returns. The signal may land a moment after `kill` returns, so the
/// calling thread parks instead of going on to take part in the next operation.
fn die(signal: Signal) -> ! {
    // Our own pid is always valid to signal.
    kill_process(getpid(), signal).unwrap();
    for _ in 0..600 {
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("still running two minutes after {signal:?}");
}

/// Waits (bounded) until `key` exists, so the victim dies at a known point of the bootstrap.
fn wait_for(store: &dyn Store, key: &Key) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while store.try_get(key).ok().flatten().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
#[ignore = "rank program of the fault suite"]
fn fault_rank() {
    let Ok(case) = std::env::var("HC_FAULT_CASE") else {
        return;
    };
    println!("pid {}", std::process::id());
    let rdv = Rendezvous::from_env().unwrap();
    let (me, n) = (rdv.rank, rdv.world_size);
    let victim: usize = var("HC_FAULT_VICTIM").parse().unwrap();
    let timeout = Duration::from_millis(var("HC_FAULT_TIMEOUT_MS").parse().unwrap());
    let name = format!("fault-{case}");
    let options = CommOptions {
        timeout,
        force_tcp: case.ends_with("tcp") || case == "tcp_drop",
        ..CommOptions::named(name.clone())
    };
    let mut client = rdv.client_options().with_timeouts(timeout * 2, timeout);
    if case == "wrong_secret" && me == victim {
        client = client.with_secret(Some(Secret::new(b"not the job's secret".to_vec()).unwrap()));
    }
    // The store_kill case's own store runs without a secret.
    let addr = match std::env::var("HC_STORE") {
        Ok(addr) => {
            client = client.with_secret(None);
            addr
        }
        Err(_) => rdv.store_addr.to_string(),
    };
    let start = Instant::now();
    let store: Arc<dyn Store> = match TcpStore::connect(addr, client) {
        Ok(s) => Arc::new(s),
        Err(e) if case == "wrong_secret" && me == victim => seen("FAULTY", start, Err::<(), _>(e)),
        Err(e) => panic!("rank {me} cannot reach the store: {e}"),
    };
    let world = |size: usize| Communicator::world(Arc::clone(&store), size, me, options.clone());
    let small = |comm: &Communicator| {
        comm.all_reduce(vec![1.0f32; 16], ReduceOp::Sum)
            .and_then(|w| w.wait())
    };
    match case.as_str() {
        "bootstrap_kill" => {
            if me == victim {
                let (boot_store, boot_options) = (Arc::clone(&store), options.clone());
                let boot = std::thread::spawn(move || {
                    Communicator::world(boot_store, n, me, boot_options)
                });
                // Die once some rank has arrived (the bootstrap's `arrivals` counter exists): the others have started
                // meeting, and this rank may or may not have been counted yet.
                wait_for(
                    store.as_ref(),
                    &Key::new("comm").push(name.as_str()).push("arrivals"),
                );
                drop(boot);
                die(Signal::KILL);
            }
            let start = Instant::now();
            // Should the victim die just after the bootstrap completed, the first operation notices instead.
            let result = world(n).and_then(|comm| comm.barrier()?.wait());
            seen("SEEN", start, result)
        }
        "wrong_world" | "wrong_secret" => {
            if me == victim {
                let start = Instant::now();
                seen("FAULTY", start, world(n + 1).and_then(|c| small(&c)))
            }
            let start = Instant::now();
            seen("SEEN", start, world(n).and_then(|c| small(&c)))
        }
        step if step.starts_with("step_") => {
            let step = step["step_".len()..].to_owned();
            let victim: usize = var("HC_FAULT_VICTIM").parse().unwrap();
            let layout = LayoutConfig::new(n).tp(2).build().unwrap();
            let mut builder = ProcessGroupCollection::for_layout(name.as_str(), layout)
                .with_world_group(true)
                .with_timeout(timeout);
            if me == victim {
                // Die at the first time this rank reaches `step` in the last group built, `world`.
                builder = builder.with_step_hook(move |at: &BuildStep<'_>| {
                    if at.name() == step && at.group().is_none_or(|g| g.kind == "world") {
                        die(Signal::KILL);
                    }
                });
            }
            let start = Instant::now();
            let result = builder.build(me, Arc::clone(&store)).and_then(|pgc| {
                // Should the victim die after the build completed (the `built` step), the world notices.
                let world = pgc.world()?;
                world
                    .barrier()
                    .and_then(|w| w.wait())
                    .map_err(|source| CollectionError::Comm {
                        collection: name.clone(),
                        group: GroupId::kind("world"),
                        source: Box::new(source),
                    })
            });
            if me == victim {
                panic!("the victim never reached step {case}: {result:?}");
            }
            seen("SEEN", start, result)
        }
        "collection_kill" => {
            let layout = LayoutConfig::new(n).tp(2).build().unwrap();
            let builder = ProcessGroupCollection::for_layout(name.as_str(), layout)
                .with_explicit_groups("everyone", vec![(0..n).collect()])
                .with_timeout(timeout);
            if me == victim {
                // Die once the others are building (their first store keys exist): they cannot finish without
                // this rank, which takes part in the `everyone` group.
                let deadline = Instant::now() + Duration::from_secs(20);
                while store.num_keys().unwrap_or(0) == 0 && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(1));
                }
                drop(builder);
                die(Signal::KILL);
            }
            let start = Instant::now();
            seen("SEEN", start, builder.build(me, Arc::clone(&store)))
        }
        "tpdp_kill_shm" | "tpdp_kill_tcp" | "tpdp_stop_shm" | "tpdp_count" => {
            tp_dp_job(&case, me, victim, n, timeout, options.force_tcp, store)
        }
        device if device.starts_with("device_") => {
            device::run(device, me, victim, n, timeout, store)
        }
        _ => {}
    }
    let comm = world(n).unwrap();
    comm.barrier().unwrap().wait().unwrap();
    match case.as_str() {
        "small_kill_shm" | "small_kill_tcp" => {
            if me == victim {
                std::thread::sleep(Duration::from_millis(200));
                die(Signal::KILL);
            }
            let start = Instant::now();
            seen("SEEN", start, small(&comm))
        }
        "large_kill_shm" | "large_kill_tcp" => {
            let big = || comm.all_reduce(vec![1.0f32; 1 << 22], ReduceOp::Sum);
            if me == victim {
                // Enter the collective and die at once. The kill may land only after this rank's progress thread
                // finished the collective with the others; then the survivors meet the dead rank in the next one,
                // which is why they keep issuing until one fails (the victim issues nothing more).
                let _pending = big().unwrap();
                die(Signal::KILL);
            }
            for _ in 0..3 {
                let start = Instant::now();
                if let Err(e) = big().and_then(|w| w.wait()) {
                    seen("SEEN", start, Err::<(), _>(e))
                }
            }
            panic!("three 16 MiB all-reduces succeeded after the victim was killed")
        }
        "between_kill" => {
            if me == victim {
                die(Signal::KILL);
            }
            // Let the victim die between two collectives (this wait is the point of the case, not a sync).
            std::thread::sleep(Duration::from_millis(300));
            let start = Instant::now();
            seen("SEEN", start, small(&comm))
        }
        "stop_shm" | "stop_tcp" => {
            if me == victim {
                die(Signal::STOP);
            }
            let start = Instant::now();
            seen("SEEN", start, small(&comm))
        }
        "tcp_drop" => {
            if me == 0 {
                comm.inject_connection_drop(1).unwrap().wait().unwrap();
            }
            let start = Instant::now();
            seen("SEEN", start, small(&comm))
        }
        "store_kill" => {
            if me == 0 {
                // The store may die before it answers this very request.
                let _ = store.set(&Key::new("kill"), b"");
            }
            // Every rank waits until it sees the store gone (bounded), then needs it for a new communicator.
            let deadline = Instant::now() + Duration::from_secs(20);
            while store.try_get(&Key::new("kill")).is_ok() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            let start = Instant::now();
            seen("SEEN", start, comm.split(Some(0), 0))
        }
        other => panic!("unknown fault case {other}"),
    }
}

/// The job of the report: a `tp 2, dp 2` collection running checked 16 MiB all-reduces on tp, then dp.
/// In the third iteration the victim faults in its tp all-reduce: it is killed or stopped right after issuing it,
/// or passes one element too many (`tpdp_count`). Every rank reports the first error it gets, with the ranks it
/// blames, and exits at once (no abort, no clean-up: what a job that dies on its first error does).
fn tp_dp_job(
    case: &str,
    me: usize,
    victim: usize,
    n: usize,
    timeout: Duration,
    tcp: bool,
    store: Arc<dyn Store>,
) -> ! {
    const LEN: usize = 1 << 22;
    let layout = LayoutConfig::new(n).tp(2).build().unwrap();
    let pgc = ProcessGroupCollection::for_layout(format!("fault-{case}"), layout)
        .with_timeout(timeout)
        .with_force_tcp(tcp)
        .build(me, store)
        .unwrap();
    let (tp, dp) = (pgc.tp().unwrap(), pgc.dp().unwrap());
    assert_eq!(tp.transport(), if tcp { "tcp" } else { "shm" });
    for iter in 0..100 {
        for comm in [tp, dp] {
            let fault = me == victim && iter == 2 && std::ptr::eq(comm, tp);
            let len = if fault && case == "tpdp_count" {
                LEN + 1
            } else {
                LEN
            };
            let start = Instant::now();
            let pending = comm.all_reduce(vec![1.0f32; len], ReduceOp::Sum);
            if fault && case.starts_with("tpdp_kill") {
                die(Signal::KILL);
            }
            if fault && case.starts_with("tpdp_stop") {
                die(Signal::STOP);
            }
            match pending.and_then(|w| w.wait()) {
                Ok(sum) => assert!(
                    sum.iter().all(|&x| x == comm.size() as f32),
                    "{} summed wrong in iteration {iter}",
                    comm.name()
                ),
                Err(e) => seen(
                    if fault { "FAULTY" } else { "SEEN" },
                    start,
                    Err::<(), _>(e),
                ),
            }
        }
    }
    panic!("the fault went unnoticed for 100 iterations");
}

/// The standalone store of the `store_kill` case: serves on a free port, prints it, and kills itself (SIGKILL, no
/// clean shutdown) once the key `kill` is set.
#[test]
#[ignore = "store program of the fault suite"]
fn fault_store() {
    if std::env::var_os("HC_FAULT_STORE").is_none() {
        return;
    }
    let server = TcpStore::server("127.0.0.1:0", Default::default()).unwrap();
    let addr = server.local_addr().to_string();
    println!("addr {addr}");
    let client = TcpStore::connect(addr, ClientOptions::default()).unwrap();
    let _ = client.get(&Key::new("kill"), Duration::from_secs(120));
    die(Signal::KILL);
}
