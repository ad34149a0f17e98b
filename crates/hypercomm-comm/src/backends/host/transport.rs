//! The one primitive the host algorithms are written against: a synchronous round in which every rank publishes
//! some bytes and then reads parts of what the others published.
//!
//! Shared memory implements a round as "copy into my slot, announce, wait for everyone, read their slots"; TCP as
//! "send each peer the parts it wants, receive the parts I want". Because every round carries the operation
//! [`Header`], ranks that called different operations are caught in the first round of the operation, by every
//! rank, before any data is consumed.

use std::ops::Range;

use super::cross_memory::Attach;
use super::header::Header;
use crate::CommError;
use crate::backend::{Payload, Progress};

/// One message of [`Transport::exchange`]: to or from `peer`, under `header`.
pub(crate) struct Message<'a> {
    /// The other rank.
    pub peer: usize,
    /// What both sides must agree on (type, length, tag).
    pub header: Header,
    /// The bytes sent, or where the received ones land.
    pub payload: Payload<'a>,
}

/// One piece of what a rank publishes: a byte range of the operation's input or of its output buffer.
#[derive(Clone, Debug)]
pub(crate) enum Seg {
    /// A range of the read-only input buffer (out-of-place operations).
    In(Range<usize>),
    /// A range of the output buffer (in-place operations, or results computed in an earlier round).
    Out(Range<usize>),
}

/// What a round publishes and who reads what.
pub(crate) struct Round<'a> {
    /// The operation; every rank must publish an identical header.
    pub header: Header,
    /// This rank's publication: the concatenation of these segments.
    pub publish: Vec<Seg>,
    /// `wants(src, dst)`: the byte ranges of `src`'s publication that `dst` reads, ascending and disjoint.
    /// Transports that copy only what is read (TCP) call it; shared memory exposes the whole publication.
    pub wants: &'a dyn Fn(usize, usize) -> Vec<Range<usize>>,
}

/// Read access to the peers' publications during a round.
pub(crate) trait Peers {
    /// Bytes `range` of `src`'s publication. `range` must lie within what `wants(src, me)` declared.
    fn get(&self, src: usize, range: Range<usize>) -> Result<&[u8], CommError>;
}

/// The consumer of a round: gets the output buffer and the peers' publications.
pub(crate) type Consume<'c> = dyn FnMut(&mut [u8], &dyn Peers) -> Result<(), CommError> + 'c;

/// A way for the ranks of one communicator to run rounds and exchange point-to-point messages.
pub(crate) trait Transport: Send {
    /// This rank, and the number of ranks.
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// The largest publication a round may carry, in bytes.
    fn capacity(&self) -> usize;
    /// Runs one round. `input` backs [`Seg::In`], `out` backs [`Seg::Out`] and is handed to `consume`, which runs
    /// only when every rank's header matches; otherwise every rank returns [`CommError::Mismatch`].
    fn round(
        &mut self,
        round: &Round<'_>,
        input: &[u8],
        out: &mut [u8],
        consume: &mut Consume<'_>,
    ) -> Result<(), CommError>;
    /// Sends and receives every message at once: no message waits for another to complete, so two ranks that
    /// send each other large messages in one exchange both finish. Messages with the same peer and direction
    /// go in their order, as separate sends and receives would.
    fn exchange(&mut self, messages: &mut [Message<'_>]) -> Result<(), CommError> {
        let mut progress = Progress::new(messages.len());
        while !self.exchange_some(messages, &mut progress, &|| false)? {}
        Ok(())
    }
    /// [`exchange`](Self::exchange) in steps: moves the messages as far as they go from where `progress` says
    /// they are, and returns `Ok(true)` once all are complete. It returns `Ok(false)` instead of waiting when
    /// `pause` holds (the caller has more messages for the exchange) or when a message completed during this call
    /// (the caller may hand its buffer back), having recorded how far every message came; the caller calls again
    /// with the same messages in the same order, and possibly more appended. A wait that moves nothing for the
    /// communicator's timeout fails, as a blocking exchange's would.
    fn exchange_some(
        &mut self,
        messages: &mut [Message<'_>],
        progress: &mut Progress,
        pause: &dyn Fn() -> bool,
    ) -> Result<bool, CommError>;
    /// Tells the peers this rank gives up, so that their waits fail at once.
    fn abort(&mut self);
    /// Fails with [`CommError::AbortedByPeer`] (naming the peer's root cause) once a peer has given up, for
    /// transports that can tell without waiting; the others never fail here.
    fn peer_aborted(&self, during: &str) -> Result<(), CommError> {
        let _ = during;
        Ok(())
    }
    /// This rank's side of reading the peers' buffers where they are ([`cross_memory`](super::cross_memory)),
    /// for transports whose ranks share a host; `None` for the others.
    fn attach(&mut self) -> Option<&mut Attach> {
        None
    }
    /// Fault injection for tests: drops the connection to `peer` the way a failing network would. Transports
    /// without per-peer connections refuse with [`CommError::InvalidArgument`].
    fn sever(&mut self, peer: usize) -> Result<(), CommError>;
}

/// Resolves a publication's segments to byte slices.
pub(crate) fn resolve<'b>(
    segs: &[Seg],
    input: &'b [u8],
    out: &'b [u8],
) -> Result<Vec<&'b [u8]>, Range<usize>> {
    segs.iter()
        .map(|s| match s {
            Seg::In(r) => input.get(r.clone()).ok_or_else(|| r.clone()),
            Seg::Out(r) => out.get(r.clone()).ok_or_else(|| r.clone()),
        })
        .collect()
}
