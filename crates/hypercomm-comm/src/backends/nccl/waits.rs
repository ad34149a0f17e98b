//! Following the waits between point-to-point operations of a timed-out NCCL communicator, from rank to rank, to
//! the rank at the end of the chain or around a cycle: [`waits`], which `behind` asks when a rank is stuck at a
//! send, a receive or a batch.
//!
//! A point-to-point operation is not joined by every rank, so its number says little; the ranks follow its peers
//! instead. A rank stuck at a send waits for its peer's receive; when the peer is stuck at something else, the
//! receive is queued behind it (NCCL runs a communicator's operations in issue order), so the wait goes on to
//! whatever that peer waits for, rank by rank, until it reaches
//! - a rank that left no record: named as dead, with the chain of waits that led to it;
//! - a rank not stuck on the communicator: it never reached the counterpart ("rank 3, which never reached the
//!   counterpart (it last started #9 all_reduce(...))");
//! - a rank already on the chain: a cycle of waits, named by its ranks and each one's operation, told from the
//!   lowest rank so that every rank on it says the same ("a cycle of waits on pp/device: rank 0 at #1
//!   send(dtype=f32, count=8, to=[1]), which waits for rank 1 at #1 send(..., to=[2]), ..., which waits for
//!   rank 0"): four pipeline stages that each send before they receive, as separate operations.

use super::progress::{Mark, Progress, blame};
use crate::error::{Fault, RootCause};
use crate::failure::from_lowest;

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
pub(crate) fn waits(
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
    use super::super::progress::testing::{AR, mark, p2p, stuck};
    use super::*;

    /// Every stuck rank's finding, from the progress of all of them (`None`: no record).
    fn everyone(comm: &str, all: &[Option<Progress>]) -> Vec<Option<RootCause>> {
        (0..all.len())
            .filter_map(|me| {
                let mine = all[me].as_ref()?;
                let peers: Vec<(usize, Option<Progress>)> = (0..all.len())
                    .filter(|&r| r != me)
                    .map(|r| (r, all[r].clone()))
                    .collect();
                Some(waits(comm, me, mine, &peers))
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
}
