//! The host flavor's interface: collectives over byte views plus an element type, and [`execute`], which runs an
//! [`Op`] on it.
//!
//! [`Communicator`](crate::Communicator) validates lengths, roots and peers ([`Op::check`]), converts typed
//! buffers to bytes and runs [`execute`] on its progress thread, one operation at a time in issue order (point-to-point operations
//! issued back to back run together, in steps of [`Backend::p2p_step`]). A backend
//! may therefore assume well-formed local arguments; it must still detect ranks that disagree with each other.

use std::sync::Arc;
use std::time::Instant;

use crate::CommError;
use crate::element::{DType, ReduceOp, as_bytes, as_bytes_mut};
use crate::op::Op;
use crate::reduce::{Src, reduce};
use crate::symmetric::Windows;

/// Where a collective reads and writes.
pub(crate) enum Io<'a> {
    /// One buffer, read and overwritten.
    InPlace(&'a mut [u8]),
    /// Separate input and output.
    OutOfPlace(&'a [u8], &'a mut [u8]),
}

/// What one part of a batch moves: bytes sent, or bytes received.
pub(crate) enum Payload<'a> {
    /// Sent to the part's peer.
    Out(&'a [u8]),
    /// Filled from the part's peer.
    In(&'a mut [u8]),
}

/// One part of a batch of point-to-point messages.
pub(crate) struct Part<'a> {
    /// The other rank.
    pub peer: usize,
    /// The tag both sides name.
    pub tag: u64,
    /// The reduction the receiver applies to what it gets, which both sides name too (the uneven
    /// reduce-scatter's parts), so that ranks passing different ones disagree; `None` for plain messages.
    pub op: Option<ReduceOp>,
    /// The bytes.
    pub payload: Payload<'a>,
}

/// How far one message of an exchange has come. A message that has not started is the default: nothing moved,
/// not complete, stage 0.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct MessageProgress {
    /// How far the message has come, in the transport's own unit (mailbox pieces, bytes written).
    pub moved: usize,
    /// Whether the message is complete.
    pub done: bool,
    /// The transport's own note of where the message stands (how shared memory tells a message it hands over by
    /// address from one it streams).
    pub stage: u8,
}

/// How far the messages of an exchange have come, kept between the steps of
/// [`Backend::p2p_step`] so that an exchange can stop, take more messages and go on.
pub(crate) struct Progress {
    /// One entry per message, in the exchange's order.
    pub messages: Vec<MessageProgress>,
    /// Since when the exchange has waited without moving anything: its timeout runs from here.
    pub stalled_since: Option<Instant>,
}

impl Progress {
    /// The progress of `n` messages that have not started.
    pub(crate) fn new(n: usize) -> Progress {
        Progress {
            messages: vec![MessageProgress::default(); n],
            stalled_since: None,
        }
    }

    /// Makes room for messages appended to the exchange, up to `n` in all.
    pub(crate) fn grow(&mut self, n: usize) {
        if n > self.messages.len() {
            self.messages.resize(n, MessageProgress::default());
        }
    }

    /// Appends the progress of the messages of another exchange, issued after this one's.
    pub(crate) fn append(&mut self, other: Progress) {
        self.messages.extend(other.messages);
    }

    /// Keeps the messages `keep` marks (the others left the exchange), in their order; messages past the end of
    /// `keep` stay.
    pub(crate) fn retain(&mut self, keep: &[bool]) {
        let mut keep = keep.iter().copied();
        self.messages.retain(|_| keep.next().unwrap_or(true));
    }

    /// Whether every message is complete.
    pub(crate) fn finished(&self) -> bool {
        self.messages.iter().all(|m| m.done)
    }

    /// Notes that the exchange moved something: a later wait's timeout starts afresh.
    pub(crate) fn moved_now(&mut self) {
        self.stalled_since = None;
    }

    /// When the current wait began (now, if the exchange was moving until now).
    pub(crate) fn stalled(&mut self) -> Instant {
        *self.stalled_since.get_or_insert_with(Instant::now)
    }
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
    /// Every part at once: sends and receives to and from any peers progress together, so no order of the parts,
    /// here or on the peers, makes one wait on another; returns when all are done. Parts with the same peer and
    /// direction go in their order.
    fn batch(&mut self, parts: &mut [Part<'_>], dtype: DType) -> Result<(), CommError>;
    /// One step of a point-to-point exchange that may grow between steps (each part with its element type): moves
    /// the parts from where `progress` says they are, and returns `Ok(true)` once all are complete, or `Ok(false)`
    /// where it would wait and `pause` holds or a part completed in this step. The caller calls again with the same
    /// parts in the same order (less those it took out with [`Progress::retain`]) and possibly more appended.
    fn p2p_step(
        &mut self,
        parts: &mut [(Part<'_>, DType)],
        progress: &mut Progress,
        pause: &dyn Fn() -> bool,
    ) -> Result<bool, CommError>;
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
    /// This rank's rank in the communicator.
    fn rank(&self) -> usize;
}

/// Runs `op` (checked by the face) on `backend` over `io`: the host flavor's executor.
pub(crate) fn execute(
    backend: &mut dyn Backend,
    op: &Op,
    io: Io<'_>,
    dtype: DType,
) -> Result<(), CommError> {
    match (op, io) {
        (Op::AllReduce(op), io) => backend.all_reduce(io, dtype, *op),
        (Op::Broadcast { root }, io) => backend.broadcast(io, dtype, *root),
        (Op::Reduce { op, root }, io) => backend.reduce(io, dtype, *op, *root),
        (Op::AllGather, io) => backend.all_gather(io, dtype),
        (Op::ReduceScatter(op), io) => backend.reduce_scatter(io, dtype, *op),
        (Op::AllToAll, io) => backend.all_to_all(io, dtype),
        (
            Op::AllToAllV {
                send_counts,
                recv_counts,
            },
            Io::OutOfPlace(input, output),
        ) => backend.all_to_all_v(input, send_counts, output, recv_counts, dtype),
        (Op::AllGatherV { counts }, Io::OutOfPlace(input, output)) => {
            all_gather_v(backend, input, counts, output, dtype)
        }
        (Op::ReduceScatterV { op, counts }, Io::OutOfPlace(input, output)) => {
            reduce_scatter_v(backend, input, counts, output, dtype, *op)
        }
        (Op::Gather { root }, Io::OutOfPlace(input, output)) => {
            backend.gather(input, output, dtype, *root)
        }
        (Op::Scatter { root }, Io::OutOfPlace(input, output)) => {
            backend.scatter(input, output, dtype, *root)
        }
        // Point-to-point operations run on the communicator's lane, in steps of `Backend::p2p_step`, so that those
        // issued back to back progress together; reaching here is a bug, reported rather than run.
        (op @ (Op::Send { .. } | Op::Recv { .. } | Op::Batch(_)), _) => {
            Err(CommError::InvalidArgument {
                comm: String::new(),
                what: format!("{} runs through Backend::p2p_step, not execute", op.name()),
            })
        }
        // The face's checks refuse these in place; reaching here is a bug, reported rather than run.
        (
            op @ (Op::AllToAllV { .. }
            | Op::AllGatherV { .. }
            | Op::ReduceScatterV { .. }
            | Op::Gather { .. }
            | Op::Scatter { .. }),
            Io::InPlace(_),
        ) => Err(CommError::InvalidArgument {
            comm: String::new(),
            what: format!("{} needs separate input and output buffers", op.name()),
        }),
    }
}

/// The tag of the messages the uneven collectives exchange, which no user message should name: a user message
/// met in their place shows as a mismatch instead of being taken for data.
const UNEVEN_TAG: u64 = u64::MAX;

/// `output` split into one block per rank of `counts[r]` elements of `width` bytes.
fn blocks<'a>(mut output: &'a mut [u8], counts: &[usize], width: usize) -> Vec<&'a mut [u8]> {
    counts
        .iter()
        .map(|&c| {
            let (block, rest) = std::mem::take(&mut output).split_at_mut(c * width);
            output = rest;
            block
        })
        .collect()
}

/// All-gather with per-rank counts on the host: this rank's block is copied into place and every other block
/// arrives in one batch, in which this rank also sends its input to every peer.
fn all_gather_v(
    backend: &mut dyn Backend,
    input: &[u8],
    counts: &[usize],
    output: &mut [u8],
    dtype: DType,
) -> Result<(), CommError> {
    let me = backend.rank();
    let mut parts = Vec::with_capacity(2 * counts.len());
    for (r, block) in blocks(output, counts, dtype.size()).into_iter().enumerate() {
        if r == me {
            block.copy_from_slice(input);
            continue;
        }
        parts.push(Part {
            peer: r,
            tag: UNEVEN_TAG,
            op: None,
            payload: Payload::Out(input),
        });
        parts.push(Part {
            peer: r,
            tag: UNEVEN_TAG,
            op: None,
            payload: Payload::In(block),
        });
    }
    backend.batch(&mut parts, dtype)
}

/// Reduce-scatter with per-rank counts on the host: block `r` of the input goes to rank `r` in one batch, and this
/// rank reduces what arrives with its own block, in rank order. Every part names `op`, so ranks that pass
/// different reductions (or premulsum factors) fail with a mismatch rather than reduce with different ones.
fn reduce_scatter_v(
    backend: &mut dyn Backend,
    input: &[u8],
    counts: &[usize],
    output: &mut [u8],
    dtype: DType,
    op: ReduceOp,
) -> Result<(), CommError> {
    let (me, width) = (backend.rank(), dtype.size());
    let bytes = counts[me] * width;
    // Backed by u64s, so that the reduction's typed view of every element type is aligned.
    let mut received: Vec<Vec<u64>> = counts
        .iter()
        .map(|_| vec![0u64; bytes.div_ceil(8)])
        .collect();
    let mut offset = 0;
    let mut parts = Vec::with_capacity(2 * counts.len());
    for (r, (&count, theirs)) in counts.iter().zip(received.iter_mut()).enumerate() {
        let block = &input[offset..offset + count * width];
        offset += count * width;
        if r == me {
            continue;
        }
        parts.push(Part {
            peer: r,
            tag: UNEVEN_TAG,
            op: Some(op),
            payload: Payload::Out(block),
        });
        parts.push(Part {
            peer: r,
            tag: UNEVEN_TAG,
            op: Some(op),
            payload: Payload::In(&mut as_bytes_mut(theirs)[..bytes]),
        });
    }
    backend.batch(&mut parts, dtype)?;
    drop(parts);
    let own_start: usize = counts[..me].iter().sum::<usize>() * width;
    let own = &input[own_start..own_start + bytes];
    let srcs: Vec<Src<'_>> = (0..counts.len())
        .map(|r| {
            Src::Bytes(if r == me {
                own
            } else {
                &as_bytes(&received[r])[..bytes]
            })
        })
        .collect();
    reduce(dtype, op, &srcs, output, counts.len()).map_err(|fault| CommError::Protocol {
        comm: String::new(),
        what: format!("reduce_scatter_v's local reduction failed: {fault:?}"),
    })
}
