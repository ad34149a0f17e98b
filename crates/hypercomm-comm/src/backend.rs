//! The internal interface every backend implements: collectives over byte views plus an element type.
//!
//! [`Communicator`](crate::Communicator) validates lengths, roots and peers, converts typed buffers to bytes and
//! calls these methods on its progress thread, one at a time in issue order. A backend may therefore assume
//! well-formed local arguments; it must still detect ranks that disagree with each other.

use std::sync::Arc;

use crate::CommError;
use crate::element::{DType, ReduceOp};
use crate::symmetric::Windows;

/// Where a collective reads and writes.
pub(crate) enum Io<'a> {
    /// One buffer, read and overwritten.
    InPlace(&'a mut [u8]),
    /// Separate input and output.
    OutOfPlace(&'a [u8], &'a mut [u8]),
}

/// The collectives that take symmetric buffers (see [`crate::symmetric`]), all in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SymmetricOp {
    AllReduce(ReduceOp),
    AllGather,
    ReduceScatter(ReduceOp),
}

/// A backend's collectives. Shapes (per operation, with `n` ranks and the caller's rank `r`):
///
/// - `all_gather`: in place, one buffer of `n` blocks with block `r` filled; out of place, a block in and `n` out.
/// - `reduce_scatter`: in place, `n` blocks whose block `r` receives the result; out of place, `n` in and one out.
/// - `all_to_all`: `n` equal blocks in and out; block `d` goes to rank `d`.
/// - `gather`/`scatter`: the root's side has `n` blocks; the other side one.
pub(crate) trait Backend: Send {
    fn all_reduce(&mut self, io: Io<'_>, dtype: DType, op: ReduceOp) -> Result<(), CommError>;
    fn broadcast(&mut self, io: Io<'_>, dtype: DType, root: usize) -> Result<(), CommError>;
    fn reduce(
        &mut self,
        io: Io<'_>,
        dtype: DType,
        op: ReduceOp,
        root: usize,
    ) -> Result<(), CommError>;
    fn all_gather(&mut self, io: Io<'_>, dtype: DType) -> Result<(), CommError>;
    fn reduce_scatter(&mut self, io: Io<'_>, dtype: DType, op: ReduceOp) -> Result<(), CommError>;
    fn all_to_all(&mut self, io: Io<'_>, dtype: DType) -> Result<(), CommError>;
    #[allow(clippy::too_many_arguments)]
    fn all_to_all_v(
        &mut self,
        input: &[u8],
        send_counts: &[usize],
        output: &mut [u8],
        recv_counts: &[usize],
        dtype: DType,
    ) -> Result<(), CommError>;
    fn gather(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        dtype: DType,
        root: usize,
    ) -> Result<(), CommError>;
    fn scatter(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        dtype: DType,
        root: usize,
    ) -> Result<(), CommError>;
    fn send(&mut self, data: &[u8], dtype: DType, peer: usize, tag: u64) -> Result<(), CommError>;
    fn recv(
        &mut self,
        data: &mut [u8],
        dtype: DType,
        peer: usize,
        tag: u64,
    ) -> Result<(), CommError>;
    fn barrier(&mut self) -> Result<(), CommError>;
    /// The in-place collective `op` over the symmetric buffers of `bytes` at byte `offset` of every rank's window
    /// (the windows [`symmetric_windows`](Self::symmetric_windows) returns, which must exist). Shapes as for the
    /// in-place forms of the ordinary collectives.
    fn symmetric(
        &mut self,
        op: SymmetricOp,
        offset: usize,
        bytes: usize,
        dtype: DType,
    ) -> Result<(), CommError>;
    /// The symmetric windows, when the options asked for them.
    fn symmetric_windows(&self) -> Option<Arc<Windows>>;
    /// Gives up: tells the peers (so their waits fail at once) and releases transport resources.
    fn abort(&mut self);
    /// Fault injection for tests: drops the connection to `peer`, if the backend has one.
    fn sever(&mut self, peer: usize) -> Result<(), CommError>;
    /// The transport in use, for diagnostics (`"shm"`, `"tcp"`).
    fn transport_name(&self) -> &'static str;
}
