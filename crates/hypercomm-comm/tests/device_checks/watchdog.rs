//! What the GPU's watchdog must end and name, checked on each rank of an `n`-rank communicator: a rank that never
//! calls while the others only order their streams and then copy to the host ([`a_rank_that_never_calls`]), a
//! rank that calls another collective at the same operation ([`a_rank_that_calls_another_collective`]), and a
//! ring of ranks that each send before they receive, as separate operations
//! ([`a_ring_that_sends_before_it_receives`]). `fake_ranks` runs them under the fake GPU (three and four ranks);
//! `gpu` on a GPU with two ranks (and under the fake in CI). Each leaves flight records in the folder it is given.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hypercomm_comm::device::{FlightRecord, Gpu, OpState};
use hypercomm_comm::{CommOptions, Communicator, Fault, ReduceOp};
use hypercomm_store::Store;

/// What a rank may take past the timeout: a watchdog tick, the ranks' comparison of their progress (half the
/// timeout at most), the abort; generous, for loaded machines.
pub const MARGIN: Duration = Duration::from_secs(5);

/// Rank `rank` of the communicator `name` over ranks `0..n` (timeout `timeout`, flight records in `dir`), after a
/// first all-reduce that connects the ranks (NCCL connects peers on a communicator's first collective).
pub fn connected(
    n: usize,
    gpu: &Arc<Gpu>,
    store: Arc<dyn Store>,
    rank: usize,
    name: &str,
    timeout: Duration,
    dir: &Path,
) -> Communicator {
    let comm = Communicator::with_gpu(
        Arc::clone(gpu),
        store,
        (0..n).collect(),
        rank,
        CommOptions {
            timeout,
            flight_recorder_dir: Some(dir.to_path_buf()),
            ..CommOptions::named(name)
        },
    )
    .unwrap();
    let first = comm
        .all_reduce(gpu.upload(&[1.0f32]).unwrap(), ReduceOp::Sum)
        .unwrap();
    assert_eq!(first.wait().unwrap().download().unwrap(), [n as f32]);
    comm
}

/// The NCCL flavor of `comm`.
fn nccl(comm: &Communicator) -> &hypercomm_comm::device::DeviceCommunicator {
    comm.nccl().expect("made with a gpu")
}

/// The flight record of communicator `comm` at member `rank` written in `dir`.
pub fn written_record(dir: &Path, comm: &str, rank: usize) -> FlightRecord {
    let path = dir.join(format!("{}.rank{rank}.json", comm.replace('/', "_")));
    let bytes = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("no flight record at {}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap()
}

/// Waits up to `limit` for `ready`; whether it came.
pub fn eventually(limit: Duration, ready: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while !ready() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

/// Rank `absent` never makes the second all-reduce of `comm` (connected, `n` ranks, timeout `timeout`); the others
/// only order their streams after it (`wait_on`) and copy the result to the host, which blocks behind the
/// collective: only the watchdog ends that, past the timeout. Their next call fails naming `absent` (it left no
/// progress record) and the group, both flavors are stopped, and the flight record says which operation timed
/// out. `finished` counts the ranks done, so that `absent` stays alive (busy elsewhere) until then.
pub fn a_rank_that_never_calls(
    comm: &Communicator,
    gpu: &Arc<Gpu>,
    absent: usize,
    finished: &AtomicUsize,
    timeout: Duration,
    dir: &Path,
) {
    let (rank, n) = (comm.rank(), comm.size());
    if rank == absent {
        eventually(Duration::from_secs(120), || {
            finished.load(Ordering::Acquire) == n - 1
        });
        return;
    }
    let device = format!("{}/device", comm.name());
    let started = Instant::now();
    let buf = comm
        .all_reduce(gpu.upload(&[1.0f32]).unwrap(), ReduceOp::Sum)
        .unwrap()
        .wait_on(nccl(comm).stream())
        .unwrap();
    // Blocks until the collective ends: on a GPU its output is undefined once the communicator is stopped.
    let _ = buf.download();
    let later = comm
        .all_reduce(gpu.upload(&[1.0f32]).unwrap(), ReduceOp::Sum)
        .and_then(|w| w.wait())
        .expect_err("the communicator is stopped");
    let took = started.elapsed();
    finished.fetch_add(1, Ordering::Release);
    eprintln!("watchdog-case: never-calls: rank {rank} failed after {took:?}: {later}");
    assert!(took < timeout + MARGIN, "{took:?}");
    assert!(later.to_string().contains(&device), "{later}");
    assert_eq!(
        (later.lost_ranks(), later.culprits()),
        (&[absent][..], &[absent][..]),
        "{later}"
    );
    let cause = later.root_cause().expect("a recorded cause");
    assert_eq!(
        (&cause.comm, cause.fault),
        (&device, Fault::Died),
        "{cause}"
    );
    assert!(cause.detail.contains("op #2 all_reduce"), "{cause}");
    // Both flavors are stopped, and the flight record says which operation timed out.
    assert!(comm.broken().is_some() && nccl(comm).broken().is_some());
    let record = written_record(dir, &device, rank);
    assert_eq!(record, nccl(comm).flight_record());
    let states: Vec<(u64, OpState)> = record.ops.iter().map(|e| (e.seq, e.state)).collect();
    assert_eq!(
        states[..2],
        [(1, OpState::Completed), (2, OpState::TimedOut)]
    );
    assert!(
        record
            .failure
            .unwrap()
            .contains(&format!("rank(s) [{absent}]"))
    );
    assert!(
        eventually(Duration::from_secs(2), || gpu.watched_operations() == 0),
        "the watchdog let go of the stopped communicator's operations within a tick or so"
    );
}

/// At op #2 of `comm` (connected, timeout `timeout`) rank `odd` calls all_gather where the others call
/// reduce_scatter: NCCL's kernels wait on such a mismatch until the communicator is stopped (the fake does with
/// `FAKE_NCCL_MISMATCH_HANGS=1`). Past the timeout every rank reports the disagreement, the operation, its number
/// and the ranks on each side, blaming `odd` without losing it; and leaves its flight record.
pub fn a_rank_that_calls_another_collective(
    comm: &Communicator,
    gpu: &Arc<Gpu>,
    odd: usize,
    timeout: Duration,
    dir: &Path,
) {
    let (rank, n) = (comm.rank(), comm.size());
    let device = format!("{}/device", comm.name());
    let started = Instant::now();
    let second = if rank == odd {
        comm.all_gather_into(
            gpu.upload(&[1.0f32]).unwrap(),
            gpu.alloc_zeros::<f32>(n).unwrap(),
        )
    } else {
        comm.reduce_scatter_into(
            gpu.upload(&vec![1.0f32; n]).unwrap(),
            gpu.alloc_zeros::<f32>(1).unwrap(),
            ReduceOp::Sum,
        )
    };
    let e = second
        .and_then(|w| w.wait())
        .expect_err("the ranks called different collectives");
    let took = started.elapsed();
    eprintln!("watchdog-case: disagreement: rank {rank} failed after {took:?}: {e}");
    assert!(took < timeout + MARGIN, "{took:?}");
    assert_eq!(
        (e.lost_ranks(), e.culprits()),
        (&[][..], &[odd][..]),
        "rank {rank}: {e}"
    );
    let cause = e.root_cause().expect("a recorded cause");
    let others: Vec<usize> = (0..n).filter(|&r| r != odd).collect();
    assert_eq!(cause.fault, Fault::Disagreed, "rank {rank}: {cause}");
    assert!(
        cause.detail.contains("op #2")
            && cause
                .detail
                .contains(&format!("rank(s) [{odd}] called all_gather"))
            && cause
                .detail
                .contains(&format!("rank(s) {others:?} called reduce_scatter")),
        "rank {rank}: {cause}"
    );
    assert!(written_record(dir, &device, rank).failure.is_some());
}

/// Every rank of `comm` (connected, timeout `timeout`) sends `len` elements to the next and then receives from the
/// previous, as two separate operations: NCCL runs a communicator's operations in issue order, so every send waits
/// for a receive queued behind its receiver's own send, and nothing moves (`len` large enough that NCCL cannot
/// buffer the message). Past the timeout every rank names the same cycle: every rank and the operation each is
/// stuck at, blaming them all and losing none. Returns the cycle as this rank tells it.
pub fn a_ring_that_sends_before_it_receives(
    comm: &Communicator,
    gpu: &Arc<Gpu>,
    len: usize,
    timeout: Duration,
    dir: &Path,
) -> String {
    let (rank, n) = (comm.rank(), comm.size());
    let device = format!("{}/device", comm.name());
    let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
    let started = Instant::now();
    let sent = comm
        .send(gpu.upload(&vec![rank as f32; len]).unwrap(), next, 0)
        .unwrap();
    let received = comm
        .recv(gpu.alloc_zeros::<f32>(len).unwrap(), prev, 0)
        .unwrap();
    let e = sent.wait().expect_err("the ring never moves");
    let took = started.elapsed();
    let later = received
        .wait()
        .expect_err("nor does the receive behind the send");
    eprintln!("watchdog-case: cycle: rank {rank} failed after {took:?}: {e}");
    assert!(took < timeout + MARGIN, "{took:?}");
    assert!(e.to_string().contains(&device), "{e}");
    assert!(later.is_fatal(), "{later}");
    let everyone: Vec<usize> = (0..n).collect();
    assert_eq!(
        (e.lost_ranks(), e.culprits()),
        (&[][..], &everyone[..]),
        "{e}"
    );
    let cause = e.root_cause().expect("a recorded cause");
    assert_eq!(cause.fault, Fault::Deadlocked, "rank {rank}: {cause}");
    let record = written_record(dir, &device, rank);
    let last: Vec<String> = record.ops.iter().skip(1).map(|e| e.describe()).collect();
    assert_eq!(
        last,
        [
            format!("send(#2, dtype=f32, count={len}, to=[{next}])"),
            format!("recv(#3, dtype=f32, count={len}, from=[{prev}])")
        ],
        "rank {rank}"
    );
    assert!(
        cause.detail.starts_with(&format!(
            "a cycle of waits on {device}: rank 0 at #2 send(dtype=f32, count={len}, to=[1]), which waits for \
             rank 1"
        )),
        "{cause}"
    );
    cause.detail.clone()
}
