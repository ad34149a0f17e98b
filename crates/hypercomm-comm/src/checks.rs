//! Argument checks shared by every communicator face (host and device): they run before anything is sent and name
//! the communicator and the offending value.

use crate::CommError;

/// An `InvalidArgument` error for communicator `comm`.
pub(crate) fn invalid(comm: &str, what: String) -> CommError {
    CommError::InvalidArgument {
        comm: comm.to_owned(),
        what,
    }
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
