//! Each NCCL call the backend makes, turned into a `Result`: the one place with `unsafe` NCCL calls.
//!
//! Nothing here owns a communicator. A call on a non-blocking communicator may answer `ncclInProgress`; that is
//! [`Progress::Pending`], not an error, and the caller polls [`async_error`] until the communicator is ready.
//!
//! **Out-pointers.** Every pointer NCCL writes through is audited here. `ncclGetUniqueId`,
//! `ncclCommInitRank[Config]` (the handle is written before the call returns, even non-blocking),
//! `ncclCommGetAsyncError`, `ncclCommCount` and `ncclCommUserRank` write before they return, so a local is
//! enough. `ncclCommSplit` and `ncclCommShrink` are different: on a non-blocking parent NCCL keeps the
//! `newcomm` address in an asynchronous job, sets `*newcomm` to null at once, and writes the child's handle
//! only when the job completes, from its own thread (`ncclCommInitChildComm`, "`*newcomm` should be
//! NCCL_COMM_NULL until comm split fully complete"), and they return `ncclSuccess`, not `ncclInProgress`, while
//! that job runs. Their child goes into a [`ChildSlot`] on the heap, read only after the parent's
//! `ncclCommGetAsyncError` reports completion, and leaked rather than freed when it never does.

use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

use nccl_sys::sys::{self, ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclUniqueId};
use nccl_sys::{Function, Nccl, NcclError};

use super::config::NcclSettings;
use super::unique_id::UNIQUE_ID_BYTES;
use crate::element::{DType, ReduceOp};

/// Whether a call finished or is still running inside a non-blocking communicator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Progress {
    Done,
    Pending,
}

/// A communicator handle that may cross threads. NCCL allows a communicator to be used from any thread as long
/// as calls on it do not overlap; the owner (`NcclComm`) serialises them with a mutex.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CommHandle(pub ncclComm_t);

// SAFETY: the pointer is an opaque handle owned by NCCL; NCCL permits using it from any thread, and every use
// goes through `NcclComm`, which serialises calls with a mutex.
unsafe impl Send for CommHandle {}
// SAFETY: the pointer is an opaque NCCL handle; shared references only pass its value to NCCL, always under the
// owning NcclComm's mutex, so no two calls on it overlap.
unsafe impl Sync for CommHandle {}

fn progress(
    nccl: &Nccl,
    function: Function,
    raw: sys::ncclResult_t,
    comm: ncclComm_t,
) -> Result<Progress, NcclError> {
    // SAFETY: `comm` is null or a live communicator of this library (every caller passes one it owns).
    match unsafe { nccl.check(function, raw, comm) } {
        Ok(()) => Ok(Progress::Done),
        Err(e) if e.is_in_progress() => Ok(Progress::Pending),
        Err(e) => Err(e),
    }
}

/// NCCL's type for a hypercomm element type (the 8-bit floats need NCCL 2.24: see [`FLOAT8_VERSION`]).
pub(crate) fn nccl_dtype(dtype: DType) -> ncclDataType_t {
    match dtype {
        DType::F32 => sys::ncclFloat32,
        DType::F64 => sys::ncclFloat64,
        DType::F16 => sys::ncclFloat16,
        DType::BF16 => sys::ncclBfloat16,
        DType::I8 => sys::ncclInt8,
        DType::U8 => sys::ncclUint8,
        DType::I32 => sys::ncclInt32,
        DType::I64 => sys::ncclInt64,
        DType::U32 => sys::ncclUint32,
        DType::U64 => sys::ncclUint64,
        DType::F8E4M3 => sys::ncclFloat8e4m3,
        DType::F8E5M2 => sys::ncclFloat8e5m2,
    }
}

/// The first NCCL release with the 8-bit float types (`ncclFloat8e4m3`, `ncclFloat8e5m2`).
pub(crate) const FLOAT8_VERSION: nccl_sys::Version = nccl_sys::Version::new(2, 24, 0);

/// NCCL's built-in reduction for a hypercomm one (`ncclAvg` needs NCCL 2.10, older than anything with configs);
/// `None` for [`ReduceOp::PreMulSum`], which each communicator creates ([`create_pre_mul_sum`]).
pub(crate) fn builtin_op(op: ReduceOp) -> Option<ncclRedOp_t> {
    Some(match op {
        ReduceOp::Sum => sys::ncclSum,
        ReduceOp::Prod => sys::ncclProd,
        ReduceOp::Min => sys::ncclMin,
        ReduceOp::Max => sys::ncclMax,
        ReduceOp::Avg => sys::ncclAvg,
        ReduceOp::PreMulSum(_) => return None,
    })
}

/// `ncclRedOpCreatePreMulSum` with a host-immediate scalar: a reduction of `comm`, for `dtype` only, that
/// multiplies each rank's input by `scalar` (one element of `dtype`, its bytes first in the array) and sums. NCCL
/// copies the scalar before returning; the operator lives until [`destroy_op`] or the communicator's end.
pub(crate) fn create_pre_mul_sum(
    nccl: &Nccl,
    comm: CommHandle,
    scalar: [u8; 8],
    dtype: DType,
) -> Result<ncclRedOp_t, NcclError> {
    let api = nccl.api(Function::RedOpCreatePreMulSum)?;
    let mut op: ncclRedOp_t = sys::ncclSum;
    // Eight bytes, aligned for every element type, of which NCCL reads `dtype`'s size.
    let mut value = u64::from_ne_bytes(scalar);
    // SAFETY: `comm` is live and serialised by its owner; NCCL writes one operator into a live local and, with
    // ncclScalarHostImmediate, reads the scalar (at most eight bytes, a live local) before it returns.
    let raw = unsafe {
        api.ncclRedOpCreatePreMulSum(
            &mut op,
            (&raw mut value).cast(),
            nccl_dtype(dtype),
            sys::ncclScalarHostImmediate,
            comm.0,
        )
    };
    progress(nccl, Function::RedOpCreatePreMulSum, raw, comm.0)?;
    Ok(op)
}

/// `ncclRedOpDestroy`: releases an operator [`create_pre_mul_sum`] made on `comm`. NCCL allows it as soon as the
/// last call given the operator has returned, work still in flight included.
pub(crate) fn destroy_op(nccl: &Nccl, comm: CommHandle, op: ncclRedOp_t) -> Result<(), NcclError> {
    let api = nccl.api(Function::RedOpDestroy)?;
    // SAFETY: `comm` is live and serialised by its owner; `op` was created on it and is not used afterwards.
    let raw = unsafe { api.ncclRedOpDestroy(op, comm.0) };
    progress(nccl, Function::RedOpDestroy, raw, comm.0).map(|_| ())
}

/// `ncclGetUniqueId`.
pub(crate) fn unique_id(nccl: &Nccl) -> Result<[u8; UNIQUE_ID_BYTES], NcclError> {
    let api = nccl.api(Function::GetUniqueId)?;
    let mut id = ncclUniqueId {
        internal: [0; UNIQUE_ID_BYTES],
    };
    // SAFETY: NCCL writes the id into a live local of the right type.
    let raw = unsafe { api.ncclGetUniqueId(&mut id) };
    progress(nccl, Function::GetUniqueId, raw, std::ptr::null_mut())?;
    Ok(id.internal.map(|b| b as u8))
}

/// `ncclCommInitRankConfig` (or `ncclCommInitRank` when the settings use no config). The handle is valid even
/// when the answer is `Pending`.
pub(crate) fn init_rank(
    nccl: &Nccl,
    nranks: usize,
    id: &[u8; UNIQUE_ID_BYTES],
    rank: usize,
    settings: &NcclSettings,
) -> Result<(CommHandle, Progress), NcclError> {
    let id = ncclUniqueId {
        internal: id.map(|b| b as std::os::raw::c_char),
    };
    let (nranks, rank) = (to_int(nranks), to_int(rank));
    let mut comm: ncclComm_t = std::ptr::null_mut();
    let (function, raw) = if settings.uses_config() {
        let api = nccl.api(Function::CommInitRankConfig)?;
        let mut config = settings.raw();
        // SAFETY: `comm` and `config` are live locals; the config's strings point into `settings`, alive for the
        // call; NCCL copies what it keeps.
        let raw = unsafe { api.ncclCommInitRankConfig(&mut comm, nranks, id, rank, &mut config) };
        (Function::CommInitRankConfig, raw)
    } else {
        let api = nccl.api(Function::CommInitRank)?;
        // SAFETY: `comm` is a live local NCCL writes one handle to.
        let raw = unsafe { api.ncclCommInitRank(&mut comm, nranks, id, rank) };
        (Function::CommInitRank, raw)
    };
    let p = progress(nccl, function, raw, comm)?;
    Ok((CommHandle(comm), p))
}

/// Where NCCL writes the handle of a child communicator that `ncclCommSplit` or `ncclCommShrink` creates,
/// possibly later, from its own thread (see the module doc).
///
/// Invariant: the slot's memory stays allocated for as long as NCCL may write to it. It is freed only after
/// [`ChildSlot::settle`], which the caller calls once the parent has reported the operation complete; a slot
/// dropped unsettled (the creation failed or timed out) is leaked, eight bytes, so that a late write lands in
/// live memory.
pub(crate) struct ChildSlot {
    cell: *mut AtomicPtr<sys::ncclComm>,
    settled: bool,
}

impl ChildSlot {
    fn new() -> ChildSlot {
        ChildSlot {
            cell: Box::into_raw(Box::new(AtomicPtr::new(std::ptr::null_mut()))),
            settled: false,
        }
    }

    /// The address to hand NCCL as `newcomm`.
    fn out(&self) -> *mut ncclComm_t {
        // SAFETY: `cell` is a live allocation (freed only in Drop); `AtomicPtr<T>` has the layout of `*mut T`.
        unsafe { (*self.cell).as_ptr() }
    }

    /// Marks the creation complete (the parent answered `Done`, or a blocking call returned): NCCL will not
    /// write again, so the slot may be read and freed.
    pub(crate) fn settle(&mut self) {
        self.settled = true;
    }

    /// The child's handle, once [`settle`](Self::settle)d; `None` when NCCL wrote none (no color) or the slot
    /// is not settled.
    pub(crate) fn child(&self) -> Option<CommHandle> {
        if !self.settled {
            return None;
        }
        // SAFETY: `cell` is live; NCCL stores the handle with release ordering, read here with acquire.
        let p = unsafe { (*self.cell).load(Ordering::Acquire) };
        (!p.is_null()).then_some(CommHandle(p))
    }
}

impl Drop for ChildSlot {
    fn drop(&mut self) {
        if self.settled {
            // SAFETY: `cell` came from Box::into_raw in `new`, and NCCL no longer writes to it once settled.
            drop(unsafe { Box::from_raw(self.cell) });
        }
        // Unsettled: leaked on purpose, NCCL may still write the handle (see the type's invariant).
    }
}

// SAFETY: the slot is a heap cell only NCCL writes (atomically) and the owner reads after settling; moving it
// between threads moves only the pointer.
unsafe impl Send for ChildSlot {}

/// `ncclCommSplit`; `color` `None` is `NCCL_SPLIT_NOCOLOR` (no child is written then). The child lands in the
/// returned slot when the split completes: at once for a blocking parent, when the parent's [`async_error`] stops
/// answering `Pending` otherwise. NCCL answers `ncclSuccess` here even while a non-blocking split is still
/// running (its group end's `ncclInProgress` is not passed on), so the call's own answer says nothing about
/// completion.
pub(crate) fn split(
    nccl: &Nccl,
    parent: CommHandle,
    color: Option<u32>,
    key: i64,
    settings: &NcclSettings,
) -> Result<ChildSlot, NcclError> {
    let api = nccl.api(Function::CommSplit)?;
    let color = color.map_or(sys::NCCL_SPLIT_NOCOLOR, |c| {
        c_int::try_from(c).unwrap_or(c_int::MAX)
    });
    let key = c_int::try_from(key).unwrap_or(if key < 0 { c_int::MIN } else { c_int::MAX });
    let slot = ChildSlot::new();
    let mut config = settings.raw();
    // SAFETY: `parent` is live (owned by the caller's NcclComm, calls serialised); `slot.out()` stays valid until
    // NCCL is done with it (ChildSlot's invariant); `config` is a live local whose strings live in `settings`
    // for the call (NCCL copies the config).
    let raw = unsafe { api.ncclCommSplit(parent.0, color, key, slot.out(), &mut config) };
    progress(nccl, Function::CommSplit, raw, parent.0)?;
    Ok(slot)
}

/// `ncclCommCount`: the number of ranks.
pub(crate) fn count(nccl: &Nccl, comm: CommHandle) -> Result<usize, NcclError> {
    let api = nccl.api(Function::CommCount)?;
    let mut n: c_int = 0;
    // SAFETY: `comm` is live and serialised by its owner; NCCL writes one int into a live local before returning.
    let raw = unsafe { api.ncclCommCount(comm.0, &mut n) };
    progress(nccl, Function::CommCount, raw, comm.0)?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// `ncclCommUserRank`: this rank's rank.
pub(crate) fn user_rank(nccl: &Nccl, comm: CommHandle) -> Result<usize, NcclError> {
    let api = nccl.api(Function::CommUserRank)?;
    let mut r: c_int = 0;
    // SAFETY: `comm` is live and serialised by its owner; NCCL writes one int into a live local before returning.
    let raw = unsafe { api.ncclCommUserRank(comm.0, &mut r) };
    progress(nccl, Function::CommUserRank, raw, comm.0)?;
    Ok(usize::try_from(r).unwrap_or(0))
}

/// `ncclCommGetAsyncError`: `Done` when the communicator is idle and healthy, `Pending` while an operation is
/// still being set up, `Err` with the asynchronous error otherwise.
pub(crate) fn async_error(nccl: &Nccl, comm: CommHandle) -> Result<Progress, NcclError> {
    let api = nccl.api(Function::CommGetAsyncError)?;
    let mut state: sys::ncclResult_t = sys::ncclSuccess;
    // SAFETY: `comm` is live; NCCL writes one result code into a live local.
    let raw = unsafe { api.ncclCommGetAsyncError(comm.0, &mut state) };
    progress(nccl, Function::CommGetAsyncError, raw, comm.0)?;
    progress(nccl, Function::CommGetAsyncError, state, comm.0)
}

/// `ncclCommAbort`: frees the communicator, stopping its work. The handle is dead afterwards.
pub(crate) fn abort(nccl: &Nccl, comm: CommHandle) -> Result<(), NcclError> {
    let api = nccl.api(Function::CommAbort)?;
    // SAFETY: `comm` is live and its owner never uses it again after this call.
    let raw = unsafe { api.ncclCommAbort(comm.0) };
    progress(nccl, Function::CommAbort, raw, std::ptr::null_mut()).map(|_| ())
}

/// `ncclCommRevoke` (NCCL 2.28 and later): stops the communicator's in-flight work and refuses new work, without
/// freeing it, so it may run while another thread is inside a call on it. A non-blocking communicator answers
/// `Pending` until the revoke settles. The caller checks [`Nccl::has`] first.
pub(crate) fn revoke(nccl: &Nccl, comm: CommHandle) -> Result<Progress, NcclError> {
    let api = nccl.api(Function::CommRevoke)?;
    let flags = c_int::try_from(sys::NCCL_REVOKE_DEFAULT).unwrap_or(0);
    // SAFETY: `comm` is live: its owner holds the lock that keeps it from being freed for this call, and NCCL
    // allows a revoke beside another call on the communicator.
    let raw = unsafe { api.ncclCommRevoke(comm.0, flags) };
    progress(nccl, Function::CommRevoke, raw, comm.0)
}

/// `ncclCommFinalize`: flushes outstanding work; poll [`async_error`] until `Done` before [`destroy`].
pub(crate) fn finalize(nccl: &Nccl, comm: CommHandle) -> Result<Progress, NcclError> {
    let api = nccl.api(Function::CommFinalize)?;
    // SAFETY: `comm` is live.
    let raw = unsafe { api.ncclCommFinalize(comm.0) };
    progress(nccl, Function::CommFinalize, raw, comm.0)
}

/// `ncclCommDestroy`. The handle is dead afterwards.
pub(crate) fn destroy(nccl: &Nccl, comm: CommHandle) -> Result<(), NcclError> {
    let api = nccl.api(Function::CommDestroy)?;
    // SAFETY: `comm` is live, finalized, and never used again by its owner.
    let raw = unsafe { api.ncclCommDestroy(comm.0) };
    progress(nccl, Function::CommDestroy, raw, std::ptr::null_mut()).map(|_| ())
}

/// One collective or point-to-point call, with device addresses. Counts are in elements; a reduction is NCCL's,
/// built in or created on the communicator the call goes to.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Call {
    AllReduce {
        send: u64,
        recv: u64,
        count: usize,
        dtype: DType,
        op: ncclRedOp_t,
    },
    Broadcast {
        send: u64,
        recv: u64,
        count: usize,
        dtype: DType,
        root: usize,
    },
    Reduce {
        send: u64,
        recv: u64,
        count: usize,
        dtype: DType,
        op: ncclRedOp_t,
        root: usize,
    },
    /// `count` is per rank (the send count).
    AllGather {
        send: u64,
        recv: u64,
        count: usize,
        dtype: DType,
    },
    /// `count` is per rank (the receive count).
    ReduceScatter {
        send: u64,
        recv: u64,
        count: usize,
        dtype: DType,
        op: ncclRedOp_t,
    },
    Send {
        buf: u64,
        count: usize,
        dtype: DType,
        peer: usize,
    },
    Recv {
        buf: u64,
        count: usize,
        dtype: DType,
        peer: usize,
    },
}

fn ptr(addr: u64) -> *mut c_void {
    addr as usize as *mut c_void
}

fn to_int(v: usize) -> c_int {
    // Callers check ranks and sizes against the communicator, whose size NCCL holds in an int.
    c_int::try_from(v).unwrap_or(c_int::MAX)
}

/// Enqueues `call` on `stream`.
///
/// # Safety
///
/// `comm` is live and not used concurrently; `stream` is a live stream of the communicator's device; every
/// address is device memory of that device holding at least what the call reads or writes, and stays allocated
/// until the work completes on `stream`.
pub(crate) unsafe fn enqueue(
    nccl: &Nccl,
    comm: CommHandle,
    call: Call,
    stream: sys::cudaStream_t,
) -> Result<Progress, NcclError> {
    let c = comm.0;
    let (function, raw) = match call {
        Call::AllReduce {
            send,
            recv,
            count,
            dtype,
            op,
        } => {
            let api = nccl.api(Function::AllReduce)?;
            // SAFETY: the caller's contract: `send` and `recv` hold `count` elements, the comm and stream are live.
            let raw = unsafe {
                api.ncclAllReduce(
                    ptr(send),
                    ptr(recv),
                    count,
                    nccl_dtype(dtype),
                    op,
                    c,
                    stream,
                )
            };
            (Function::AllReduce, raw)
        }
        Call::Broadcast {
            send,
            recv,
            count,
            dtype,
            root,
        } => {
            let api = nccl.api(Function::Broadcast)?;
            // SAFETY: the caller's contract: `send` and `recv` hold `count` elements, the comm and stream are live.
            let raw = unsafe {
                api.ncclBroadcast(
                    ptr(send),
                    ptr(recv),
                    count,
                    nccl_dtype(dtype),
                    to_int(root),
                    c,
                    stream,
                )
            };
            (Function::Broadcast, raw)
        }
        Call::Reduce {
            send,
            recv,
            count,
            dtype,
            op,
            root,
        } => {
            let api = nccl.api(Function::Reduce)?;
            // SAFETY: the caller's contract: `send` holds `count` elements (and `recv` on the root), the comm and stream are live.
            let raw = unsafe {
                api.ncclReduce(
                    ptr(send),
                    ptr(recv),
                    count,
                    nccl_dtype(dtype),
                    op,
                    to_int(root),
                    c,
                    stream,
                )
            };
            (Function::Reduce, raw)
        }
        Call::AllGather {
            send,
            recv,
            count,
            dtype,
        } => {
            let api = nccl.api(Function::AllGather)?;
            // SAFETY: the caller's contract: `send` holds `count` elements and `recv` `count` per rank; comm and stream are live.
            let raw = unsafe {
                api.ncclAllGather(ptr(send), ptr(recv), count, nccl_dtype(dtype), c, stream)
            };
            (Function::AllGather, raw)
        }
        Call::ReduceScatter {
            send,
            recv,
            count,
            dtype,
            op,
        } => {
            let api = nccl.api(Function::ReduceScatter)?;
            // SAFETY: the caller's contract: `send` holds `count` elements per rank and `recv` `count`; comm and stream are live.
            let raw = unsafe {
                api.ncclReduceScatter(
                    ptr(send),
                    ptr(recv),
                    count,
                    nccl_dtype(dtype),
                    op,
                    c,
                    stream,
                )
            };
            (Function::ReduceScatter, raw)
        }
        Call::Send {
            buf,
            count,
            dtype,
            peer,
        } => {
            let api = nccl.api(Function::Send)?;
            // SAFETY: the caller's contract: `buf` holds `count` elements until the send completes on `stream`; comm is live.
            let raw = unsafe {
                api.ncclSend(ptr(buf), count, nccl_dtype(dtype), to_int(peer), c, stream)
            };
            (Function::Send, raw)
        }
        Call::Recv {
            buf,
            count,
            dtype,
            peer,
        } => {
            let api = nccl.api(Function::Recv)?;
            // SAFETY: the caller's contract: `buf` has room for `count` elements until the receive completes; comm is live.
            let raw = unsafe {
                api.ncclRecv(ptr(buf), count, nccl_dtype(dtype), to_int(peer), c, stream)
            };
            (Function::Recv, raw)
        }
    };
    progress(nccl, function, raw, c)
}

/// `ncclGroupStart`.
pub(crate) fn group_start(nccl: &Nccl) -> Result<(), NcclError> {
    let api = nccl.api(Function::GroupStart)?;
    // SAFETY: no arguments; affects only this thread's NCCL group state.
    let raw = unsafe { api.ncclGroupStart() };
    progress(nccl, Function::GroupStart, raw, std::ptr::null_mut()).map(|_| ())
}

/// `ncclGroupEnd`; `Pending` on a non-blocking communicator until the group is launched.
pub(crate) fn group_end(nccl: &Nccl) -> Result<Progress, NcclError> {
    let api = nccl.api(Function::GroupEnd)?;
    // SAFETY: no arguments; ends this thread's group started by `group_start`.
    let raw = unsafe { api.ncclGroupEnd() };
    progress(nccl, Function::GroupEnd, raw, std::ptr::null_mut())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_element_type_and_reduction_has_a_distinct_nccl_code() {
        let types: std::collections::BTreeSet<_> =
            DType::ALL.iter().map(|&d| nccl_dtype(d)).collect();
        assert_eq!(types.len(), DType::ALL.len());
        assert_eq!(nccl_dtype(DType::BF16), 9);
        assert_eq!(nccl_dtype(DType::U64), 5);
        let ops: std::collections::BTreeSet<_> = ReduceOp::ALL
            .iter()
            .filter_map(|&o| builtin_op(o))
            .collect();
        assert_eq!(ops.len(), ReduceOp::ALL.len());
        assert_eq!(builtin_op(ReduceOp::Avg), Some(4));
        assert_eq!(builtin_op(ReduceOp::pre_mul_sum(0.5)), None);
    }
}
