//! The shared-memory transport's point-to-point exchange, in steps that can stop and go on (see
//! [`Transport::exchange_some`](super::transport::Transport::exchange_some)).
//!
//! Every message goes through its pair's mailbox, which holds one piece at a time: the sender puts a piece in and
//! counts it `sent`; the receiver takes it out and counts it `taken`. A message moves as far as its mailbox lets
//! it, and the exchange waits only when no message can move, so no order of the messages here or on the peers
//! makes one wait on another.
//!
//! A large message is handed over by address instead of streamed: its only piece is a [`Record`] of the sender's
//! buffer, and the receiver copies the whole message straight out of the sender's memory with one kernel copy
//! ([`cross_memory`](super::cross_memory)), where streaming copies every byte twice (into the mailbox and out of
//! it). The receiver answers in the mailbox's length field before it counts the piece taken: [`READ`] (the sender's
//! message is complete, and only now may the sender hand its buffer back) or [`REFUSED`] (the kernel would not let
//! it read the sender's memory: the sender streams the message after all, and streams to that peer from then on).
//! Whether to hand over by address is the sender's call alone, so ranks never need to agree on it beforehand.

use std::sync::atomic::Ordering::SeqCst;

use super::cross_memory::{RECORD_BYTES, Record};
use super::header::p2p_mismatch;
use super::segment::PREFIX;
use super::shm::ShmTransport;
use super::transport::Message;
use crate::CommError;
use crate::backend::{MessageProgress, Payload, Progress};

/// Messages of at least this many bytes go by address where they can. Streamed, a message costs two copies of
/// every byte and a hand-over per mailbox piece; by address, one system call and one copy: from about 16 KiB up
/// the one copy wins, and by far more as messages grow (`docs/perf/point-to-point.md`, "By address").
pub(crate) const BY_ADDRESS_BYTES: usize = 16 << 10;

/// The length field of a piece that carries a [`Record`] instead of data.
const BY_ADDRESS: u64 = u64::MAX;
/// The receiver's answer to a [`BY_ADDRESS`] piece: it copied the message.
const READ: u64 = u64::MAX - 1;
/// The receiver's answer to a [`BY_ADDRESS`] piece: it may not read the sender's memory; stream it.
const REFUSED: u64 = u64::MAX - 2;

/// A message's [`MessageProgress::stage`]: streamed piece by piece (a receive always starts here).
const STREAMED: u8 = 0;
/// A send whose record is in the mailbox, waiting for the receiver's answer.
const OFFERED: u8 = 1;

fn payload_len(payload: &Payload<'_>) -> usize {
    match payload {
        Payload::Out(data) => data.len(),
        Payload::In(data) => data.len(),
    }
}

/// How many mailbox pieces message `m` takes when streamed (one at least: an empty message still goes through).
fn pieces(m: &Message<'_>, cap: usize) -> usize {
    payload_len(&m.payload).div_ceil(cap).max(1)
}

/// Whether message `i` may move now: it is unfinished, and no earlier message with its peer and direction is (those
/// go first, so their pieces never interleave).
fn is_active(messages: &[Message<'_>], progress: &[MessageProgress], i: usize) -> bool {
    let lane = |m: &Message<'_>| (m.peer, matches!(m.payload, Payload::In(_)));
    !progress[i].done
        && !(0..i).any(|j| lane(&messages[j]) == lane(&messages[i]) && !progress[j].done)
}

/// What an exchange waits for, for errors: each active message's header and peer.
fn describe(active: impl Iterator<Item = usize>, messages: &[Message<'_>]) -> String {
    active
        .map(|i| {
            let m = &messages[i];
            match m.payload {
                Payload::Out(_) => format!("{} to rank {}", m.header, m.peer),
                Payload::In(_) => format!("{} from rank {}", m.header, m.peer),
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

impl ShmTransport {
    /// [`Transport::exchange_some`](super::transport::Transport::exchange_some) over shared memory;
    /// a message's [`MessageProgress::moved`] counts streamed pieces, its [`MessageProgress::stage`] tells a streamed
    /// message from an offered one.
    pub(super) fn exchange_step(
        &mut self,
        messages: &mut [Message<'_>],
        progress: &mut Progress,
        pause: &dyn Fn() -> bool,
    ) -> Result<bool, CommError> {
        progress.grow(messages.len());
        let mut finished_here = false;
        loop {
            let mut progressed = false;
            for i in 0..messages.len() {
                if !is_active(messages, &progress.messages, i) {
                    continue;
                }
                let state = &mut progress.messages[i];
                while !state.done && self.can_move(&messages[i]) {
                    self.step(&mut messages[i], state)?;
                    progressed = true;
                }
                finished_here |= state.done;
            }
            if progressed {
                progress.moved_now();
            }
            if progress.finished() {
                return Ok(true);
            }
            if progressed {
                continue;
            }
            if finished_here || pause() {
                return Ok(false);
            }
            let since = progress.stalled();
            let states = &progress.messages;
            let active = || (0..messages.len()).filter(|&i| is_active(messages, states, i));
            self.wait_since(
                since,
                &|| describe(active(), messages),
                &|| pause() || active().any(|i| self.can_move(&messages[i])),
                &|| active().map(|i| messages[i].peer).collect(),
            )?;
        }
    }

    /// Moves message `m`, which has come as far as `progress` says, one step, its mailbox being ready
    /// ([`can_move`](Self::can_move)): a piece in or out, an offer of the whole message by address, or the answer
    /// to one.
    fn step(
        &mut self,
        m: &mut Message<'_>,
        progress: &mut MessageProgress,
    ) -> Result<(), CommError> {
        let cap = self.seg.mailbox;
        let (me, peer) = (self.rank, m.peer);
        match (&mut m.payload, progress.stage) {
            (Payload::Out(_), OFFERED) => {
                // The receiver has answered: the length field holds READ or REFUSED.
                let (_, answer) = self.read_prefix(self.seg.mailbox(me, peer), peer)?;
                if answer as u64 == READ {
                    progress.moved = pieces(m, cap);
                    progress.done = true;
                } else {
                    self.streams_to[peer] = true;
                    progress.stage = STREAMED;
                }
                return Ok(());
            }
            (Payload::Out(data), _)
                if progress.moved == 0
                    && data.len() >= BY_ADDRESS_BYTES
                    && !self.streams_to[peer] =>
            {
                let record = self.attach.record(data.as_ptr(), data.len()).encode();
                let dst = self.seg.mailbox(me, peer);
                Self::write_prefix_raw(dst, &m.header, BY_ADDRESS);
                // SAFETY: the mailbox is empty (taken == sent, checked by can_move), so the receiver does not read
                // it until we bump `sent`; a record is far smaller than a mailbox.
                unsafe {
                    std::ptr::copy_nonoverlapping(record.as_ptr(), dst.add(PREFIX), RECORD_BYTES)
                };
                progress.stage = OFFERED;
            }
            (Payload::Out(data), _) => {
                let at = progress.moved * cap;
                let end = (at + cap).min(data.len());
                let bytes = &data[at.min(data.len())..end];
                let dst = self.seg.mailbox(me, peer);
                Self::write_prefix(dst, &m.header, bytes.len());
                // SAFETY: the mailbox is empty (taken == sent, checked by can_move), so the receiver does not read
                // it until we bump `sent`; the piece is at most the mailbox size.
                unsafe {
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst.add(PREFIX), bytes.len())
                };
                progress.moved += 1;
                progress.done = progress.moved == pieces(m, cap);
            }
            (Payload::In(data), _) => {
                let src = self.seg.mailbox(peer, me);
                let (got, len) = self.read_prefix(src, peer)?;
                if got != m.header {
                    return Err(p2p_mismatch(&self.comm, me, &m.header, peer, &got));
                }
                if len as u64 == BY_ADDRESS {
                    let answer = self.read_offered(src, peer, data)?;
                    Self::write_prefix_raw(src, &m.header, answer);
                    if answer == READ {
                        progress.moved = pieces(m, cap);
                        progress.done = true;
                    }
                    self.seg.mail_ctl(peer, me).taken.fetch_add(1, SeqCst);
                    self.ring();
                    return Ok(());
                }
                let at = progress.moved * cap;
                let start = at.min(data.len());
                let end = (at + cap).min(data.len());
                if len != end - start {
                    return Err(CommError::Protocol {
                        comm: self.comm.clone(),
                        what: format!(
                            "rank {peer} sent a {len}-byte piece where {} bytes were due",
                            end - start
                        ),
                    });
                }
                // SAFETY: sent > taken (checked by can_move), so the sender filled the mailbox and does not touch it
                // until we bump `taken`; `len` bytes are within the mailbox (len == end - start <= cap).
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        src.add(PREFIX),
                        data[start..end].as_mut_ptr(),
                        len,
                    )
                };
                self.seg.mail_ctl(peer, me).taken.fetch_add(1, SeqCst);
                progress.moved += 1;
                progress.done = progress.moved == pieces(m, cap);
                self.ring();
                return Ok(());
            }
        }
        self.seg.mail_ctl(me, peer).sent.fetch_add(1, SeqCst);
        self.ring();
        Ok(())
    }

    /// Copies the message `peer` offered by address (the record in mailbox `src`) into `data`; says [`READ`], or
    /// [`REFUSED`] when the kernel will not let this process read the sender's memory.
    fn read_offered(&self, src: *const u8, peer: usize, data: &mut [u8]) -> Result<u64, CommError> {
        let mut bytes = [0u8; RECORD_BYTES];
        // SAFETY: sent > taken (checked by can_move), so the sender wrote the record and does not touch the mailbox
        // until we bump `taken`; a record is far smaller than a mailbox.
        unsafe { std::ptr::copy_nonoverlapping(src.add(PREFIX), bytes.as_mut_ptr(), RECORD_BYTES) };
        let record = Record::decode(&bytes)
            .filter(|r| r.len == data.len())
            .ok_or_else(|| CommError::Protocol {
                comm: self.comm.clone(),
                what: format!(
                    "rank {peer} offered an undecodable record or one of another length than {}",
                    data.len()
                ),
            })?;
        if record.read(0, data).is_err() {
            return Ok(REFUSED);
        }
        // The sender keeps its buffer until it sees the answer, unless it gave up meanwhile (a timeout aborts the
        // communicator before it frees anything): then what was read may be stale, and this fails instead.
        self.check_aborted(&|| format!("reading a message from rank {peer}"))?;
        Ok(READ)
    }
}
