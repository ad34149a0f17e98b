//! The expert escape hatch: NCCL called directly on a communicator's own handle
//! ([`DeviceCommunicator::with_raw_comm`](hypercomm_comm::device::DeviceCommunicator::with_raw_comm)), ordered
//! with hypercomm's operations on the same buffer by [`DeviceBuffer::address_on`], and refused once the
//! communicator is aborted.

use std::ffi::c_void;
use std::time::{Duration, Instant};

use hypercomm_comm::device::DeviceBuffer;
use hypercomm_comm::{CommError, Communicator, ReduceOp};
use nccl_sys::{Function, NcclError, sys};

use crate::fake_support::{nccl, ranks};
use crate::join;

/// An in-place sum all-reduce of `buf` with `ncclAllReduce` called directly on `comm`'s handle and stream; on a
/// non-blocking communicator (the default, and the fake answers ncclInProgress to every call there) it polls
/// `ncclCommGetAsyncError` until the call settles, as `with_raw_comm`'s contract asks.
fn raw_sum(comm: &Communicator, buf: &mut DeviceBuffer<i32>) -> Result<usize, CommError> {
    let dev = nccl(comm);
    let addr = buf.address_on(dev.stream()) as usize as *mut c_void;
    let stream = dev.stream().cu_stream() as sys::cudaStream_t;
    let count = buf.len();
    // SAFETY: the closure enqueues one in-place all-reduce of `buf` (`count` i32s on this communicator's gpu,
    // borrowed by the caller until the work is enqueued and alive until it completes) on the communicator's own
    // stream, waits for the call to settle, and keeps nothing of the handle; every NCCL call in it is on `h`, the
    // live communicator lent for the closure.
    let polled = unsafe {
        dev.with_raw_comm(|h, nccl| -> Result<usize, NcclError> {
            let api = nccl.api(Function::AllReduce)?;
            let raw = api.ncclAllReduce(addr, addr, count, sys::ncclInt32, sys::ncclSum, h, stream);
            match nccl.check(Function::AllReduce, raw, h) {
                Err(e) if e.is_in_progress() => {}
                other => return other.map(|()| 0),
            }
            let poll = nccl.api(Function::CommGetAsyncError)?;
            let deadline = Instant::now() + Duration::from_secs(30);
            let mut polls = 0;
            loop {
                assert!(
                    Instant::now() < deadline,
                    "the raw all-reduce never settled"
                );
                polls += 1;
                let mut state = sys::ncclSuccess;
                // NCCL writes one result into a live local.
                let raw = poll.ncclCommGetAsyncError(h, &mut state);
                nccl.check(Function::CommGetAsyncError, raw, h)?;
                match nccl.check(Function::CommGetAsyncError, state, h) {
                    Err(e) if e.is_in_progress() => std::thread::yield_now(),
                    other => return other.map(|()| polls),
                }
            }
        })
    };
    polled?.map_err(|e| CommError::Device {
        comm: comm.name().to_owned(),
        what: format!("the raw all-reduce: {e}"),
    })
}

#[test]
#[ignore = "run under fake-gpu by suite_ranks_as_threads"]
fn fake_a_raw_nccl_call_runs_between_hypercomm_operations() {
    let got = ranks(2, |rank, gpu, store| {
        let comm = join(&gpu, &store, 2, rank, "raw");
        let mut buf = gpu.upload(&[rank as i32 + 1, 10]).unwrap();
        let polls = raw_sum(&comm, &mut buf).unwrap();
        assert!(
            polls > 0,
            "the fake's non-blocking calls answer ncclInProgress first"
        );
        // hypercomm's next operation on the buffer comes after the raw one, on the same stream.
        let buf = comm.all_reduce(buf, ReduceOp::Sum).unwrap().wait().unwrap();
        let sums = buf.download().unwrap();
        // Once aborted, the handle is no longer lent: the closure does not run.
        comm.abort();
        let mut after = gpu.upload(&[0i32]).unwrap();
        let refused = raw_sum(&comm, &mut after).unwrap_err();
        assert!(matches!(refused, CommError::Broken { .. }), "{refused}");
        sums
    });
    assert_eq!(got, [[6, 40], [6, 40]]);
}
