//! Which source rank sends which bytes: each group of source replicas splits the bytes it serves evenly.
//!
//! The deliveries a group serves are laid end to end, ordered by receiver and then by chunk (so each source rank
//! talks to few receivers), `T` bytes in all, and cut at `⌊i·T/h⌋` for its `h` holders, each cut moved back to the
//! start of the element it falls in: holder `i` sends bytes `cut(i)..cut(i+1)`. Rounding the cuts down to whole
//! bytes and then to whole elements moves each by less than a byte plus an element, so a holder's share of the
//! group differs from `T/h` by less than two elements, and a source rank sends its *balanced share* (the sum over
//! the groups it belongs to of `T/h`) give or take less than two elements per group. Every source rank belongs to a
//! few groups (one per set of stages and expert owner its parameters share), so that is far below one bucket.

use crate::chunks::{Chunk, Delivery, RankSets};
use crate::runs::slice_all;
use crate::{Peer, Runs};

/// Bytes one source rank sends to one destination rank: a piece of one delivery.
#[derive(Debug, Clone)]
pub(crate) struct Send {
    /// The chunk the bytes belong to.
    pub(crate) chunk: usize,
    /// The sender.
    pub(crate) from: Peer,
    /// The receiving destination rank.
    pub(crate) to: usize,
    /// The bytes.
    pub(crate) runs: Vec<Runs>,
    /// Their total.
    pub(crate) bytes: u64,
}

/// The sends serving every delivery, and the bytes each group serves (indexed like `groups`).
pub(crate) fn assign_sources(
    chunks: &[Chunk],
    deliveries: &[Delivery],
    groups: &RankSets,
) -> (Vec<Send>, Vec<u64>) {
    let mut by_group: Vec<Vec<Delivery>> = vec![Vec::new(); groups.len()];
    for &d in deliveries {
        by_group[chunks[d.chunk].group].push(d);
    }
    let mut sends = Vec::new();
    let mut totals = Vec::with_capacity(groups.len());
    for (group, mut line) in by_group.into_iter().enumerate() {
        // Stable: chunks stay in order for each receiver.
        line.sort_by_key(|d| d.receiver);
        let holders = groups.get(group);
        let total: u64 = line.iter().map(|d| chunks[d.chunk].bytes).sum();
        totals.push(total);
        let h = holders.len() as u128;
        let cut = |i: usize| (i as u128 * total as u128 / h) as u64;
        let mut pos = 0u64;
        let mut first = 0usize;
        for d in line {
            let chunk = &chunks[d.chunk];
            let (start, end) = (pos, pos + chunk.bytes);
            pos = end;
            while first + 1 < holders.len() && cut(first + 1) <= start {
                first += 1;
            }
            let snap = |at: u64| {
                let local = at.clamp(start, end) - start;
                local - local % chunk.elem
            };
            let mut i = first;
            loop {
                let (lo, hi) = (snap(cut(i)), snap(cut(i + 1)));
                if hi > lo {
                    sends.push(Send {
                        chunk: d.chunk,
                        from: Peer::Source(holders[i]),
                        to: d.receiver,
                        runs: slice_all(&chunk.runs, lo, hi),
                        bytes: hi - lo,
                    });
                }
                if i + 1 == holders.len() || cut(i + 1) >= end {
                    break;
                }
                i += 1;
            }
        }
    }
    (sends, totals)
}

#[cfg(test)]
mod tests {
    use std::rc::Rc;

    use super::*;

    fn chunk(group: usize, bytes: u64, elem: u64) -> Chunk {
        Chunk {
            param: 0,
            class: 0,
            group,
            runs: vec![Runs::contiguous(0, 0, bytes)],
            bytes,
            elem,
        }
    }

    #[test]
    fn holders_split_the_group_evenly_in_whole_elements() {
        let mut groups = RankSets::default();
        groups.intern(&Rc::new(vec![vec![0, 1, 2]]), 0);
        let chunks = [chunk(0, 40, 4), chunk(0, 20, 2)];
        let deliveries = [
            Delivery {
                chunk: 0,
                receiver: 9,
            },
            Delivery {
                chunk: 1,
                receiver: 8,
            },
        ];
        let (sends, totals) = assign_sources(&chunks, &deliveries, &groups);
        assert_eq!(totals, [60]);
        // Receiver 8 first: 20 bytes, then receiver 9: 40 bytes; cuts at 20 and 40.
        let got: Vec<(usize, usize, u64)> = sends
            .iter()
            .map(|s| (s.from.rank(), s.to, s.bytes))
            .collect();
        assert_eq!(got, [(0, 8, 20), (1, 9, 20), (2, 9, 20)]);
        assert_eq!(sends[2].runs, [Runs::contiguous(20, 20, 20)]);
    }

    #[test]
    fn cuts_move_back_to_element_starts_and_tiny_groups_leave_holders_idle() {
        let mut groups = RankSets::default();
        groups.intern(&Rc::new(vec![vec![0, 1, 2, 3, 4]]), 0);
        // 16 bytes of f64 over 5 holders: cuts at 3, 6, 9, 12 snap to 0, 0, 8, 8; holders 2 and 4 send.
        let (sends, _) = assign_sources(
            &[chunk(0, 16, 8)],
            &[Delivery {
                chunk: 0,
                receiver: 7,
            }],
            &groups,
        );
        let got: Vec<(usize, u64)> = sends.iter().map(|s| (s.from.rank(), s.bytes)).collect();
        assert_eq!(got, [(2, 8), (4, 8)]);
    }
}
