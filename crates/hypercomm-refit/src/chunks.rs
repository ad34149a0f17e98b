//! What the destination needs from the source, in chunks: for each destination shard and each source shard it
//! overlaps, the shared bytes cut into [`Chunk`]s of at most one bucket, and which destination rank receives
//! each chunk from a source ([`deliveries`]).
//!
//! The ranks holding one destination shard are a *class* (its replicas); the ranks holding one source shard are
//! a *group* (the replicas that may serve it). Both are interned as sets of ranks, so that every parameter living
//! on the same ranks shares one class or one group: balancing is over whole sets of ranks, not per parameter.

use std::collections::BTreeMap;
use std::rc::Rc;

use crate::Runs;
use crate::runs::slice_all;

/// At most one bucket of the bytes one destination class needs from one source group, of one parameter.
#[derive(Debug, Clone)]
pub(crate) struct Chunk {
    /// The parameter (index in the destination sharding).
    pub(crate) param: usize,
    /// The destination class (index into [`RankSets`] of classes).
    pub(crate) class: usize,
    /// The source group (index into [`RankSets`] of groups).
    pub(crate) group: usize,
    /// The bytes, in the source shard's and the destination shard's layouts.
    pub(crate) runs: Vec<Runs>,
    /// Their total.
    pub(crate) bytes: u64,
    /// The element size: every cut of this chunk falls on a multiple of it.
    pub(crate) elem: u64,
}

/// Sets of ranks, each stored once and named by its index.
#[derive(Debug, Default)]
pub(crate) struct RankSets {
    sets: Vec<Rc<Vec<usize>>>,
    by_content: BTreeMap<Rc<Vec<usize>>, usize>,
    /// Holder lists shared by a placer are recognised by address first, so that a set of thousands of ranks is
    /// compared by content once, not once per parameter.
    by_address: BTreeMap<(usize, usize), usize>,
}

impl RankSets {
    /// The index of `holders[t]`, adding it when new.
    pub(crate) fn intern(&mut self, holders: &Rc<Vec<Vec<usize>>>, t: usize) -> usize {
        let address = (Rc::as_ptr(holders) as usize, t);
        if let Some(&id) = self.by_address.get(&address) {
            return id;
        }
        let set = Rc::new(holders[t].clone());
        let id = match self.by_content.get(&set) {
            Some(&id) => id,
            None => {
                self.sets.push(Rc::clone(&set));
                self.by_content.insert(set, self.sets.len() - 1);
                self.sets.len() - 1
            }
        };
        self.by_address.insert(address, id);
        id
    }

    /// The set named `id`.
    pub(crate) fn get(&self, id: usize) -> &[usize] {
        &self.sets[id]
    }

    /// Every set, in the order they were first interned.
    pub(crate) fn all(&self) -> impl Iterator<Item = &[usize]> {
        self.sets.iter().map(|s| s.as_slice())
    }

    /// The number of sets.
    pub(crate) fn len(&self) -> usize {
        self.sets.len()
    }
}

/// Cuts `runs` (all `bytes` of them) into chunks of at most `limit` bytes, rounded down to whole elements, and
/// appends them to `out`.
pub(crate) fn push_chunks(
    out: &mut Vec<Chunk>,
    param: usize,
    class: usize,
    group: usize,
    runs: &[Runs],
    elem: u64,
    limit: u64,
) {
    let total: u64 = runs.iter().map(Runs::bytes).sum();
    let step = limit - limit % elem;
    let mut start = 0;
    while start < total {
        let end = total.min(start + step);
        out.push(Chunk {
            param,
            class,
            group,
            runs: if start == 0 && end == total {
                runs.to_vec()
            } else {
                slice_all(runs, start, end)
            },
            bytes: end - start,
            elem,
        });
        start = end;
    }
}

/// A chunk that a destination rank receives from the sources.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Delivery {
    /// The chunk (index).
    pub(crate) chunk: usize,
    /// The receiving destination rank.
    pub(crate) receiver: usize,
}

/// Who receives each chunk from the sources. With `forward`, one member of its class: the one that has been given
/// the fewest bytes of that class so far (the lowest rank on a tie), so the class's members share the sources'
/// bytes within a chunk of each other and then forward to one another. Without, every member.
pub(crate) fn deliveries(chunks: &[Chunk], classes: &RankSets, forward: bool) -> Vec<Delivery> {
    let mut out = Vec::with_capacity(chunks.len());
    let mut given: Vec<Vec<u64>> = classes.all().map(|c| vec![0; c.len()]).collect();
    for (index, chunk) in chunks.iter().enumerate() {
        let members = classes.get(chunk.class);
        if forward {
            let load = &mut given[chunk.class];
            // Classes are never empty: a placement has at least one holder per shard.
            let least = (0..load.len()).min_by_key(|&j| (load[j], j)).unwrap_or(0);
            load[least] += chunk.bytes;
            out.push(Delivery {
                chunk: index,
                receiver: members[least],
            });
        } else {
            out.extend(members.iter().map(|&receiver| Delivery {
                chunk: index,
                receiver,
            }));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_runs_in_whole_elements() {
        let runs = vec![Runs::contiguous(0, 0, 40), Runs::contiguous(100, 40, 24)];
        let mut out = Vec::new();
        push_chunks(&mut out, 0, 0, 0, &runs, 4, 30);
        let sizes: Vec<u64> = out.iter().map(|c| c.bytes).collect();
        assert_eq!(sizes, [28, 28, 8]);
        assert_eq!(
            out[1].runs,
            [Runs::contiguous(28, 28, 12), Runs::contiguous(100, 40, 16)]
        );
    }

    #[test]
    fn rank_sets_are_shared_by_content_and_address() {
        let a = Rc::new(vec![vec![0, 2], vec![1, 3]]);
        let b = Rc::new(vec![vec![1, 3]]);
        let mut sets = RankSets::default();
        assert_eq!(sets.intern(&a, 0), 0);
        assert_eq!(sets.intern(&a, 1), 1);
        assert_eq!(sets.intern(&b, 0), 1);
        assert_eq!(sets.intern(&a, 1), 1);
        assert_eq!(sets.len(), 2);
        assert_eq!(sets.get(1), [1, 3]);
    }

    #[test]
    fn forwarding_spreads_chunks_over_the_class_and_otherwise_sends_to_all() {
        let mut sets = RankSets::default();
        let class = sets.intern(&Rc::new(vec![vec![4, 5, 6]]), 0);
        let chunk = |bytes| Chunk {
            param: 0,
            class,
            group: 0,
            runs: vec![Runs::contiguous(0, 0, bytes)],
            bytes,
            elem: 1,
        };
        let chunks = [chunk(10), chunk(4), chunk(4), chunk(4), chunk(10)];
        let receivers: Vec<usize> = deliveries(&chunks, &sets, true)
            .iter()
            .map(|d| d.receiver)
            .collect();
        assert_eq!(receivers, [4, 5, 6, 5, 6]);
        assert_eq!(deliveries(&chunks, &sets, false).len(), 15);
    }
}
