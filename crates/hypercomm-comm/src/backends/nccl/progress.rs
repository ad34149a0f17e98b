//! What the ranks of a timed-out NCCL communicator publish and compare (`behind`, `waits`): each one's
//! [`Progress`], the operations it started, completed and still waits for, each a [`Mark`] (its number, its call
//! and, for a point-to-point operation, its peers), read off its flight record.

use serde::{Deserialize, Serialize};

use super::flight::{FlightEntry, FlightRecord};
use crate::error::{Fault, RootCause};

/// One operation as the ranks compare it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Mark {
    /// Its number on the communicator.
    pub seq: u64,
    /// The call without its number (`all_reduce(dtype=f32, count=8)`).
    pub call: String,
    /// A point-to-point operation's peers it sends to (member ids; empty for a collective).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub to: Vec<usize>,
    /// A point-to-point operation's peers it receives from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from: Vec<usize>,
}

impl Mark {
    /// The operation `e` of a flight record.
    pub(crate) fn of(e: &FlightEntry) -> Mark {
        Mark {
            seq: e.seq,
            call: e.call(),
            to: e.to.clone(),
            from: e.from.clone(),
        }
    }

    /// Whether it is a send, a receive or a batch: one with peers.
    pub(crate) fn is_point_to_point(&self) -> bool {
        !(self.to.is_empty() && self.from.is_empty())
    }

    /// Whether this operation, rank `me`'s, answers `theirs`, rank `peer`'s: it receives what `theirs` sends to
    /// `me` and sends what `theirs` receives from `me` (either may be a batch that holds more).
    pub(crate) fn answers(&self, me: usize, theirs: &Mark, peer: usize) -> bool {
        (!theirs.to.contains(&me) || self.from.contains(&peer))
            && (!theirs.from.contains(&me) || self.to.contains(&peer))
    }

    /// `#3 send(dtype=f32, count=8, to=[1])`.
    pub(crate) fn describe(&self) -> String {
        format!("#{} {}", self.seq, self.call)
    }
}

/// What a rank publishes about one communicator when it times out.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Progress {
    /// The last operation it started.
    pub started: Option<Mark>,
    /// The last operation it saw complete.
    pub completed: Option<Mark>,
    /// Operations it started and did not see complete, oldest first (those still in its flight recorder).
    pub unfinished: Vec<Mark>,
}

impl Progress {
    /// The progress a flight record shows.
    pub(crate) fn of(record: &FlightRecord) -> Progress {
        Progress {
            started: record.last_started.as_ref().map(Mark::of),
            completed: record.last_completed.as_ref().map(Mark::of),
            unfinished: record.unfinished.iter().map(Mark::of).collect(),
        }
    }

    /// The operation this rank is stuck at: its oldest unfinished one, else the one after its last completed.
    pub(crate) fn stuck_at(&self) -> Option<Mark> {
        if let Some(m) = self.unfinished.first() {
            return Some(m.clone());
        }
        match (&self.started, &self.completed) {
            (Some(s), Some(c)) if s.seq <= c.seq => None,
            (Some(s), _) => Some(s.clone()),
            (None, _) => None,
        }
    }

    /// The call this rank made as operation `seq`, when its progress shows it.
    pub(crate) fn call_at(&self, seq: u64) -> Option<&str> {
        self.unfinished
            .iter()
            .chain(&self.started)
            .chain(&self.completed)
            .find(|m| m.seq == seq)
            .map(|m| m.call.as_str())
    }

    /// The number of the last operation it started (0: none).
    pub(crate) fn last_started(&self) -> u64 {
        self.started.as_ref().map_or(0, |m| m.seq)
    }
}

/// What rank `me` finds on `comm`: a root cause blaming `ranks` for `fault`, with `detail`.
pub(crate) fn blame(comm: &str, me: usize) -> impl Fn(Vec<usize>, Fault, String) -> RootCause + '_ {
    move |ranks, fault, detail| RootCause {
        ranks,
        fault,
        comm: comm.to_owned(),
        seen_by: me,
        detail,
    }
}

/// Operations as tests of the comparisons write them.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// The call every collective of these tests makes.
    pub(crate) const AR: &str = "all_reduce(dtype=f32, count=8)";

    /// Operation `#seq`, a collective making `call`.
    pub(crate) fn mark(seq: u64, call: &str) -> Mark {
        Mark {
            seq,
            call: call.into(),
            to: Vec::new(),
            from: Vec::new(),
        }
    }

    /// A point-to-point operation `#seq` sending to `to` and receiving from `from`.
    pub(crate) fn p2p(seq: u64, to: &[usize], from: &[usize]) -> Mark {
        let op = match (to.is_empty(), from.is_empty()) {
            (false, true) => "send",
            (true, false) => "recv",
            _ => "batch",
        };
        let e = FlightEntry {
            seq,
            op: op.into(),
            dtype: "f32".into(),
            count: 8,
            bytes: 32,
            to: to.to_vec(),
            from: from.to_vec(),
            state: crate::backends::nccl::flight::OpState::Enqueued,
            enqueued_us: 0,
            finished_us: None,
        };
        Mark::of(&e)
    }

    /// Stuck at `unfinished` (in issue order), after completing `#done` (none when 0).
    pub(crate) fn stuck(done: u64, unfinished: Vec<Mark>) -> Progress {
        Progress {
            started: unfinished.last().cloned(),
            completed: (done > 0).then(|| mark(done, AR)),
            unfinished,
        }
    }

    /// Started up to `started` with `call`, completed up to `done`, the rest unfinished.
    pub(crate) fn progress(started: u64, done: u64, call: &str) -> Progress {
        Progress {
            started: (started > 0).then(|| mark(started, call)),
            completed: (done > 0).then(|| mark(done, call)),
            unfinished: (done + 1..=started).map(|s| mark(s, call)).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{AR, mark};
    use super::*;

    #[test]
    fn progress_comes_from_the_flight_record() {
        use super::super::flight::{FlightRecorder, OpState, Partners};
        let r = FlightRecorder::new("c", 8, None);
        // Each begun operation is handed on (to the watchdog) before the next is begun.
        let a = r.begin(
            "all_reduce",
            crate::element::DType::F32,
            8,
            Partners::default(),
        );
        r.take_pending();
        let b = r.begin(
            "all_reduce",
            crate::element::DType::F32,
            8,
            Partners::default(),
        );
        r.take_pending();
        r.finish(a, OpState::Completed);
        let p = Progress::of(&r.record());
        assert_eq!(p.started, Some(mark(b, AR)));
        assert_eq!(p.completed, Some(mark(a, AR)));
        assert_eq!(p.unfinished, [mark(b, AR)]);
        assert_eq!(p.stuck_at(), Some(mark(b, AR)));
    }
}
