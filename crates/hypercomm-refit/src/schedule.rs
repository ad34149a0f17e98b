//! Buckets: the order in which an executor runs a plan's transfers, and the forwarding trees between destination
//! replicas.
//!
//! An executor runs bucket 0 as one batch of sends and receives, waits for it, then bucket 1, and so on. Within a
//! bucket every rank sends at most `bucket_bytes` and receives at most `bucket_bytes` (what it stages when runs
//! are strided), and a forward only reads bytes its sender received in an earlier bucket.
//!
//! The sources' sends are placed first, taking each sender's sends in turn (its first, then every other sender's
//! first, ...) so that all sources start at once; each goes to the earliest bucket, not before its sender's last,
//! where both its sender and its receiver have room. Then, with forwarding, each chunk travels from the member of
//! its class that received it down a binomial tree over the class, rooted there: member `v` places after the root
//! (in the class's order, rotated to start at the root) receives from member `v` without its highest bit, one
//! bucket or more after that member received it; a class of `k` replicas is `⌈log2 k⌉` hops deep, and each
//! member receives each byte of its shard exactly once.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use crate::balance::Send;
use crate::chunks::{Chunk, RankSets};
use crate::{Peer, Runs, Transfer};

/// Bytes per rank per bucket, sent and received.
struct Buckets {
    limit: u64,
    sent: BTreeMap<Peer, Vec<u64>>,
    received: BTreeMap<usize, Vec<u64>>,
    /// The bucket of each sender's last send: a sender's sends stay in order.
    last: BTreeMap<Peer, usize>,
    count: usize,
}

impl Buckets {
    fn new(limit: u64) -> Buckets {
        Buckets {
            limit,
            sent: BTreeMap::new(),
            received: BTreeMap::new(),
            last: BTreeMap::new(),
            count: 0,
        }
    }

    /// Places `bytes` (at most the limit) from `from` to `to` in the earliest bucket from `earliest` on, and not
    /// before `from`'s last, where both have room; returns it.
    fn place(&mut self, from: Peer, to: usize, bytes: u64, earliest: usize) -> usize {
        let sent = self.sent.entry(from).or_default();
        let received = self.received.entry(to).or_default();
        let mut bucket = earliest.max(self.last.get(&from).copied().unwrap_or(0));
        let load = |loads: &Vec<u64>, b: usize| loads.get(b).copied().unwrap_or(0);
        // An empty bucket always has room (bytes <= limit), so the search ends.
        while load(sent, bucket) + bytes > self.limit || load(received, bucket) + bytes > self.limit
        {
            bucket += 1;
        }
        for loads in [&mut *sent, &mut *received] {
            if loads.len() <= bucket {
                loads.resize(bucket + 1, 0);
            }
            loads[bucket] += bytes;
        }
        self.last.insert(from, bucket);
        self.count = self.count.max(bucket + 1);
        bucket
    }
}

/// Appends one transfer per runs of `runs`.
fn push(
    transfers: &mut Vec<Transfer>,
    bucket: usize,
    param: usize,
    from: Peer,
    to: usize,
    runs: &[Runs],
) {
    transfers.extend(runs.iter().map(|runs| Transfer {
        bucket,
        param,
        from,
        to,
        runs: runs.clone(),
    }));
}

/// Every transfer of the plan, in bucket order, and the number of buckets.
pub(crate) fn schedule(
    chunks: &[Chunk],
    classes: &RankSets,
    sends: Vec<Send>,
    forward: bool,
    limit: u64,
) -> (Vec<Transfer>, usize) {
    let mut buckets = Buckets::new(limit);
    let mut transfers = Vec::new();

    // The sources' sends, each sender's in turn.
    let mut by_sender: BTreeMap<Peer, Vec<usize>> = BTreeMap::new();
    for (index, send) in sends.iter().enumerate() {
        by_sender.entry(send.from).or_default().push(index);
    }
    let rounds = by_sender.values().map(Vec::len).max().unwrap_or(0);
    // Per chunk, with forwarding: the member that received it from the sources, and the last bucket it arrived in.
    let mut arrival: Vec<Option<(usize, usize)>> = vec![None; chunks.len()];
    for round in 0..rounds {
        for indices in by_sender.values() {
            let Some(&index) = indices.get(round) else {
                continue;
            };
            let send = &sends[index];
            let bucket = buckets.place(send.from, send.to, send.bytes, 0);
            let param = chunks[send.chunk].param;
            push(
                &mut transfers,
                bucket,
                param,
                send.from,
                send.to,
                &send.runs,
            );
            let arrived = &mut arrival[send.chunk];
            let latest = arrived.map_or(bucket, |(_, b)| b.max(bucket));
            *arrived = Some((send.to, latest));
        }
    }

    if forward {
        forward_down_trees(chunks, classes, &arrival, &mut buckets, &mut transfers);
    }

    transfers.sort_by_key(|t| (t.bucket, t.from, t.to));
    (transfers, buckets.count)
}

/// Places every forward: each chunk down a binomial tree over its class, rooted at the member that received it.
///
/// Edges are placed in the order they become possible, across all chunks: an edge is ready one bucket after its
/// sender received the chunk, and of the edges ready first, those of earlier chunks first and, within a chunk,
/// those to the lowest position first. A node's subtree is every position it reaches by adding powers of two above
/// its own highest bit, so the root's child 1 heads half the tree, child 2 a quarter, and so on: the lowest
/// position first is the largest subtree first, and the far half starts forwarding soonest.
fn forward_down_trees(
    chunks: &[Chunk],
    classes: &RankSets,
    arrival: &[Option<(usize, usize)>],
    buckets: &mut Buckets,
    transfers: &mut Vec<Transfer>,
) {
    /// Members of the tree, by position from the root: `(chunk, position of the root in the class, class size)`.
    struct Tree {
        start: usize,
        forwarded: Vec<Runs>,
    }
    let mut trees: Vec<Option<Tree>> = Vec::with_capacity(chunks.len());
    // Ready edges, soonest first: (earliest bucket, chunk, position of the receiver in the tree).
    let mut ready = BinaryHeap::new();
    let children = |v: usize, k: usize| {
        // Node v's children are v + 2^j for every 2^j above v (every power of two for the root), within k.
        let first = if v == 0 { 0 } else { v.ilog2() + 1 };
        (first..usize::BITS).map_while(move |j| v.checked_add(1 << j).filter(|&c| c < k))
    };
    for (index, chunk) in chunks.iter().enumerate() {
        let members = classes.get(chunk.class);
        let tree = arrival[index].and_then(|(root, bucket)| {
            let start = members.iter().position(|&m| m == root)?;
            for child in children(0, members.len()) {
                ready.push(Reverse((bucket + 1, index, child)));
            }
            Some(Tree {
                start,
                forwarded: chunk.runs.iter().map(Runs::forwarded).collect(),
            })
        });
        trees.push(tree);
    }
    while let Some(Reverse((earliest, index, v))) = ready.pop() {
        let (chunk, members) = (&chunks[index], classes.get(chunks[index].class));
        let Some(tree) = &trees[index] else {
            continue;
        };
        let k = members.len();
        let member = |v: usize| members[(tree.start + v) % k];
        let from = Peer::Destination(member(v - (1 << v.ilog2())));
        let bucket = buckets.place(from, member(v), chunk.bytes, earliest);
        push(
            transfers,
            bucket,
            chunk.param,
            from,
            member(v),
            &tree.forwarded,
        );
        for child in children(v, k) {
            ready.push(Reverse((bucket + 1, index, child)));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::rc::Rc;

    use super::*;

    #[test]
    fn buckets_hold_a_limit_per_sender_and_receiver() {
        let mut b = Buckets::new(10);
        assert_eq!(b.place(Peer::Source(0), 5, 6, 0), 0);
        // Receiver 5 has 4 bytes of room left in bucket 0.
        assert_eq!(b.place(Peer::Source(1), 5, 6, 0), 1);
        assert_eq!(
            b.place(Peer::Source(1), 6, 4, 0),
            1,
            "a sender's sends stay in order"
        );
        assert_eq!(b.place(Peer::Source(2), 5, 4, 0), 0);
        assert_eq!(b.place(Peer::Destination(5), 6, 10, 1), 2);
        assert_eq!(b.count, 3);
    }

    #[test]
    fn forwards_follow_a_binomial_tree_from_the_root() {
        let mut classes = RankSets::default();
        let class = classes.intern(&Rc::new(vec![vec![10, 11, 12, 13, 14]]), 0);
        let chunk = Chunk {
            param: 0,
            class,
            group: 0,
            runs: vec![Runs::contiguous(4, 8, 8)],
            bytes: 8,
            elem: 1,
        };
        let send = Send {
            chunk: 0,
            from: Peer::Source(0),
            to: 12,
            runs: chunk.runs.clone(),
            bytes: 8,
        };
        let (transfers, count) = schedule(&[chunk], &classes, vec![send], true, 8);
        let edges: Vec<(usize, Peer, usize)> =
            transfers.iter().map(|t| (t.bucket, t.from, t.to)).collect();
        // Rotated order 12, 13, 14, 10, 11: 12 -> 13, then 12 -> 14 and 13 -> 10, then 12 -> 11.
        assert_eq!(
            edges,
            [
                (0, Peer::Source(0), 12),
                (1, Peer::Destination(12), 13),
                (2, Peer::Destination(12), 14),
                (2, Peer::Destination(13), 10),
                (3, Peer::Destination(12), 11),
            ]
        );
        assert_eq!(count, 4);
        assert_eq!(
            transfers[1].runs,
            Runs::contiguous(8, 8, 8),
            "forwards read where the bytes landed"
        );
    }
}
