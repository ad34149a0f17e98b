//! The order the ranks exit in: one thread per rank blocks until its rank exits and timestamps it, so that the
//! supervision loop names the rank that really failed first, whatever order it polls in.

use std::sync::mpsc;
use std::thread;
use std::time::Instant;

use rustix::process::Pid;

/// Watches rank `index` (process `pid`) and sends `(index, now)` the moment it exits. It waits with `WNOWAIT`, so
/// the rank stays unreaped (a zombie) until the launcher's loop reaps it: until then its pid cannot be reused, and
/// signalling the ranks the loop still thinks are running stays safe.
pub(super) fn watch_exit(index: usize, rank: usize, pid: Pid, tx: mpsc::Sender<(usize, Instant)>) {
    let spawned = thread::Builder::new()
        .name(format!("rank-{rank}-exit"))
        .spawn(move || {
            use rustix::process::{WaitId, WaitIdOptions, waitid};
            // Blocks until the rank exits; retried only on EINTR.
            while let Err(rustix::io::Errno::INTR) = waitid(
                WaitId::Pid(pid),
                WaitIdOptions::EXITED | WaitIdOptions::NOWAIT,
            ) {}
            let _ = tx.send((index, Instant::now()));
        });
    if let Err(e) = spawned {
        // The loop still polls every rank; only the order of near-simultaneous exits is less exact.
        tracing::debug!(rank, error = %e, "no exit watcher for rank");
    }
}
