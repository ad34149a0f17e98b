//! The collectives and point-to-point operations of a [`Communicator`]: each checks its local arguments at once,
//! then becomes one job for the progress thread and returns its [`Work`] handle.

use super::{Communicator, InOut};
use crate::CommError;
use crate::backend::Io;
use crate::element::{Element, ReduceOp, as_bytes, as_bytes_mut};
use crate::work::Work;

impl Communicator {
    /// All-reduce in place: every rank ends with the reduction of all ranks' `buf`.
    pub fn all_reduce<T: Element>(
        &self,
        mut buf: Vec<T>,
        op: ReduceOp,
    ) -> Result<Work<Vec<T>>, CommError> {
        self.submit(move |b| {
            b.all_reduce(Io::InPlace(as_bytes_mut(&mut buf)), T::DTYPE, op)?;
            Ok(buf)
        })
    }

    /// All-reduce out of place: `output` (same length as `input`) receives the reduction. Returns `(input, output)`.
    pub fn all_reduce_into<T: Element>(
        &self,
        input: Vec<T>,
        mut output: Vec<T>,
        op: ReduceOp,
    ) -> Result<Work<InOut<T>>, CommError> {
        self.check_len("all_reduce output", output.len(), input.len())?;
        self.submit(move |b| {
            b.all_reduce(
                Io::OutOfPlace(as_bytes(&input), as_bytes_mut(&mut output)),
                T::DTYPE,
                op,
            )?;
            Ok((input, output))
        })
    }

    /// Broadcast in place: every rank's `buf` becomes `root`'s.
    pub fn broadcast<T: Element>(
        &self,
        mut buf: Vec<T>,
        root: usize,
    ) -> Result<Work<Vec<T>>, CommError> {
        self.check_root(root)?;
        self.submit(move |b| {
            b.broadcast(Io::InPlace(as_bytes_mut(&mut buf)), T::DTYPE, root)?;
            Ok(buf)
        })
    }

    /// Broadcast out of place: every rank's `output` becomes `root`'s `input` (read only at the root, where it
    /// must have `output`'s length). Returns `(input, output)`.
    pub fn broadcast_into<T: Element>(
        &self,
        input: Vec<T>,
        mut output: Vec<T>,
        root: usize,
    ) -> Result<Work<InOut<T>>, CommError> {
        self.check_root(root)?;
        if self.rank == root {
            self.check_len("broadcast input at the root", input.len(), output.len())?;
        }
        self.submit(move |b| {
            b.broadcast(
                Io::OutOfPlace(as_bytes(&input), as_bytes_mut(&mut output)),
                T::DTYPE,
                root,
            )?;
            Ok((input, output))
        })
    }

    /// Reduce in place: `root`'s `buf` becomes the reduction; other ranks' buffers are left unchanged.
    pub fn reduce<T: Element>(
        &self,
        mut buf: Vec<T>,
        op: ReduceOp,
        root: usize,
    ) -> Result<Work<Vec<T>>, CommError> {
        self.check_root(root)?;
        self.submit(move |b| {
            b.reduce(Io::InPlace(as_bytes_mut(&mut buf)), T::DTYPE, op, root)?;
            Ok(buf)
        })
    }

    /// Reduce out of place: the root's `output` (length of `input`) receives the reduction; elsewhere `output`
    /// is ignored and may be empty. Returns `(input, output)`.
    pub fn reduce_into<T: Element>(
        &self,
        input: Vec<T>,
        mut output: Vec<T>,
        op: ReduceOp,
        root: usize,
    ) -> Result<Work<InOut<T>>, CommError> {
        self.check_root(root)?;
        if self.rank == root {
            self.check_len("reduce output at the root", output.len(), input.len())?;
        }
        self.submit(move |b| {
            b.reduce(
                Io::OutOfPlace(as_bytes(&input), as_bytes_mut(&mut output)),
                T::DTYPE,
                op,
                root,
            )?;
            Ok((input, output))
        })
    }

    /// All-gather in place: `buf` holds `size()` equal blocks, this rank's filled in; every block gets filled.
    pub fn all_gather<T: Element>(&self, mut buf: Vec<T>) -> Result<Work<Vec<T>>, CommError> {
        self.check_multiple("all_gather buffer", buf.len())?;
        self.submit(move |b| {
            b.all_gather(Io::InPlace(as_bytes_mut(&mut buf)), T::DTYPE)?;
            Ok(buf)
        })
    }

    /// All-gather out of place into one buffer: `output` (`size() * input.len()`) receives every rank's `input`
    /// in rank order. Returns `(input, output)`.
    pub fn all_gather_into<T: Element>(
        &self,
        input: Vec<T>,
        mut output: Vec<T>,
    ) -> Result<Work<InOut<T>>, CommError> {
        self.check_len("all_gather output", output.len(), input.len() * self.size())?;
        self.submit(move |b| {
            b.all_gather(
                Io::OutOfPlace(as_bytes(&input), as_bytes_mut(&mut output)),
                T::DTYPE,
            )?;
            Ok((input, output))
        })
    }

    /// Reduce-scatter in place: `buf` holds `size()` equal blocks; block `rank()` becomes the reduction of every
    /// rank's block `rank()`. The other blocks are left unchanged.
    pub fn reduce_scatter<T: Element>(
        &self,
        mut buf: Vec<T>,
        op: ReduceOp,
    ) -> Result<Work<Vec<T>>, CommError> {
        self.check_multiple("reduce_scatter buffer", buf.len())?;
        self.submit(move |b| {
            b.reduce_scatter(Io::InPlace(as_bytes_mut(&mut buf)), T::DTYPE, op)?;
            Ok(buf)
        })
    }

    /// Reduce-scatter out of one buffer: `input` holds `size()` blocks of `output.len()`; `output` receives the
    /// reduction of every rank's block `rank()`. Returns `(input, output)`.
    pub fn reduce_scatter_into<T: Element>(
        &self,
        input: Vec<T>,
        mut output: Vec<T>,
        op: ReduceOp,
    ) -> Result<Work<InOut<T>>, CommError> {
        self.check_len(
            "reduce_scatter input",
            input.len(),
            output.len() * self.size(),
        )?;
        self.submit(move |b| {
            b.reduce_scatter(
                Io::OutOfPlace(as_bytes(&input), as_bytes_mut(&mut output)),
                T::DTYPE,
                op,
            )?;
            Ok((input, output))
        })
    }

    /// All-to-all in place with equal blocks: block `d` of `buf` goes to rank `d`, and block `s` is replaced by
    /// what rank `s` sent.
    pub fn all_to_all<T: Element>(&self, mut buf: Vec<T>) -> Result<Work<Vec<T>>, CommError> {
        self.check_multiple("all_to_all buffer", buf.len())?;
        self.submit(move |b| {
            b.all_to_all(Io::InPlace(as_bytes_mut(&mut buf)), T::DTYPE)?;
            Ok(buf)
        })
    }

    /// All-to-all out of place with equal blocks. Returns `(input, output)`.
    pub fn all_to_all_into<T: Element>(
        &self,
        input: Vec<T>,
        mut output: Vec<T>,
    ) -> Result<Work<InOut<T>>, CommError> {
        self.check_multiple("all_to_all input", input.len())?;
        self.check_len("all_to_all output", output.len(), input.len())?;
        self.submit(move |b| {
            b.all_to_all(
                Io::OutOfPlace(as_bytes(&input), as_bytes_mut(&mut output)),
                T::DTYPE,
            )?;
            Ok((input, output))
        })
    }

    /// All-to-all with per-peer counts: `input` holds `send_counts[d]` elements for each rank `d`, back to back;
    /// `output` receives `recv_counts[s]` elements from each rank `s`, back to back. Every rank's
    /// `send_counts[d]` must equal rank `d`'s `recv_counts` entry for it; otherwise every rank gets
    /// [`CommError::Mismatch`]. Returns `(input, output)`.
    pub fn all_to_all_v<T: Element>(
        &self,
        input: Vec<T>,
        send_counts: Vec<usize>,
        mut output: Vec<T>,
        recv_counts: Vec<usize>,
    ) -> Result<Work<InOut<T>>, CommError> {
        self.check_len("all_to_all_v send_counts", send_counts.len(), self.size())?;
        self.check_len("all_to_all_v recv_counts", recv_counts.len(), self.size())?;
        self.check_len("all_to_all_v input", input.len(), send_counts.iter().sum())?;
        self.check_len(
            "all_to_all_v output",
            output.len(),
            recv_counts.iter().sum(),
        )?;
        self.submit(move |b| {
            b.all_to_all_v(
                as_bytes(&input),
                &send_counts,
                as_bytes_mut(&mut output),
                &recv_counts,
                T::DTYPE,
            )?;
            Ok((input, output))
        })
    }

    /// Gather: the root's `output` (`size() * input.len()`) receives every rank's `input` in rank order; elsewhere
    /// `output` is ignored and may be empty. Returns `(input, output)`.
    pub fn gather<T: Element>(
        &self,
        input: Vec<T>,
        mut output: Vec<T>,
        root: usize,
    ) -> Result<Work<InOut<T>>, CommError> {
        self.check_root(root)?;
        if self.rank == root {
            self.check_len(
                "gather output at the root",
                output.len(),
                input.len() * self.size(),
            )?;
        }
        self.submit(move |b| {
            b.gather(as_bytes(&input), as_bytes_mut(&mut output), T::DTYPE, root)?;
            Ok((input, output))
        })
    }

    /// Scatter: rank `d`'s `output` receives block `d` of the root's `input` (`size() * output.len()` there;
    /// ignored elsewhere, may be empty). Returns `(input, output)`.
    pub fn scatter<T: Element>(
        &self,
        input: Vec<T>,
        mut output: Vec<T>,
        root: usize,
    ) -> Result<Work<InOut<T>>, CommError> {
        self.check_root(root)?;
        if self.rank == root {
            self.check_len(
                "scatter input at the root",
                input.len(),
                output.len() * self.size(),
            )?;
        }
        self.submit(move |b| {
            b.scatter(as_bytes(&input), as_bytes_mut(&mut output), T::DTYPE, root)?;
            Ok((input, output))
        })
    }

    fn check_peer(&self, peer: usize) -> Result<(), CommError> {
        crate::checks::peer(&self.name, self.size(), self.rank, peer)
    }

    /// Sends `buf` to `peer` with `tag`. Messages between two ranks arrive in order; the matching
    /// [`recv`](Self::recv) must name the same tag, type and length. A send may wait until the peer receives, so
    /// order sends and receives so that neither side waits on the other (as with NCCL).
    pub fn send<T: Element>(
        &self,
        buf: Vec<T>,
        peer: usize,
        tag: u64,
    ) -> Result<Work<Vec<T>>, CommError> {
        self.check_peer(peer)?;
        self.submit(move |b| {
            b.send(as_bytes(&buf), T::DTYPE, peer, tag)?;
            Ok(buf)
        })
    }

    /// Receives the next message from `peer` into `buf`. When that message has another tag, type or length, this
    /// fails with [`CommError::Mismatch`] and leaves the message for a later receive.
    pub fn recv<T: Element>(
        &self,
        mut buf: Vec<T>,
        peer: usize,
        tag: u64,
    ) -> Result<Work<Vec<T>>, CommError> {
        self.check_peer(peer)?;
        self.submit(move |b| {
            b.recv(as_bytes_mut(&mut buf), T::DTYPE, peer, tag)?;
            Ok(buf)
        })
    }

    /// Fault injection for tests, not part of the supported API: once the operations issued before it are done,
    /// drops this rank's connection to `peer` as a failing network would (TCP transport only; shared memory
    /// refuses). The next operation involving `peer` fails on both sides.
    #[doc(hidden)]
    pub fn inject_connection_drop(&self, peer: usize) -> Result<Work<()>, CommError> {
        self.check_peer(peer)?;
        self.submit(move |b| b.sever(peer))
    }

    /// Completes once every rank has issued it.
    pub fn barrier(&self) -> Result<Work<()>, CommError> {
        self.submit(|b| b.barrier())
    }
}
