//! What a connection's frames do: the handshake first, then requests answered from this server's table or, on a
//! relay, handed upstream. The event loop owns the sockets; this owns everything the requests share.

use std::io;
use std::time::Instant;

use super::connection::{Connection, Expiry, Pending, Phase, later};
use super::options::ServerOptions;
use super::requests::{self, Outcome, Refusal};
use super::table::{Table, Waiter};
use super::upstream::Upstream;
use crate::frame::{Frame, FrameError};

/// Everything the requests of all connections share, apart from the connections themselves.
pub(super) struct Core {
    /// How the server behaves.
    pub options: ServerOptions,
    /// Every value, and the requests parked on missing keys.
    pub table: Table,
    /// For a relay: where requests go instead of the table.
    pub upstream: Option<Upstream>,
    /// Requests released by the last write, to re-check.
    pub woken: Vec<Waiter>,
    /// The sequence number of the next request parked or forwarded.
    pub next_seq: u64,
}

impl Core {
    /// Answers the complete frames buffered on `conn`, stopping at a parked request. Returns why the connection
    /// must close now, if it must.
    pub fn answer_buffered(
        &mut self,
        t: usize,
        conn: &mut Connection,
        now: Instant,
    ) -> Option<Closing> {
        let max_frame = self.options.max_frame;
        while conn.pending.is_none() && !matches!(conn.phase, Phase::Closing) {
            let frame = match conn.next_frame(max_frame) {
                Ok(Some(frame)) => frame,
                Ok(None) => return None,
                Err(e) => return self.malformed(conn, e),
            };
            match &conn.phase {
                Phase::Greeting { nonce } => match requests::greet(&self.options, nonce, frame) {
                    Ok(welcome) => {
                        conn.queue(&welcome, max_frame);
                        conn.phase = Phase::Serving;
                        conn.touch(now);
                    }
                    Err(Refusal {
                        reason,
                        reply: Some(reply),
                    }) => {
                        tracing::warn!(peer = %conn.peer, %reason, "store handshake failed; closing connection");
                        conn.queue(&reply, max_frame);
                        conn.phase = Phase::Closing;
                    }
                    Err(Refusal {
                        reason,
                        reply: None,
                    }) => return Some(Closing::Refused(reason)),
                },
                Phase::Serving if self.upstream.is_some() => self.forward(t, conn, frame, now),
                Phase::Serving => {
                    let outcome = requests::answer(
                        &mut self.table,
                        frame,
                        self.options.max_wait,
                        &mut self.woken,
                    );
                    match outcome {
                        Outcome::Reply(reply) => {
                            conn.queue(&reply, max_frame);
                            conn.touch(now);
                        }
                        Outcome::ReplyAndClose(reply) => {
                            conn.queue(&reply, max_frame);
                            conn.phase = Phase::Closing;
                        }
                        Outcome::Park { parked, timeout } => {
                            let seq = self.next_seq;
                            self.next_seq += 1;
                            self.table.park(parked.watched(), Waiter { conn: t, seq });
                            conn.pending = Some(Pending {
                                seq,
                                parked: Some(parked),
                                deadline: later(now, timeout),
                                timeout,
                            });
                        }
                    }
                }
                Phase::Closing => return None,
            }
        }
        None
    }

    /// Hands a relay's request upstream; the connection waits for the answer (or gets one at once).
    fn forward(&mut self, t: usize, conn: &mut Connection, frame: Frame, now: Instant) {
        let Some(upstream) = self.upstream.as_mut() else {
            return;
        };
        let seq = self.next_seq;
        self.next_seq += 1;
        let waiter = Waiter { conn: t, seq };
        match upstream.submit(waiter, frame, self.options.max_wait, now) {
            Ok(forwarded) => {
                conn.pending = Some(Pending {
                    seq,
                    parked: None,
                    deadline: later(now, forwarded.keep),
                    timeout: forwarded.timeout,
                });
            }
            Err(reply) => {
                conn.queue(&reply, self.options.max_frame);
                conn.phase = Phase::Closing;
            }
        }
    }

    /// A frame that does not decode: during the handshake the connection just closes; afterwards the client is
    /// told why first.
    fn malformed(&self, conn: &mut Connection, e: FrameError) -> Option<Closing> {
        match conn.phase {
            Phase::Greeting { .. } => Some(Closing::Refused(format!("no auth frame: {e}"))),
            Phase::Serving => {
                tracing::warn!(peer = %conn.peer, error = %e, "malformed frame from store client; closing its connection");
                let failed = Frame::Failed {
                    message: format!("malformed frame: {e}"),
                };
                conn.queue(&failed, self.options.max_frame);
                conn.phase = Phase::Closing;
                None
            }
            Phase::Closing => None,
        }
    }
}

/// Why a connection is closed now.
#[derive(Debug)]
pub(super) enum Closing {
    /// Its last frames are out (or the client closed between requests).
    Done,
    /// The client closed while a request of its was parked.
    GoneWhileParked,
    /// The client closed in the middle of a frame.
    Truncated,
    /// The socket failed.
    Broken(io::Error),
    /// A deadline passed.
    Expired(Expiry),
    /// The handshake failed in a way the client is not told about.
    Refused(String),
}
