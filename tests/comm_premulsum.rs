//! `ReduceOp::PreMulSum` on the host flavor, ranks as threads over shared memory and TCP: every reducing
//! collective (all-reduce, reduce, reduce-scatter, uneven reduce-scatter, the symmetric ones) on every type the
//! host reduces, through each algorithm, against a reference computed apart; ranks that pass different factors
//! fail with a mismatch naming both; factors a type cannot hold are refused before anything is sent.

mod comm_support;

use std::time::Duration;

use comm_support::*;
use hypercomm::comm::{Algorithm, CommError, CommOptions, Communicator, DType, ReduceOp};

/// The factors a type is checked with: for floats a quarter (sharded data parallelism's 1/dp) and one that is not
/// a power of two; for integers whole numbers, negative for the signed ones.
fn factors(dtype: DType) -> [f64; 2] {
    match dtype {
        DType::F32 | DType::F64 | DType::F16 | DType::BF16 => [0.25, -1.5],
        DType::U8 | DType::U32 | DType::U64 => [3.0, 255.0],
        _ => [3.0, -2.0],
    }
}

/// Requires `got == want` bit for bit: the test values make every premulsum exact.
fn exact<T: TestElem>(got: &[T], want: &[T], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) =
        (0..got.len()).find(|&i| got[i].to_f64().to_bits() != want[i].to_f64().to_bits())
    {
        panic!(
            "{what}: index {i} is {}, want {}",
            got[i].to_f64(),
            want[i].to_f64()
        );
    }
}

/// Every reducing collective with every factor of `T`, `len` elements a rank (a multiple of the rank count for
/// the reduce-scatters, whose uneven form gives rank `r` a block of `r + 1` parts).
fn every_collective<T: TestElem>(comm: &Communicator, len: usize) {
    let (n, me) = (comm.size(), comm.rank());
    for f in factors(T::DTYPE) {
        let op = ReduceOp::pre_mul_sum(f);
        let what = |name: &str| format!("{} {op} n={n} rank={me} len={len}: {name}", T::DTYPE);
        let mine = values::<T>(op, me, len);
        let want = expected::<T>(op, n, len);
        let got = comm.all_reduce(mine.clone(), op).unwrap().wait().unwrap();
        exact(&got, &want, &what("all_reduce"));
        let (input, got) = comm
            .all_reduce_into(mine.clone(), vec![T::default(); len], op)
            .unwrap()
            .wait()
            .unwrap();
        exact(&got, &want, &what("all_reduce_into"));
        assert_eq!(input, mine, "{}", what("all_reduce_into keeps its input"));
        let root = n - 1;
        let got = comm.reduce(mine.clone(), op, root).unwrap().wait().unwrap();
        exact(
            &got,
            if me == root { &want } else { &mine },
            &what("reduce"),
        );
        // Reduce-scatter: block `me` of the result, in place (the other blocks untouched) and into a block.
        let block = len / n;
        let mine_block = &want[me * block..(me + 1) * block];
        let got = comm
            .reduce_scatter(mine.clone(), op)
            .unwrap()
            .wait()
            .unwrap();
        exact(
            &got[me * block..(me + 1) * block],
            mine_block,
            &what("reduce_scatter"),
        );
        exact(
            &got[..me * block],
            &mine[..me * block],
            &what("reduce_scatter leaves the rest"),
        );
        let (_, got) = comm
            .reduce_scatter_into(mine.clone(), vec![T::default(); block], op)
            .unwrap()
            .wait()
            .unwrap();
        exact(&got, mine_block, &what("reduce_scatter_into"));
        // Uneven: `len` split in parts of (r + 1) / (1 + 2 + ... + n), the last rank taking the remainder.
        let parts = n * (n + 1) / 2;
        let mut counts: Vec<usize> = (0..n).map(|r| len * (r + 1) / parts).collect();
        counts[n - 1] = len - counts[..n - 1].iter().sum::<usize>();
        let start: usize = counts[..me].iter().sum();
        let (_, got) = comm
            .reduce_scatter_v(
                mine.clone(),
                vec![T::default(); counts[me]],
                counts.clone(),
                op,
            )
            .unwrap()
            .wait()
            .unwrap();
        exact(
            &got,
            &want[start..start + counts[me]],
            &what("reduce_scatter_v"),
        );
    }
}

/// Every type the host reduces, `len` elements of f32 (the other types a smaller, fixed length).
fn every_type(comm: &Communicator, len: usize) {
    let n = comm.size();
    every_collective::<f32>(comm, len);
    let small = 7 * n;
    every_collective::<f64>(comm, small);
    every_collective::<half::f16>(comm, small);
    every_collective::<half::bf16>(comm, small);
    every_collective::<i8>(comm, small);
    every_collective::<u8>(comm, small);
    every_collective::<i32>(comm, small);
    every_collective::<i64>(comm, small);
    every_collective::<u32>(comm, small);
    every_collective::<u64>(comm, small);
}

fn run(n: usize, tcp: bool, algorithm: Algorithm, lens: &'static [usize]) {
    let name = format!("premulsum-{n}-{tcp}-{algorithm:?}");
    let options = CommOptions {
        algorithm,
        ..options(&name, tcp)
    };
    on_threads(n, options, move |comm| {
        for &len in lens {
            every_type(&comm, len * n);
        }
    });
}

#[test]
fn premulsum_matches_the_reference_over_shared_memory() {
    // Lengths per rank: nothing, one element, and past the latency path's limit (bandwidth and direct paths).
    for n in [1, 2, 3, 4] {
        run(n, false, Algorithm::Auto, &[0, 1, 257, 300_001]);
    }
}

#[test]
fn premulsum_matches_the_reference_through_every_host_algorithm() {
    for algorithm in [Algorithm::Latency, Algorithm::Bandwidth, Algorithm::Direct] {
        run(3, false, algorithm, &[5, 20_001]);
    }
}

#[test]
fn premulsum_matches_the_reference_over_tcp() {
    for n in [2, 3] {
        run(n, true, Algorithm::Auto, &[0, 3, 40_001]);
    }
}

#[test]
fn premulsum_on_symmetric_buffers_matches_the_ordinary_collectives() {
    let options = CommOptions {
        symmetric_bytes: 4 << 20,
        ..options("premulsum-symmetric", false)
    };
    on_threads(3, options, |comm| {
        let (n, me) = (comm.size(), comm.rank());
        for len in [3, 30_000] {
            let op = ReduceOp::pre_mul_sum(0.25);
            let mine = values::<f32>(op, me, len);
            let mut buf = comm.symmetric_buffer(len, 0f32).unwrap();
            buf.copy_from_slice(&mine);
            let got = comm.all_reduce_symmetric(buf, op).unwrap().wait().unwrap();
            exact(&got, &expected::<f32>(op, n, len), "all_reduce_symmetric");
            drop(got);
            let mine = values::<half::bf16>(op, me, n * len);
            let mut buf = comm.symmetric_buffer(n * len, half::bf16::ZERO).unwrap();
            buf.copy_from_slice(&mine);
            let got = comm
                .reduce_scatter_symmetric(buf, op)
                .unwrap()
                .wait()
                .unwrap();
            let want = expected::<half::bf16>(op, n, n * len);
            let at = me * len..(me + 1) * len;
            exact(&got[at.clone()], &want[at], "reduce_scatter_symmetric");
        }
    });
}

/// Runs `call` on three ranks, rank 0 with `first` and the others with `rest`: every rank must fail with a
/// mismatch whose message names both reductions.
fn disagree(
    tcp: bool,
    first: ReduceOp,
    rest: ReduceOp,
    call: fn(&Communicator, ReduceOp) -> Result<Vec<f32>, CommError>,
) {
    for e in disagreeing(tcp, first, rest, Duration::from_secs(60), call) {
        assert!(matches!(e, CommError::Mismatch { .. }), "{e}");
    }
}

/// Runs `call` on three ranks, rank 0 with `first` and the others with `rest` (the communicator's timeout
/// `timeout`); every rank's error, each of which must name both reductions.
fn disagreeing(
    tcp: bool,
    first: ReduceOp,
    rest: ReduceOp,
    timeout: Duration,
    call: fn(&Communicator, ReduceOp) -> Result<Vec<f32>, CommError>,
) -> Vec<CommError> {
    let name = format!("premulsum-mismatch-{tcp}-{first}");
    let options = CommOptions {
        timeout,
        ..options(&name, tcp)
    };
    let errors = on_threads(3, options, move |comm| {
        let op = if comm.rank() == 0 { first } else { rest };
        call(&comm, op).expect_err("the ranks disagree")
    });
    for e in &errors {
        let text = e.to_string();
        assert!(
            text.contains(&format!("op={first}")) && text.contains(&format!("op={rest}")),
            "{text}"
        );
    }
    errors
}

#[test]
fn ranks_passing_different_factors_fail_with_a_mismatch_naming_both() {
    for tcp in [false, true] {
        disagree(
            tcp,
            ReduceOp::pre_mul_sum(0.25),
            ReduceOp::pre_mul_sum(0.5),
            |comm, op| comm.all_reduce(vec![1f32; 6], op)?.wait(),
        );
        // A factor of one sums, but it is another reduction than a sum: the ranks disagree.
        disagree(
            tcp,
            ReduceOp::Sum,
            ReduceOp::pre_mul_sum(1.0),
            |comm, op| comm.reduce_scatter(vec![1f32; 6], op)?.wait(),
        );
        // Bits, not values: -0.0 and 0.0 are different factors.
        disagree(
            tcp,
            ReduceOp::pre_mul_sum(-0.0),
            ReduceOp::pre_mul_sum(0.0),
            |comm, op| comm.reduce(vec![1f32; 6], op, 2)?.wait(),
        );
        // The uneven reduce-scatter exchanges point-to-point messages that name the reduction: a rank that
        // receives one naming another fails with the mismatch, and a rank left waiting for a message the failed
        // rank never sent times out, with that mismatch as the root cause.
        let errors = disagreeing(
            tcp,
            ReduceOp::pre_mul_sum(0.25),
            ReduceOp::pre_mul_sum(0.5),
            Duration::from_secs(3),
            |comm, op| {
                let (_, out) = comm
                    .reduce_scatter_v(vec![1f32; 6], vec![0f32; 2], vec![2, 2, 2], op)?
                    .wait()?;
                Ok(out)
            },
        );
        assert!(
            errors
                .iter()
                .any(|e| matches!(e, CommError::Mismatch { .. })),
            "{errors:?}"
        );
    }
}

#[test]
fn factors_a_type_cannot_hold_are_refused_before_anything_is_sent() {
    on_threads(2, options("premulsum-refused", false), |comm| {
        let refused = |e: CommError, says: &str| {
            assert!(matches!(e, CommError::InvalidArgument { .. }), "{e}");
            assert!(e.to_string().contains(says), "{e}");
        };
        refused(
            comm.all_reduce(vec![1i32; 4], ReduceOp::pre_mul_sum(0.5))
                .unwrap_err(),
            "all_reduce of i32: premulsum factor 0.5 is not a whole number",
        );
        refused(
            comm.reduce_scatter_v(
                vec![1u8; 4],
                vec![0u8; 2],
                vec![2, 2],
                ReduceOp::pre_mul_sum(256.0),
            )
            .unwrap_err(),
            "reduce_scatter_v of u8: premulsum factor 256 is outside u8's range",
        );
        refused(
            comm.reduce(vec![half::f16::ONE; 2], ReduceOp::pre_mul_sum(1e5), 0)
                .unwrap_err(),
            "premulsum factor 100000 overflows f16",
        );
        refused(
            comm.all_reduce(vec![1f64], ReduceOp::pre_mul_sum(f64::INFINITY))
                .unwrap_err(),
            "premulsum factor inf is not a number",
        );
        // The host still moves 8-bit floats without reducing them, whatever the factor.
        refused(
            comm.all_reduce(vec![float8::F8E4M3::ONE; 2], ReduceOp::pre_mul_sum(1.0))
                .unwrap_err(),
            "does not reduce them",
        );
        // Nothing was sent: the next operation lines up on every rank.
        let sum = comm
            .all_reduce(vec![comm.rank() as i32 + 1; 2], ReduceOp::pre_mul_sum(-1.0))
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(sum, [-3, -3]);
    });
}
