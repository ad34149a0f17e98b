//! The NCCL half: communicators of any number of ranks (threads of one process or processes of one machine),
//! asynchronous as NCCL is, strict where NCCL is strict.
//!
//! - **Ranks meet through files** ([`exchange`]) in a directory named by the unique id, so threads and processes
//!   are served by the same code, and collectives exchange and reduce real data ([`reduce`]).
//! - **Asynchrony**: a non-blocking communicator's creation, split and shrink run on a thread of the fake and
//!   answer `ncclInProgress`; a split or shrink writes the child's handle through the caller's `newcomm` pointer
//!   only when it completes, as NCCL does. Collectives and sends run when their stream reaches them
//!   ([`crate::stream`]). After each enqueue a non-blocking communicator stays in progress for
//!   `FAKE_NCCL_OP_POLLS` polls, and a call on a communicator still in progress is refused as NCCL refuses it.
//! - **Validation**: configs are checked as `parseCommConfig` checks them ([`config`]), ranks and peers as
//!   NCCL checks them, and every rank of a collective must call the same thing.
//! - **Failures on demand**: `FAKE_NCCL_FAIL_AFTER` (and `FAKE_NCCL_FAIL_RANK`) make a communicator fail after K
//!   operations; a peer that never comes is reported after `FAKE_NCCL_TIMEOUT_SECS`.

mod comm;
mod config;
mod exchange;
mod ops;
mod reduce;

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicPtr, Ordering};

use nccl_sys::sys::{
    cudaStream_t, ncclComm, ncclComm_t, ncclConfig_t, ncclDataType_t, ncclRedOp_t, ncclResult_t,
    ncclUniqueId,
};

use self::comm::{Comm, from_handle, into_handle, release};
use self::ops::{Call, Issued, issue};
use crate::knobs;
use crate::stream;

pub(crate) const SUCCESS: ncclResult_t = 0;
pub(crate) const SYSTEM_ERROR: ncclResult_t = 2;
pub(crate) const INVALID_ARGUMENT: ncclResult_t = 4;
pub(crate) const INVALID_USAGE: ncclResult_t = 5;
pub(crate) const REMOTE_ERROR: ncclResult_t = 6;
pub(crate) const IN_PROGRESS: ncclResult_t = 7;
const SPLIT_NOCOLOR: c_int = -1;
/// `NCCL_SHRINK_ABORT`.
const SHRINK_ABORT: c_int = 1;
/// What a unique id made here starts with; the rest names the communicator's directory.
const ID_PREFIX: &[u8] = b"fake-nccl:";

/// The calls of an open `ncclGroupStart`/`ncclGroupEnd` on this thread. NCCL's group state is per thread too.
#[derive(Default)]
struct Group {
    depth: u32,
    calls: Vec<(usize, Issued)>,
}

thread_local! {
    static GROUP: RefCell<Group> = RefCell::new(Group::default());
}

/// `ncclGetVersion`: `FAKE_NCCL_VERSION`, 22809 by default.
///
/// # Safety
///
/// `version` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGetVersion(version: *mut c_int) -> ncclResult_t {
    if version.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: non-null and valid by the contract.
    unsafe { version.write(knobs::nccl_version()) };
    SUCCESS
}

/// `ncclGetUniqueId`: names a fresh directory where the communicator's ranks will meet.
///
/// # Safety
///
/// `id` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGetUniqueId(id: *mut ncclUniqueId) -> ncclResult_t {
    if id.is_null() {
        return INVALID_ARGUMENT;
    }
    let mut internal = [0 as c_char; 128];
    let text = [ID_PREFIX, exchange::random_token().as_bytes()].concat();
    for (slot, b) in internal.iter_mut().zip(text) {
        *slot = b as c_char;
    }
    // SAFETY: non-null and valid by the contract.
    unsafe { id.write(ncclUniqueId { internal }) };
    SUCCESS
}

/// The token of a unique id made by [`ncclGetUniqueId`].
fn token(id: &ncclUniqueId) -> Option<String> {
    let bytes: Vec<u8> = id
        .internal
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    let rest = bytes.strip_prefix(ID_PREFIX)?;
    let t = String::from_utf8(rest.to_vec()).ok()?;
    (!t.is_empty() && t.chars().all(|c| c.is_ascii_hexdigit())).then_some(t)
}

/// The config behind a pointer, checked as NCCL checks it, and logged.
///
/// # Safety
///
/// `config` is null or valid, its strings null or NUL-terminated.
unsafe fn read_config(
    what: &str,
    config: *const ncclConfig_t,
) -> Result<Option<ncclConfig_t>, ncclResult_t> {
    // SAFETY: the contract.
    let Some(c) = (unsafe { config.as_ref() }) else {
        eprintln!("fake-nccl: {what}: no config");
        return Ok(None);
    };
    eprintln!("fake-nccl: {what}: {}", config::describe(c));
    match config::check(c) {
        Ok(()) => Ok(Some(*c)),
        Err(warn) => {
            eprintln!("fake-nccl: {what}: {warn}");
            Err(INVALID_ARGUMENT)
        }
    }
}

fn comm_name(config: Option<&ncclConfig_t>, fallback: String) -> String {
    match config {
        Some(c) if !c.commName.is_null() => {
            // SAFETY: checked configs' strings are NUL-terminated (read_config's contract).
            unsafe { std::ffi::CStr::from_ptr(c.commName) }
                .to_string_lossy()
                .into_owned()
        }
        _ => fallback,
    }
}

/// Runs `job` as NCCL runs a communicator's creation: on a thread of the fake for a non-blocking communicator
/// (`ncclInProgress` until it finishes), at once otherwise.
fn run_job(
    owner: &Arc<Comm>,
    job: impl FnOnce() -> Result<(), (ncclResult_t, String)> + Send + 'static,
) -> ncclResult_t {
    if owner.non_blocking {
        owner.set_job_running(true);
        let comm = Arc::clone(owner);
        let spawned = std::thread::Builder::new()
            .name("fake-nccl-job".into())
            .spawn(move || {
                if let Err((code, why)) = job() {
                    comm.fail(code, &why);
                }
                comm.linger(knobs::init_polls());
                comm.set_job_running(false);
            });
        match spawned {
            Ok(_) => IN_PROGRESS,
            Err(_) => {
                owner.set_job_running(false);
                SYSTEM_ERROR
            }
        }
    } else {
        match job() {
            Ok(()) => SUCCESS,
            Err((code, why)) => {
                owner.fail(code, &why);
                code
            }
        }
    }
}

/// `ncclCommInitRankConfig`: the handle is written at once; the ranks meet before (blocking) or after
/// (non-blocking) the call returns.
///
/// # Safety
///
/// `out` is valid for one write; `config` is null or a valid config.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommInitRankConfig(
    out: *mut ncclComm_t,
    nranks: c_int,
    id: ncclUniqueId,
    rank: c_int,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    if out.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: the contract.
    let config = match unsafe { read_config("ncclCommInitRankConfig", config) } {
        Ok(c) => c,
        Err(e) => return e,
    };
    let (Ok(n), Ok(r)) = (usize::try_from(nranks), usize::try_from(rank)) else {
        return INVALID_ARGUMENT;
    };
    if n == 0 || r >= n {
        eprintln!("fake-nccl: ncclCommInitRankConfig: rank {rank} of {nranks} ranks");
        return INVALID_ARGUMENT;
    }
    let Some(token) = token(&id) else {
        eprintln!(
            "fake-nccl: ncclCommInitRankConfig: the unique id was not made by ncclGetUniqueId"
        );
        return INVALID_ARGUMENT;
    };
    let non_blocking = config.is_some_and(|c| c.blocking == 0);
    let name = comm_name(config.as_ref(), format!("comm-{token}"));
    let comm = Comm::new(exchange::directory(&token), r, n, name, non_blocking);
    // SAFETY: non-null and valid by the contract.
    unsafe { out.write(into_handle(Arc::clone(&comm))) };
    let (joining, device) = (Arc::clone(&comm), crate::cuda::current_device());
    let answer = run_job(&comm, move || joining.join(device));
    if answer != SUCCESS && answer != IN_PROGRESS {
        // A blocking creation that failed leaves no communicator behind.
        // SAFETY: the handle was written just above and nobody else has it yet.
        unsafe {
            release(out.read()).leave();
            out.write(std::ptr::null_mut());
        }
    }
    answer
}

/// `ncclCommInitRank`: blocking, no config.
///
/// # Safety
///
/// As [`ncclCommInitRankConfig`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommInitRank(
    out: *mut ncclComm_t,
    nranks: c_int,
    id: ncclUniqueId,
    rank: c_int,
) -> ncclResult_t {
    // SAFETY: the caller's contract.
    unsafe { ncclCommInitRankConfig(out, nranks, id, rank, std::ptr::null_mut()) }
}

/// Where a split or shrink writes its child: the caller's `newcomm`, kept as an address because NCCL writes it
/// from another thread, later.
#[derive(Clone, Copy)]
struct ChildOut(usize);

impl ChildOut {
    /// Writes the child's handle (atomically, with release ordering, as NCCL does).
    ///
    /// # Safety
    ///
    /// The address is still valid: NCCL's contract for a non-blocking split is that `*newcomm` stays valid until
    /// the parent reports completion, which happens only after this write.
    unsafe fn write(self, child: ncclComm_t) {
        // SAFETY: the contract; `*mut ncclComm` and `AtomicPtr<ncclComm>` share a layout, and the address is
        // aligned for a pointer (it came from a `*mut ncclComm_t`).
        unsafe { AtomicPtr::<ncclComm>::from_ptr(self.0 as *mut ncclComm_t) }
            .store(child, Ordering::Release);
    }
}

/// `ncclCommSplit`: `*newcomm` is null until the split completes; then the child (none for
/// `NCCL_SPLIT_NOCOLOR`).
///
/// # Safety
///
/// `parent` is live; `out` stays valid until the parent reports completion; `config` is null or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommSplit(
    parent: ncclComm_t,
    color: c_int,
    key: c_int,
    out: *mut ncclComm_t,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    // SAFETY: the caller's contract.
    let Some(parent) = (unsafe { from_handle(parent) }).cloned() else {
        return INVALID_ARGUMENT;
    };
    if out.is_null() {
        return INVALID_ARGUMENT;
    }
    if let Err(e) = parent.ensure_ready("ncclCommSplit") {
        return e;
    }
    // SAFETY: the caller's contract.
    let config = match unsafe { read_config("ncclCommSplit", config) } {
        Ok(c) => c,
        Err(e) => return e,
    };
    // SAFETY: valid by the contract; NCCL nulls it at once.
    unsafe { out.write(std::ptr::null_mut()) };
    let child_blocking = config.map_or(!parent.non_blocking, |c| c.blocking != 0);
    let name = comm_name(config.as_ref(), format!("{}/split", parent.name));
    let k = parent.next_control();
    let slot = ChildOut(out as usize);
    let p = Arc::clone(&parent);
    run_job(&parent, move || {
        let mine = [color.to_le_bytes(), key.to_le_bytes()].concat();
        let all: Vec<usize> = (0..p.nranks).collect();
        let records = p
            .gather("x", k, &mine, &all, &p.gone)
            .map_err(|e| (SYSTEM_ERROR, format!("split #{k}: {e}")))?;
        if color == SPLIT_NOCOLOR {
            return Ok(());
        }
        let mut members: Vec<(c_int, usize)> = Vec::new();
        for (r, rec) in records.iter().enumerate() {
            let c = c_int::from_le_bytes(rec[..4].try_into().unwrap_or([0; 4]));
            let kk = c_int::from_le_bytes(rec[4..8].try_into().unwrap_or([0; 4]));
            if c == color {
                members.push((kk, r));
            }
        }
        members.sort_unstable();
        let rank = members.iter().position(|&(_, r)| r == p.rank).unwrap_or(0);
        let dir = p.dir.with_file_name(format!(
            "{}-x{k}-c{color}",
            p.dir
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default()
        ));
        std::fs::create_dir_all(&dir)
            .map_err(|e| (SYSTEM_ERROR, format!("creating {}: {e}", dir.display())))?;
        let child = Comm::new(dir, rank, members.len(), name, !child_blocking);
        child.linger(knobs::init_polls());
        // SAFETY: `out` stays valid until the parent reports completion (the contract), which it does only after
        // this job returns.
        unsafe { slot.write(into_handle(child)) };
        Ok(())
    })
}

/// `ncclCommShrink`: a child of the ranks not in `exclude`, written as for [`ncclCommSplit`].
///
/// # Safety
///
/// `parent` is live; `exclude` holds `count` ints; `out` stays valid until the parent reports completion.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommShrink(
    parent: ncclComm_t,
    exclude: *mut c_int,
    count: c_int,
    out: *mut ncclComm_t,
    config: *mut ncclConfig_t,
    flags: c_int,
) -> ncclResult_t {
    // SAFETY: the caller's contract.
    let Some(parent) = (unsafe { from_handle(parent) }).cloned() else {
        return INVALID_ARGUMENT;
    };
    let Ok(count) = usize::try_from(count) else {
        return INVALID_ARGUMENT;
    };
    if out.is_null() || (count > 0 && exclude.is_null()) {
        return INVALID_ARGUMENT;
    }
    let mut excluded: Vec<usize> = if count == 0 {
        Vec::new()
    } else {
        // SAFETY: the contract: `exclude` holds `count` ints.
        unsafe { std::slice::from_raw_parts(exclude, count) }
            .iter()
            .filter_map(|&r| usize::try_from(r).ok())
            .collect()
    };
    excluded.sort_unstable();
    excluded.dedup();
    if excluded.len() != count
        || excluded.iter().any(|&r| r >= parent.nranks)
        || excluded.contains(&parent.rank)
    {
        eprintln!(
            "fake-nccl: ncclCommShrink on {}: bad exclude list {excluded:?}",
            parent.label()
        );
        return INVALID_ARGUMENT;
    }
    if excluded.len() == parent.nranks {
        return INVALID_ARGUMENT;
    }
    if flags & SHRINK_ABORT != 0 {
        parent.stop.store(true, Ordering::Release);
    } else if let Err(e) = parent.ensure_ready("ncclCommShrink") {
        return e;
    }
    // SAFETY: the caller's contract.
    let config = match unsafe { read_config("ncclCommShrink", config) } {
        Ok(c) => c,
        Err(e) => return e,
    };
    // SAFETY: valid by the contract; NCCL nulls it at once.
    unsafe { out.write(std::ptr::null_mut()) };
    let child_blocking = config.map_or(!parent.non_blocking, |c| c.blocking != 0);
    let name = comm_name(config.as_ref(), format!("{}/shrink", parent.name));
    let k = parent.next_control();
    let slot = ChildOut(out as usize);
    let p = Arc::clone(&parent);
    run_job(&parent, move || {
        let survivors: Vec<usize> = (0..p.nranks).filter(|r| !excluded.contains(r)).collect();
        let mine: Vec<u8> = excluded
            .iter()
            .flat_map(|&r| (r as u64).to_le_bytes())
            .collect();
        let records = p
            .gather("k", k, &mine, &survivors, &p.gone)
            .map_err(|e| (SYSTEM_ERROR, format!("shrink #{k}: {e}")))?;
        if let Some(r) = records.iter().position(|rec| *rec != mine) {
            return Err((
                INVALID_USAGE,
                format!(
                    "shrink #{k}: rank {} excludes other ranks than this rank's {excluded:?}",
                    survivors[r]
                ),
            ));
        }
        let rank = survivors.iter().position(|&r| r == p.rank).unwrap_or(0);
        let dir = p.dir.with_file_name(format!(
            "{}-k{k}",
            p.dir
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default()
        ));
        std::fs::create_dir_all(&dir)
            .map_err(|e| (SYSTEM_ERROR, format!("creating {}: {e}", dir.display())))?;
        let child = Comm::new(dir, rank, survivors.len(), name, !child_blocking);
        child.linger(knobs::init_polls());
        // SAFETY: as in ncclCommSplit.
        unsafe { slot.write(into_handle(child)) };
        Ok(())
    })
}

/// `ncclCommGetAsyncError`.
///
/// # Safety
///
/// `c` is live; `state` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommGetAsyncError(
    c: ncclComm_t,
    state: *mut ncclResult_t,
) -> ncclResult_t {
    // SAFETY: the caller's contract.
    let Some(c) = (unsafe { from_handle(c) }) else {
        return INVALID_ARGUMENT;
    };
    if state.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: non-null and valid by the contract.
    unsafe { state.write(c.async_error()) };
    SUCCESS
}

/// Writes `value(comm)` through `out` for a live communicator `c`.
///
/// # Safety
///
/// `c` is null or live; `out` is null or valid for one write.
unsafe fn answer(
    c: ncclComm_t,
    out: *mut c_int,
    value: impl FnOnce(&Comm) -> usize,
) -> ncclResult_t {
    // SAFETY: the caller's contract.
    let Some(c) = (unsafe { from_handle(c) }) else {
        return INVALID_ARGUMENT;
    };
    if out.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: non-null and valid by the contract.
    unsafe { out.write(c_int::try_from(value(c)).unwrap_or(c_int::MAX)) };
    SUCCESS
}

/// `ncclCommCount`.
///
/// # Safety
///
/// `c` is live; `count` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommCount(c: ncclComm_t, count: *mut c_int) -> ncclResult_t {
    // SAFETY: the caller's contract.
    unsafe { answer(c, count, |c| c.nranks) }
}

/// `ncclCommUserRank`.
///
/// # Safety
///
/// `c` is live; `rank` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommUserRank(c: ncclComm_t, rank: *mut c_int) -> ncclResult_t {
    // SAFETY: the caller's contract.
    unsafe { answer(c, rank, |c| c.rank) }
}

/// `ncclCommFinalize`: outstanding work must drain; non-blocking communicators answer `ncclInProgress` until it has.
///
/// # Safety
///
/// `c` is live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommFinalize(c: ncclComm_t) -> ncclResult_t {
    // SAFETY: the caller's contract.
    let Some(c) = (unsafe { from_handle(c) }) else {
        return INVALID_ARGUMENT;
    };
    if let Err(e) = c.ensure_ready("ncclCommFinalize") {
        return e;
    }
    c.set_finalizing();
    if c.non_blocking {
        return c.async_error();
    }
    let drained = stream::poll_until(knobs::hang_timeout(), || {
        c.in_flight.load(Ordering::Acquire) == 0
    });
    if drained { SUCCESS } else { SYSTEM_ERROR }
}

/// `ncclCommDestroy`.
///
/// # Safety
///
/// `c` came from this library and is not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommDestroy(c: ncclComm_t) -> ncclResult_t {
    if c.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: the caller's contract.
    unsafe { release(c) }.leave();
    SUCCESS
}

/// `ncclCommAbort`: waiting operations of this rank give up at once.
///
/// # Safety
///
/// `c` came from this library and is not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommAbort(c: ncclComm_t) -> ncclResult_t {
    // SAFETY: the caller's contract, passed on.
    unsafe { ncclCommDestroy(c) }
}

/// Queues `batch` on `stream`.
fn submit(stream_handle: usize, batch: Vec<Issued>) -> Result<(), String> {
    let n = batch.len() as u64;
    if let Some(first) = batch.first() {
        first.comm.in_flight.fetch_add(n, Ordering::AcqRel);
    }
    // SAFETY: run's contract is the C API's: buffers stay valid until the stream has run the work.
    let work: stream::Work = Box::new(move || unsafe { ops::run(batch) });
    // SAFETY: the stream handle came from the caller of an NCCL function, valid by its contract.
    unsafe { stream::submit(stream_handle as *mut c_void, work) }
}

/// Issues one call: checked now, queued on the stream (or held by the open group).
///
/// # Safety
///
/// `c` is live; `s` is null or a live stream.
unsafe fn enqueue(c: ncclComm_t, call: Call, s: cudaStream_t) -> ncclResult_t {
    // SAFETY: the caller's contract.
    let Some(comm) = (unsafe { from_handle(c) }).cloned() else {
        return INVALID_ARGUMENT;
    };
    if let Err(e) = comm.ensure_ready("a collective") {
        return e;
    }
    let issued = match issue(&comm, call) {
        Ok(i) => i,
        Err((code, why)) => {
            eprintln!("fake-nccl: {}: {why}", comm.label());
            return code;
        }
    };
    let in_group = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0 {
            g.calls.push((s as usize, issued));
            None
        } else {
            Some(issued)
        }
    });
    let Some(issued) = in_group else {
        return SUCCESS;
    };
    if let Err(e) = submit(s as usize, vec![issued]) {
        eprintln!("fake-nccl: {}: {e}", comm.label());
        return SYSTEM_ERROR;
    }
    comm.linger(knobs::op_polls());
    if comm.non_blocking && knobs::op_polls() > 0 {
        IN_PROGRESS
    } else {
        SUCCESS
    }
}

macro_rules! collective {
    ($(#[$doc:meta])* $name:ident($($arg:ident: $ty:ty),*) => $call:expr) => {
        $(#[$doc])*
        ///
        /// # Safety
        ///
        /// `comm` is live; `stream` is null or a live stream; the buffers hold what the call reads and writes
        /// until the stream has run it.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty,)* comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t {
            // SAFETY: the caller's contract.
            unsafe { enqueue(comm, $call, stream) }
        }
    };
}

fn rank_of(r: c_int) -> usize {
    usize::try_from(r).unwrap_or(usize::MAX)
}

collective!(
    /// `ncclAllReduce`.
    ncclAllReduce(send: *const c_void, recv: *mut c_void, count: usize, dtype: ncclDataType_t, op: ncclRedOp_t)
        => Call::AllReduce { send: send as u64, recv: recv as u64, count, dtype: dtype as i32, op: op as i32 }
);
collective!(
    /// `ncclBroadcast`.
    ncclBroadcast(send: *const c_void, recv: *mut c_void, count: usize, dtype: ncclDataType_t, root: c_int)
        => Call::Broadcast { send: send as u64, recv: recv as u64, count, dtype: dtype as i32, root: rank_of(root) }
);
collective!(
    /// `ncclReduce`: only the root's receive buffer is written.
    ncclReduce(send: *const c_void, recv: *mut c_void, count: usize, dtype: ncclDataType_t, op: ncclRedOp_t,
        root: c_int)
        => Call::Reduce { send: send as u64, recv: recv as u64, count, dtype: dtype as i32, op: op as i32, root: rank_of(root) }
);
collective!(
    /// `ncclAllGather`: `count` is the send count.
    ncclAllGather(send: *const c_void, recv: *mut c_void, count: usize, dtype: ncclDataType_t)
        => Call::AllGather { send: send as u64, recv: recv as u64, count, dtype: dtype as i32 }
);
collective!(
    /// `ncclReduceScatter`: `count` is the receive count.
    ncclReduceScatter(send: *const c_void, recv: *mut c_void, count: usize, dtype: ncclDataType_t,
        op: ncclRedOp_t)
        => Call::ReduceScatter { send: send as u64, recv: recv as u64, count, dtype: dtype as i32, op: op as i32 }
);
collective!(
    /// `ncclSend`: completes when the peer's matching receive has taken the data.
    ncclSend(send: *const c_void, count: usize, dtype: ncclDataType_t, peer: c_int)
        => Call::Send { buf: send as u64, count, dtype: dtype as i32, peer: rank_of(peer) }
);
collective!(
    /// `ncclRecv`.
    ncclRecv(recv: *mut c_void, count: usize, dtype: ncclDataType_t, peer: c_int)
        => Call::Recv { buf: recv as u64, count, dtype: dtype as i32, peer: rank_of(peer) }
);

/// `ncclGroupStart`: calls on this thread are held until the matching `ncclGroupEnd`.
#[unsafe(no_mangle)]
pub extern "C" fn ncclGroupStart() -> ncclResult_t {
    GROUP.with(|g| g.borrow_mut().depth += 1);
    SUCCESS
}

/// `ncclGroupEnd`: the outermost one queues the held calls, one batch per communicator and stream, so a
/// group's sends and receives run together.
#[unsafe(no_mangle)]
pub extern "C" fn ncclGroupEnd() -> ncclResult_t {
    let calls = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return None;
        }
        g.depth -= 1;
        Some(if g.depth == 0 {
            std::mem::take(&mut g.calls)
        } else {
            Vec::new()
        })
    });
    let Some(calls) = calls else {
        eprintln!("fake-nccl: ncclGroupEnd without ncclGroupStart");
        return INVALID_USAGE;
    };
    let mut batches: Vec<(usize, Vec<Issued>)> = Vec::new();
    for (s, issued) in calls {
        match batches
            .iter_mut()
            .find(|(bs, b)| *bs == s && Arc::ptr_eq(&b[0].comm, &issued.comm))
        {
            Some((_, b)) => b.push(issued),
            None => batches.push((s, vec![issued])),
        }
    }
    let mut answer = SUCCESS;
    for (s, batch) in batches {
        let comm = Arc::clone(&batch[0].comm);
        if let Err(e) = submit(s, batch) {
            eprintln!("fake-nccl: {}: {e}", comm.label());
            return SYSTEM_ERROR;
        }
        comm.linger(knobs::op_polls());
        if comm.non_blocking && knobs::op_polls() > 0 {
            answer = IN_PROGRESS;
        }
    }
    answer
}

/// `ncclGetErrorString`.
#[unsafe(no_mangle)]
pub extern "C" fn ncclGetErrorString(_result: ncclResult_t) -> *const c_char {
    c"error from the fake nccl (see its stderr)".as_ptr()
}

/// `ncclGetLastError`.
#[unsafe(no_mangle)]
pub extern "C" fn ncclGetLastError(_comm: ncclComm_t) -> *const c_char {
    c"".as_ptr()
}
