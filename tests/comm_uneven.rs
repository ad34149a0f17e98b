//! All-gather and reduce-scatter with per-rank counts (`all_gather_v`, `reduce_scatter_v`: sharded data parallelism
//! with uneven shards) on the host, ranks as threads over shared memory and TCP: zero counts, every rank's block
//! in place, reductions in rank order, and bad counts refused before anything is sent.

mod comm_support;

use comm_support::{on_threads, options};
use hypercomm::comm::{CommError, Communicator, ReduceOp};

/// Rank `r`'s block sizes: uneven, with an empty one.
const COUNTS: [usize; 4] = [3, 0, 70_000, 5];

fn value(rank: usize, i: usize) -> f32 {
    ((rank * 131 + i * 7) % 1000) as f32
}

#[test]
fn uneven_all_gather_and_reduce_scatter_give_every_rank_its_blocks() {
    for tcp in [false, true] {
        on_threads(4, options("uneven", tcp), move |comm: Communicator| {
            let me = comm.rank();
            let counts = COUNTS.to_vec();
            let total: usize = counts.iter().sum();
            // All-gather: every block, in rank order.
            let mine: Vec<f32> = (0..counts[me]).map(|i| value(me, i)).collect();
            let (_, all) = comm
                .all_gather_v(mine, vec![-1.0f32; total], counts.clone())
                .unwrap()
                .wait()
                .unwrap();
            let want: Vec<f32> = (0..4)
                .flat_map(|r| (0..COUNTS[r]).map(move |i| value(r, i)))
                .collect();
            assert_eq!(all, want, "tcp {tcp}: rank {me}'s all_gather_v");
            // Reduce-scatter: rank r gets the sum and the max over ranks of everyone's block r.
            let input: Vec<f32> = (0..total).map(|i| value(me, i)).collect();
            let start: usize = counts[..me].iter().sum();
            for (op, fold) in [
                (
                    ReduceOp::Sum,
                    (|a: f32, b: f32| a + b) as fn(f32, f32) -> f32,
                ),
                (ReduceOp::Max, f32::max),
            ] {
                let (_, out) = comm
                    .reduce_scatter_v(input.clone(), vec![0.0f32; counts[me]], counts.clone(), op)
                    .unwrap()
                    .wait()
                    .unwrap();
                let want: Vec<f32> = (start..start + counts[me])
                    .map(|i| (1..4).fold(value(0, i), |acc, r| fold(acc, value(r, i))))
                    .collect();
                assert_eq!(out, want, "tcp {tcp}: rank {me}'s reduce_scatter_v {op}");
            }
        });
    }
}

#[test]
fn bad_counts_are_refused_before_anything_is_sent() {
    on_threads(2, options("uneven-bad", false), |comm: Communicator| {
        let me = comm.rank();
        let invalid = |e: CommError, says: &str| {
            let text = e.to_string();
            assert!(matches!(e, CommError::InvalidArgument { .. }), "{text}");
            assert!(text.contains(says), "{text}");
        };
        invalid(
            comm.all_gather_v(vec![1u32; 2], vec![0; 3], vec![2])
                .unwrap_err(),
            "all_gather_v counts has 1 elements, expected 2",
        );
        invalid(
            comm.all_gather_v(vec![1u32; 3], vec![0; 3], vec![1, 2])
                .unwrap_err(),
            "all_gather_v input has 3",
        );
        invalid(
            comm.reduce_scatter_v(vec![1u32; 3], vec![0; 1], vec![1, 1], ReduceOp::Sum)
                .unwrap_err(),
            "reduce_scatter_v input has 3",
        );
        // Nothing was sent: the next collective still matches.
        let (_, all) = comm
            .all_gather_v(vec![me as u32; me + 1], vec![0; 3], vec![1, 2])
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(all, [0, 1, 1]);
    });
}
