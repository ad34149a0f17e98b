//! Soak: thousands of collectives of random kinds, sizes, element types and reduce ops, on several communicators
//! and a collection at once (shared memory, TCP, a split child, the tp and dp groups of a layout), on vectors and,
//! where a communicator has a symmetric window, on symmetric buffers, each result checked against an
//! independently computed reference. Zero wrong results and zero hangs are required.
//!
//! Runs `HYPERCOMM_SOAK_SECS` seconds (default 60 when `CI=true`, else 20). Prints the counts.

mod comm_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use comm_support::{TestElem, assert_close, expected, values};
use hypercomm::comm::{CommOptions, Communicator, ReduceOp};
use hypercomm::grid::layout::LayoutConfig;
use hypercomm::pgc::ProcessGroupCollection;
use hypercomm::store::{MemoryStore, Store};

const RANKS: usize = 4;
/// No single operation may take this long: a bound that catches hangs, far above any honest duration.
const HANG: Duration = Duration::from_secs(60);

fn soak_secs() -> u64 {
    let env = |k: &str| std::env::var(k).ok();
    env("HYPERCOMM_SOAK_SECS")
        .and_then(|s| s.parse().ok())
        .unwrap_or(if env("CI").as_deref() == Some("true") {
            60
        } else {
            20
        })
}

/// A deterministic generator: every rank draws the same sequence, so all agree on each operation.
struct Rng(u64);

impl Rng {
    fn next(&mut self, below: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % below as u64) as usize
    }
}

type Check = Box<dyn FnOnce() -> Result<(), String>>;

/// Issues one random collective of element type `T` on `comm`; returns the check to run once it completes.
fn issue<T: TestElem>(comm: &Communicator, rng: &mut Rng) -> Result<Check, String> {
    let (n, me) = (comm.size(), comm.rank());
    let len = match rng.next(10) {
        0 => 0,
        1..=6 => 1 + rng.next(300),
        7 | 8 => 1 + rng.next(40_000),
        _ => 1 + rng.next(400_000),
    };
    let op = ReduceOp::ALL[rng.next(ReduceOp::ALL.len())];
    let what = format!("{} {}[{len}] on {} rank {me}", T::DTYPE, op, comm.name());
    let e = |x: hypercomm::comm::CommError| format!("{what}: {x}");
    let wait = |done: bool, what: &str| {
        if done {
            Ok(())
        } else {
            Err(format!("{what}: not done after {HANG:?} (hang)"))
        }
    };
    // Communicators with a symmetric window also draw the in-place collectives over symmetric buffers. Every rank
    // draws the same kinds in the same order on the same communicators, so their buffers line up.
    let kinds = if comm.options().symmetric_bytes > 0 {
        7
    } else {
        4
    };
    Ok(match rng.next(kinds) {
        4 => {
            let mut buf = comm.symmetric_buffer(len, T::default()).map_err(e)?;
            buf.copy_from_slice(&values::<T>(op, me, len));
            let w = comm.all_reduce_symmetric(buf, op).map_err(e)?;
            Box::new(move || {
                wait(w.wait_timeout(HANG), &what)?;
                let got = w.wait().map_err(|x| format!("{what}: {x}"))?;
                check(|| assert_close(&got, &expected::<T>(op, n, len), &what))
            })
        }
        5 => {
            let mut buf = comm.symmetric_buffer(n * len, T::default()).map_err(e)?;
            buf[me * len..(me + 1) * len].copy_from_slice(&values::<T>(ReduceOp::Sum, me, len));
            let w = comm.all_gather_symmetric(buf).map_err(e)?;
            Box::new(move || {
                wait(w.wait_timeout(HANG), &what)?;
                let got = w.wait().map_err(|x| format!("{what}: {x}"))?;
                let want: Vec<T> = (0..n)
                    .flat_map(|r| values::<T>(ReduceOp::Sum, r, len))
                    .collect();
                check(|| assert_eq!(&got[..], &want[..], "{what} all_gather_symmetric"))
            })
        }
        6 => {
            let mut buf = comm.symmetric_buffer(n * len, T::default()).map_err(e)?;
            buf.copy_from_slice(&values::<T>(op, me, n * len));
            let w = comm.reduce_scatter_symmetric(buf, op).map_err(e)?;
            Box::new(move || {
                wait(w.wait_timeout(HANG), &what)?;
                let got = w.wait().map_err(|x| format!("{what}: {x}"))?;
                let all = expected::<T>(op, n, n * len);
                let mine = &got[me * len..(me + 1) * len];
                check(|| assert_close(mine, &all[me * len..(me + 1) * len], &what))
            })
        }
        0 => {
            let w = comm.all_reduce(values::<T>(op, me, len), op).map_err(e)?;
            Box::new(move || {
                wait(w.wait_timeout(HANG), &what)?;
                let got = w.wait().map_err(|x| format!("{what}: {x}"))?;
                check(|| assert_close(&got, &expected::<T>(op, n, len), &what))
            })
        }
        1 => {
            let root = rng.next(n);
            let w = comm
                .broadcast(values::<T>(ReduceOp::Sum, me, len), root)
                .map_err(e)?;
            Box::new(move || {
                wait(w.wait_timeout(HANG), &what)?;
                let got = w.wait().map_err(|x| format!("{what}: {x}"))?;
                check(|| {
                    assert_eq!(
                        got,
                        values::<T>(ReduceOp::Sum, root, len),
                        "{what} broadcast"
                    )
                })
            })
        }
        2 => {
            let w = comm
                .all_gather_into(
                    values::<T>(ReduceOp::Sum, me, len),
                    vec![T::from_i64(0); n * len],
                )
                .map_err(e)?;
            Box::new(move || {
                wait(w.wait_timeout(HANG), &what)?;
                let (_, got) = w.wait().map_err(|x| format!("{what}: {x}"))?;
                let want: Vec<T> = (0..n)
                    .flat_map(|r| values::<T>(ReduceOp::Sum, r, len))
                    .collect();
                check(|| assert_eq!(got, want, "{what} all_gather"))
            })
        }
        _ => {
            let w = comm
                .reduce_scatter_into(values::<T>(op, me, n * len), vec![T::from_i64(0); len], op)
                .map_err(e)?;
            Box::new(move || {
                wait(w.wait_timeout(HANG), &what)?;
                let (_, got) = w.wait().map_err(|x| format!("{what}: {x}"))?;
                let all = expected::<T>(op, n, n * len);
                check(|| assert_close(&got, &all[me * len..(me + 1) * len], &what))
            })
        }
    })
}

/// Runs an assertion, turning a failure into an error so the soak can count it.
fn check(f: impl FnOnce()) -> Result<(), String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .unwrap_or_else(|| "assertion failed".into())
    })
}

fn issue_any(comm: &Communicator, rng: &mut Rng) -> Result<Check, String> {
    match rng.next(6) {
        0 => issue::<f32>(comm, rng),
        1 => issue::<f64>(comm, rng),
        2 => issue::<i32>(comm, rng),
        3 => issue::<i64>(comm, rng),
        4 => issue::<half::bf16>(comm, rng),
        _ => issue::<u8>(comm, rng),
    }
}

#[derive(Default, Debug)]
struct Counts {
    ops: u64,
    wrong: Vec<String>,
}

fn rank(me: usize, store: Arc<dyn Store>, deadline: Instant) -> Counts {
    // Room for a batch of the largest symmetric buffers in flight at once (4 of 4 ranks x 400 000 f64).
    let options = |name: &str, tcp: bool| CommOptions {
        timeout: HANG,
        force_tcp: tcp,
        symmetric_bytes: 64 << 20,
        ..CommOptions::named(name)
    };
    let shm =
        Communicator::world(Arc::clone(&store), RANKS, me, options("soak-shm", false)).unwrap();
    let tcp =
        Communicator::world(Arc::clone(&store), RANKS, me, options("soak-tcp", true)).unwrap();
    let half = shm.split(Some((me % 2) as u32), 0).unwrap().unwrap();
    let pgc =
        ProcessGroupCollection::for_layout("soak", LayoutConfig::new(RANKS).tp(2).build().unwrap())
            .with_timeout(HANG)
            .build(me, Arc::clone(&store))
            .unwrap();
    let comms = [&shm, &tcp, &half, pgc.tp().unwrap(), pgc.dp().unwrap()];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut counts = Counts::default();
    // Every rank must run the same number of batches: rank 0 decides when to stop, through the shm world.
    loop {
        let go = u8::from(Instant::now() < deadline);
        let go = shm
            .all_reduce(vec![go], ReduceOp::Min)
            .unwrap()
            .wait()
            .unwrap()[0];
        if go == 0 {
            break;
        }
        let batch = 1 + rng.next(4);
        let checks: Vec<Result<Check, String>> = (0..batch)
            .map(|_| issue_any(comms[rng.next(comms.len())], &mut rng))
            .collect();
        for c in checks {
            counts.ops += 1;
            if let Err(e) = c.and_then(|c| c()) {
                counts.wrong.push(e);
            }
        }
        if counts.wrong.len() > 10 {
            break;
        }
    }
    counts
}

#[test]
fn thousands_of_random_collectives_are_all_correct() {
    let secs = soak_secs();
    let deadline = Instant::now() + Duration::from_secs(secs);
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let handles: Vec<_> = (0..RANKS)
        .map(|me| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || rank(me, store, deadline))
        })
        .collect();
    let counts: Vec<Counts> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let ops: u64 = counts.iter().map(|c| c.ops).sum();
    let wrong: Vec<&String> = counts.iter().flat_map(|c| &c.wrong).collect();
    println!(
        "soak: {secs} s, {RANKS} ranks, 5 communicators each: {ops} rank-operations ({} per rank), {} wrong or failed",
        ops / RANKS as u64,
        wrong.len()
    );
    assert!(wrong.is_empty(), "{wrong:#?}");
    assert!(
        ops >= RANKS as u64 * 100,
        "only {ops} operations ran in {secs} s"
    );
}
