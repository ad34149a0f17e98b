//! NCCL groups in the fake, through its C entry points: nested groups over several communicators issued at the
//! outermost end, and what NCCL refuses in a group (a failed call, blocking and non-blocking communicators
//! together), which an earlier fake let through.

use std::ffi::c_void;
use std::ptr::null_mut;

use nccl_sys::sys::ncclComm_t;

use crate::cuda::*;
use crate::nccl::*;
use crate::tests::{alloc, download, join, settle, stream, sum_in_place, unique_id, upload_f32};

/// `ncclInvalidArgument`.
const INVALID_ARGUMENT: u32 = 4;

/// A one-rank blocking communicator (no config), on the device of rank 0.
fn blocking_single() -> ncclComm_t {
    cuCtxSetCurrent(std::ptr::without_provenance_mut(1));
    let mut c = null_mut();
    // SAFETY: `c` is a live local.
    assert_eq!(unsafe { ncclCommInitRank(&mut c, 1, unique_id(), 0) }, 0);
    c
}

/// Enqueues an out-of-place all-reduce (sum) of one `f32` from `send` into `recv` on `c` and `s`; NCCL's answer.
fn sum_into(send: u64, recv: u64, c: ncclComm_t, s: *mut c_void) -> u32 {
    // SAFETY: both buffers hold one f32 until the stream has run the call (the callers synchronise before
    // freeing); `c` and `s` are live.
    unsafe {
        ncclAllReduce(
            send as *const c_void,
            recv as *mut c_void,
            1,
            7,
            0,
            c,
            s.cast(),
        )
    }
}

/// `buf`'s one `f32` once `s` has run everything enqueued on it.
fn read_f32(buf: u64, s: *mut c_void) -> f32 {
    // SAFETY: live stream.
    assert_eq!(unsafe { cuStreamSynchronize(s) }, 0);
    let bytes = download(buf, 4);
    f32::from_le_bytes(bytes.try_into().unwrap())
}

#[test]
fn a_group_mixing_blocking_and_non_blocking_communicators_is_refused_and_issues_nothing() {
    let non_blocking = join(unique_id(), 0, 1);
    let blocking = blocking_single();
    let s = stream();
    let (send, recv) = (alloc(4), alloc(4));
    upload_f32(send, 5.0, s);
    assert_eq!(ncclGroupStart(), 0);
    assert_eq!(
        sum_into(send, recv, non_blocking, s),
        0,
        "held by the group"
    );
    assert_eq!(
        sum_into(send, recv, blocking, s),
        INVALID_ARGUMENT,
        "a blocking communicator in a group of non-blocking ones"
    );
    assert_eq!(
        ncclGroupEnd(),
        INVALID_ARGUMENT,
        "the group fails with its failed call"
    );
    assert_eq!(
        read_f32(recv, s),
        0.0,
        "the non-blocking call of the failed group ran"
    );
    // The next group starts clean: a blocking communicator alone is taken.
    assert_eq!(ncclGroupStart(), 0);
    assert_eq!(sum_into(send, recv, blocking, s), 0);
    assert_eq!(ncclGroupEnd(), 0);
    assert_eq!(read_f32(recv, s), 5.0);
    // SAFETY: both communicators are live and not used again.
    unsafe {
        assert_eq!(ncclCommDestroy(non_blocking), 0);
        assert_eq!(ncclCommDestroy(blocking), 0);
    }
}

#[test]
fn a_failed_call_fails_its_group_which_issues_none_of_its_calls() {
    let c = join(unique_id(), 0, 1);
    let s = stream();
    let (send, recv) = (alloc(4), alloc(4));
    upload_f32(send, 3.0, s);
    assert_eq!(ncclGroupStart(), 0);
    assert_eq!(ncclGroupStart(), 0, "groups nest");
    assert_eq!(sum_into(send, recv, c, s), 0);
    assert_eq!(ncclGroupEnd(), 0, "an inner end issues nothing");
    // SAFETY: `recv` holds one f32; root 5 is not a rank of the one-rank communicator, which NCCL refuses.
    let bad = unsafe {
        ncclBroadcast(
            recv as *const c_void,
            recv as *mut c_void,
            1,
            7,
            5,
            c,
            s.cast(),
        )
    };
    assert_eq!(bad, INVALID_ARGUMENT);
    assert_eq!(ncclGroupEnd(), INVALID_ARGUMENT);
    assert_eq!(
        read_f32(recv, s),
        0.0,
        "the good call of the failed group ran"
    );
    settle(c);
    // The thread's group state was cleared: the next group runs.
    assert_eq!(ncclGroupStart(), 0);
    assert_eq!(sum_into(send, recv, c, s), 0);
    assert_eq!(ncclGroupEnd(), 7, "a non-blocking group is in progress");
    settle(c);
    assert_eq!(read_f32(recv, s), 3.0);
    // SAFETY: live, not used again.
    assert_eq!(unsafe { ncclCommDestroy(c) }, 0);
}

#[test]
fn twins_on_one_stream_first_used_in_opposite_orders_in_one_nested_group_complete() {
    // Outside a group each rank would wait in its first call for the other (NCCL's runtime connection); in one
    // group every communicator of the group arrives before any waits. And on one stream the two all-reduces run
    // one after the other: NCCL launches a group's communicators in the order of their hashes, the same on every
    // rank, so each rank runs the twins in the same order whatever the order of its calls (an earlier fake ran
    // them in call order, and the ranks waited on each other until its timeout).
    let (first, second) = (unique_id(), unique_id());
    let sums: Vec<[f32; 2]> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                scope.spawn(move || {
                    let twins = [join(first, rank, 2), join(second, rank, 2)];
                    let s = stream();
                    let bufs = [alloc(4), alloc(4)];
                    upload_f32(bufs[0], (rank + 1) as f32, s);
                    upload_f32(bufs[1], 10.0 * (rank + 1) as f32, s);
                    let order = if rank == 0 { [0, 1] } else { [1, 0] };
                    assert_eq!(ncclGroupStart(), 0);
                    for i in order {
                        assert_eq!(ncclGroupStart(), 0);
                        assert_eq!(sum_in_place(bufs[i], twins[i], s), 0, "held by the group");
                        assert_eq!(ncclGroupEnd(), 0, "an inner end issues nothing");
                    }
                    assert_eq!(
                        ncclGroupEnd(),
                        7,
                        "non-blocking communicators are in progress"
                    );
                    twins.iter().for_each(|&c| settle(c));
                    let sums = [read_f32(bufs[0], s), read_f32(bufs[1], s)];
                    for c in twins {
                        // SAFETY: live, not used again.
                        assert_eq!(unsafe { ncclCommDestroy(c) }, 0);
                    }
                    sums
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(sums, [[3.0, 30.0], [3.0, 30.0]]);
}
