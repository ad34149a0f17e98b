//! The fake's knobs: environment variables of the process that loads it, read when needed.

use std::path::PathBuf;
use std::time::Duration;

fn parsed<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// `FAKE_GPU_DEVICES`: how many devices the driver reports (default 1).
pub(crate) fn devices() -> i32 {
    parsed("FAKE_GPU_DEVICES").unwrap_or(1)
}

/// `FAKE_NCCL_VERSION`: the code `ncclGetVersion` reports (default 22809, NCCL 2.28.9).
pub(crate) fn nccl_version() -> i32 {
    parsed("FAKE_NCCL_VERSION").unwrap_or(22809)
}

/// Whether several ranks of one communicator may share a device: NCCL 2.30 or newer (by `FAKE_NCCL_VERSION`)
/// with `NCCL_MULTI_RANK_GPU_ENABLE=1`, as in the real library.
pub(crate) fn multi_rank_gpu() -> bool {
    nccl_version() >= 23000
        && std::env::var("NCCL_MULTI_RANK_GPU_ENABLE").is_ok_and(|v| v.trim() == "1")
}

/// Whether a communicator connects its peers lazily, on its first collective (NCCL's runtime connection): NCCL
/// 2.22 or newer (by `FAKE_NCCL_VERSION`) unless `NCCL_RUNTIME_CONNECT=0`, which connects at creation, as in the
/// real library.
pub(crate) fn runtime_connect() -> bool {
    nccl_version() >= 22200 && !std::env::var("NCCL_RUNTIME_CONNECT").is_ok_and(|v| v.trim() == "0")
}

/// Whether `ncclCommAbort` inside `ncclGroupStart`/`ncclGroupEnd` waits for the group's end to free the
/// communicator: NCCL 2.22 or newer (by `FAKE_NCCL_VERSION`), as in the real library; before, it frees at once.
pub(crate) fn grouped_abort() -> bool {
    nccl_version() >= 22200
}

/// `FAKE_NCCL_INIT_POLLS`: extra `ncclCommGetAsyncError` polls a non-blocking communicator stays in progress
/// after its creation has finished (default 2).
pub(crate) fn init_polls() -> u32 {
    parsed("FAKE_NCCL_INIT_POLLS").unwrap_or(2)
}

/// `FAKE_NCCL_OP_POLLS`: polls a non-blocking communicator stays in progress after each collective, send,
/// receive or group is enqueued (default 1), so callers' handling of `ncclInProgress` on enqueue runs.
pub(crate) fn op_polls() -> u32 {
    parsed("FAKE_NCCL_OP_POLLS").unwrap_or(1)
}

/// `FAKE_NCCL_FAIL_AFTER`: when set to K, a communicator fails asynchronously (`ncclRemoteError` from
/// `ncclCommGetAsyncError`) once K of its operations have run; later operations do nothing.
/// `FAKE_NCCL_FAIL_RANK` limits this to the communicators where this process is that rank.
pub(crate) fn fail_after(rank: usize) -> Option<u64> {
    let k = parsed::<u64>("FAKE_NCCL_FAIL_AFTER")?;
    match parsed::<usize>("FAKE_NCCL_FAIL_RANK") {
        Some(r) if r != rank => None,
        _ => Some(k),
    }
}

/// `FAKE_NCCL_TIMEOUT_SECS`: how long a rank waits for its peers (an unmatched send or receive, a rank that never
/// joins a collective) before the fake reports it and fails the communicator, where a real NCCL would hang
/// (default 60 s).
pub(crate) fn peer_timeout() -> Duration {
    Duration::from_secs_f64(parsed("FAKE_NCCL_TIMEOUT_SECS").unwrap_or(60.0))
}

/// `FAKE_NCCL_MISMATCH_HANGS=1`: a collective that the ranks called differently (another operation, count, type,
/// reduction or root) waits, as NCCL's kernels would, until the communicator is stopped (revoked or aborted) or
/// [`peer_timeout`] passes, instead of failing at once with `ncclInvalidUsage` (the default, which catches the
/// mistake sooner in the fake's own tests).
pub(crate) fn mismatch_hangs() -> bool {
    std::env::var_os("FAKE_NCCL_MISMATCH_HANGS").is_some_and(|v| v == "1")
}

/// `FAKE_GPU_HANG_SECS`: how long a stream waits on an event, or a host call on a stream, before the fake
/// reports the hang and fails the stream (default 120 s).
pub(crate) fn hang_timeout() -> Duration {
    Duration::from_secs_f64(parsed("FAKE_GPU_HANG_SECS").unwrap_or(120.0))
}

/// `FAKE_NCCL_DIR`: where communicators keep the files through which their ranks (threads or processes)
/// exchange data (default `/dev/shm` when it exists, else the temporary directory).
pub(crate) fn exchange_root() -> PathBuf {
    if let Some(d) = std::env::var_os("FAKE_NCCL_DIR") {
        return PathBuf::from(d);
    }
    let shm = PathBuf::from("/dev/shm");
    if shm.is_dir() {
        shm
    } else {
        std::env::temp_dir()
    }
}

/// `FAKE_GPU_TRACE_CALLS=1`: every driver call is logged to stderr as `fake-cuda: call <name> on thread <tid>`,
/// `<tid>` the kernel's id of the calling thread (`gettid`), so that a test can count the calls an operation makes
/// on its own thread (on a GPU, hypercomm's own cost per operation is mostly driver calls; a watchdog's queries
/// from its thread are not). A variant that forwards to another entry point (`cuMemFree_v2`,
/// `cuEventRecordWithFlags`, ...) is logged under the call it forwards to. NCCL's `ncclRedOpCreatePreMulSum` and
/// `ncclRedOpDestroy` are logged the same way, so that a test can count the reductions a communicator creates and
/// releases.
pub(crate) fn trace_call(name: &str) {
    if std::env::var_os("FAKE_GPU_TRACE_CALLS").is_some_and(|v| v == "1") {
        eprintln!(
            "fake-cuda: call {name} on thread {}",
            rustix::thread::gettid().as_raw_nonzero()
        );
    }
}

/// `FAKE_GPU_TRACE_CALLS=1` also logs every NCCL call that issues work, brackets a group or stops a communicator,
/// as `fake-nccl: call <name>` followed by ` on <communicator>` for a collective, send, receive, abort or revoke,
/// so that a test can see which calls an operation made and how they were grouped. (Polls such as
/// `ncclCommGetAsyncError` are not logged.)
pub(crate) fn trace_nccl_call(name: &str, comm: Option<&str>) {
    if std::env::var_os("FAKE_GPU_TRACE_CALLS").is_some_and(|v| v == "1") {
        match comm {
            Some(comm) => eprintln!("fake-nccl: call {name} on {comm}"),
            None => eprintln!("fake-nccl: call {name}"),
        }
    }
}

/// `FAKE_GPU_TRACE_CALLS=1` also logs where each aborted communicator is freed, as `fake-nccl: freed <communicator>
/// in ncclCommAbort` or `fake-nccl: freed <communicator> at ncclGroupEnd with <n> other(s)`, so that a test can
/// tell aborts made one at a time from aborts made in one group whichever threads' lines come between.
pub(crate) fn trace_nccl_free(comm: &str, with_others: Option<usize>) {
    if std::env::var_os("FAKE_GPU_TRACE_CALLS").is_some_and(|v| v == "1") {
        match with_others {
            Some(n) => eprintln!("fake-nccl: freed {comm} at ncclGroupEnd with {n} other(s)"),
            None => eprintln!("fake-nccl: freed {comm} in ncclCommAbort"),
        }
    }
}

/// `FAKE_GPU_STREAM_DELAY_MS`: how long a stream's worker waits before running each piece of work (default 0), a
/// slow GPU: work that a caller forgot to wait for then reliably runs too late, and memory released too early is
/// reliably still in use.
pub(crate) fn stream_delay() -> Duration {
    Duration::from_secs_f64(parsed::<f64>("FAKE_GPU_STREAM_DELAY_MS").unwrap_or(0.0) / 1e3)
}
