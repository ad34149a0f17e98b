//! The symmetric-buffer side of a [`Communicator`]: allocating [`SymmetricBuffer`]s in this rank's window and the
//! collectives that read them in place (see [`crate::symmetric`]).

use std::sync::Arc;

use super::Communicator;
use crate::CommError;
use crate::backend::SymmetricOp;
use crate::element::{Element, ReduceOp};
use crate::symmetric::{SymmetricBuffer, Windows};
use crate::work::Work;

impl Communicator {
    /// A buffer of `len` copies of `value` in this rank's symmetric window, which the collectives that take one
    /// (like [`all_reduce_symmetric`](Self::all_reduce_symmetric)) read in place from the other ranks on this
    /// host. Every rank must allocate the same buffers in the same order (see [`crate::symmetric`]); dropping a
    /// buffer returns its space.
    ///
    /// Fails when the communicator has no window ([`CommOptions::symmetric_bytes`](crate::CommOptions) is 0) or
    /// the buffer does not fit what is left of it, saying how much is.
    pub fn symmetric_buffer<T: Element>(
        &self,
        len: usize,
        value: T,
    ) -> Result<SymmetricBuffer<T>, CommError> {
        SymmetricBuffer::new(Arc::clone(self.windows()?), len, value)
    }

    /// All-reduce in place over symmetric buffers: every rank's `buf` becomes the reduction of all ranks'. Each
    /// rank must pass the buffer it allocated alike (same offset and length), or all fail with
    /// [`CommError::Mismatch`]. Ranks that share a host work on each other's buffers without staging them: each
    /// reduces its part of every buffer and writes the result into all of them. The results are those of
    /// [`all_reduce`](Self::all_reduce), bit for bit on every rank.
    ///
    /// If the operation fails, the buffer's space stays out of later allocations (a peer may still be reading or
    /// writing it); so for the other collectives here.
    pub fn all_reduce_symmetric<T: Element>(
        &self,
        buf: SymmetricBuffer<T>,
        op: ReduceOp,
    ) -> Result<Work<SymmetricBuffer<T>>, CommError> {
        crate::buffer::host_reduces::<T>(self, "all_reduce_symmetric")?;
        crate::checks::reduction(self.name(), "all_reduce_symmetric", op, T::DTYPE)?;
        self.submit_symmetric(buf, SymmetricOp::AllReduce(op))
    }

    /// All-gather in place over symmetric buffers of `size()` equal blocks, this rank's (block `rank()`) filled
    /// in: every block gets filled, as [`all_gather`](Self::all_gather) does. Read in place, each rank copies
    /// every other block once, straight from its owner's buffer.
    pub fn all_gather_symmetric<T: Element>(
        &self,
        buf: SymmetricBuffer<T>,
    ) -> Result<Work<SymmetricBuffer<T>>, CommError> {
        self.check_multiple("all_gather_symmetric buffer", buf.len())?;
        self.submit_symmetric(buf, SymmetricOp::AllGather)
    }

    /// Reduce-scatter in place over symmetric buffers of `size()` equal blocks: block `rank()` becomes the
    /// reduction of every rank's block `rank()`, the other blocks are left unchanged, as
    /// [`reduce_scatter`](Self::reduce_scatter) does. Read in place, each rank reads its block of every buffer
    /// once and writes its own.
    pub fn reduce_scatter_symmetric<T: Element>(
        &self,
        buf: SymmetricBuffer<T>,
        op: ReduceOp,
    ) -> Result<Work<SymmetricBuffer<T>>, CommError> {
        self.check_multiple("reduce_scatter_symmetric buffer", buf.len())?;
        crate::buffer::host_reduces::<T>(self, "reduce_scatter_symmetric")?;
        crate::checks::reduction(self.name(), "reduce_scatter_symmetric", op, T::DTYPE)?;
        self.submit_symmetric(buf, SymmetricOp::ReduceScatter(op))
    }

    fn submit_symmetric<T: Element>(
        &self,
        mut buf: SymmetricBuffer<T>,
        op: SymmetricOp,
    ) -> Result<Work<SymmetricBuffer<T>>, CommError> {
        self.check_own(&buf)?;
        self.submit(
            move |b| match b.symmetric(op, buf.offset(), buf.bytes(), T::DTYPE) {
                Ok(()) => Ok(buf),
                Err(e) => {
                    buf.retire();
                    Err(e)
                }
            },
        )
        .map(Work::from)
    }

    fn windows(&self) -> Result<&Arc<Windows>, CommError> {
        self.windows.as_ref().ok_or_else(|| {
            self.invalid(
                "this communicator has no symmetric window: create it with \
                 CommOptions::symmetric_bytes set"
                    .into(),
            )
        })
    }

    /// Fails unless `buf` was allocated from this communicator's window.
    fn check_own<T: Element>(&self, buf: &SymmetricBuffer<T>) -> Result<(), CommError> {
        if Arc::ptr_eq(self.windows()?, buf.windows()) {
            Ok(())
        } else {
            Err(self.invalid(format!("{buf:?} belongs to another communicator's window")))
        }
    }
}
