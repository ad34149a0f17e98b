//! Issuing collectives and point-to-point calls: checked and numbered when called, held by an open group, and
//! queued on their stream to run when it reaches them ([`super::ops`]). A communicator's first one connects its
//! peers, and does not settle before every rank has come to its own first one ([`connect`]).
//!
//! Groups are NCCL's: per thread, nested (only the outermost `ncclGroupEnd` issues), over any number of
//! communicators, whose first uses connect together and whose work is queued in an order every rank shares, so
//! that no order of the calls across ranks waits on another, even on one stream. As in
//! NCCL, a call that fails inside a group fails the group: the outermost `ncclGroupEnd` answers its error and
//! issues none of the group's calls (NCCL's `ncclGroupError`); and blocking and non-blocking communicators are not
//! allowed in one group (NCCL's "Blocking and nonblocking communicators are not allowed in the same group"): such
//! a call is refused with `ncclInvalidArgument`, and fails its group.
//!
//! From NCCL 2.22 a group holds aborts too ([`hold_abort`]): `ncclCommAbort` raises the communicator's abort flag
//! in the call, and the outermost `ncclGroupEnd` frees every aborted communicator of the group together
//! ([`super::abort`], [`free_aborted`]) before it issues the group's other calls. It blocks until they are freed,
//! whatever the communicators' `blocking` setting, and aborts take no part in the check that keeps blocking and
//! non-blocking communicators apart (NCCL's `ncclAsyncLaunch` makes a group with an abort blocking). A group that
//! fails drops its aborts unfreed, as NCCL's `groupCleanup` drops its queued jobs.

use std::cell::RefCell;
use std::ffi::{c_int, c_void};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use nccl_sys::sys::{cudaStream_t, ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclResult_t};

use super::comm::{Comm, free_aborted, from_handle};
use super::create::run_job;
use super::ops::{self, Call, Issued, issue};
use super::result_codes::{IN_PROGRESS, INVALID_ARGUMENT, INVALID_USAGE, SUCCESS, SYSTEM_ERROR};
use crate::{knobs, stream};

/// The calls of an open `ncclGroupStart`/`ncclGroupEnd` on this thread. NCCL's group state is per thread too.
#[derive(Default)]
struct Group {
    depth: u32,
    calls: Vec<(usize, Issued)>,
    /// Whether the group's communicators are non-blocking, fixed by its first call.
    non_blocking: Option<bool>,
    /// The first call of the group that failed: the group fails with it.
    error: Option<ncclResult_t>,
    /// The communicators aborted in the group, freed at its end (their handles).
    aborts: Vec<usize>,
}

thread_local! {
    static GROUP: RefCell<Group> = RefCell::new(Group::default());
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

/// NCCL's runtime connection, after `comm` [arrived](Comm::arrive) at its first collective: a non-blocking
/// communicator stays in progress until every rank has come to its own (`ncclInProgress`), a blocking one waits
/// here. Seen on an H100 with NCCL 2.30.7 (`docs/gpu-validation.md`): two ranks whose first collectives were on
/// two communicators in opposite orders each waited in their first enqueue for the other, until the timeout.
fn connect(comm: &Arc<Comm>) -> ncclResult_t {
    let c = Arc::clone(comm);
    run_job(comm, 0, move || c.await_connected())
}

/// Fails this thread's open group, if any, with `code` (the first failure sticks), and passes `code` on.
fn fail_group(code: ncclResult_t) -> ncclResult_t {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0 {
            g.error.get_or_insert(code);
        }
    });
    code
}

/// Holds the freeing of the aborted communicator `c` (its abort flag raised already) for the outermost
/// `ncclGroupEnd`, when this thread has a group open and the loaded version groups aborts (NCCL 2.22 and later);
/// false otherwise, and then the caller frees it now.
pub(super) fn hold_abort(c: ncclComm_t) -> bool {
    knobs::grouped_abort()
        && GROUP.with(|g| {
            let mut g = g.borrow_mut();
            if g.depth == 0 {
                return false;
            }
            g.aborts.push(c as usize);
            true
        })
}

/// Issues one call, `name`: checked now, queued on the stream (or held by the open group).
///
/// # Safety
///
/// `c` is live; `s` is null or a live stream.
unsafe fn enqueue(name: &str, c: ncclComm_t, call: Call, s: cudaStream_t) -> ncclResult_t {
    // SAFETY: the caller's contract.
    let Some(comm) = (unsafe { from_handle(c) }).cloned() else {
        return fail_group(INVALID_ARGUMENT);
    };
    knobs::trace_nccl_call(name, Some(&comm.label()));
    if let Err(e) = comm.ensure_ready("a collective") {
        return fail_group(e);
    }
    let mixed = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return false;
        }
        *g.non_blocking.get_or_insert(comm.non_blocking) != comm.non_blocking
    });
    if mixed {
        eprintln!(
            "fake-nccl: {name} on {}: Blocking and nonblocking communicators are not allowed in the same group.",
            comm.label()
        );
        return fail_group(INVALID_ARGUMENT);
    }
    if comm.revoked() {
        eprintln!(
            "fake-nccl: {}: a collective on a revoked communicator",
            comm.label()
        );
        return INVALID_USAGE;
    }
    let issued = match issue(&comm, call) {
        Ok(i) => i,
        Err((code, why)) => {
            eprintln!("fake-nccl: {}: {why}", comm.label());
            return fail_group(code);
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
    match comm.arrive() {
        Ok(true) => connect(&comm),
        Ok(false) if comm.non_blocking && knobs::op_polls() > 0 => IN_PROGRESS,
        Ok(false) => SUCCESS,
        Err(e) => {
            comm.fail(SYSTEM_ERROR, &e);
            SYSTEM_ERROR
        }
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
            unsafe { enqueue(stringify!($name), comm, $call, stream) }
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
    knobs::trace_nccl_call("ncclGroupStart", None);
    GROUP.with(|g| g.borrow_mut().depth += 1);
    SUCCESS
}

/// What the outermost `ncclGroupEnd` takes from this thread's group: its calls and aborts, or the error of its
/// first failed call and the aborts it drops (then its calls are dropped, never issued).
type Ended = Result<(Vec<(usize, Issued)>, Vec<usize>), (ncclResult_t, usize)>;

/// `ncclGroupEnd`: the outermost one frees the group's aborted communicators, then queues the held calls, one
/// batch per communicator and stream, so a group's sends and receives run together, the batches in an order every
/// rank shares; a group with a failed call answers that call's error instead and issues and frees nothing.
#[unsafe(no_mangle)]
pub extern "C" fn ncclGroupEnd() -> ncclResult_t {
    knobs::trace_nccl_call("ncclGroupEnd", None);
    let ended: Option<Ended> = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return None;
        }
        g.depth -= 1;
        if g.depth > 0 {
            return Some(Ok((Vec::new(), Vec::new())));
        }
        let calls = std::mem::take(&mut g.calls);
        let aborts = std::mem::take(&mut g.aborts);
        g.non_blocking = None;
        Some(match g.error.take() {
            Some(e) => Err((e, aborts.len())),
            None => Ok((calls, aborts)),
        })
    });
    let (calls, aborts) = match ended {
        None => {
            eprintln!("fake-nccl: ncclGroupEnd without ncclGroupStart");
            return INVALID_USAGE;
        }
        Some(Err((e, dropped))) => {
            eprintln!(
                "fake-nccl: ncclGroupEnd: a call of the group failed; none of its calls were issued, and its \
                 {dropped} aborted communicator(s) stay allocated"
            );
            return e;
        }
        Some(Ok(ended)) => ended,
    };
    if !aborts.is_empty() {
        let handles = aborts.into_iter().map(|c| c as ncclComm_t).collect();
        // SAFETY: each came from ncclCommAbort, whose caller gave it up (its contract), and is freed only here.
        unsafe { free_aborted(handles, true) };
    }
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
    // NCCL launches a group's communicators in the order of their hashes, the same on every rank, not in the
    // order of the calls (`ncclGroupCommJoin`, NCCL 2.19 and later): ranks that call twin communicators in
    // opposite orders, on one stream, still run them in the same order. The directory is the fake's hash.
    batches.sort_by(|(_, a), (_, b)| a[0].comm.dir.cmp(&b[0].comm.dir));
    let mut answer = SUCCESS;
    let mut connecting = Vec::new();
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
        match comm.arrive() {
            Ok(true) => connecting.push(comm),
            Ok(false) => {}
            Err(e) => {
                comm.fail(SYSTEM_ERROR, &e);
                return SYSTEM_ERROR;
            }
        }
    }
    // Every communicator of the group has arrived before any waits: the group connects them together.
    for comm in connecting {
        match connect(&comm) {
            SUCCESS => {}
            IN_PROGRESS => answer = IN_PROGRESS,
            e => return e,
        }
    }
    answer
}
