//! The rank behind, by name: when an NCCL communicator times out, its live ranks compare how far they got.
//!
//! NCCL itself never says which rank a stuck collective waits for. But every rank numbers its operations on a
//! communicator alike (`flight`), so when rank A's operation `#k` times out, A publishes its progress (the last
//! operation it started, the last it saw complete, and those still unfinished, each with its number and call)
//! under its failure domain's key in the store, beside the failure records (`FailureDomain::publish_progress`),
//! and reads its peers' for a bounded while ([`stuck_wait`] of the timeout: the peers stuck on the same
//! operation time out at about the same moment and publish theirs). Then:
//!
//! - a peer whose last started operation is before `#k` never reached it: it is named, with where it stopped
//!   ("rank(s) [2] never reached it; rank 2 last started #40 all_reduce(dtype=f32, count=8)");
//! - a peer that published nothing within the wait is named as dead (it may be alive but outside hypercomm,
//!   which from here looks the same);
//! - when every rank reached `#k` but not with the same call, the ranks outside the largest side are named
//!   ("op #41 on dp/device: rank(s) [3] called all_gather(dtype=f32, count=8) where rank(s) [0, 1, 2] called
//!   reduce_scatter(dtype=f32, count=8)"), a disagreement;
//! - when all reached `#k` with the same call, nothing is known beyond the timeout itself.
//!
//! A point-to-point operation (a send, a receive, a batch) is not joined by every rank, so its number says
//! little; the ranks follow its peers instead. A rank stuck at a send waits for its peer's receive; when the
//! peer is stuck at something else, the receive is queued behind it (NCCL runs a communicator's operations in
//! issue order), so the wait goes on to whatever that peer waits for, rank by rank, until it reaches
//! - a rank that left no record: named as dead, with the chain of waits that led to it;
//! - a rank not stuck on the communicator: it never reached the counterpart ("rank 3, which never reached the
//!   counterpart (it last started #9 all_reduce(...))");
//! - a rank already on the chain: a cycle of waits, named by its ranks and each one's operation, told from the
//!   lowest rank so that every rank on it says the same ("a cycle of waits on pp/device: rank 0 at #1
//!   send(dtype=f32, count=8, to=[1]), which waits for rank 1 at #1 send(..., to=[2]), ..., which waits for
//!   rank 0"): four pipeline stages that each send before they receive, as separate operations.
//!
//! The finding is the timeout's root cause, recorded through the failure domain like any other, so ranks that
//! learn of the failure later (through the host halves of the collection) report it too. Ranks are member ids:
//! world ranks in a collection.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::flight::{FlightEntry, FlightRecord};
use crate::CommError;
use crate::error::{Call, Fault, RootCause};
use crate::failure::{FailureDomain, from_lowest, stuck_wait};

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
    fn of(e: &FlightEntry) -> Mark {
        Mark {
            seq: e.seq,
            call: e.call(),
            to: e.to.clone(),
            from: e.from.clone(),
        }
    }

    fn is_point_to_point(&self) -> bool {
        !(self.to.is_empty() && self.from.is_empty())
    }

    /// Whether this operation, rank `me`'s, answers `theirs`, rank `peer`'s: it receives what `theirs` sends to
    /// `me` and sends what `theirs` receives from `me` (either may be a batch that holds more).
    fn answers(&self, me: usize, theirs: &Mark, peer: usize) -> bool {
        (!theirs.to.contains(&me) || self.from.contains(&peer))
            && (!theirs.from.contains(&me) || self.to.contains(&peer))
    }

    /// `#3 send(dtype=f32, count=8, to=[1])`.
    fn describe(&self) -> String {
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
    fn stuck_at(&self) -> Option<Mark> {
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
    fn call_at(&self, seq: u64) -> Option<&str> {
        self.unfinished
            .iter()
            .chain(&self.started)
            .chain(&self.completed)
            .find(|m| m.seq == seq)
            .map(|m| m.call.as_str())
    }

    fn last_started(&self) -> u64 {
        self.started.as_ref().map_or(0, |m| m.seq)
    }
}

/// The timeout error of the NCCL communicator `comm` (timeout `after`, flight record `record`) in `during`, with
/// the rank behind as its root cause when the ranks' progress names one. Publishes this rank's progress and reads
/// the peers' through the communicator's failure domain (none: no comparison).
pub(crate) fn diagnose(
    comm: &str,
    after: Duration,
    record: &FlightRecord,
    domain: Option<&FailureDomain>,
    during: String,
) -> CommError {
    let members = record.members.clone();
    let plain = |missing: Vec<usize>, cause: Option<RootCause>| CommError::Timeout {
        comm: comm.to_owned(),
        members: members.clone(),
        missing,
        after,
        during: during.clone(),
        cause: cause.map(Box::new),
    };
    let Some(domain) = domain else {
        return plain(Vec::new(), None);
    };
    let mine = Progress::of(record);
    if let Ok(bytes) = serde_json::to_vec(&mine) {
        domain.publish_progress(comm, bytes);
    }
    let me = record.rank;
    let deadline = Instant::now() + stuck_wait(after);
    let peers: Vec<(usize, Option<Progress>)> = members
        .iter()
        .filter(|&&m| m != me)
        .map(|&m| {
            // Each later rank still gets a moment: its record may have landed while we waited for an earlier one.
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(20));
            let theirs = domain
                .read_progress(comm, m, left)
                .and_then(|b| serde_json::from_slice(&b).ok());
            (m, theirs)
        })
        .collect();
    match analyse(comm, &members, me, &mine, &peers) {
        // Ranks that disagree or wait on each other are there all the same: none of them is missing.
        Some(cause) if !cause.fault.loses_ranks() => plain(Vec::new(), Some(cause)),
        Some(cause) => plain(cause.ranks.clone(), Some(cause)),
        None => plain(Vec::new(), None),
    }
}

/// What rank `me` finds on `comm`: a root cause blaming `ranks` for `fault`, with `detail`.
fn blame(comm: &str, me: usize) -> impl Fn(Vec<usize>, Fault, String) -> RootCause + '_ {
    move |ranks, fault, detail| RootCause {
        ranks,
        fault,
        comm: comm.to_owned(),
        seen_by: me,
        detail,
    }
}

/// Who is to blame for this rank (`me`, with progress `mine`) being stuck on `comm`, from the peers' progress
/// (`None`: no record within the wait). `members` in member order.
pub(crate) fn analyse(
    comm: &str,
    members: &[usize],
    me: usize,
    mine: &Progress,
    peers: &[(usize, Option<Progress>)],
) -> Option<RootCause> {
    let at = mine.stuck_at()?;
    if at.is_point_to_point() {
        return waits(comm, me, mine, peers);
    }
    let k = at.seq;
    let cause = blame(comm, me);
    let op = format!("op #{k} {} on {comm}", at.call);
    let dead: Vec<usize> = peers
        .iter()
        .filter(|(_, p)| p.is_none())
        .map(|(r, _)| *r)
        .collect();
    let behind: Vec<(usize, &Progress)> = peers
        .iter()
        .filter_map(|(r, p)| p.as_ref().map(|p| (*r, p)))
        .filter(|(_, p)| p.last_started() < k)
        .collect();
    if !dead.is_empty() || !behind.is_empty() {
        let mut parts = Vec::new();
        if !behind.is_empty() {
            let ranks: Vec<usize> = behind.iter().map(|(r, _)| *r).collect();
            let wheres: Vec<String> = behind
                .iter()
                .map(|(r, p)| match &p.started {
                    Some(m) => format!("rank {r} last started #{} {}", m.seq, m.call),
                    None => format!("rank {r} started none"),
                })
                .collect();
            parts.push(format!(
                "rank(s) {ranks:?} never reached it ({})",
                wheres.join(", ")
            ));
        }
        if !dead.is_empty() {
            parts.push(format!(
                "rank(s) {dead:?} left no progress record within the wait: dead, or stuck outside hypercomm"
            ));
        }
        let mut ranks: Vec<usize> = behind.iter().map(|(r, _)| *r).chain(dead).collect();
        ranks.sort_unstable();
        let fault = if behind.is_empty() {
            Fault::Died
        } else {
            Fault::Missing
        };
        return Some(cause(ranks, fault, format!("{op}: {}", parts.join("; "))));
    }
    // Everyone reached #k: did they all call the same thing?
    let mut sides: Vec<Call> = Vec::new();
    let calls = std::iter::once((me, Some(at.call.as_str()))).chain(
        peers
            .iter()
            .filter_map(|(r, p)| p.as_ref().map(|p| (*r, p.call_at(k)))),
    );
    for (r, call) in calls {
        // A peer whose progress no longer shows #k (it finished it long ago) cannot be compared.
        let Some(call) = call else { continue };
        match sides.iter_mut().find(|c| c.call == call) {
            Some(side) => side.ranks.push(r),
            None => sides.push(Call {
                ranks: vec![r],
                call: call.to_owned(),
            }),
        }
    }
    if sides.len() < 2 {
        return None;
    }
    let CommError::Mismatch {
        culprits, calls, ..
    } = CommError::mismatch(comm, members.to_vec(), sides)
    else {
        return None;
    };
    let (reference, others) = calls.split_last()?;
    let others: Vec<String> = others
        .iter()
        .map(|c| format!("rank(s) {:?} called {}", c.ranks, c.call))
        .collect();
    Some(cause(
        culprits,
        Fault::Disagreed,
        format!(
            "op #{k} on {comm}: {} where rank(s) {:?} called {}",
            others.join(", "),
            reference.ranks,
            reference.call
        ),
    ))
}

/// Where a chain of waits between point-to-point operations ends.
enum Hold {
    /// The wait goes on to rank `next`, which is stuck at `at` (its oldest unfinished operation).
    Waits { next: usize, at: Mark },
    /// The next rank left no progress record.
    Dead(usize),
    /// The next rank is not stuck on this communicator: it never reached the counterpart.
    Behind(usize),
}

/// Who is to blame when this rank (`me`) is stuck at a point-to-point operation: the wait is followed from rank to
/// rank (a rank stuck at a send waits for its peer's receive, which waits behind whatever that peer is stuck at,
/// since NCCL runs a communicator's operations in issue order) until it reaches a rank that left no record
/// (dead), a rank that is not stuck (it never reached the counterpart), or a rank already on the chain: a cycle
/// of waits, reported alike by every rank on it.
fn waits(
    comm: &str,
    me: usize,
    mine: &Progress,
    peers: &[(usize, Option<Progress>)],
) -> Option<RootCause> {
    let progress_of = |r: usize| -> Option<Option<&Progress>> {
        if r == me {
            return Some(Some(mine));
        }
        peers.iter().find(|(p, _)| *p == r).map(|(_, p)| p.as_ref())
    };
    let first = mine.stuck_at()?;
    let cause = blame(comm, me);
    let mut chain: Vec<(usize, Mark)> = vec![(me, first)];
    // Each step adds a rank not on the chain yet, so the walk ends within one step per member.
    loop {
        let (rank, at) = chain.last()?.clone();
        // The chain so far, for a wait that ends off it.
        let route = || {
            let steps: Vec<String> = chain
                .iter()
                .map(|(r, m)| format!("rank {r} at {}", m.describe()))
                .collect();
            steps.join(", which waits for ")
        };
        let (next, theirs) = match hold_up(rank, &at, &progress_of)? {
            Hold::Waits { next, at } => (next, at),
            Hold::Dead(r) => {
                return Some(cause(
                    vec![r],
                    Fault::Died,
                    format!(
                        "on {comm}: {}, which waits for rank {r}, which left no progress record within the \
                         wait: dead, or stuck outside hypercomm",
                        route()
                    ),
                ));
            }
            Hold::Behind(r) => {
                let last = progress_of(r)
                    .flatten()
                    .and_then(|p| p.started.as_ref())
                    .map_or_else(
                        || "it started none".to_owned(),
                        |m| format!("it last started {}", m.describe()),
                    );
                return Some(cause(
                    vec![r],
                    Fault::Missing,
                    format!(
                        "on {comm}: {}, which waits for rank {r}, which never reached the counterpart ({last})",
                        route()
                    ),
                ));
            }
        };
        if let Some(start) = chain.iter().position(|(r, _)| *r == next) {
            let mut cycle: Vec<(usize, Mark)> = chain.split_off(start);
            // Every rank on the cycle starts its account at the lowest rank, so all of them say the same.
            let ranks = from_lowest(&mut cycle);
            let steps: Vec<String> = cycle
                .iter()
                .map(|(r, m)| format!("rank {r} at {}", m.describe()))
                .collect();
            let back = cycle[0].0;
            return Some(cause(
                ranks,
                Fault::Deadlocked,
                format!(
                    "a cycle of waits on {comm}: {}, which waits for rank {back}; none can go on (a rank's \
                     operations run in issue order: issue the sends and receives that must progress together as \
                     one batch or inside one OpGroup)",
                    steps.join(", which waits for ")
                ),
            ));
        }
        chain.push((next, theirs));
    }
}

/// Whom `rank`, stuck at the point-to-point operation `at`, waits for: the first peer of `at` that is not stuck
/// at its counterpart; `None` when every peer is, or when `at` is a collective (whose hold-up the ranks stuck in it
/// name by the operation's number).
fn hold_up<'a>(
    rank: usize,
    at: &Mark,
    progress_of: &impl Fn(usize) -> Option<Option<&'a Progress>>,
) -> Option<Hold> {
    for &q in at.to.iter().chain(&at.from) {
        match progress_of(q) {
            // Not a member we know of: nothing to say.
            None => continue,
            Some(None) => return Some(Hold::Dead(q)),
            Some(Some(p)) => match p.stuck_at() {
                None => return Some(Hold::Behind(q)),
                Some(q_at) if q_at.answers(q, at, rank) => continue,
                Some(q_at) => return Some(Hold::Waits { next: q, at: q_at }),
            },
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(seq: u64, call: &str) -> Mark {
        Mark {
            seq,
            call: call.into(),
            to: Vec::new(),
            from: Vec::new(),
        }
    }

    /// A point-to-point operation `#seq` sending to `to` and receiving from `from`.
    fn p2p(seq: u64, to: &[usize], from: &[usize]) -> Mark {
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
            state: super::super::flight::OpState::Enqueued,
            enqueued_us: 0,
            finished_us: None,
        };
        Mark::of(&e)
    }

    /// Stuck at `unfinished` (in issue order), after completing `#done` (none when 0).
    fn stuck(done: u64, unfinished: Vec<Mark>) -> Progress {
        Progress {
            started: unfinished.last().cloned(),
            completed: (done > 0).then(|| mark(done, AR)),
            unfinished,
        }
    }

    /// Every rank's analysis, from the progress of all of them (`None`: no record).
    fn everyone(comm: &str, all: &[Option<Progress>]) -> Vec<Option<RootCause>> {
        let members: Vec<usize> = (0..all.len()).collect();
        members
            .iter()
            .filter_map(|&me| {
                let mine = all[me].as_ref()?;
                let peers: Vec<(usize, Option<Progress>)> = members
                    .iter()
                    .filter(|&&r| r != me)
                    .map(|&r| (r, all[r].clone()))
                    .collect();
                Some(analyse(comm, &members, me, mine, &peers))
            })
            .collect()
    }

    #[test]
    fn a_ring_that_sends_before_it_receives_is_one_cycle_named_alike_by_every_rank() {
        // Four pipeline stages, each `send(next)` then `recv(prev)` as separate operations: each send waits for
        // the next stage's receive, queued behind that stage's own send.
        let all: Vec<Option<Progress>> = (0..4)
            .map(|r| {
                Some(stuck(
                    0,
                    vec![p2p(1, &[(r + 1) % 4], &[]), p2p(2, &[], &[(r + 3) % 4])],
                ))
            })
            .collect();
        let causes = everyone("pp/device", &all);
        let first = causes[0].clone().expect("a cause");
        assert_eq!(
            (first.ranks.as_slice(), first.fault),
            (&[0, 1, 2, 3][..], Fault::Deadlocked)
        );
        assert_eq!(
            first.detail,
            "a cycle of waits on pp/device: rank 0 at #1 send(dtype=f32, count=8, to=[1]), which waits for rank 1 \
             at #1 send(dtype=f32, count=8, to=[2]), which waits for rank 2 at #1 send(dtype=f32, count=8, \
             to=[3]), which waits for rank 3 at #1 send(dtype=f32, count=8, to=[0]), which waits for rank 0; none \
             can go on (a rank's operations run in issue order: issue the sends and receives that must progress \
             together as one batch or inside one OpGroup)"
        );
        for (me, c) in causes.iter().enumerate() {
            let c = c.as_ref().expect("every rank finds it");
            assert_eq!(
                (&c.ranks, &c.detail, c.seen_by),
                (&first.ranks, &first.detail, me)
            );
        }
        // Not lost: everyone is alive.
        assert!(!first.fault.loses_ranks());
    }

    #[test]
    fn a_chain_of_waits_ends_at_the_rank_that_is_dead_or_never_got_there() {
        // 0 sends to 1, which is stuck sending to 2, which left no record.
        let all = vec![
            Some(stuck(0, vec![p2p(1, &[1], &[])])),
            Some(stuck(0, vec![p2p(1, &[2], &[])])),
            None,
        ];
        let c = everyone("pp/device", &all)[0].clone().unwrap();
        assert_eq!((c.ranks.as_slice(), c.fault), (&[2][..], Fault::Died));
        assert!(
            c.detail.starts_with(
                "on pp/device: rank 0 at #1 send(dtype=f32, count=8, to=[1]), which waits for rank 1 at #1 \
                 send(dtype=f32, count=8, to=[2]), which waits for rank 2, which left no progress record"
            ),
            "{}",
            c.detail
        );
        // 0 receives from 1, which is stuck in nothing: it finished its last operation and never sent.
        let mut idle = stuck(3, Vec::new());
        idle.started = Some(mark(3, AR));
        let all = vec![Some(stuck(0, vec![p2p(1, &[], &[1])])), Some(idle)];
        let c = everyone("pp/device", &all)[0].clone().unwrap();
        assert_eq!((c.ranks.as_slice(), c.fault), (&[1][..], Fault::Missing));
        assert!(
            c.detail.ends_with(
                "which waits for rank 1, which never reached the counterpart (it last started #3 \
                 all_reduce(dtype=f32, count=8))"
            ),
            "{}",
            c.detail
        );
    }

    #[test]
    fn peers_stuck_at_each_others_counterparts_name_nobody() {
        // A batch exchange both sides reached (whatever holds it up, it is not a rank of this communicator), and
        // a send whose receive the peer has reached.
        let all = vec![
            Some(stuck(0, vec![p2p(4, &[1], &[1])])),
            Some(stuck(0, vec![p2p(7, &[0], &[0])])),
        ];
        assert_eq!(everyone("c", &all), [None, None]);
        let all = vec![
            Some(stuck(0, vec![p2p(1, &[1], &[])])),
            Some(stuck(0, vec![p2p(1, &[], &[0]), p2p(2, &[0], &[])])),
        ];
        assert_eq!(everyone("c", &all), [None, None]);
    }

    /// Started up to `started` with `call`, completed up to `done`, the rest unfinished.
    fn progress(started: u64, done: u64, call: &str) -> Progress {
        Progress {
            started: (started > 0).then(|| mark(started, call)),
            completed: (done > 0).then(|| mark(done, call)),
            unfinished: (done + 1..=started).map(|s| mark(s, call)).collect(),
        }
    }

    const AR: &str = "all_reduce(dtype=f32, count=8)";

    #[test]
    fn a_rank_that_never_reached_the_operation_is_named_with_where_it_stopped() {
        let members = [0, 1, 2, 3];
        let mine = progress(41, 40, AR);
        let peers = vec![
            (1, Some(progress(41, 40, AR))),
            (2, Some(progress(40, 40, AR))),
            (3, Some(progress(42, 40, AR))),
        ];
        let c = analyse("dp/device", &members, 0, &mine, &peers).unwrap();
        assert_eq!((c.ranks.as_slice(), c.fault), (&[2][..], Fault::Missing));
        assert_eq!(
            c.detail,
            "op #41 all_reduce(dtype=f32, count=8) on dp/device: rank(s) [2] never reached it (rank 2 last \
             started #40 all_reduce(dtype=f32, count=8))"
        );
        assert_eq!(c.seen_by, 0);
    }

    #[test]
    fn a_rank_without_a_record_is_named_dead() {
        let mine = progress(2, 1, AR);
        let peers = vec![(5, Some(progress(2, 1, AR))), (7, None)];
        let c = analyse("w/device", &[3, 5, 7], 3, &mine, &peers).unwrap();
        assert_eq!((c.ranks.as_slice(), c.fault), (&[7][..], Fault::Died));
        assert!(
            c.detail.contains("rank(s) [7] left no progress record"),
            "{}",
            c.detail
        );
        // Behind and dead together: both named, as missing.
        let peers = vec![(5, Some(progress(1, 1, AR))), (7, None)];
        let c = analyse("w/device", &[3, 5, 7], 3, &mine, &peers).unwrap();
        assert_eq!((c.ranks.as_slice(), c.fault), (&[5, 7][..], Fault::Missing));
    }

    #[test]
    fn different_calls_at_the_same_number_are_a_disagreement_naming_the_minority() {
        let rs = "reduce_scatter(dtype=f32, count=8)";
        let ag = "all_gather(dtype=f32, count=8)";
        let mine = progress(41, 40, rs);
        let peers = vec![
            (1, Some(progress(41, 40, rs))),
            (2, Some(progress(41, 40, rs))),
            (3, Some(progress(41, 40, ag))),
        ];
        let c = analyse("dp/device", &[0, 1, 2, 3], 0, &mine, &peers).unwrap();
        assert_eq!((c.ranks.as_slice(), c.fault), (&[3][..], Fault::Disagreed));
        assert_eq!(
            c.detail,
            "op #41 on dp/device: rank(s) [3] called all_gather(dtype=f32, count=8) where rank(s) [0, 1, 2] called \
             reduce_scatter(dtype=f32, count=8)"
        );
    }

    #[test]
    fn the_same_call_everywhere_names_nobody() {
        let mine = progress(3, 2, AR);
        let peers = vec![(1, Some(progress(3, 2, AR))), (2, Some(progress(4, 2, AR)))];
        assert_eq!(analyse("c", &[0, 1, 2], 0, &mine, &peers), None);
        // Nothing started: nothing to compare.
        assert_eq!(
            analyse("c", &[0, 1], 0, &Progress::default(), &[(1, None)]),
            None
        );
    }

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
