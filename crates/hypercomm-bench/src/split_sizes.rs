//! The split sizes of the all-to-all-v benchmark ([`BenchOp::AllToAllV`](crate::BenchOp::AllToAllV)): a matrix of
//! element counts, `count(s, d)` from rank `s` to rank `d`, drawn at random from a seed, so that every rank computes
//! the same matrix on its own and knows both what it sends (its row) and what it receives (its column).
//!
//! How they are drawn: a 64-bit linear congruential generator (Knuth's MMIX multiplier and increment) is seeded
//! with `seed`; each row in turn, rank 0 first, takes `n - 1` cut points uniformly from `0..=E` (the high bits of
//! one draw times `E + 1`, a widening multiply), sorts them, and its counts are the gaps between consecutive cuts,
//! with `0` before the first and `E` after the last. So each row is a uniformly random split of `E` elements among
//! the `n` ranks, itself included, and the matrix depends only on `(seed, n, E)`.
//!
//! Every row sums to exactly `E`: each rank sends the same number of bytes, as every rank does in nccl-tests'
//! alltoall, which is what the benchmark's `bytes` counts; what each rank receives (its column) varies. A count is
//! zero when two cuts fall together or on an end, which is certain when `E < n` and rare otherwise; the all-to-all-v
//! allows zero counts and the benchmark keeps them.
//!
//! ```
//! use hypercomm_bench::split_sizes::SplitSizes;
//!
//! let splits = SplitSizes::seeded(7, 4, 1000);
//! let mine = splits.of_rank(2)?;
//! assert_eq!(mine.send.iter().sum::<usize>(), 1000);
//! // What rank 2 receives from rank 0 is what rank 0 sends to rank 2.
//! assert_eq!(mine.recv[0], splits.of_rank(0)?.send[2]);
//! # Ok::<(), hypercomm_bench::split_sizes::NotARank>(())
//! ```

use hypercomm_comm::{CommError, Communicator};

/// Knuth's MMIX multiplier.
const MULTIPLIER: u64 = 6364136223846793005;
/// Knuth's MMIX increment (odd, so the generator has the full period 2^64).
const INCREMENT: u64 = 1442695040888963407;

/// A rank outside the ranks a [`SplitSizes`] was drawn for.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[error("rank {rank} is not one of the {ranks} ranks the split sizes were drawn for")]
pub struct NotARank {
    /// The rank asked for.
    pub rank: usize,
    /// How many ranks the matrix has.
    pub ranks: usize,
}

/// One rank's part of a [`SplitSizes`]: the `send_counts` and `recv_counts` of its
/// [`Communicator::all_to_all_v`](hypercomm_comm::Communicator::all_to_all_v).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RankCounts {
    /// Elements to each rank, in rank order: the rank's row.
    pub send: Vec<usize>,
    /// Elements from each rank, in rank order: the rank's column.
    pub recv: Vec<usize>,
}

/// The all-to-all-v's element counts for every pair of ranks, drawn from a seed (see the [module](self) for how).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitSizes {
    ranks: usize,
    /// Row-major: `counts[s * ranks + d]` elements from rank `s` to rank `d`.
    counts: Vec<usize>,
}

impl SplitSizes {
    /// The counts for `ranks` ranks that each send `per_rank` elements in all, drawn from `seed`.
    pub fn seeded(seed: u64, ranks: usize, per_rank: usize) -> SplitSizes {
        let mut state = seed;
        let mut draw = |below: usize| {
            state = state.wrapping_mul(MULTIPLIER).wrapping_add(INCREMENT);
            // The widening multiply keeps the state's high bits, the generator's strongest.
            ((u128::from(state) * below as u128) >> 64) as usize
        };
        let mut counts = Vec::with_capacity(ranks * ranks);
        for _ in 0..ranks {
            let mut cuts: Vec<usize> = (1..ranks).map(|_| draw(per_rank + 1)).collect();
            cuts.sort_unstable();
            cuts.push(per_rank);
            let mut last = 0;
            for cut in cuts {
                counts.push(cut - last);
                last = cut;
            }
        }
        SplitSizes { ranks, counts }
    }

    /// How many ranks the matrix is for.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// Rank `rank`'s row (what it sends to each rank) and column (what it receives from each).
    pub fn of_rank(&self, rank: usize) -> Result<RankCounts, NotARank> {
        let n = self.ranks;
        if rank >= n {
            return Err(NotARank { rank, ranks: n });
        }
        Ok(RankCounts {
            send: self.counts[rank * n..(rank + 1) * n].to_vec(),
            recv: (0..n).map(|s| self.counts[s * n + rank]).collect(),
        })
    }
}

/// The all-to-all-v counts of `comm`'s rank when every rank sends `per_rank` elements, drawn from `seed`
/// ([`SplitSizes::seeded`]) for the communicator's size.
pub fn rank_counts(
    comm: &Communicator,
    seed: u64,
    per_rank: usize,
) -> Result<RankCounts, CommError> {
    SplitSizes::seeded(seed, comm.size(), per_rank)
        .of_rank(comm.rank())
        .map_err(|e| CommError::InvalidArgument {
            comm: comm.name().to_owned(),
            what: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(s: &SplitSizes) -> Vec<Vec<usize>> {
        (0..s.ranks()).map(|r| s.of_rank(r).unwrap().send).collect()
    }

    #[test]
    fn the_same_seed_draws_the_same_matrix_and_another_seed_another() {
        let a = SplitSizes::seeded(42, 8, 1 << 20);
        assert_eq!(a, SplitSizes::seeded(42, 8, 1 << 20));
        assert_ne!(a, SplitSizes::seeded(43, 8, 1 << 20));
        // Not an even split: the counts of a row differ.
        let row = &rows(&a)[0];
        assert!(row.iter().any(|&c| c != row[0]), "{row:?}");
    }

    #[test]
    fn the_matrix_of_a_seed_stays_the_one_the_figures_were_measured_with() {
        // docs/perf/point-to-point.md quotes seed 1's split of 16 MiB on two ranks: a generator that changed
        // would measure another exchange under the same name.
        let s = SplitSizes::seeded(1, 2, 4 << 20);
        assert_eq!(rows(&s), [[1775068, 2419236], [2136610, 2057694]]);
    }

    #[test]
    fn every_row_sums_to_the_per_rank_total_and_columns_mirror_rows() {
        for (seed, n, per_rank) in [(1, 2, 4 << 20), (9, 3, 1000), (5, 8, 12345), (0, 1, 77)] {
            let s = SplitSizes::seeded(seed, n, per_rank);
            let rows = rows(&s);
            assert!(
                rows.iter()
                    .all(|r| r.len() == n && r.iter().sum::<usize>() == per_rank)
            );
            for d in 0..n {
                let column: Vec<usize> = rows.iter().map(|r| r[d]).collect();
                assert_eq!(s.of_rank(d).unwrap().recv, column, "seed {seed}, rank {d}");
            }
            // Everything sent is received somewhere.
            let received: usize = (0..n)
                .map(|d| s.of_rank(d).unwrap().recv.iter().sum::<usize>())
                .sum();
            assert_eq!(received, n * per_rank);
        }
    }

    #[test]
    fn zero_counts_are_drawn_and_kept() {
        // Three elements among eight ranks: at least five of every row's counts are zero.
        let s = SplitSizes::seeded(3, 8, 3);
        for row in rows(&s) {
            assert_eq!(row.iter().sum::<usize>(), 3);
            assert!(row.iter().filter(|&&c| c == 0).count() >= 5, "{row:?}");
        }
        // Nothing to send at all: every count is zero.
        let none = SplitSizes::seeded(3, 4, 0);
        assert!(rows(&none).iter().flatten().all(|&c| c == 0));
    }

    #[test]
    fn cuts_spread_over_the_whole_range() {
        // Over many seeds, what rank 0 keeps of two ranks' split averages about half, and both ends occur.
        let kept: Vec<f64> = (0..400)
            .map(|seed| {
                SplitSizes::seeded(seed, 2, 1000).of_rank(0).unwrap().send[0] as f64 / 1000.0
            })
            .collect();
        let mean = kept.iter().sum::<f64>() / kept.len() as f64;
        assert!((0.4..0.6).contains(&mean), "mean share {mean}");
        assert!(
            kept.iter().any(|&k| k < 0.1) && kept.iter().any(|&k| k > 0.9),
            "{kept:?}"
        );
    }

    #[test]
    fn a_rank_outside_the_matrix_is_named() {
        let err = SplitSizes::seeded(1, 4, 100).of_rank(4).unwrap_err();
        assert_eq!(err, NotARank { rank: 4, ranks: 4 });
        assert_eq!(
            err.to_string(),
            "rank 4 is not one of the 4 ranks the split sizes were drawn for"
        );
    }
}
