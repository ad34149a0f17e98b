//! The supervision loop: poll the ranks until every one has exited, and apply the launcher's policies on the way
//! (a failed rank gives the others a grace period, then SIGTERM, then SIGKILL after `kill_after`; the job
//! timeout; forwarded SIGINT/SIGTERM, a second one killing every rank). A rank "fails first" in the order the
//! ranks exited, as [`exit_order`](super::exit_order) reports it, not in the order they are polled in.

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use rustix::process::Signal;

use super::Job;
use crate::config::Launcher;
use crate::{Exit, signal_name};

/// How often the launcher checks its ranks and pending signals.
const POLL: Duration = Duration::from_millis(5);

/// `now + wait`, with `wait` capped at a century so that a huge grace means "never" instead of overflowing.
fn later(now: Instant, wait: Duration) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    now.checked_add(wait.min(CENTURY)).unwrap_or(now)
}

/// What happened while watching.
pub(crate) struct Watched {
    pub(crate) first_failure: Option<usize>,
    pub(crate) timed_out: bool,
    pub(crate) interrupted_by: Option<i32>,
    pub(crate) elapsed: Duration,
    pub(crate) signals: Option<signal_hook::iterator::Signals>,
}

impl Job {
    /// Polls until every rank has exited, applying the failure, timeout and signal policies.
    pub(crate) fn watch(
        &mut self,
        launcher: &Launcher,
        mut signals: Option<signal_hook::iterator::Signals>,
    ) -> Watched {
        let started = Instant::now();
        let grace = launcher.grace_period();
        let mut first_failure = None;
        let mut timed_out = false;
        let mut interrupted_by = None;
        // When to send SIGTERM and then SIGKILL to every rank still running, once a reason to stop exists.
        let mut term_at: Option<Instant> = None;
        let mut kill_at: Option<Instant> = None;
        let mut termed = false;
        let mut killed = false;
        let mut pending_notice: Option<(usize, Instant)> = None;
        loop {
            let now = Instant::now();
            if let Some(signals) = signals.as_mut() {
                for sig in signals.pending() {
                    if interrupted_by.is_none() {
                        interrupted_by = Some(sig);
                        tracing::warn!(signal = %signal_name(sig), "forwarding signal to every rank");
                        if let Some(signal) = Signal::from_named_raw(sig) {
                            self.signal_running(signal);
                        }
                        kill_at = Some(later(now, launcher.kill_after));
                    } else {
                        tracing::warn!("second signal: killing every rank");
                        self.signal_running(Signal::KILL);
                        killed = true;
                    }
                }
            }
            // Ranks whose exit watchers reported, in the order they exited, then every other rank in index order
            // (a fallback; without it a rank whose watcher could not start would never be reaped).
            let mut noticed: Vec<(Instant, usize)> = pending_notice
                .take()
                .into_iter()
                .chain(self.exits.try_iter())
                .map(|(i, at)| (at, i))
                .collect();
            noticed.sort_unstable();
            let order: Vec<usize> = noticed
                .iter()
                .map(|&(_, i)| i)
                .chain(0..self.ranks.len())
                .collect();
            for i in order {
                let rank = &mut self.ranks[i];
                if rank.exit.is_some() {
                    continue;
                }
                match rank.child.try_wait() {
                    Ok(Some(status)) => {
                        let exit = match (status.code(), status.signal()) {
                            (Some(code), _) => Exit::Code(code),
                            (None, Some(sig)) => Exit::Signal(sig),
                            (None, None) => Exit::Code(-1),
                        };
                        rank.exit = Some(exit);
                        if !exit.success() && first_failure.is_none() && !rank.stopped_by_launcher {
                            first_failure = Some(rank.rank);
                            tracing::warn!(
                                rank = rank.rank,
                                "rank {} {exit}; stopping the others",
                                rank.rank
                            );
                            term_at.get_or_insert(later(now, grace));
                        }
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(rank = rank.rank, error = %e, "cannot poll rank; treating it as failed");
                        rank.exit = Some(Exit::Code(-1));
                        first_failure.get_or_insert(rank.rank);
                        term_at.get_or_insert(later(now, grace));
                    }
                }
            }
            if self.ranks.iter().all(|r| r.exit.is_some()) {
                break;
            }
            if let Some(limit) = launcher.timeout
                && !timed_out
                && now.duration_since(started) >= limit
            {
                timed_out = true;
                tracing::warn!(?limit, "job timed out; stopping every rank");
                term_at = Some(now);
            }
            if let Some(at) = term_at
                && !termed
                && now >= at
            {
                termed = true;
                self.signal_running(Signal::TERM);
                kill_at.get_or_insert(later(now, launcher.kill_after));
            }
            if let Some(at) = kill_at
                && !killed
                && now >= at
            {
                killed = true;
                self.signal_running(Signal::KILL);
            }
            // Sleep until a rank exits or POLL passes; the notice goes back for the next round's ordering.
            if let Ok(notice) = self.exits.recv_timeout(POLL) {
                pending_notice = Some(notice);
            }
        }
        Watched {
            first_failure,
            timed_out,
            interrupted_by,
            elapsed: started.elapsed(),
            signals,
        }
    }
}
