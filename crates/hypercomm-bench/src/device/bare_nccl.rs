//! The device benchmark's baseline: `ncclAllReduce` called directly on a communicator's own handle, stream and
//! buffer, nothing of hypercomm's in between, through
//! [`DeviceCommunicator::with_raw_comm`] (the one place in the workspace outside `hypercomm-comm`'s raw layer that
//! calls NCCL itself).

use std::ffi::c_void;
use std::time::{Duration, Instant};

use hypercomm_comm::CommError;
use hypercomm_comm::device::{DeviceBuffer, DeviceCommunicator};
use nccl_sys::{Function, Nccl, NcclError, sys};

/// `calls` in-place sum all-reduces of `buf` with `ncclAllReduce` called directly on `comm`'s handle and stream,
/// under one hold of the communicator's lock for the whole batch. Returns the CPU time the calls took and how many
/// answered `ncclInProgress`.
///
/// A call that answers `ncclInProgress` (a non-blocking communicator, hypercomm's default, still setting it up) is
/// followed, inside the timed loop, by polling `ncclCommGetAsyncError` until it settles, as NCCL requires before
/// the next call on that communicator and as hypercomm's own path does; the poll gives up at the communicator's
/// timeout.
pub fn all_reduces(
    comm: &DeviceCommunicator,
    buf: &mut DeviceBuffer<f32>,
    calls: usize,
) -> Result<(Duration, usize), CommError> {
    let count = buf.len();
    let stream = comm.stream().cu_stream() as sys::cudaStream_t;
    let addr = buf.address_on(comm.stream()) as usize as *mut c_void;
    let deadline = Instant::now() + comm.options().timeout;
    // SAFETY: `with_raw_comm`'s contract: the closure enqueues only in-place all-reduces of `buf` on the
    // communicator's own stream (`addr` is `buf`'s address for that stream, holding `count` f32s on the
    // communicator's gpu; the caller holds `buf` by `&mut` until the calls are enqueued and keeps it alive
    // afterwards, so any later use or release is ordered after them), polls until each call that answered
    // ncclInProgress settles, and neither keeps the handle nor destroys, finalizes or aborts it.
    // `bare_all_reduces`' contract: `h` is lent for the closure, serialised with every other call on the
    // communicator; `stream`, `addr` and `count` as just said.
    let timed = unsafe {
        comm.with_raw_comm(|h, nccl| {
            bare_all_reduces(nccl, h, addr, count, stream, calls, deadline)
        })
    };
    timed?.map_err(|e| CommError::Device {
        comm: comm.name().to_owned(),
        what: format!("the bare ncclAllReduce baseline: {e}"),
    })
}

/// The timed loop of [`all_reduces`].
///
/// # Safety
///
/// `comm` is live and not used concurrently (lent by `with_raw_comm`), `stream` is a live stream of its device,
/// and `addr` holds `count` f32s of that device until the work completes on `stream`.
unsafe fn bare_all_reduces(
    nccl: &Nccl,
    comm: sys::ncclComm_t,
    addr: *mut c_void,
    count: usize,
    stream: sys::cudaStream_t,
    calls: usize,
    deadline: Instant,
) -> Result<(Duration, usize), NcclError> {
    let all_reduce = nccl.api(Function::AllReduce)?;
    let async_error = nccl.api(Function::CommGetAsyncError)?;
    // Whether `raw`, the answer of `function` on `comm`, is ncclInProgress; any other failure is an error.
    let pending = |function: Function, raw: sys::ncclResult_t| -> Result<bool, NcclError> {
        // SAFETY: `comm` is live (the function's contract); `check` only reads its last error on a failure.
        match unsafe { nccl.check(function, raw, comm) } {
            Ok(()) => Ok(false),
            Err(e) if e.is_in_progress() => Ok(true),
            Err(e) => Err(e),
        }
    };
    let mut in_progress = 0;
    let start = Instant::now();
    for _ in 0..calls {
        // SAFETY: the function's contract: `comm` is live and ours for the call, `stream` belongs to its device,
        // `addr` holds `count` f32s until the all-reduce completes on `stream`.
        let r = unsafe {
            all_reduce.ncclAllReduce(
                addr,
                addr,
                count,
                sys::ncclFloat32,
                sys::ncclSum,
                comm,
                stream,
            )
        };
        if pending(Function::AllReduce, r)? {
            in_progress += 1;
            // Bounded by `deadline`.
            loop {
                let mut state = sys::ncclSuccess;
                // SAFETY: `comm` is live and not used concurrently; NCCL writes one result into a live local.
                let r = unsafe { async_error.ncclCommGetAsyncError(comm, &mut state) };
                pending(Function::CommGetAsyncError, r)?;
                if !pending(Function::CommGetAsyncError, state)? || Instant::now() >= deadline {
                    break;
                }
                std::hint::spin_loop();
            }
        }
    }
    Ok((start.elapsed(), in_progress))
}
