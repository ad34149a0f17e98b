//! [`Communicator::batch`]: several sends and receives, to and from several peers, issued as one operation that
//! progresses every part at once and completes as a whole, and [`P2p`], one part of it.
//!
//! This is what pipeline parallelism (send to the next stage and receive from the previous one, Megatron's
//! `batch_isend_irecv`) and ring context parallelism need: two ranks that each send before they receive, or send
//! each other large messages, would wait on each other as separate blocking operations; as parts of one batch
//! they cannot. On NCCL a batch is one group of `ncclSend`/`ncclRecv`; on the host every part is progressed
//! together.

use super::Communicator;
use crate::CommError;
use crate::buffer::Buffer;
use crate::op::{Message, Op, Shape};
use crate::work::Work;

/// One part of a [`Communicator::batch`]: a send of `buf` to `peer`, or a receive into `buf` from `peer`.
///
/// `peer` is a rank of the communicator other than this one. Parts with the same peer and direction are matched
/// in their order; on host buffers `tag` must equal the other side's, on device buffers it must be 0 (NCCL
/// matches by order alone).
#[derive(Debug)]
pub enum P2p<B> {
    /// Send `buf` to `peer`.
    Send {
        /// The data.
        buf: B,
        /// The receiving rank.
        peer: usize,
        /// The tag the receive names.
        tag: u64,
    },
    /// Receive into `buf` from `peer`; `buf`'s length is the message's.
    Recv {
        /// Where the data lands.
        buf: B,
        /// The sending rank.
        peer: usize,
        /// The tag the send names.
        tag: u64,
    },
}

impl<B> P2p<B> {
    /// A send of `buf` to `peer` with tag 0.
    pub fn send(buf: B, peer: usize) -> P2p<B> {
        P2p::Send { buf, peer, tag: 0 }
    }

    /// A receive into `buf` from `peer` with tag 0.
    pub fn recv(buf: B, peer: usize) -> P2p<B> {
        P2p::Recv { buf, peer, tag: 0 }
    }

    /// The part's buffer.
    pub fn buf(&self) -> &B {
        match self {
            P2p::Send { buf, .. } | P2p::Recv { buf, .. } => buf,
        }
    }

    /// The part's buffer, taken out.
    pub fn into_buf(self) -> B {
        match self {
            P2p::Send { buf, .. } | P2p::Recv { buf, .. } => buf,
        }
    }
}

impl Communicator {
    /// Runs `parts` as one operation: every send and receive progresses at once, whatever their order here or
    /// on the peers and whatever the message sizes, and the returned work completes when all have. The parts'
    /// buffers come back in the parts' order. Collective only between the ranks that exchange messages: each send needs the
    /// matching receive in a batch (or a [`recv`](Self::recv)) on its peer.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use hypercomm_comm::{CommOptions, Communicator, P2p};
    /// use hypercomm_store::MemoryStore;
    ///
    /// // A ring of three ranks: each sends to the next and receives from the previous, in one batch.
    /// let store = Arc::new(MemoryStore::new());
    /// let ranks: Vec<_> = (0..3)
    ///     .map(|me| {
    ///         let store = Arc::clone(&store);
    ///         std::thread::spawn(move || {
    ///             let ring = Communicator::world(store, 3, me, CommOptions::named("ring"))?;
    ///             let (next, prev) = ((me + 1) % 3, (me + 2) % 3);
    ///             let bufs = ring
    ///                 .batch(vec![P2p::send(vec![me as u32; 4], next), P2p::recv(vec![0u32; 4], prev)])?
    ///                 .wait()?;
    ///             assert_eq!(bufs[1], vec![prev as u32; 4]);
    ///             Ok::<_, hypercomm_comm::CommError>(())
    ///         })
    ///     })
    ///     .collect();
    /// for r in ranks {
    ///     r.join().unwrap()?;
    /// }
    /// # Ok::<(), hypercomm_comm::CommError>(())
    /// ```
    pub fn batch<B: Buffer>(&self, parts: Vec<P2p<B>>) -> Result<Work<Vec<B>>, CommError> {
        let (messages, bufs): (Vec<Message>, Vec<B>) = parts
            .into_iter()
            .map(|part| {
                let (send, buf, peer, tag) = match part {
                    P2p::Send { buf, peer, tag } => (true, buf, peer, tag),
                    P2p::Recv { buf, peer, tag } => (false, buf, peer, tag),
                };
                let count = buf.len();
                (
                    Message {
                        send,
                        peer,
                        tag,
                        count,
                    },
                    buf,
                )
            })
            .unzip();
        let op = Op::Batch(messages);
        op.check(self.group(), Shape::Parts(bufs.len()))?;
        B::run_many(self, op, bufs)
    }
}
