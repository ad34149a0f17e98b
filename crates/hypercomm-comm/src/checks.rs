//! Argument checks shared by every communicator face (host and device): member lists, roots, peers, lengths, shrink
//! exclusions. They
//! run before anything is sent and name the communicator and the offending value.

use crate::CommError;
use crate::element::{DType, ReduceOp};

/// An `InvalidArgument` error for communicator `comm`.
pub(crate) fn invalid(comm: &str, what: String) -> CommError {
    CommError::InvalidArgument {
        comm: comm.to_owned(),
        what,
    }
}

/// `op` must have a meaning for elements of `dtype` in `what` (an operation's name): a premulsum's factor must
/// be a value of the type ([`ReduceOp::check_for`]).
pub(crate) fn reduction(
    comm: &str,
    what: &str,
    op: ReduceOp,
    dtype: DType,
) -> Result<(), CommError> {
    op.check_for(dtype)
        .map_err(|why| invalid(comm, format!("{what} of {dtype}: {why}")))
}

/// This rank's position in `ranks`, the member list of communicator `comm`: `me` must be in it, and no rank
/// twice.
pub(crate) fn member_position(comm: &str, ranks: &[usize], me: usize) -> Result<usize, CommError> {
    let rank = ranks.iter().position(|&r| r == me).ok_or_else(|| {
        invalid(
            comm,
            format!("rank {me} is not in the member list {ranks:?}"),
        )
    })?;
    let mut sorted = ranks.to_vec();
    sorted.sort_unstable();
    if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return Err(invalid(
            comm,
            format!("rank {} appears twice in the member list {ranks:?}", w[0]),
        ));
    }
    Ok(rank)
}

/// `root` must be a rank of a `size`-rank communicator.
pub(crate) fn root(comm: &str, size: usize, root: usize) -> Result<(), CommError> {
    if root >= size {
        return Err(invalid(
            comm,
            format!("root {root} is not a rank of a {size}-rank communicator"),
        ));
    }
    Ok(())
}

/// `peer` of a send or receive must be another rank of a `size`-rank communicator whose own rank is `rank`.
pub(crate) fn peer(comm: &str, size: usize, rank: usize, peer: usize) -> Result<(), CommError> {
    if peer >= size || peer == rank {
        return Err(invalid(
            comm,
            format!(
                "peer {peer} is not another rank of this {size}-rank communicator (this is rank {rank})"
            ),
        ));
    }
    Ok(())
}

/// A buffer (`what`) must have exactly `expected` elements.
pub(crate) fn len(comm: &str, what: &str, got: usize, expected: usize) -> Result<(), CommError> {
    if got != expected {
        return Err(invalid(
            comm,
            format!("{what} has {got} elements, expected {expected}"),
        ));
    }
    Ok(())
}

/// A shrink's exclusion list, sorted and checked: ranks of a `size`-rank communicator, no repeats, not the calling
/// `rank` (excluded ranks do not call shrink).
pub(crate) fn exclusions(
    comm: &str,
    size: usize,
    rank: usize,
    exclude: &[usize],
) -> Result<Vec<usize>, CommError> {
    let mut sorted = exclude.to_vec();
    sorted.sort_unstable();
    if let Some(&bad) = sorted.iter().find(|&&r| r >= size) {
        return Err(invalid(
            comm,
            format!(
                "shrink excludes rank {bad}, which is not a rank of a {size}-rank communicator"
            ),
        ));
    }
    if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return Err(invalid(
            comm,
            format!("shrink excludes rank {} twice in {exclude:?}", w[0]),
        ));
    }
    if sorted.binary_search(&rank).is_ok() {
        return Err(invalid(
            comm,
            format!(
                "rank {rank} called shrink but excludes itself in {exclude:?}; excluded ranks do not call shrink"
            ),
        ));
    }
    Ok(sorted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_position_refuses_strangers_and_duplicates() {
        assert_eq!(member_position("c", &[4, 7, 9], 7).unwrap(), 1);
        let e = member_position("c", &[4, 7], 5).unwrap_err().to_string();
        assert!(e.contains("rank 5 is not in the member list [4, 7]"), "{e}");
        let e = member_position("c", &[4, 7, 4], 7).unwrap_err().to_string();
        assert!(e.contains("rank 4 appears twice"), "{e}");
    }

    #[test]
    fn peers_are_other_ranks_and_roots_are_ranks() {
        assert!(peer("c", 3, 1, 2).is_ok());
        assert!(
            peer("c", 3, 1, 1)
                .unwrap_err()
                .to_string()
                .contains("peer 1 is not another rank")
        );
        assert!(peer("c", 3, 1, 3).is_err());
        assert!(root("c", 3, 2).is_ok());
        assert!(
            root("c", 3, 3)
                .unwrap_err()
                .to_string()
                .contains("root 3 is not a rank")
        );
    }
}
