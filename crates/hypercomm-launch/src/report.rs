//! [`LaunchReport`]: how each rank of a launched job ended, and a one-paragraph summary of why a job failed.

use std::fmt;
use std::time::Duration;

use hypercomm_store::StoreAddr;

/// How a rank's process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// It exited with this status.
    Code(i32),
    /// A signal with this number killed it.
    Signal(i32),
}

impl Exit {
    /// Whether this is exit status 0.
    pub fn success(self) -> bool {
        self == Exit::Code(0)
    }

    /// The exit status a shell would report for it (128 + N for signal N).
    pub fn shell_status(self) -> i32 {
        match self {
            Exit::Code(code) => code,
            Exit::Signal(sig) => 128 + sig,
        }
    }
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Exit::Code(code) => write!(f, "exited with status {code}"),
            Exit::Signal(sig) => write!(f, "was killed by {}", signal_name(sig)),
        }
    }
}

/// `SIGTERM (15)` for 15, `signal 42` for numbers without a common name.
pub fn signal_name(sig: i32) -> String {
    let name = match sig {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        _ => return format!("signal {sig}"),
    };
    format!("{name} ({sig})")
}

/// How one rank ended.
#[derive(Debug, Clone)]
pub struct RankOutcome {
    /// Global rank.
    pub rank: usize,
    /// Rank on this node.
    pub local_rank: usize,
    /// How its process ended.
    pub exit: Exit,
    /// Whether the launcher signalled it to stop (after another rank failed, a timeout, or a forwarded signal)
    /// before it ended.
    pub stopped_by_launcher: bool,
    /// Its standard output lines, when the launcher captured output.
    pub stdout: Vec<String>,
    /// Its standard error lines, when the launcher captured output.
    pub stderr: Vec<String>,
}

/// How a launched job ended.
#[derive(Debug, Clone)]
pub struct LaunchReport {
    /// Every rank started on this node, in rank order.
    pub ranks: Vec<RankOutcome>,
    /// The global rank that failed first, if any.
    pub first_failure: Option<usize>,
    /// Whether the job's timeout ran out.
    pub timed_out: bool,
    /// The first SIGINT or SIGTERM the launcher received and forwarded, if any.
    pub interrupted_by: Option<i32>,
    /// The address the ranks were told to rendezvous at.
    pub store_addr: StoreAddr,
    /// Wall time from the first spawn to the last exit.
    pub elapsed: Duration,
}

impl LaunchReport {
    /// Whether every rank exited with status 0 and nothing stopped the job.
    pub fn success(&self) -> bool {
        self.first_failure.is_none()
            && !self.timed_out
            && self.interrupted_by.is_none()
            && self.ranks.iter().all(|r| r.exit.success())
    }

    /// The status for the launcher to exit with: 0 on success, else the first failing rank's status, 124 for a
    /// timeout, or 128 + N for a forwarded signal N.
    pub fn exit_code(&self) -> i32 {
        if let Some(sig) = self.interrupted_by {
            return 128 + sig;
        }
        if self.timed_out {
            return 124;
        }
        match self.first_failure.and_then(|r| self.rank(r)) {
            Some(outcome) => match outcome.exit.shell_status() {
                0 => 1,
                code => code,
            },
            None if self.success() => 0,
            None => 1,
        }
    }

    /// The outcome of global rank `rank`, when it ran on this node.
    pub fn rank(&self, rank: usize) -> Option<&RankOutcome> {
        self.ranks.iter().find(|r| r.rank == rank)
    }

    /// One paragraph saying how the job ended, naming the rank that failed and how.
    pub fn summary(&self) -> String {
        let n = self.ranks.len();
        let secs = self.elapsed.as_secs_f64();
        if self.success() {
            return format!("all {n} rank(s) exited with status 0 in {secs:.1}s");
        }
        let mut parts = Vec::new();
        if let Some(sig) = self.interrupted_by {
            parts.push(format!(
                "the launcher received {} and forwarded it",
                signal_name(sig)
            ));
        }
        if self.timed_out {
            parts.push(format!("the job timed out after {secs:.1}s"));
        }
        if let Some(outcome) = self.first_failure.and_then(|r| self.rank(r)) {
            parts.push(format!(
                "rank {} failed first: it {}",
                outcome.rank, outcome.exit
            ));
        }
        let others: Vec<String> = self
            .ranks
            .iter()
            .filter(|r| Some(r.rank) != self.first_failure && !r.exit.success())
            .map(|r| {
                let by = if r.stopped_by_launcher {
                    ", stopped by the launcher"
                } else {
                    ""
                };
                format!("rank {} {}{by}", r.rank, r.exit)
            })
            .collect();
        if !others.is_empty() {
            parts.push(others.join("; "));
        }
        let ok = self.ranks.iter().filter(|r| r.exit.success()).count();
        parts.push(format!("{ok} of {n} rank(s) exited with status 0"));
        parts.join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(rank: usize, exit: Exit, stopped: bool) -> RankOutcome {
        RankOutcome {
            rank,
            local_rank: rank,
            exit,
            stopped_by_launcher: stopped,
            stdout: Vec::new(),
            stderr: Vec::new(),
        }
    }

    fn report(ranks: Vec<RankOutcome>, first_failure: Option<usize>) -> LaunchReport {
        LaunchReport {
            ranks,
            first_failure,
            timed_out: false,
            interrupted_by: None,
            store_addr: StoreAddr {
                host: "127.0.0.1".into(),
                port: 1,
            },
            elapsed: Duration::from_millis(1500),
        }
    }

    #[test]
    fn summary_names_the_first_failure_and_the_stopped_ranks() {
        let r = report(
            vec![
                outcome(0, Exit::Signal(15), true),
                outcome(1, Exit::Code(3), false),
                outcome(2, Exit::Code(0), false),
            ],
            Some(1),
        );
        assert!(!r.success());
        assert_eq!(r.exit_code(), 3);
        assert_eq!(
            r.summary(),
            "rank 1 failed first: it exited with status 3; rank 0 was killed by SIGTERM (15), stopped by the \
             launcher; 1 of 3 rank(s) exited with status 0"
        );
    }

    #[test]
    fn signal_deaths_map_to_shell_statuses() {
        let r = report(vec![outcome(0, Exit::Signal(9), false)], Some(0));
        assert_eq!(r.exit_code(), 137);
        assert!(r.summary().contains("SIGKILL (9)"), "{}", r.summary());
    }

    #[test]
    fn success_and_timeouts() {
        let ok = report(vec![outcome(0, Exit::Code(0), false)], None);
        assert!(ok.success());
        assert_eq!(ok.exit_code(), 0);
        let mut late = report(vec![outcome(0, Exit::Signal(15), true)], None);
        late.timed_out = true;
        assert_eq!(late.exit_code(), 124);
        assert!(
            late.summary().starts_with("the job timed out"),
            "{}",
            late.summary()
        );
    }
}
