//! Splitting a [`Communicator`]: [`Communicator::split`], [`Communicator::split_many`] and [`Splits`], the
//! children taken one by one. The host flavor's children meet through the parent's store; the NCCL flavor's come
//! from `ncclCommSplit` of the parent's, with the same colors and keys.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{Communicator, DeviceSource};
use crate::CommError;
use crate::options::CommOptions;

impl Communicator {
    /// Splits the communicator, with NCCL's semantics: ranks passing the same `color` form a new communicator,
    /// ordered by `key` and then by rank here; `None` (NCCL's `NCCL_SPLIT_NOCOLOR`) joins nothing and returns
    /// `None`. Collective: every rank must call it, in the same order relative to other splits. The child's name
    /// is `<parent>/split<n>/color<c>`, where `n` counts this communicator's splits, so repeated splits never
    /// collide. The child inherits the parent's options. With a GPU, the NCCL flavor is split too
    /// (`ncclCommSplit`, same color and key), so the child has a GPU as well.
    pub fn split(&self, color: Option<u32>, key: i64) -> Result<Option<Communicator>, CommError> {
        self.split_with(color, key, self.options.clone())
    }

    /// [`split`](Self::split) with other options for the child (like `ncclCommSplit`'s config argument).
    /// `options.name` is replaced by the derived child name.
    pub fn split_with(
        &self,
        color: Option<u32>,
        key: i64,
        options: CommOptions,
    ) -> Result<Option<Communicator>, CommError> {
        let mut children = self.split_many(vec![(color, key, options)])?;
        // One split asked for, one child to take; `None` only if the iterator were already spent.
        children.next().unwrap_or(Ok(None))
    }

    /// Many splits at once: `splits[i]` is the `(color, key, options)` of the `i`-th split, with the same
    /// semantics, names and order as that many calls of [`split_with`](Self::split_with), but one all-gather of
    /// every rank's colors and keys instead of one per split. Collective: every rank must pass the same number of
    /// splits. The children are created as the returned iterator is advanced, in order, so that the caller can
    /// interleave its own steps between them; every rank must take every child, as it would call every split.
    pub fn split_many(
        &self,
        splits: Vec<(Option<u32>, i64, CommOptions)>,
    ) -> Result<Splits<'_>, CommError> {
        // NCCL's colors are C ints: refused here, on the rank that passed it, before any rank starts a split.
        if self.nccl.is_some()
            && let Some(color) = splits
                .iter()
                .filter_map(|(color, _, _)| *color)
                .find(|&c| i32::try_from(c).is_err())
        {
            return Err(self.invalid(format!(
                "split color {color} does not fit nccl's int colors (at most {})",
                i32::MAX
            )));
        }
        let count = splits.len();
        let first = self.splits.fetch_add(count as u64, Ordering::Relaxed);
        let mine: Vec<u64> = splits
            .iter()
            .flat_map(|(color, key, _)| [color.map_or(u64::MAX, u64::from), *key as u64])
            .collect();
        let (_, all) = if count == 0 {
            (Vec::new(), Vec::new())
        } else {
            let n = self.size();
            self.all_gather_into(mine, vec![0u64; 2 * count * n])?
                .wait()?
        };
        Ok(Splits {
            parent: self,
            all,
            count,
            first,
            pending: splits.into_iter(),
        })
    }
}

/// The children of [`Communicator::split_many`], each created (collectively, with its members) when taken.
pub struct Splits<'a> {
    parent: &'a Communicator,
    /// Every rank's `(color, key)` per split: rank `r`'s for split `i` at `2 * (r * count + i)`.
    all: Vec<u64>,
    count: usize,
    /// The parent's split number of split 0.
    first: u64,
    pending: std::vec::IntoIter<(Option<u32>, i64, CommOptions)>,
}

impl std::fmt::Debug for Splits<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Splits")
            .field("parent", &self.parent.name)
            .field("count", &self.count)
            .field("taken", &(self.count - self.pending.len()))
            .finish()
    }
}

impl Iterator for Splits<'_> {
    type Item = Result<Option<Communicator>, CommError>;

    fn next(&mut self) -> Option<Self::Item> {
        // The index of the split about to be taken: those already taken.
        let i = self.count - self.pending.len();
        let (color, key, options) = self.pending.next()?;
        let parent = self.parent;
        let Some(color) = color else {
            // ncclCommSplit is collective over the whole parent: a rank that joins no child still takes part.
            return Some(match &parent.nccl {
                Some(nccl) => nccl
                    .split_with(None, key, options.for_device())
                    .map(|_| None),
                None => Ok(None),
            });
        };
        let n = parent.size();
        let (all, count) = (&self.all, self.count);
        let mut members: Vec<(i64, usize)> = (0..n)
            .filter(|r| all[2 * (r * count + i)] == u64::from(color))
            .map(|r| (all[2 * (r * count + i) + 1] as i64, r))
            .collect();
        members.sort_unstable();
        let ranks = members.iter().map(|&(_, r)| parent.ranks[r]).collect();
        let options = CommOptions {
            name: format!(
                "{}/split{}/color{color}",
                parent.name,
                self.first + i as u64
            ),
            ..options
        };
        let device = parent
            .nccl
            .as_ref()
            .map(|parent| DeviceSource::Split { parent, color, key });
        Some(
            Communicator::create(
                Arc::clone(&parent.store),
                ranks,
                parent.ranks[parent.rank],
                options,
                device,
            )
            .map(Some),
        )
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.pending.size_hint()
    }
}
