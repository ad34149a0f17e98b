//! Direct reads (`Algorithm::Direct`, and `Auto` from 1 MiB): the all-reduce, all-gather and reduce-scatter read
//! the peers' buffers with `process_vm_readv` instead of staging them through shared memory. The whole collective
//! matrix runs with the path forced (`comm_collectives.rs`, `comm_processes.rs`); here: the same bits as the staged
//! path, and ranks that may not read each other's memory agreeing to stage.

mod comm_support;

use comm_support::*;
use hypercomm::comm::{Algorithm, CommOptions, Communicator, ReduceOp};

/// Values whose float sums round differently in different orders, so only the same fold gives the same bits.
fn ragged(rank: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7919 + rank * 104_729) % 1000) as f32 / 7.0 + 1e-3 * rank as f32)
        .collect()
}

/// The all-reduce (of `n * len` elements), all-gather and reduce-scatter (of `len` per rank) on `comm`.
fn three(comm: &Communicator, len: usize) -> [Vec<f32>; 3] {
    let (n, me) = (comm.size(), comm.rank());
    let ar = comm
        .all_reduce(ragged(me, n * len), ReduceOp::Sum)
        .unwrap()
        .wait()
        .unwrap();
    let (_, ag) = comm
        .all_gather_into(ragged(me, len), vec![0.0; n * len])
        .unwrap()
        .wait()
        .unwrap();
    let (_, rs) = comm
        .reduce_scatter_into(ragged(me, n * len), vec![0.0; len], ReduceOp::Sum)
        .unwrap()
        .wait()
        .unwrap();
    [ar, ag, rs]
}

/// [`three`] on every rank of a world of `n` with `algorithm`.
fn run(n: usize, len: usize, algorithm: Algorithm, name: &str) -> Vec<[Vec<f32>; 3]> {
    on_threads(
        n,
        CommOptions {
            algorithm,
            ..options(name, false)
        },
        move |comm| three(&comm, len),
    )
}

#[test]
fn direct_reads_give_the_staged_paths_bits() {
    for n in [2, 3] {
        // Odd lengths, so that parts and steps end mid-vector; the larger one spans several 256 KiB steps.
        for len in [1001, 200_003] {
            let direct = run(n, len, Algorithm::Direct, &format!("direct-{n}-{len}"));
            let staged = run(n, len, Algorithm::Bandwidth, &format!("staged-{n}-{len}"));
            for (r, (d, s)) in direct.iter().zip(&staged).enumerate() {
                for (what, (d, s)) in ["all_reduce", "all_gather", "reduce_scatter"]
                    .iter()
                    .zip(d.iter().zip(s))
                {
                    let same = d.len() == s.len()
                        && d.iter().zip(s).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "n={n} len={len} rank {r}: {what} differs from staged");
                }
            }
            // And the gather is the ranks' inputs, not merely equal on both paths.
            for ranks in &direct {
                for src in 0..n {
                    assert_eq!(ranks[1][src * len..(src + 1) * len], ragged(src, len)[..]);
                }
            }
        }
    }
}

/// One rank may not read its peers (it may be read): every rank must stage, or the ranks would run different
/// rounds. Several operations of each kind in a row, so the agreement is also kept rather than probed once and
/// forgotten.
#[test]
fn a_rank_that_may_not_read_its_peers_makes_every_rank_stage() {
    let n = 3;
    let len = 300_001;
    let results = on_threads(n, options("direct-refused", false), move |comm| {
        // Before the first operation, so the progress thread (started by it) inherits the filter too.
        let forbidden = comm.rank() == 1 && forbid_reading_other_processes();
        let out: Vec<[Vec<f32>; 3]> = (0..3).map(|_| three(&comm, len)).collect();
        (forbidden, out)
    });
    if !results.iter().any(|(forbidden, _)| *forbidden) {
        println!("skipped: a seccomp filter could not be installed on this machine");
        return;
    }
    // The rank-order fold every path computes (starting from 0.0 changes nothing: 0.0 + x is x).
    let inputs: Vec<Vec<f32>> = (0..n).map(|r| ragged(r, n * len)).collect();
    let want_ar: Vec<f32> = (0..n * len)
        .map(|i| inputs.iter().fold(0.0f32, |acc, v| acc + v[i]))
        .collect();
    for (r, (_, ops)) in results.into_iter().enumerate() {
        let want_rs = &want_ar[r * len..(r + 1) * len];
        for (k, [ar, ag, rs]) in ops.iter().enumerate() {
            assert!(
                ar.iter()
                    .zip(&want_ar)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "rank {r}, all-reduce {k}"
            );
            for src in 0..n {
                assert_eq!(
                    ag[src * len..(src + 1) * len],
                    ragged(src, len)[..],
                    "rank {r}, all-gather {k}, block {src}"
                );
            }
            assert!(
                rs.iter()
                    .zip(want_rs)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "rank {r}, reduce-scatter {k}"
            );
        }
    }
}
