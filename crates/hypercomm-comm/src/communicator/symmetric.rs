//! The symmetric-buffer side of a [`Communicator`]: allocating [`SymmetricBuffer`]s in this rank's window and the
//! collectives that read them in place (see [`crate::symmetric`]).

use std::sync::Arc;

use super::Communicator;
use crate::CommError;
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
    /// [`CommError::Mismatch`]. Ranks that share a host read each other's buffers without staging them; the
    /// results are those of [`all_reduce`](Self::all_reduce), bit for bit on every rank.
    ///
    /// If the operation fails, the buffer's space stays out of later allocations (a peer may still be reading
    /// it).
    pub fn all_reduce_symmetric<T: Element>(
        &self,
        mut buf: SymmetricBuffer<T>,
        op: ReduceOp,
    ) -> Result<Work<SymmetricBuffer<T>>, CommError> {
        self.check_own(&buf)?;
        self.submit(move |b| {
            match b.all_reduce_symmetric(buf.offset(), buf.bytes(), T::DTYPE, op) {
                Ok(()) => Ok(buf),
                Err(e) => {
                    buf.retire();
                    Err(e)
                }
            }
        })
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
