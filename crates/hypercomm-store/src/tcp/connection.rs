//! One client connection as the event loop holds it: a non-blocking socket, the bytes read but not yet answered,
//! the replies not yet written, where it is in the handshake, the request it has parked, and its deadlines.
//!
//! An idle connection holds no buffer at all: input and output grow only as frames need and are given back when
//! a large frame has gone through, so thousands of idle clients cost a few hundred bytes each.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mio::net::TcpStream;

use super::options::ServerOptions;
use super::requests::Parked;
use crate::frame::{Frame, FrameError, NONCE_LEN, encode_frame, split_frame};

/// Buffers larger than this are freed rather than kept once empty.
const KEEP_CAPACITY: usize = 4096;

/// Where a connection is in its life.
#[derive(Debug)]
pub(super) enum Phase {
    /// Hello sent with this nonce; waiting for the client's auth frame.
    Greeting {
        /// The nonce the client must key-hash.
        nonce: [u8; NONCE_LEN],
    },
    /// Authenticated; answering requests.
    Serving,
    /// Writing its last frames; closes once they are out. Nothing more is read.
    Closing,
}

/// A request parked on the table.
#[derive(Debug)]
pub(super) struct Pending {
    /// Its sequence number, as registered in the table.
    pub seq: u64,
    /// The request itself, when it is parked on this server's table; `None` when a relay forwarded it upstream.
    pub parked: Option<Parked>,
    /// When it times out.
    pub deadline: Instant,
    /// How long it may wait in all, for the timed-out reply.
    pub timeout: Duration,
}

/// Which of a connection's deadlines has passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Expiry {
    /// The handshake took too long.
    Handshake,
    /// A reply could not be written for the write timeout.
    WriteStalled,
    /// The parked request ran out of time.
    Wait,
    /// No request arrived for the idle timeout.
    Idle,
}

/// What one read from the socket brought.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Received {
    /// Some bytes, now at the end of the input.
    Bytes,
    /// Nothing more for now; the event loop will say when there is.
    Blocked,
    /// The client closed its side.
    Closed,
}

/// One client connection.
#[derive(Debug)]
pub(super) struct Connection {
    pub stream: TcpStream,
    pub peer: SocketAddr,
    pub phase: Phase,
    /// The parked `get` or `wait`, if any; while it waits, later frames stay in `input`.
    pub pending: Option<Pending>,
    /// Whether the socket may have bytes to read (set by readiness, cleared when a read would block).
    pub may_read: bool,
    /// Whether the socket is registered for writability (only while output is waiting).
    pub watching_writes: bool,
    /// The deadline this connection has in the event loop's timer heap, if any.
    pub scheduled: Option<Instant>,
    input: Vec<u8>,
    /// How much of `input` has been decoded.
    consumed: usize,
    output: Vec<u8>,
    /// How much of `output` has been written.
    written: usize,
    opened: Instant,
    last_activity: Instant,
    /// Since when a write has been unable to make progress.
    stalled_since: Option<Instant>,
}

impl Connection {
    /// A connection that has just been sent hello with `nonce`.
    pub fn new(stream: TcpStream, peer: SocketAddr, nonce: [u8; NONCE_LEN], now: Instant) -> Self {
        Connection {
            stream,
            peer,
            phase: Phase::Greeting { nonce },
            pending: None,
            may_read: true,
            watching_writes: false,
            scheduled: None,
            input: Vec::new(),
            consumed: 0,
            output: Vec::new(),
            written: 0,
            opened: now,
            last_activity: now,
            stalled_since: None,
        }
    }

    /// Queues `frame` for writing. A reply over the frame limit is replaced by a failure that says so.
    pub fn queue(&mut self, frame: &Frame, max_frame: u32) {
        let bytes = encode_frame(frame, max_frame).unwrap_or_else(|e| {
            let failed = Frame::Failed {
                message: e.to_string(),
            };
            // A failure message of a few dozen bytes fits any limit a server can usefully run with; should the
            // limit be smaller still, send nothing and let the client's timeout speak.
            encode_frame(&failed, max_frame).unwrap_or_default()
        });
        self.output.extend_from_slice(&bytes);
    }

    /// Whether replies are still waiting to be written.
    pub fn has_output(&self) -> bool {
        self.written < self.output.len()
    }

    /// Writes as much queued output as the socket takes now.
    pub fn flush(&mut self, now: Instant) -> io::Result<()> {
        while self.written < self.output.len() {
            match self.stream.write(&self.output[self.written..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.written += n;
                    self.stalled_since = None;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.stalled_since.get_or_insert(now);
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.stalled_since = None;
        self.output.clear();
        self.written = 0;
        if self.output.capacity() > KEEP_CAPACITY {
            self.output = Vec::new();
        }
        Ok(())
    }

    /// Reads once into `scratch` and appends what came to the input.
    pub fn receive(&mut self, scratch: &mut [u8], now: Instant) -> io::Result<Received> {
        loop {
            return match self.stream.read(scratch) {
                Ok(0) => {
                    self.may_read = false;
                    Ok(Received::Closed)
                }
                Ok(n) => {
                    self.input.extend_from_slice(&scratch[..n]);
                    self.last_activity = now;
                    Ok(Received::Bytes)
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.may_read = false;
                    Ok(Received::Blocked)
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => Err(e),
            };
        }
    }

    /// Bytes read but not yet decoded.
    pub fn unread(&self) -> usize {
        self.input.len() - self.consumed
    }

    /// The next complete frame in the input, if there is one.
    pub fn next_frame(&mut self, max_frame: u32) -> Result<Option<Frame>, FrameError> {
        match split_frame(&self.input[self.consumed..], max_frame)? {
            Some((frame, used)) => {
                self.consumed += used;
                Ok(Some(frame))
            }
            None => Ok(None),
        }
    }

    /// Drops the decoded bytes from the input, giving back a large buffer once it is empty.
    pub fn compact(&mut self) {
        if self.consumed == 0 {
            return;
        }
        self.input.drain(..self.consumed);
        self.consumed = 0;
        if self.input.is_empty() && self.input.capacity() > KEEP_CAPACITY {
            self.input = Vec::new();
        }
    }

    /// Marks the connection as busy now (a request was answered), restarting its idle clock.
    pub fn touch(&mut self, now: Instant) {
        self.last_activity = now;
    }

    /// The earliest moment one of this connection's deadlines passes.
    pub fn deadline(&self, options: &ServerOptions) -> Option<Instant> {
        [
            Expiry::Handshake,
            Expiry::WriteStalled,
            Expiry::Wait,
            Expiry::Idle,
        ]
        .into_iter()
        .filter_map(|expiry| self.deadline_of(expiry, options))
        .min()
    }

    /// The deadline that has passed at `now`, if any, most urgent first.
    pub fn expired(&self, now: Instant, options: &ServerOptions) -> Option<Expiry> {
        [
            Expiry::Handshake,
            Expiry::WriteStalled,
            Expiry::Wait,
            Expiry::Idle,
        ]
        .into_iter()
        .find(|&expiry| {
            self.deadline_of(expiry, options)
                .is_some_and(|at| at <= now)
        })
    }

    fn deadline_of(&self, expiry: Expiry, options: &ServerOptions) -> Option<Instant> {
        match expiry {
            Expiry::Handshake => matches!(self.phase, Phase::Greeting { .. })
                .then(|| later(self.opened, options.handshake_timeout)),
            Expiry::WriteStalled => self
                .stalled_since
                .map(|since| later(since, options.write_timeout)),
            Expiry::Wait => self.pending.as_ref().map(|p| p.deadline),
            Expiry::Idle => (matches!(self.phase, Phase::Serving)
                && self.pending.is_none()
                && !self.has_output())
            .then(|| later(self.last_activity, options.idle_timeout)),
        }
    }
}

/// `at + after`, or a century from `at` when the sum is beyond what an `Instant` holds (an "infinite" timeout).
pub(super) fn later(at: Instant, after: Duration) -> Instant {
    at.checked_add(after)
        .or_else(|| at.checked_add(Duration::from_secs(100 * 365 * 24 * 3600)))
        .unwrap_or(at)
}
