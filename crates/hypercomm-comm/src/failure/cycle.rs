//! A cycle of waits between live ranks, found from their provisional failure records.
//!
//! A rank that times out waiting for one peer records at once that it is alive and stuck waiting for that peer
//! (a provisional record). When every rank of a ring waits for the next (each blocked in a receive before it
//! sends, say), each one's timeout names another rank, and none of them alone is at fault. Following the records
//! from rank to rank (A waits for B, whose record says it waits for C, ...) until a rank already on the chain
//! finds the cycle, which is reported as one root cause naming every rank on it, told from the lowest rank so that
//! all of them say the same.
//!
//! Two ranks waiting for each other are left out: that is also what a broken link between two live ranks looks
//! like, which the failure domain reports as such. A chain that ends anywhere else (a rank without a record, one
//! that waits for several, one that already settled something other than a cycle) is not a cycle either, and
//! the usual resolution stands.

use crate::error::{Fault, RootCause};

/// What a peer's failure record says, as far as a cycle goes.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Seen {
    /// It is alive and stuck, as its provisional record says.
    Waiting(RootCause),
    /// It settled this root cause.
    Settled(RootCause),
    /// It gave up without a cause of its own.
    NoCause,
}

/// The cycle of waits that rank `me`, stuck waiting for the one rank `mine` names, is on, if the peers' records
/// (`read`, `None` for no record) show one; at most `limit` records are read.
pub(crate) fn find(
    me: usize,
    mine: &RootCause,
    mut read: impl FnMut(usize) -> Option<Seen>,
    limit: usize,
) -> Option<RootCause> {
    let [mut next] = mine.ranks[..] else {
        return None;
    };
    let mut chain: Vec<(usize, RootCause)> = vec![(me, mine.clone())];
    for _ in 0..limit {
        if let Some(start) = chain.iter().position(|(r, _)| *r == next) {
            let cycle = chain.split_off(start);
            return (cycle.len() >= 3).then(|| told(me, cycle));
        }
        match read(next)? {
            Seen::Waiting(c) if c.fault == Fault::Missing && c.ranks.len() == 1 => {
                let after = c.ranks[0];
                chain.push((next, c));
                next = after;
            }
            // A rank on the cycle that settled it already: the same account.
            Seen::Settled(c) if c.fault == Fault::Deadlocked && c.ranks.contains(&me) => {
                return Some(RootCause { seen_by: me, ..c });
            }
            _ => return None,
        }
    }
    None
}

/// Turns `cycle` (ranks, each with where it stands, each waiting for the next and the last for the first) to start
/// at its lowest rank, so that every rank on it tells it alike; returns its ranks, ascending.
pub(crate) fn from_lowest<T>(cycle: &mut [(usize, T)]) -> Vec<usize> {
    let lowest = cycle
        .iter()
        .enumerate()
        .min_by_key(|(_, (r, _))| *r)
        .map_or(0, |(i, _)| i);
    cycle.rotate_left(lowest);
    let mut ranks: Vec<usize> = cycle.iter().map(|(r, _)| *r).collect();
    ranks.sort_unstable();
    ranks
}

/// The root cause of the cycle `cycle` (each rank with its provisional record, each waiting for the next and the
/// last for the first), as rank `me` reports it.
fn told(me: usize, mut cycle: Vec<(usize, RootCause)>) -> RootCause {
    let ranks = from_lowest(&mut cycle);
    let steps: Vec<String> = cycle
        .iter()
        .map(|(r, c)| format!("rank {r} (in {}) waits for rank {}", c.detail, c.ranks[0]))
        .collect();
    let comm = cycle[0].1.comm.clone();
    RootCause {
        ranks,
        fault: Fault::Deadlocked,
        detail: format!(
            "a cycle of waits on {comm}: {}; none can go on (a rank that waits for a message before it sends \
             its own blocks the rank that waits for it: issue the sends and receives that must progress \
             together before waiting, or as one batch)",
            steps.join(", ")
        ),
        comm,
        seen_by: me,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rank `r`'s provisional record: stuck in `recv from <waits_for>`, waiting for it.
    fn waiting(r: usize, waits_for: usize) -> RootCause {
        RootCause {
            ranks: vec![waits_for],
            fault: Fault::Missing,
            comm: "pp".into(),
            seen_by: r,
            detail: format!("recv from {waits_for}"),
        }
    }

    #[test]
    fn a_ring_of_receives_is_one_cycle_told_alike_by_every_rank() {
        // Four ranks, each waiting for the previous one.
        let prev = |r: usize| (r + 3) % 4;
        let found: Vec<RootCause> = (0..4)
            .map(|me| {
                find(
                    me,
                    &waiting(me, prev(me)),
                    |r| Some(Seen::Waiting(waiting(r, prev(r)))),
                    8,
                )
                .expect("a cycle")
            })
            .collect();
        assert_eq!(
            (found[0].ranks.as_slice(), found[0].fault),
            (&[0, 1, 2, 3][..], Fault::Deadlocked)
        );
        assert!(
            found[0].detail.starts_with(
                "a cycle of waits on pp: rank 0 (in recv from 3) waits for rank 3, rank 3 (in recv from 2) waits \
                 for rank 2, rank 2 (in recv from 1) waits for rank 1, rank 1 (in recv from 0) waits for rank 0;"
            ),
            "{}",
            found[0].detail
        );
        for (me, c) in found.iter().enumerate() {
            assert_eq!((&c.detail, c.seen_by), (&found[0].detail, me));
        }
    }

    #[test]
    fn a_rank_that_settled_the_cycle_already_is_followed() {
        let settled = RootCause {
            seen_by: 2,
            ..find(
                2,
                &waiting(2, 1),
                |r| Some(Seen::Waiting(waiting(r, (r + 2) % 3))),
                8,
            )
            .unwrap()
        };
        let c = find(
            0,
            &waiting(0, 2),
            |_| Some(Seen::Settled(settled.clone())),
            8,
        )
        .unwrap();
        assert_eq!((c.ranks.clone(), c.seen_by), (vec![0, 1, 2], 0));
        assert_eq!(c.detail, settled.detail);
    }

    #[test]
    fn chains_that_are_no_cycle_of_three_or_more_are_left_alone() {
        // Two ranks waiting for each other: a broken link looks the same.
        assert_eq!(
            find(0, &waiting(0, 1), |_| Some(Seen::Waiting(waiting(1, 0))), 8),
            None
        );
        // A chain that ends at a rank without a record (dead), or at a settled cause that is no cycle.
        assert_eq!(
            find(
                0,
                &waiting(0, 1),
                |r| (r == 1).then(|| Seen::Waiting(waiting(1, 2))),
                8
            ),
            None
        );
        let died = RootCause {
            fault: Fault::Died,
            ..waiting(1, 2)
        };
        assert_eq!(
            find(0, &waiting(0, 1), |_| Some(Seen::Settled(died.clone())), 8),
            None
        );
        // Waiting for several ranks at once (a collective) is not a chain; nor is one longer than the limit.
        let several = RootCause {
            ranks: vec![1, 2],
            ..waiting(0, 1)
        };
        assert_eq!(find(0, &several, |_| None, 8), None);
        assert_eq!(
            find(
                0,
                &waiting(0, 5),
                |r| Some(Seen::Waiting(waiting(r, (r + 5) % 6))),
                3
            ),
            None
        );
    }
}
