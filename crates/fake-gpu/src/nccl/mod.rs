//! The NCCL half: communicators of any number of ranks (threads of one process or processes of one machine),
//! asynchronous as NCCL is, strict where NCCL is strict.
//!
//! - **Ranks meet through files** ([`exchange`]) in a directory named by the unique id, so threads and processes
//!   are served by the same code, and collectives exchange and reduce real data ([`reduce`]).
//! - **Asynchrony**: a non-blocking communicator's creation, split and shrink run on a thread of the fake; the
//!   creation answers `ncclInProgress`, a split or shrink answers `ncclSuccess` (as NCCL does, though its job
//!   still runs) and writes the child's handle through the caller's `newcomm` pointer only when it completes. Collectives and sends run when their stream reaches them
//!   ([`crate::stream`]). After each enqueue a non-blocking communicator stays in progress for
//!   `FAKE_NCCL_OP_POLLS` polls, and a call on a communicator still in progress is refused as NCCL refuses it.
//! - **First use connects the peers**: from NCCL 2.22 (`FAKE_NCCL_VERSION`) a communicator of several ranks
//!   connects them on its first collective, send or receive (NCCL's runtime connection), and that first call
//!   does not settle until every rank has made its own first call: a non-blocking communicator answers
//!   `ncclInProgress` (from the enqueue and from `ncclCommGetAsyncError`) meanwhile, a blocking one waits in the
//!   call; a rank that never comes fails it after `FAKE_NCCL_TIMEOUT_SECS`, an abort ends the wait. Later calls
//!   are unaffected, and `NCCL_RUNTIME_CONNECT=0` connects at creation, as in NCCL. Seen on an H100 with NCCL
//!   2.30.7 (`docs/gpu-validation.md`): two ranks whose first collectives were on twin communicators in opposite
//!   orders each waited in their first enqueue for the other until both timed out, which this fake had let pass.
//! - **Groups** ([`enqueue`]): per thread and nested, as NCCL's; the outermost `ncclGroupEnd` issues every held
//!   call, on any number of communicators, whose first uses connect together (so no order of them across ranks
//!   waits on another). A failed call fails its group, which then issues nothing, and blocking and non-blocking
//!   communicators in one group are refused, as in NCCL. With `FAKE_GPU_TRACE_CALLS=1` each call that issues
//!   work or brackets a group is logged (`fake-nccl: call <name>`).
//! - **Validation**: configs are checked as `parseCommConfig` checks them ([`config`]), ranks and peers as
//!   NCCL checks them, and every rank of a collective must call the same thing. Created reductions
//!   ([`red_ops`]) belong to one communicator and one element type.
//! - **Revoke**: `ncclCommRevoke` stops in-flight work without freeing the communicator, safe beside another
//!   thread's call on it (a blocking call waiting for peers returns), and refuses later work.
//! - **Abort** ([`mod@abort`]): `ncclCommAbort` stops the communicator's work at once; freeing it waits for the work
//!   on its device to end, as freeing device memory does on a GPU, so aborting one communicator while another's
//!   work waits for a peer holds the abort until that work ends. Inside a group (NCCL 2.22 and later) the
//!   freeing waits for the outermost `ncclGroupEnd`, which frees the group's aborted communicators together,
//!   after every one's work was stopped. With `FAKE_GPU_TRACE_CALLS=1` aborts and revokes are logged too.
//! - **Failures on demand**: `FAKE_NCCL_FAIL_AFTER` (and `FAKE_NCCL_FAIL_RANK`) make a communicator fail after K
//!   operations; a peer that never comes is reported after `FAKE_NCCL_TIMEOUT_SECS`.

mod abort;
mod comm;
mod config;
mod create;
mod enqueue;
mod exchange;
mod ops;
mod red_ops;
mod reduce;
mod result_codes;

// The C entry points are found by symbol name; the crate's own tests call them through these paths.
#[cfg(test)]
pub(crate) use abort::*;
#[cfg(test)]
pub(crate) use create::*;
#[cfg(test)]
pub(crate) use enqueue::*;

use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::Ordering;

use nccl_sys::sys::{
    ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclResult_t, ncclScalarHostImmediate,
    ncclScalarResidence_t, ncclUniqueId,
};

use self::comm::{Comm, from_handle, release};
use self::red_ops::{NUM_OPS, PreMulSum};
use self::reduce::{type_name, width};
use self::result_codes::{INVALID_ARGUMENT, SUCCESS, SYSTEM_ERROR};
use crate::knobs;
use crate::stream;

const SPLIT_NOCOLOR: c_int = -1;
/// `NCCL_SHRINK_ABORT`.
const SHRINK_ABORT: c_int = 1;
/// What a unique id made here starts with; the rest names the communicator's directory.
const ID_PREFIX: &[u8] = b"fake-nccl:";

/// The directory where the ranks of the live communicator `c` meet: a rank's `gone.r<rank>` file there says it
/// freed its communicator.
///
/// # Safety
///
/// `c` is live.
#[cfg(test)]
pub(crate) unsafe fn exchange_dir(c: ncclComm_t) -> std::path::PathBuf {
    // SAFETY: the caller's contract.
    unsafe { from_handle(c) }
        .expect("a live communicator")
        .dir
        .clone()
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
    let comm = unsafe { release(c) };
    // NCCL frees them with the communicator; an orderly caller has destroyed them already.
    let live = comm.ops.live();
    if live > 0 {
        eprintln!(
            "fake-nccl: {}: destroyed with {live} created reduction(s) never destroyed",
            comm.label()
        );
    }
    comm.leave();
    SUCCESS
}

/// `ncclCommRevoke` (NCCL 2.28): this rank's in-flight operations stop without an error (a call waiting for
/// peers returns), later ones are refused with `ncclInvalidUsage`; a non-blocking communicator answers
/// `ncclInProgress` (here and from `ncclCommGetAsyncError`) until its operations have stopped, a blocking one
/// waits for that in the call. The communicator stays allocated: as in NCCL, this may run while another thread is
/// inside a call on it, which is why a watchdog revokes rather than aborts.
///
/// # Safety
///
/// `c` is live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommRevoke(c: ncclComm_t, flags: c_int) -> ncclResult_t {
    // SAFETY: the caller's contract.
    let Some(c) = (unsafe { from_handle(c) }) else {
        return INVALID_ARGUMENT;
    };
    knobs::trace_nccl_call("ncclCommRevoke", Some(&c.label()));
    if flags != 0 {
        eprintln!("fake-nccl: ncclCommRevoke: flags {flags} are not NCCL_REVOKE_DEFAULT");
        return INVALID_ARGUMENT;
    }
    c.revoke();
    if c.non_blocking {
        return c.async_error();
    }
    let stopped = stream::poll_until(knobs::hang_timeout(), || {
        c.in_flight.load(Ordering::Acquire) == 0
    });
    if stopped { SUCCESS } else { SYSTEM_ERROR }
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

/// `ncclRedOpCreatePreMulSum`: a host-immediate scalar is read now; device-resident scalars are not in the fake.
///
/// # Safety
///
/// `op` is valid for one write; `scalar` holds one element of `datatype`; `comm` is live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclRedOpCreatePreMulSum(
    op: *mut ncclRedOp_t,
    scalar: *mut c_void,
    datatype: ncclDataType_t,
    residence: ncclScalarResidence_t,
    comm: ncclComm_t,
) -> ncclResult_t {
    knobs::trace_call("ncclRedOpCreatePreMulSum");
    // SAFETY: the caller's contract.
    let Some(c) = (unsafe { from_handle(comm) }) else {
        return INVALID_ARGUMENT;
    };
    if let Err(e) = c.ensure_ready("ncclRedOpCreatePreMulSum") {
        return e;
    }
    let dtype = datatype as i32;
    let refuse = |why: String| {
        eprintln!(
            "fake-nccl: ncclRedOpCreatePreMulSum on {}: {why}",
            c.label()
        );
        INVALID_ARGUMENT
    };
    let Some(w) = width(dtype) else {
        return refuse(format!("{} is not an nccl type", type_name(dtype)));
    };
    if op.is_null() || scalar.is_null() {
        return refuse("a null operator or scalar pointer".into());
    }
    if residence != ncclScalarHostImmediate {
        return refuse(format!(
            "scalar residence {residence}: the fake takes host-immediate scalars only"
        ));
    }
    let mut value = [0u8; 8];
    // SAFETY: the contract: `scalar` holds one element of `datatype`, `w` bytes.
    value[..w].copy_from_slice(unsafe { std::slice::from_raw_parts(scalar.cast::<u8>(), w) });
    match c.ops.create(PreMulSum {
        dtype,
        scalar: value,
    }) {
        Ok(handle) => {
            // SAFETY: non-null and valid for one write by the contract.
            unsafe { op.write(handle as ncclRedOp_t) };
            SUCCESS
        }
        Err(why) => refuse(why),
    }
}

/// `ncclRedOpDestroy`: the operator must be one `comm` created and has not destroyed.
///
/// # Safety
///
/// `comm` is null or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclRedOpDestroy(op: ncclRedOp_t, comm: ncclComm_t) -> ncclResult_t {
    knobs::trace_call("ncclRedOpDestroy");
    let op = op as c_int;
    if (0..NUM_OPS).contains(&op) {
        eprintln!("fake-nccl: ncclRedOpDestroy: operator {op} is built in, not created");
        return INVALID_ARGUMENT;
    }
    if op < 0 {
        eprintln!("fake-nccl: ncclRedOpDestroy: operator {op} is no operator nccl hands out");
        return INVALID_ARGUMENT;
    }
    // SAFETY: the caller's contract.
    let Some(c) = (unsafe { from_handle(comm) }) else {
        eprintln!("fake-nccl: ncclRedOpDestroy: a null communicator");
        return INVALID_ARGUMENT;
    };
    match c.ops.destroy(op) {
        Ok(()) => SUCCESS,
        Err(why) => {
            eprintln!("fake-nccl: {}: {why}", c.label());
            INVALID_ARGUMENT
        }
    }
}
