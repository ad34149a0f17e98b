//! [`Runs`]: the bytes of one transfer, as strided runs between two local shards.
//!
//! A transfer copies bytes from the sender's local shard of a parameter into the receiver's local shard of the
//! same parameter, both row-major. Where the two shards split a tensor the same way the bytes are one contiguous
//! run; where they do not (a row-parallel weight `[out, in]` split along `in` on one side and whole on the other)
//! they are one run per row, each at a fixed stride from the last. `Runs` says that in a few numbers whatever the
//! tensor's size:
//!
//! ```text
//! for i0 in 0..repeat[0].count, i1 in 0..repeat[1].count, ...  (outermost first)
//!     copy len bytes
//!         from src_offset + i0·repeat[0].src + i1·repeat[1].src + ...
//!         to   dst_offset + i0·repeat[0].dst + i1·repeat[1].dst + ...
//! ```
//!
//! With no `repeat` it is one contiguous copy. Its *linear order* is the order of that loop; [`Runs::slice`] cuts
//! a byte range of it into `Runs` again, which is how plans cut transfers into buckets. Every `Runs` a plan holds
//! is normalised: no level repeats once, and no level merges into the one inside it or into `len`.

use serde::{Deserialize, Serialize};

/// One level of repetition of a [`Runs`]: `count` times, stepping `src` bytes in the sender's shard and `dst`
/// bytes in the receiver's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Stride {
    /// How many times the level repeats (at least 2 in a normalised `Runs`).
    pub count: u64,
    /// The step in the sender's local shard, in bytes.
    pub src: u64,
    /// The step in the receiver's local shard, in bytes.
    pub dst: u64,
}

/// Strided runs of bytes from one local shard to another; see the module docs.
///
/// ```
/// use hypercomm_refit::{Runs, Stride};
///
/// // Rows 0..3 of a [3, 8] f32 tensor's right half, into a [3, 4] shard: 3 runs of 16 bytes.
/// let runs = Runs { src_offset: 16, dst_offset: 0, len: 16, repeat: vec![Stride { count: 3, src: 32, dst: 16 }] };
/// assert_eq!(runs.bytes(), 48);
/// assert_eq!(runs.iter().collect::<Vec<_>>(), [(16, 0, 16), (48, 16, 16), (80, 32, 16)]);
/// // The middle 24 bytes: the end of row 0 and the start of row 1.
/// assert_eq!(runs.slice(12, 36).iter().map(Runs::bytes).sum::<u64>(), 24);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Runs {
    /// Where the first run starts in the sender's local shard, in bytes.
    pub src_offset: u64,
    /// Where the first run lands in the receiver's local shard, in bytes.
    pub dst_offset: u64,
    /// The bytes of each contiguous run.
    pub len: u64,
    /// The levels of repetition, outermost first; empty for one contiguous run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub repeat: Vec<Stride>,
}

impl Runs {
    /// One contiguous run of `len` bytes.
    pub fn contiguous(src_offset: u64, dst_offset: u64, len: u64) -> Runs {
        Runs {
            src_offset,
            dst_offset,
            len,
            repeat: Vec::new(),
        }
    }

    /// The bytes copied in all (saturating at `u64::MAX` for runs no plan makes).
    pub fn bytes(&self) -> u64 {
        self.len.saturating_mul(self.run_count())
    }

    /// The number of contiguous runs (saturating at `u64::MAX`).
    pub fn run_count(&self) -> u64 {
        self.repeat
            .iter()
            .fold(1u64, |acc, s| acc.saturating_mul(s.count))
    }

    /// Every contiguous run as `(src_offset, dst_offset, len)`, in linear order.
    pub fn iter(&self) -> RunsIter<'_> {
        RunsIter {
            runs: self,
            index: vec![0; self.repeat.len()],
            done: self.len == 0 || self.repeat.iter().any(|s| s.count == 0),
        }
    }

    /// The bytes `start..end` of the linear order, as normalised `Runs` in linear order: at most two per level
    /// of repetition and one more. Empty when `start >= end`; `end` is capped at [`Runs::bytes`].
    pub fn slice(&self, start: u64, end: u64) -> Vec<Runs> {
        let mut out = Vec::new();
        self.slice_into(start, end.min(self.bytes()), &mut out);
        out
    }

    fn slice_into(&self, start: u64, end: u64, out: &mut Vec<Runs>) {
        if start >= end {
            return;
        }
        let Some((outer, inner_levels)) = self.repeat.split_first() else {
            out.push(Runs::contiguous(
                self.src_offset + start,
                self.dst_offset + start,
                end - start,
            ));
            return;
        };
        let row = |i: u64| Runs {
            src_offset: self.src_offset.saturating_add(i.saturating_mul(outer.src)),
            dst_offset: self.dst_offset.saturating_add(i.saturating_mul(outer.dst)),
            len: self.len,
            repeat: inner_levels.to_vec(),
        };
        let size = row(0).bytes();
        let (first, last) = (start / size, (end - 1) / size);
        if first == last {
            row(first).slice_into(start - first * size, end - first * size, out);
            return;
        }
        let mut full_from = first;
        if start % size != 0 {
            row(first).slice_into(start % size, size, out);
            full_from = first + 1;
        }
        let tail = end - last * size;
        let full_to = if tail < size { last } else { last + 1 };
        if full_to > full_from {
            let mut repeat = Vec::with_capacity(self.repeat.len());
            repeat.push(Stride {
                count: full_to - full_from,
                ..*outer
            });
            repeat.extend_from_slice(inner_levels);
            let start_row = row(full_from);
            out.push(
                Runs {
                    repeat,
                    ..start_row
                }
                .normalized(),
            );
        }
        if tail < size {
            row(last).slice_into(0, tail, out);
        }
    }

    /// The same bytes with no level that repeats once, every level that continues the one inside it merged into
    /// it, and the innermost levels that continue the run merged into `len`.
    pub fn normalized(mut self) -> Runs {
        self.repeat.retain(|s| s.count != 1);
        loop {
            if let Some(last) = self.repeat.last()
                && last.src == self.len
                && last.dst == self.len
            {
                self.len = self.len.saturating_mul(last.count);
                self.repeat.pop();
                continue;
            }
            let mergeable = (0..self.repeat.len().saturating_sub(1)).rev().find(|&i| {
                let (a, b) = (self.repeat[i], self.repeat[i + 1]);
                b.src.checked_mul(b.count) == Some(a.src)
                    && b.dst.checked_mul(b.count) == Some(a.dst)
            });
            match mergeable {
                Some(i) => {
                    self.repeat[i + 1].count = self.repeat[i + 1]
                        .count
                        .saturating_mul(self.repeat[i].count);
                    self.repeat.remove(i);
                }
                None => return self,
            }
        }
    }

    /// The same bytes read from where they were written: a receiver forwarding them to a replica whose shard is
    /// laid out as its own.
    pub fn forwarded(&self) -> Runs {
        Runs {
            src_offset: self.dst_offset,
            dst_offset: self.dst_offset,
            len: self.len,
            repeat: self
                .repeat
                .iter()
                .map(|s| Stride { src: s.dst, ..*s })
                .collect(),
        }
        .normalized()
    }
}

/// The bytes `start..end` of `list` laid end to end in linear order, as normalised `Runs`.
pub(crate) fn slice_all(list: &[Runs], start: u64, end: u64) -> Vec<Runs> {
    let mut out = Vec::new();
    let mut pos = 0;
    for runs in list {
        if pos >= end {
            break;
        }
        let bytes = runs.bytes();
        let (lo, hi) = (start.max(pos), end.min(pos + bytes));
        if lo < hi {
            out.extend(runs.slice(lo - pos, hi - pos));
        }
        pos += bytes;
    }
    out
}

/// The contiguous runs of a [`Runs`], from [`Runs::iter`].
#[derive(Debug, Clone)]
pub struct RunsIter<'a> {
    runs: &'a Runs,
    index: Vec<u64>,
    done: bool,
}

impl Iterator for RunsIter<'_> {
    type Item = (u64, u64, u64);

    fn next(&mut self) -> Option<(u64, u64, u64)> {
        if self.done {
            return None;
        }
        let (mut src, mut dst) = (self.runs.src_offset, self.runs.dst_offset);
        for (i, s) in self.index.iter().zip(&self.runs.repeat) {
            src = src.saturating_add(i.saturating_mul(s.src));
            dst = dst.saturating_add(i.saturating_mul(s.dst));
        }
        // Advance the innermost level, carrying outwards; past the outermost the iteration ends.
        self.done = true;
        for (i, s) in self.index.iter_mut().zip(&self.runs.repeat).rev() {
            *i += 1;
            if *i < s.count {
                self.done = false;
                break;
            }
            *i = 0;
        }
        Some((src, dst, self.runs.len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(count: u64, src: u64, dst: u64, len: u64) -> Runs {
        Runs {
            src_offset: 0,
            dst_offset: 0,
            len,
            repeat: vec![Stride { count, src, dst }],
        }
    }

    /// Every byte of `runs` as (src, dst), in linear order.
    fn bytes_of(runs: &[Runs]) -> Vec<(u64, u64)> {
        runs.iter()
            .flat_map(|r| r.iter().collect::<Vec<_>>())
            .flat_map(|(s, d, len)| (0..len).map(move |i| (s + i, d + i)))
            .collect()
    }

    #[test]
    fn normalising_merges_what_continues() {
        // Rows that follow each other in both shards are one run.
        assert_eq!(rows(4, 8, 8, 8).normalized(), Runs::contiguous(0, 0, 32));
        // A level repeating once disappears.
        assert_eq!(rows(1, 100, 7, 8).normalized(), Runs::contiguous(0, 0, 8));
        // Two levels that continue each other merge into one.
        let two = Runs {
            src_offset: 0,
            dst_offset: 0,
            len: 4,
            repeat: vec![
                Stride {
                    count: 2,
                    src: 48,
                    dst: 24,
                },
                Stride {
                    count: 3,
                    src: 16,
                    dst: 8,
                },
            ],
        };
        assert_eq!(two.clone().normalized(), rows(6, 16, 8, 4));
        assert_eq!(
            bytes_of(std::slice::from_ref(&two)),
            bytes_of(&[two.normalized()])
        );
        // Strides that differ on one side stay.
        assert_eq!(rows(4, 16, 8, 8).normalized(), rows(4, 16, 8, 8));
    }

    #[test]
    fn slices_cover_exactly_their_byte_range() {
        let runs = Runs {
            src_offset: 5,
            dst_offset: 3,
            len: 3,
            repeat: vec![
                Stride {
                    count: 3,
                    src: 40,
                    dst: 20,
                },
                Stride {
                    count: 4,
                    src: 8,
                    dst: 4,
                },
            ],
        };
        let all = bytes_of(std::slice::from_ref(&runs));
        assert_eq!(all.len() as u64, runs.bytes());
        for start in 0..=runs.bytes() {
            for end in start..=runs.bytes() {
                let cut = runs.slice(start, end);
                assert_eq!(
                    bytes_of(&cut),
                    all[start as usize..end as usize],
                    "{start}..{end}"
                );
                assert!(cut.len() <= 2 * runs.repeat.len() + 1, "{cut:?}");
                assert!(cut.iter().all(|r| r.clone().normalized() == *r));
            }
        }
    }

    #[test]
    fn forwarding_reads_where_the_bytes_were_written() {
        let runs = rows(3, 32, 16, 16);
        let fwd = runs.forwarded();
        assert_eq!(fwd, Runs::contiguous(0, 0, 48));
        let shifted = Runs {
            src_offset: 64,
            dst_offset: 8,
            ..rows(3, 32, 24, 16)
        };
        assert_eq!(
            shifted.forwarded().iter().collect::<Vec<_>>(),
            [(8, 8, 16), (32, 32, 16), (56, 56, 16)]
        );
    }

    #[test]
    fn serialises_without_an_empty_repeat() {
        let json = serde_json::to_string(&Runs::contiguous(1, 2, 3)).unwrap();
        assert_eq!(json, r#"{"src_offset":1,"dst_offset":2,"len":3}"#);
        let runs = rows(2, 8, 4, 4);
        let back: Runs = serde_json::from_str(&serde_json::to_string(&runs).unwrap()).unwrap();
        assert_eq!(back, runs);
    }
}
