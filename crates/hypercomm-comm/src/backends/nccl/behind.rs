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
//! little: for a rank stuck at one, the ranks follow its peers instead (`waits`), to the rank at the end of the
//! chain of waits, or around a cycle of them.
//!
//! The finding is the timeout's root cause, recorded through the failure domain like any other, so ranks that
//! learn of the failure later (through the host halves of the collection) report it too. Ranks are member ids:
//! world ranks in a collection.

use std::time::{Duration, Instant};

use super::flight::FlightRecord;
use super::progress::{Progress, blame};
use super::waits::waits;
use crate::CommError;
use crate::error::{Call, Fault, RootCause};
use crate::failure::{FailureDomain, stuck_wait};

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

#[cfg(test)]
mod tests {
    use super::super::progress::testing::{AR, p2p, progress, stuck};
    use super::*;

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
    fn a_rank_stuck_at_a_point_to_point_operation_follows_the_waits() {
        // Three ranks, each sending to the next before it receives: the chain of waits, not the numbers.
        let all: Vec<Progress> = (0..3)
            .map(|r| {
                stuck(
                    0,
                    vec![p2p(1, &[(r + 1) % 3], &[]), p2p(2, &[], &[(r + 2) % 3])],
                )
            })
            .collect();
        let peers: Vec<(usize, Option<Progress>)> =
            (1..3).map(|r| (r, Some(all[r].clone()))).collect();
        let c = analyse("pp/device", &[0, 1, 2], 0, &all[0], &peers).expect("a cycle");
        assert_eq!(
            (c.ranks.as_slice(), c.fault),
            (&[0, 1, 2][..], Fault::Deadlocked)
        );
    }
}
