//! Aborts in the fake, through its C entry points: an abort stops its communicator's work in the call, and freeing
//! it waits for the work on its device, as on a GPU, so aborting one communicator while another's work waits for a
//! peer holds the abort; in a group (NCCL 2.22 and later) the freeing waits for the group's end, when every
//! communicator of the group was stopped. An earlier fake freed at once, in a group or not.

use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::ptr::null_mut;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nccl_sys::config::config_initializer;
use nccl_sys::sys::{ncclComm_t, ncclUniqueId};

use crate::cuda::*;
use crate::nccl::*;
use crate::tests::{alloc, settle, stream, sum_in_place, unique_id, upload_f32};

/// Creates rank `rank` of `n`, non-blocking, on `device` (one no other test of this binary uses: freeing waits for
/// every stream of the device), and waits until it is ready.
fn join_on(id: ncclUniqueId, rank: i32, n: i32, device: usize) -> ncclComm_t {
    cuCtxSetCurrent(std::ptr::without_provenance_mut(device + 1));
    let mut config = config_initializer();
    config.blocking = 0;
    let mut c = null_mut();
    // SAFETY: `c` and `config` are live locals.
    let r = unsafe { ncclCommInitRankConfig(&mut c, n, id, rank, &mut config) };
    assert_eq!(r, 7, "non-blocking creation is in progress");
    settle(c);
    c
}

/// Whether rank 0 freed the communicator that met in `dir`.
fn freed(dir: &Path) -> bool {
    dir.join("gone.r0").exists()
}

/// Whether stream `s` has run everything enqueued on it, within `limit`.
fn drains_within(s: *mut c_void, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    // SAFETY: live stream.
    while unsafe { cuStreamQuery(s) } != 0 {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

/// Two communicators of two ranks (rank `r` on device `devices[r]`), connected by a first all-reduce on each; rank 1
/// then never calls again. Rank 0's second all-reduce on each waits on its own stream for rank 1, which never
/// comes. Runs `f(communicators, streams, exchange directories)` as rank 0, rank 1 idling until it returns.
fn two_stuck(
    devices: [usize; 2],
    f: impl FnOnce([ncclComm_t; 2], [*mut c_void; 2], [PathBuf; 2]) + Send,
) {
    let ids = [unique_id(), unique_id()];
    let (finished, done) = mpsc::channel::<()>();
    std::thread::scope(|scope| {
        scope.spawn(move || {
            let comms = ids.map(|id| join_on(id, 1, 2, devices[1]));
            let s = stream();
            let buf = alloc(4);
            upload_f32(buf, 1.0, s);
            for c in comms {
                assert_eq!(sum_in_place(buf, c, s), 7);
                settle(c);
            }
            // Until rank 0 is done (or has panicked: the sender is dropped then too).
            let _ = done.recv_timeout(Duration::from_secs(60));
            for c in comms {
                // SAFETY: live, not used again.
                assert_eq!(unsafe { ncclCommDestroy(c) }, 0);
            }
        });
        let comms = ids.map(|id| join_on(id, 0, 2, devices[0]));
        let streams = [stream(), stream()];
        let bufs = [alloc(4), alloc(4)];
        for ((c, s), buf) in comms.into_iter().zip(streams).zip(bufs) {
            upload_f32(buf, 1.0, s);
            assert_eq!(sum_in_place(buf, c, s), 7);
            settle(c);
        }
        for ((c, s), buf) in comms.into_iter().zip(streams).zip(bufs) {
            // Rank 1 never makes this one.
            assert_eq!(sum_in_place(buf, c, s), 7);
            settle(c);
        }
        for s in streams {
            assert!(
                !drains_within(s, Duration::from_millis(50)),
                "waits for rank 1"
            );
        }
        // SAFETY: both are live.
        let dirs = comms.map(|c| unsafe { exchange_dir(c) });
        f(comms, streams, dirs);
        drop(finished);
    });
}

#[test]
fn an_abort_in_a_group_stops_the_work_in_the_call_and_frees_at_the_group_end() {
    two_stuck([5, 6], |comms, streams, dirs| {
        assert_eq!(ncclGroupStart(), 0);
        for c in comms {
            // SAFETY: live, not used again.
            assert_eq!(unsafe { ncclCommAbort(c) }, 0);
        }
        for (s, dir) in streams.into_iter().zip(&dirs) {
            assert!(
                drains_within(s, Duration::from_secs(5)),
                "the abort flag is raised in the call: the waiting work gives up"
            );
            assert!(!freed(dir), "freed at the group's end, not in the call");
        }
        let started = Instant::now();
        assert_eq!(
            ncclGroupEnd(),
            0,
            "a group of aborts is blocking, even for non-blocking communicators"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert!(dirs.iter().all(|d| freed(d)), "freed by the group's end");
    });
}

#[test]
fn an_abort_alone_waits_for_another_communicators_stuck_work_on_its_device() {
    two_stuck([7, 8], |[first, second], _, dirs| {
        let handle = first as usize;
        let (aborted, took) = mpsc::channel();
        std::thread::spawn(move || {
            let started = Instant::now();
            // SAFETY: live, not used again (the main thread only reads its directory).
            let answer = unsafe { ncclCommAbort(handle as ncclComm_t) };
            let _ = aborted.send((answer, started.elapsed()));
        });
        // Freeing the first waits for the work on the device, the second's included, which waits for rank 1.
        assert!(
            took.recv_timeout(Duration::from_millis(300)).is_err(),
            "the first abort returned while the second communicator's work still waited on the device"
        );
        assert!(!freed(&dirs[0]));
        // SAFETY: live, not used again.
        assert_eq!(unsafe { ncclCommAbort(second) }, 0);
        let (answer, waited) = took
            .recv_timeout(Duration::from_secs(10))
            .expect("the first abort returned");
        assert_eq!(answer, 0);
        assert!(waited >= Duration::from_millis(300), "{waited:?}");
        assert!(dirs.iter().all(|d| freed(d)));
    });
}
