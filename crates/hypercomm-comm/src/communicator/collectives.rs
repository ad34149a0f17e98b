//! The face's operations: each names its [`Op`], and [`Communicator::one`] or [`Communicator::two`] checks it once
//! and hands it to the flavor the buffers' type names. Every operation takes host vectors and device buffers alike
//! and gives the same type back through its [`Work`].
//!
//! On a device buffer NCCL's rules apply where they differ from the host's: point-to-point messages have no tags
//! (tag 0 only), and the in-place all-to-all is refused (NCCL's sends and receives cannot share one buffer).

use super::Communicator;
use crate::CommError;
use crate::buffer::Buffer;
use crate::element::{Element, ReduceOp};
use crate::op::{Op, Shape};
use crate::work::Work;

impl Communicator {
    /// Checks `op` on one buffer read and overwritten, then runs it on the buffer's flavor.
    fn one<B: Buffer>(&self, op: Op, buf: B) -> Result<Work<B>, CommError> {
        op.check(self.group(), Shape::InPlace(buf.len()))?;
        op.check_elements(self.name(), B::Elem::DTYPE)?;
        B::run_one(self, op, buf)
    }

    /// Checks `op` on an input and an output buffer, then runs it on their flavor.
    fn two<B: Buffer>(&self, op: Op, input: B, output: B) -> Result<Work<(B, B)>, CommError> {
        op.check(
            self.group(),
            Shape::OutOfPlace {
                input: input.len(),
                output: output.len(),
            },
        )?;
        op.check_elements(self.name(), B::Elem::DTYPE)?;
        B::run_two(self, op, input, output)
    }

    /// All-reduce in place: every rank ends with the reduction of all ranks' `buf`.
    pub fn all_reduce<B: Buffer>(&self, buf: B, op: ReduceOp) -> Result<Work<B>, CommError> {
        self.one(Op::AllReduce(op), buf)
    }

    /// All-reduce out of place: `output` (same length as `input`) receives the reduction. Returns `(input, output)`.
    pub fn all_reduce_into<B: Buffer>(
        &self,
        input: B,
        output: B,
        op: ReduceOp,
    ) -> Result<Work<(B, B)>, CommError> {
        self.two(Op::AllReduce(op), input, output)
    }

    /// Broadcast in place: every rank's `buf` becomes `root`'s.
    pub fn broadcast<B: Buffer>(&self, buf: B, root: usize) -> Result<Work<B>, CommError> {
        self.one(Op::Broadcast { root }, buf)
    }

    /// Broadcast out of place: every rank's `output` becomes `root`'s `input` (read only at the root, where it
    /// must have `output`'s length). Returns `(input, output)`.
    pub fn broadcast_into<B: Buffer>(
        &self,
        input: B,
        output: B,
        root: usize,
    ) -> Result<Work<(B, B)>, CommError> {
        self.two(Op::Broadcast { root }, input, output)
    }

    /// Reduce in place: `root`'s `buf` becomes the reduction; other ranks' buffers are left unchanged.
    pub fn reduce<B: Buffer>(
        &self,
        buf: B,
        op: ReduceOp,
        root: usize,
    ) -> Result<Work<B>, CommError> {
        self.one(Op::Reduce { op, root }, buf)
    }

    /// Reduce out of place: the root's `output` (length of `input`) receives the reduction; elsewhere `output`
    /// is ignored and may be empty. Returns `(input, output)`.
    pub fn reduce_into<B: Buffer>(
        &self,
        input: B,
        output: B,
        op: ReduceOp,
        root: usize,
    ) -> Result<Work<(B, B)>, CommError> {
        self.two(Op::Reduce { op, root }, input, output)
    }

    /// All-gather in place: `buf` holds `size()` equal blocks, this rank's filled in; every block gets filled.
    pub fn all_gather<B: Buffer>(&self, buf: B) -> Result<Work<B>, CommError> {
        self.one(Op::AllGather, buf)
    }

    /// All-gather out of place into one buffer: `output` (`size() * input.len()`) receives every rank's `input`
    /// in rank order. Returns `(input, output)`.
    pub fn all_gather_into<B: Buffer>(
        &self,
        input: B,
        output: B,
    ) -> Result<Work<(B, B)>, CommError> {
        self.two(Op::AllGather, input, output)
    }

    /// Reduce-scatter in place: `buf` holds `size()` equal blocks; block `rank()` becomes the reduction of every
    /// rank's block `rank()`. The other blocks are left unchanged.
    pub fn reduce_scatter<B: Buffer>(&self, buf: B, op: ReduceOp) -> Result<Work<B>, CommError> {
        self.one(Op::ReduceScatter(op), buf)
    }

    /// Reduce-scatter out of one buffer: `input` holds `size()` blocks of `output.len()`; `output` receives the
    /// reduction of every rank's block `rank()`. Returns `(input, output)`.
    pub fn reduce_scatter_into<B: Buffer>(
        &self,
        input: B,
        output: B,
        op: ReduceOp,
    ) -> Result<Work<(B, B)>, CommError> {
        self.two(Op::ReduceScatter(op), input, output)
    }

    /// All-to-all in place with equal blocks: block `d` of `buf` goes to rank `d`, and block `s` is replaced by
    /// what rank `s` sent.
    pub fn all_to_all<B: Buffer>(&self, buf: B) -> Result<Work<B>, CommError> {
        self.one(Op::AllToAll, buf)
    }

    /// All-to-all out of place with equal blocks. Returns `(input, output)`.
    pub fn all_to_all_into<B: Buffer>(
        &self,
        input: B,
        output: B,
    ) -> Result<Work<(B, B)>, CommError> {
        self.two(Op::AllToAll, input, output)
    }

    /// All-to-all with per-peer counts: `input` holds `send_counts[d]` elements for each rank `d`, back to back;
    /// `output` receives `recv_counts[s]` elements from each rank `s`, back to back. Every rank's
    /// `send_counts[d]` must equal rank `d`'s `recv_counts` entry for it. On host vectors a disagreement gives
    /// every rank [`CommError::Mismatch`]; on device buffers NCCL does not exchange the counts, so it surfaces as
    /// an NCCL error or as the communicator's timeout in [`Work::wait`]. Zero counts are allowed. Returns
    /// `(input, output)`.
    pub fn all_to_all_v<B: Buffer>(
        &self,
        input: B,
        send_counts: Vec<usize>,
        output: B,
        recv_counts: Vec<usize>,
    ) -> Result<Work<(B, B)>, CommError> {
        self.two(
            Op::AllToAllV {
                send_counts,
                recv_counts,
            },
            input,
            output,
        )
    }

    /// All-gather with per-rank counts: rank `r` contributes `counts[r]` elements (its `input`), and every rank's
    /// `output` (`counts`' sum) receives every rank's in rank order. Counts may be zero; every rank passes the
    /// same `counts`. Returns `(input, output)`.
    pub fn all_gather_v<B: Buffer>(
        &self,
        input: B,
        output: B,
        counts: Vec<usize>,
    ) -> Result<Work<(B, B)>, CommError> {
        self.two(Op::AllGatherV { counts }, input, output)
    }

    /// Reduce-scatter with per-rank counts: `input` (`counts`' sum) holds one block per rank, block `r` of
    /// `counts[r]` elements, and rank `r`'s `output` (`counts[r]`) receives the reduction of every rank's block
    /// `r`. Counts may be zero; every rank passes the same `counts`. Returns `(input, output)`.
    pub fn reduce_scatter_v<B: Buffer>(
        &self,
        input: B,
        output: B,
        counts: Vec<usize>,
        op: ReduceOp,
    ) -> Result<Work<(B, B)>, CommError> {
        self.two(Op::ReduceScatterV { op, counts }, input, output)
    }

    /// Gather: the root's `output` (`size() * input.len()`) receives every rank's `input` in rank order; elsewhere
    /// `output` is ignored and may be empty. Returns `(input, output)`.
    pub fn gather<B: Buffer>(
        &self,
        input: B,
        output: B,
        root: usize,
    ) -> Result<Work<(B, B)>, CommError> {
        self.two(Op::Gather { root }, input, output)
    }

    /// Scatter: rank `d`'s `output` receives block `d` of the root's `input` (`size() * output.len()` there;
    /// ignored elsewhere, may be empty). Returns `(input, output)`.
    pub fn scatter<B: Buffer>(
        &self,
        input: B,
        output: B,
        root: usize,
    ) -> Result<Work<(B, B)>, CommError> {
        self.two(Op::Scatter { root }, input, output)
    }

    /// Sends `buf` to `peer` with `tag`. Messages between two ranks arrive in order; the matching
    /// [`recv`](Self::recv) must name the same tag, type and length.
    ///
    /// On host buffers, sends and receives issued one after another (with no collective between them) progress
    /// together, as gloo's `isend`/`irecv` do, and each completes on its own: ranks that each send before they
    /// receive, whatever the sizes, all complete once every rank has issued both. On NCCL a send waits until the
    /// peer receives and device operations run in issue order, so two ranks that each send before they receive
    /// wait on each other: exchange with [`batch`](Self::batch), one NCCL group, instead. On a device buffer the tag
    /// must be 0: NCCL matches messages by order alone.
    pub fn send<B: Buffer>(&self, buf: B, peer: usize, tag: u64) -> Result<Work<B>, CommError> {
        self.one(Op::Send { peer, tag }, buf)
    }

    /// Receives the next message from `peer` into `buf`. When that message has another tag, type or length, this
    /// fails with [`CommError::Mismatch`] and leaves the message for a later receive.
    pub fn recv<B: Buffer>(&self, buf: B, peer: usize, tag: u64) -> Result<Work<B>, CommError> {
        self.one(Op::Recv { peer, tag }, buf)
    }

    /// Fault injection for tests, not part of the supported API: once the operations issued before it are done,
    /// drops this rank's connection to `peer` as a failing network would (TCP transport only; shared memory
    /// refuses). The next operation involving `peer` fails on both sides.
    #[doc(hidden)]
    pub fn inject_connection_drop(&self, peer: usize) -> Result<Work<()>, CommError> {
        crate::checks::peer(&self.name, self.size(), self.rank, peer)?;
        self.submit(move |b| b.sever(peer)).map(Work::from)
    }

    /// Completes once every rank has issued it. On a communicator with a GPU it also orders device work: it
    /// completes after the device operations this rank issued before it have finished (bounded by the timeout),
    /// so after the barrier every rank's earlier device work is done.
    pub fn barrier(&self) -> Result<Work<()>, CommError> {
        let fence = self.device_fence()?;
        self.submit(move |b| {
            if let Some(fence) = fence {
                fence.synchronize()?;
            }
            b.barrier()
        })
        .map(Work::from)
    }
}
