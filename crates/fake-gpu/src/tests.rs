//! The fake's own behaviours, through its C entry points: what a GPU does that an earlier fake did not.

use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use nccl_sys::config::config_initializer;
use nccl_sys::sys::{ncclComm_t, ncclUniqueId};

use crate::cuda::*;
use crate::nccl::*;

pub(crate) fn stream() -> *mut c_void {
    let mut s = null_mut();
    // SAFETY: `s` is a live local.
    assert_eq!(unsafe { cuStreamCreate(&mut s, 0) }, 0);
    s
}

fn event() -> *mut c_void {
    let mut e = null_mut();
    // SAFETY: `e` is a live local.
    assert_eq!(unsafe { cuEventCreate(&mut e, 0) }, 0);
    e
}

pub(crate) fn alloc(bytes: usize) -> u64 {
    let mut a = 0;
    // SAFETY: `a` is a live local.
    assert_eq!(unsafe { cuMemAlloc_v2(&mut a, bytes) }, 0);
    a
}

pub(crate) fn download(addr: u64, n: usize) -> Vec<u8> {
    let mut out = vec![0u8; n];
    // SAFETY: `addr` holds `n` bytes (allocated by the caller); `out` too; the null stream is valid.
    let r = unsafe { cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), addr, n, null_mut()) };
    assert_eq!(r, 0);
    out
}

#[test]
fn events_complete_when_their_stream_reaches_them_not_when_recorded() {
    let (a, b) = (stream(), stream());
    let (gate, done) = (event(), event());
    // Stream a waits on `gate`, recorded on stream b behind a sleep: nothing on a may run before it.
    let buf = alloc(4);
    // SAFETY: all handles are live; `buf` holds 4 bytes; the sleep is an ordinary closure on the worker.
    unsafe {
        crate::stream::submit(
            b,
            Box::new(|| {
                std::thread::sleep(Duration::from_millis(200));
                Ok(())
            }),
        )
        .unwrap();
        assert_eq!(cuEventRecord(gate, b), 0);
        assert_eq!(cuStreamWaitEvent(a, gate, 0), 0);
        assert_eq!(cuMemsetD8Async(buf, 7, 4, a), 0);
        assert_eq!(cuEventRecord(done, a), 0);
        assert_eq!(
            cuEventQuery(done),
            600,
            "not reached yet: the memset waits for the gate"
        );
        assert_eq!(cuStreamQuery(a), 600);
    }
    // Without waiting, the memory is still as it was: a missing wait reads stale data.
    assert_eq!(download(buf, 4), [0; 4]);
    let started = Instant::now();
    // SAFETY: live event.
    assert_eq!(unsafe { cuEventSynchronize(done) }, 0);
    assert!(started.elapsed() >= Duration::from_millis(100));
    assert_eq!(download(buf, 4), [7; 4]);
    let mut ms = 0f32;
    // SAFETY: live events, `ms` a live local.
    assert_eq!(unsafe { cuEventElapsedTime(&mut ms, gate, done) }, 0);
    assert!(ms >= 0.0);
}

#[test]
fn host_to_device_copies_take_their_bytes_at_the_call() {
    let s = stream();
    let buf = alloc(3);
    let mut host = [1u8, 2, 3];
    // SAFETY: `host` holds 3 bytes, `buf` too; the stream is live.
    unsafe { assert_eq!(cuMemcpyHtoDAsync_v2(buf, host.as_ptr().cast(), 3, s), 0) };
    host = [9, 9, 9];
    // SAFETY: live stream.
    assert_eq!(unsafe { cuStreamSynchronize(s) }, 0);
    assert_eq!(download(buf, 3), [1, 2, 3]);
    assert_eq!(host, [9, 9, 9]);
}

pub(crate) fn unique_id() -> ncclUniqueId {
    let mut id = ncclUniqueId { internal: [0; 128] };
    // SAFETY: `id` is a live local.
    assert_eq!(unsafe { ncclGetUniqueId(&mut id) }, 0);
    id
}

/// Creates rank `rank` of `n` on device `rank`, non-blocking, and waits until it is ready.
pub(crate) fn join(id: ncclUniqueId, rank: i32, n: i32) -> ncclComm_t {
    cuCtxSetCurrent(std::ptr::without_provenance_mut(rank as usize + 1));
    let mut config = config_initializer();
    config.blocking = 0;
    let mut c = null_mut();
    // SAFETY: `c` and `config` are live locals.
    let r = unsafe { ncclCommInitRankConfig(&mut c, n, id, rank, &mut config) };
    assert_eq!(r, 7, "non-blocking creation is in progress");
    assert!(!c.is_null(), "the handle is written at once");
    settle(c);
    c
}

/// What `ncclCommGetAsyncError` answers for `c` now.
pub(crate) fn state(c: ncclComm_t) -> u32 {
    let mut state = 0;
    // SAFETY: `c` is live; `state` a live local.
    assert_eq!(unsafe { ncclCommGetAsyncError(c, &mut state) }, 0);
    state
}

pub(crate) fn settle(c: ncclComm_t) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match state(c) {
            0 => return,
            7 if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
            s => panic!("communicator state {s}"),
        }
    }
}

#[test]
fn ranks_as_threads_reduce_real_data_and_split_writes_the_child_late() {
    let id = unique_id();
    let results: Vec<(Vec<u8>, usize)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                scope.spawn(move || {
                    let c = join(id, rank, 2);
                    let s = stream();
                    let buf = alloc(8);
                    let mine = [(rank + 1) as f32, 10.0 * (rank + 1) as f32];
                    // SAFETY: `buf` holds 8 bytes, `mine` too; `c` and `s` are live.
                    unsafe {
                        assert_eq!(cuMemcpyHtoDAsync_v2(buf, mine.as_ptr().cast(), 8, s), 0);
                        let r = ncclAllReduce(
                            buf as *const c_void,
                            buf as *mut c_void,
                            2,
                            7,
                            2,
                            c,
                            s.cast(),
                        );
                        assert_eq!(r, 7, "a non-blocking enqueue answers ncclInProgress");
                    }
                    // Using the communicator before it settles is refused, as NCCL refuses it.
                    let mut out = null_mut();
                    let mut config = config_initializer();
                    config.blocking = 0;
                    // SAFETY: live handle and locals.
                    let early = unsafe { ncclCommSplit(c, 0, rank, &mut out, &mut config) };
                    assert_eq!(early, 4, "split before the enqueue settled");
                    settle(c);
                    // SAFETY: as above.
                    let r = unsafe { ncclCommSplit(c, 0, -rank, &mut out, &mut config) };
                    assert_eq!(
                        r, 0,
                        "a non-blocking split answers ncclSuccess while its job runs, as NCCL does"
                    );
                    settle(c);
                    assert!(
                        !out.is_null(),
                        "the child is written once the parent settles"
                    );
                    let mut child_rank = 0;
                    // SAFETY: the child is live.
                    unsafe { assert_eq!(ncclCommUserRank(out, &mut child_rank), 0) };
                    // SAFETY: live stream.
                    unsafe { assert_eq!(cuStreamSynchronize(s), 0) };
                    let bytes = download(buf, 8);
                    // SAFETY: both communicators are live and not used again.
                    unsafe {
                        assert_eq!(ncclCommDestroy(out), 0);
                        assert_eq!(ncclCommDestroy(c), 0);
                    }
                    (bytes, child_rank as usize)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let max: Vec<u8> = [2.0f32, 20.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    assert_eq!(results[0].0, max, "ncclMax over both ranks' data");
    assert_eq!(results[1].0, max);
    // Keys 0 and -1: rank 1 sorts first in the child.
    assert_eq!((results[0].1, results[1].1), (1, 0));
}

#[test]
fn two_ranks_on_one_device_are_refused_before_nccl_2_30() {
    let id = unique_id();
    let states: Vec<u32> = std::thread::scope(|scope| {
        let hs: Vec<_> = (0..2)
            .map(|rank| {
                scope.spawn(move || {
                    cuCtxSetCurrent(std::ptr::without_provenance_mut(1));
                    let mut c = null_mut();
                    // SAFETY: `c` is a live local; no config means blocking.
                    unsafe { ncclCommInitRank(&mut c, 2, id, rank) }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(states, [5, 5], "ncclInvalidUsage: duplicate GPU");
}

/// Enqueues an all-reduce (sum) of the one `f32` at `buf` on `c` and `s`; NCCL's answer.
pub(crate) fn sum_in_place(buf: u64, c: ncclComm_t, s: *mut c_void) -> u32 {
    // SAFETY: `buf` holds one f32 until the stream has run the call (the callers synchronise before freeing);
    // `c` and `s` are live.
    unsafe {
        ncclAllReduce(
            buf as *const c_void,
            buf as *mut c_void,
            1,
            7,
            0,
            c,
            s.cast(),
        )
    }
}

pub(crate) fn upload_f32(buf: u64, v: f32, s: *mut c_void) {
    let bytes = v.to_le_bytes();
    // SAFETY: `buf` holds 4 bytes; the copy takes the host bytes at the call; the stream is live.
    let r = unsafe { cuMemcpyHtoDAsync_v2(buf, bytes.as_ptr().cast(), 4, s) };
    assert_eq!(r, 0);
}

/// Polls `c` for up to `limit`: whether it settled (a failure panics).
fn settles_within(c: ncclComm_t, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        match state(c) {
            0 => return true,
            7 if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
            7 => return false,
            s => panic!("communicator state {s}"),
        }
    }
}

#[test]
fn a_first_collective_stays_in_progress_until_every_rank_has_called_one() {
    // NCCL's runtime connection (2.22 and later), seen on an H100 with NCCL 2.30.7 (docs/gpu-validation.md): a
    // communicator connects its peers on its first collective, so that first enqueue does not settle until every
    // rank has made its own. Later collectives settle on their own. (Rank 0 asserts only after both barriers, so that a
    // failure cannot leave rank 1 waiting at one.)
    let id = unique_id();
    let (first, second) = (Barrier::new(2), Barrier::new(2));
    let ranks: Vec<(bool, bool, Vec<u8>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                let (first, second) = (&first, &second);
                scope.spawn(move || {
                    let c = join(id, rank, 2);
                    let s = stream();
                    let buf = alloc(4);
                    upload_f32(buf, (rank + 1) as f32, s);
                    if rank == 1 {
                        first.wait();
                    }
                    assert_eq!(sum_in_place(buf, c, s), 7);
                    // Rank 0 polls for 200 ms before rank 1 calls anything.
                    let early = rank == 0 && settles_within(c, Duration::from_millis(200));
                    if rank == 0 {
                        first.wait();
                    }
                    settle(c);
                    // Rank 0's second all-reduce settles before rank 1 calls it.
                    if rank == 1 {
                        second.wait();
                    }
                    assert_eq!(sum_in_place(buf, c, s), 7);
                    let alone = rank == 1 || settles_within(c, Duration::from_secs(5));
                    if rank == 0 {
                        second.wait();
                    }
                    settle(c);
                    // SAFETY: live stream.
                    assert_eq!(unsafe { cuStreamSynchronize(s) }, 0);
                    let bytes = download(buf, 4);
                    // SAFETY: live, not used again.
                    assert_eq!(unsafe { ncclCommDestroy(c) }, 0);
                    (early, alone, bytes)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(
        !ranks[0].0,
        "rank 0's first all-reduce settled before rank 1 called one"
    );
    assert!(ranks[0].1, "rank 0's second all-reduce waited for rank 1");
    // (1 + 2) summed again over both ranks.
    assert_eq!(ranks[0].2, 6f32.to_le_bytes());
    assert_eq!(ranks[1].2, 6f32.to_le_bytes());
}

#[test]
fn a_blocking_first_collective_waits_in_the_call_for_every_rank() {
    let id = unique_id();
    let waited: Vec<Duration> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                scope.spawn(move || {
                    cuCtxSetCurrent(std::ptr::without_provenance_mut(rank as usize + 1));
                    let mut c = null_mut();
                    // SAFETY: `c` is a live local; no config means blocking.
                    assert_eq!(unsafe { ncclCommInitRank(&mut c, 2, id, rank) }, 0);
                    let s = stream();
                    let buf = alloc(4);
                    upload_f32(buf, 1.0, s);
                    if rank == 1 {
                        std::thread::sleep(Duration::from_millis(300));
                    }
                    let started = Instant::now();
                    assert_eq!(
                        sum_in_place(buf, c, s),
                        0,
                        "a blocking call settles in the call"
                    );
                    let waited = started.elapsed();
                    // SAFETY: live stream, then a live communicator not used again.
                    unsafe {
                        assert_eq!(cuStreamSynchronize(s), 0);
                        assert_eq!(ncclCommDestroy(c), 0);
                    }
                    waited
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(
        waited[0] >= Duration::from_millis(200),
        "rank 0's first call returned after {:?}, before rank 1 had called",
        waited[0]
    );
}

/// Rank `rank` of `n` on device `rank`, blocking.
fn join_blocking(id: ncclUniqueId, rank: i32, n: i32) -> ncclComm_t {
    cuCtxSetCurrent(std::ptr::without_provenance_mut(rank as usize + 1));
    let mut c = null_mut();
    // SAFETY: `c` is a live local; no config means blocking.
    assert_eq!(unsafe { ncclCommInitRank(&mut c, n, id, rank) }, 0);
    c
}

/// `ncclRedOpCreatePreMulSum` of one host-immediate `f32` on `c`: NCCL's answer and the operator.
fn pre_mul_sum_f32(scalar: f32, residence: u32, c: ncclComm_t) -> (u32, u32) {
    let mut op = 0;
    let mut value = scalar;
    // SAFETY: `op` and `value` are live locals; `c` is live.
    let r = unsafe { ncclRedOpCreatePreMulSum(&mut op, (&raw mut value).cast(), 7, residence, c) };
    (r, op)
}

/// Enqueues an in-place all-reduce of `count` elements of `dtype` at `buf` with `op`; NCCL's answer.
fn all_reduce_with(
    buf: u64,
    count: usize,
    dtype: u32,
    op: u32,
    c: ncclComm_t,
    s: *mut c_void,
) -> u32 {
    // SAFETY: `buf` holds `count` elements until the stream has run the call (the callers synchronise first);
    // `c` and `s` are live.
    unsafe {
        ncclAllReduce(
            buf as *const c_void,
            buf as *mut c_void,
            count,
            dtype,
            op,
            c,
            s.cast(),
        )
    }
}

#[test]
fn a_created_premulsum_belongs_to_one_communicator_and_one_type_until_destroyed() {
    const INVALID_ARGUMENT: u32 = 4;
    let (id, other_id) = (unique_id(), unique_id());
    let results: Vec<Vec<u8>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                scope.spawn(move || {
                    let c = join_blocking(id, rank, 2);
                    let other = join_blocking(other_id, rank, 2);
                    let s = stream();
                    let buf = alloc(8);
                    let mine = [(rank + 1) as f32, 10.0 * (rank + 1) as f32];
                    // SAFETY: `buf` holds 8 bytes, `mine` too; the stream is live.
                    let r = unsafe { cuMemcpyHtoDAsync_v2(buf, mine.as_ptr().cast(), 8, s) };
                    assert_eq!(r, 0);
                    // Each rank its own factor, as NCCL allows: rank 0 halves, rank 1 triples.
                    let (r, op) = pre_mul_sum_f32([0.5, 3.0][rank as usize], 1, c);
                    assert_eq!(r, 0);
                    assert!(op >= 5 && op <= i32::MAX as u32, "operator {op}");
                    // Refused when issued, before any rank waits: another type, another communicator.
                    assert_eq!(
                        all_reduce_with(buf, 2, 2, op, c, s),
                        INVALID_ARGUMENT,
                        "i32"
                    );
                    assert_eq!(all_reduce_with(buf, 2, 7, op, other, s), INVALID_ARGUMENT);
                    // SAFETY: `other` and `c` are live; builtin and foreign operators are refused.
                    unsafe {
                        assert_eq!(ncclRedOpDestroy(op, other), INVALID_ARGUMENT);
                        assert_eq!(ncclRedOpDestroy(0, c), INVALID_ARGUMENT, "ncclSum");
                        assert_eq!(ncclRedOpDestroy(u32::MAX, c), INVALID_ARGUMENT);
                    }
                    assert_eq!(all_reduce_with(buf, 2, 7, op, c, s), 0);
                    // Destroyed as soon as the call returned, before the stream runs it: the call kept a copy.
                    // SAFETY: `op` is `c`'s; then it is gone.
                    unsafe {
                        assert_eq!(ncclRedOpDestroy(op, c), 0);
                        assert_eq!(ncclRedOpDestroy(op, c), INVALID_ARGUMENT, "twice");
                    }
                    assert_eq!(
                        all_reduce_with(buf, 2, 7, op, c, s),
                        INVALID_ARGUMENT,
                        "destroyed"
                    );
                    let (r, _) = pre_mul_sum_f32(1.0, 0, c);
                    assert_eq!(
                        r, INVALID_ARGUMENT,
                        "a device-resident scalar is not in the fake"
                    );
                    // SAFETY: live stream.
                    assert_eq!(unsafe { cuStreamSynchronize(s) }, 0);
                    assert_eq!(
                        state(c),
                        0,
                        "the refused calls left the communicator healthy"
                    );
                    let bytes = download(buf, 8);
                    // SAFETY: live, not used again.
                    unsafe {
                        assert_eq!(ncclCommDestroy(other), 0);
                        assert_eq!(ncclCommDestroy(c), 0);
                    }
                    bytes
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // 0.5 * 1 + 3 * 2 and 0.5 * 10 + 3 * 20.
    let want: Vec<u8> = [6.5f32, 65.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    assert_eq!(results, [want.clone(), want]);
}

#[test]
fn a_revoke_from_another_thread_ends_a_blocking_call_waiting_for_peers() {
    // Rank 1 joins but never calls: rank 0's first (blocking) all-reduce waits in the call for it to connect, as
    // NCCL's does. A watchdog cannot abort from another thread there (ncclCommAbort frees the communicator under
    // the call); ncclCommRevoke may run beside it, and the call returns.
    let id = unique_id();
    let (finished, done) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|scope| {
        scope.spawn(move || {
            cuCtxSetCurrent(std::ptr::without_provenance_mut(2));
            let mut c = null_mut();
            // SAFETY: `c` is a live local; no config means blocking.
            assert_eq!(unsafe { ncclCommInitRank(&mut c, 2, id, 1) }, 0);
            // Until rank 0 is done (or has panicked: the sender is dropped then too).
            let _ = done.recv_timeout(Duration::from_secs(60));
            // SAFETY: live, not used again.
            assert_eq!(unsafe { ncclCommDestroy(c) }, 0);
        });
        cuCtxSetCurrent(std::ptr::without_provenance_mut(1));
        let mut c = null_mut();
        // SAFETY: `c` is a live local; no config means blocking.
        assert_eq!(unsafe { ncclCommInitRank(&mut c, 2, id, 0) }, 0);
        let (s, buf) = (stream(), alloc(4));
        upload_f32(buf, 1.0, s);
        let handle = c as usize;
        let revoker = scope.spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            // SAFETY: the communicator stays allocated until rank 0 destroys it, after this thread is joined.
            unsafe { ncclCommRevoke(handle as ncclComm_t, 0) }
        });
        let started = Instant::now();
        let answer = sum_in_place(buf, c, s);
        let waited = started.elapsed();
        assert_eq!(
            revoker.join().unwrap(),
            0,
            "a blocking revoke settles in the call"
        );
        assert_ne!(answer, 0, "the call gave up: its peer never connected");
        assert!(
            waited >= Duration::from_millis(200) && waited < Duration::from_secs(10),
            "the call returned after {waited:?}"
        );
        assert_eq!(
            sum_in_place(buf, c, s),
            5,
            "a revoked communicator refuses work"
        );
        // SAFETY: live stream, then a live communicator not used again.
        unsafe {
            assert_eq!(cuStreamSynchronize(s), 0);
            assert_eq!(ncclCommAbort(c), 0);
        }
        drop(finished);
    });
}

#[test]
fn a_host_copy_behind_a_collective_waits_for_it_until_its_communicator_is_aborted() {
    // Both ranks connect with a first all-reduce; rank 1 never makes the second. Rank 0's stream waits on the
    // collective, and a copy to the host behind it blocks, as on a GPU, until the communicator is aborted (NCCL's
    // kernel then ends, its output undefined); then it returns and the stream goes on.
    let id = unique_id();
    let (finished, done) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|scope| {
        scope.spawn(move || {
            let c = join(id, 1, 2);
            let (s, buf) = (stream(), alloc(4));
            upload_f32(buf, 1.0, s);
            assert_eq!(sum_in_place(buf, c, s), 7);
            settle(c);
            // Until rank 0 is done (or has panicked: the sender is dropped then too).
            let _ = done.recv_timeout(Duration::from_secs(60));
            // SAFETY: live, not used again.
            assert_eq!(unsafe { ncclCommDestroy(c) }, 0);
        });
        let c = join(id, 0, 2);
        let (s, buf) = (stream(), alloc(4));
        upload_f32(buf, 1.0, s);
        assert_eq!(sum_in_place(buf, c, s), 7);
        // Connected once rank 0's first all-reduce settles (rank 1 has called its own).
        settle(c);
        assert_eq!(sum_in_place(buf, c, s), 7);
        settle(c);
        let handle = c as usize;
        let aborter = scope.spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            // SAFETY: no call is inside the communicator (the main thread is in a copy), and it is not used again.
            unsafe { ncclCommAbort(handle as ncclComm_t) }
        });
        let gate = event();
        let mut out = [0u8; 4];
        let started = Instant::now();
        // SAFETY: live event and streams; `buf` and `out` hold 4 bytes. The null stream's wait and copy block.
        unsafe {
            assert_eq!(cuEventRecord(gate, s), 0);
            assert_eq!(cuStreamWaitEvent(null_mut(), gate, 0), 0);
            assert_eq!(cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), buf, 4, s), 0);
        }
        let waited = started.elapsed();
        assert_eq!(aborter.join().unwrap(), 0);
        assert!(
            waited >= Duration::from_millis(200) && waited < Duration::from_secs(10),
            "the copy returned after {waited:?}"
        );
        // SAFETY: live stream.
        assert_eq!(unsafe { cuStreamSynchronize(s) }, 0, "the stream went on");
        drop(finished);
    });
}
