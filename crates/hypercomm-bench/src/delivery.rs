//! What the point-to-point benchmarks must have delivered, checked once after their timed iterations, as
//! nccl-tests checks its results: the sendrecv ring and the all-to-all-v move bytes without changing them, so each
//! rank's input holds one value, [`input_value`]`(rank)`, and every element received from rank `s` must hold
//! `input_value(s)`. A benchmark that timed an exchange which delivered the wrong bytes fails instead of
//! reporting a figure.

use hypercomm_comm::CommError;

use crate::op::{BenchOp, ring_peers};
use crate::split_sizes::RankCounts;

/// The value every element of rank `rank`'s input holds: `rank + 1`, so that no rank's is the zero an untouched
/// output holds.
pub fn input_value(rank: usize) -> f32 {
    (rank + 1) as f32
}

/// Checks `output`, what rank `rank` of `n` on communicator `comm` received in `op` (with `counts`, for the
/// all-to-all-v, the rank's split sizes): every element from rank `s` must be [`input_value`]`(s)`. Other
/// operations are not checked here. The error names the first element that differs.
///
/// ```
/// use hypercomm_bench::BenchOp;
/// use hypercomm_bench::delivery::check_delivered;
/// use hypercomm_bench::split_sizes::RankCounts;
///
/// let none = RankCounts { send: vec![], recv: vec![] };
/// // Rank 0 of 3 receives from rank 2, whose input holds 3.0.
/// assert!(check_delivered("ring", BenchOp::SendRecv, 0, 3, &[3.0; 4], &none).is_ok());
/// let e = check_delivered("ring", BenchOp::SendRecv, 0, 3, &[3.0, 0.0], &none).unwrap_err();
/// assert!(e.to_string().contains("element 1 holds 0 where rank 2's 3 was due"), "{e}");
/// ```
pub fn check_delivered(
    comm: &str,
    op: BenchOp,
    rank: usize,
    n: usize,
    output: &[f32],
    counts: &RankCounts,
) -> Result<(), CommError> {
    let sources: Vec<(usize, usize)> = match op {
        BenchOp::SendRecv => vec![(ring_peers(rank, n).1, output.len())],
        BenchOp::AllToAllV => counts.recv.iter().copied().enumerate().collect(),
        _ => return Ok(()),
    };
    let due: usize = sources.iter().map(|&(_, len)| len).sum();
    if due != output.len() {
        return Err(wrong(
            comm,
            op,
            rank,
            format!("received {} elements where {due} were due", output.len()),
        ));
    }
    let mut at = 0;
    for (source, len) in sources {
        let want = input_value(source);
        if let Some(i) = output[at..at + len].iter().position(|&x| x != want) {
            let got = output[at + i];
            return Err(wrong(
                comm,
                op,
                rank,
                format!(
                    "element {} holds {got} where rank {source}'s {want} was due",
                    at + i
                ),
            ));
        }
        at += len;
    }
    Ok(())
}

fn wrong(comm: &str, op: BenchOp, rank: usize, what: String) -> CommError {
    CommError::Protocol {
        comm: comm.to_owned(),
        what: format!("the {} benchmark on rank {rank}: {what}", op.name()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(recv: Vec<usize>) -> RankCounts {
        RankCounts {
            send: Vec::new(),
            recv,
        }
    }

    #[test]
    fn all_to_all_v_blocks_come_from_their_ranks_in_order() {
        // Rank 1 of 3 receives 2 from rank 0, none from itself, 1 from rank 2.
        let c = counts(vec![2, 0, 1]);
        let good = [1.0, 1.0, 3.0];
        assert!(check_delivered("a2av", BenchOp::AllToAllV, 1, 3, &good, &c).is_ok());
        let swapped = [1.0, 3.0, 1.0];
        let e = check_delivered("a2av", BenchOp::AllToAllV, 1, 3, &swapped, &c)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "all_to_all_v benchmark on rank 1: element 1 holds 3 where rank 0's 1 was due"
            ),
            "{e}"
        );
        let short = check_delivered("a2av", BenchOp::AllToAllV, 1, 3, &good[..2], &c)
            .unwrap_err()
            .to_string();
        assert!(
            short.contains("received 2 elements where 3 were due"),
            "{short}"
        );
    }

    #[test]
    fn sendrecv_receives_from_the_previous_rank_and_others_are_not_checked() {
        let none = counts(Vec::new());
        assert!(check_delivered("r", BenchOp::SendRecv, 2, 3, &[2.0; 5], &none).is_ok());
        assert!(check_delivered("r", BenchOp::SendRecv, 0, 2, &[2.0; 5], &none).is_ok());
        assert!(check_delivered("r", BenchOp::SendRecv, 0, 2, &[1.0; 5], &none).is_err());
        assert!(check_delivered("r", BenchOp::AllReduce, 0, 2, &[9.0], &none).is_ok());
    }
}
