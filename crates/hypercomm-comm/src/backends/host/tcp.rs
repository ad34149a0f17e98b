//! The TCP transport: a full mesh of connections, one per pair of ranks (built by [`mesh`](super::mesh)).
//!
//! A frame is one kind byte, a 64-byte prefix (the operation [`Header`] plus the payload length) and the payload.
//! In a round each rank sends every peer only the ranges that peer wants (from a scoped sender thread, so that two
//! ranks sending large frames to each other cannot deadlock on full socket buffers) and receives one round frame
//! from every peer. Frames of another kind that arrive meanwhile are kept, in order, for the call that wants them.
//! A closed connection means the peer died; an abort frame means it gave up.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::ops::Range;
use std::time::Duration;

use super::header::{HEADER_BYTES, Header, disagreement, p2p_mismatch};
use super::segment::PREFIX;
use super::transport::{Consume, Message, Peers, Round, Transport, resolve};
use crate::CommError;
use crate::backend::Progress;
use crate::options::CommOptions;

const KIND_ROUND: u8 = 0;
pub(super) const KIND_P2P: u8 = 1;
const KIND_ABORT: u8 = 2;

/// A received frame; the payload sits in `u64` words so that it is aligned for every element type.
struct Frame {
    kind: u8,
    header: Header,
    len: usize,
    words: Vec<u64>,
}

impl Frame {
    fn bytes(&self) -> &[u8] {
        // `words` holds at least `len` bytes (see `read_frame`).
        &as_u8(&self.words)[..self.len]
    }
}

fn as_u8(words: &[u64]) -> &[u8] {
    crate::element::as_bytes(words)
}

fn as_u8_mut(words: &mut [u64]) -> &mut [u8] {
    crate::element::as_bytes_mut(words)
}

/// Rounds and messages over TCP.
pub(crate) struct TcpTransport {
    pub(super) comm: String,
    rank: usize,
    n: usize,
    cap: usize,
    pub(super) timeout: Duration,
    peers: Vec<Option<TcpStream>>,
    stash: Vec<VecDeque<Frame>>,
}

impl TcpTransport {
    /// Wraps the mesh of connections [`mesh::connect`](super::mesh::connect) built (one per peer, `None` for
    /// this rank) and configures them.
    pub(crate) fn from_streams(
        peers: Vec<Option<TcpStream>>,
        me: usize,
        options: &CommOptions,
        cap: usize,
    ) -> Result<Self, CommError> {
        let comm = options.name.clone();
        let timeout = options.timeout;
        let n = peers.len();
        let io = |what: &str| {
            let comm = comm.clone();
            let what = what.to_owned();
            move |source| CommError::Io { comm, what, source }
        };
        for s in peers.iter().flatten() {
            s.set_nodelay(true)
                .map_err(io("configuring a connection"))?;
            s.set_read_timeout(Some(timeout))
                .map_err(io("configuring a connection"))?;
            s.set_write_timeout(Some(timeout))
                .map_err(io("configuring a connection"))?;
        }
        Ok(TcpTransport {
            comm,
            rank: me,
            n,
            cap,
            timeout,
            peers,
            stash: (0..n).map(|_| VecDeque::new()).collect(),
        })
    }

    pub(super) fn failure(&self, peer: usize, e: std::io::Error, during: &str) -> CommError {
        match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => {
                CommError::timeout(&self.comm, vec![peer], self.timeout, during)
            }
            _ => CommError::peer_died(&self.comm, vec![peer], during),
        }
    }

    pub(super) fn stream(&self, peer: usize) -> Result<&TcpStream, CommError> {
        self.peers
            .get(peer)
            .and_then(Option::as_ref)
            .ok_or_else(|| CommError::Protocol {
                comm: self.comm.clone(),
                what: format!("no connection to rank {peer}"),
            })
    }

    fn read_frame(&self, peer: usize, during: &str) -> Result<Frame, CommError> {
        let mut stream = self.stream(peer)?;
        let mut head = [0u8; 1 + PREFIX];
        stream
            .read_exact(&mut head)
            .map_err(|e| self.failure(peer, e, during))?;
        let mut len = [0u8; 8];
        len.copy_from_slice(&head[1 + HEADER_BYTES - 8..1 + HEADER_BYTES]);
        let len = u64::from_le_bytes(len) as usize;
        head[1 + HEADER_BYTES - 8..].fill(0);
        let header = Header::decode(&head[1..]).ok_or_else(|| CommError::Protocol {
            comm: self.comm.clone(),
            what: format!("rank {peer} sent an undecodable header"),
        })?;
        if head[0] == KIND_ABORT {
            return Err(CommError::aborted_by(&self.comm, peer, during));
        }
        if len > self.cap.max(1 << 30) {
            return Err(CommError::Protocol {
                comm: self.comm.clone(),
                what: format!("rank {peer} announced a {len}-byte frame"),
            });
        }
        let mut words = vec![0u64; len.div_ceil(8)];
        stream
            .read_exact(&mut as_u8_mut(&mut words)[..len])
            .map_err(|e| self.failure(peer, e, during))?;
        Ok(Frame {
            kind: head[0],
            header,
            len,
            words,
        })
    }

    /// Receives the next point-to-point message from `peer` into `data`; its header must equal `header` (else a
    /// mismatch, and the message stays for a later receive).
    pub(super) fn receive(
        &mut self,
        peer: usize,
        header: &Header,
        data: &mut [u8],
    ) -> Result<(), CommError> {
        let during = format!("{header} from rank {peer}");
        let f = self.next_frame(peer, KIND_P2P, &during)?;
        if f.header != *header || f.len != data.len() {
            let error = p2p_mismatch(&self.comm, self.rank, header, peer, &f.header);
            self.stash[peer].push_front(f);
            return Err(error);
        }
        data.copy_from_slice(f.bytes());
        Ok(())
    }

    /// Whether a point-to-point frame from `peer` is already in the stash.
    pub(super) fn has_p2p_frame(&self, peer: usize) -> bool {
        self.stash[peer].iter().any(|f| f.kind == KIND_P2P)
    }

    /// The next frame of `kind` from `peer`, from the stash or the wire (stashing frames of other kinds).
    fn next_frame(&mut self, peer: usize, kind: u8, during: &str) -> Result<Frame, CommError> {
        if let Some(i) = self.stash[peer].iter().position(|f| f.kind == kind) {
            if let Some(f) = self.stash[peer].remove(i) {
                return Ok(f);
            }
        }
        for _ in 0..1_000_000 {
            let f = self.read_frame(peer, during)?;
            if f.kind == kind {
                return Ok(f);
            }
            self.stash[peer].push_back(f);
        }
        Err(CommError::Protocol {
            comm: self.comm.clone(),
            what: format!("rank {peer} flooded frames of another kind"),
        })
    }
}

/// The bytes before a frame's payload: its kind and its prefix.
pub(super) const HEAD: usize = 1 + PREFIX;

/// The head of a frame of `kind` carrying `len` bytes under `header`.
pub(super) fn frame_head(kind: u8, header: &Header, len: usize) -> [u8; HEAD] {
    let mut head = [0u8; HEAD];
    head[0] = kind;
    head[1..1 + HEADER_BYTES].copy_from_slice(&header.encode());
    head[1 + HEADER_BYTES - 8..1 + HEADER_BYTES].copy_from_slice(&(len as u64).to_le_bytes());
    head
}

fn write_frame(
    mut stream: &TcpStream,
    kind: u8,
    header: &Header,
    parts: &[&[u8]],
) -> std::io::Result<()> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    stream.write_all(&frame_head(kind, header, len))?;
    for p in parts {
        stream.write_all(p)?;
    }
    Ok(())
}

/// The sub-slices of the concatenation of `segs` covering `ranges`.
fn slices<'b>(segs: &[&'b [u8]], ranges: &[Range<usize>]) -> Vec<&'b [u8]> {
    let mut out = Vec::new();
    for r in ranges {
        let mut base = 0;
        for s in segs {
            let (lo, hi) = (r.start.max(base), r.end.min(base + s.len()));
            if lo < hi {
                out.push(&s[lo - base..hi - base]);
            }
            base += s.len();
        }
    }
    out
}

struct TcpPeers<'a> {
    comm: &'a str,
    frames: &'a [Option<Frame>],
    wanted: Vec<Vec<Range<usize>>>,
}

impl Peers for TcpPeers<'_> {
    fn get(&self, src: usize, range: Range<usize>) -> Result<&[u8], CommError> {
        let bad = || CommError::Protocol {
            comm: self.comm.to_owned(),
            what: format!("bytes {range:?} of rank {src}'s publication were not requested"),
        };
        let frame = self
            .frames
            .get(src)
            .and_then(Option::as_ref)
            .ok_or_else(bad)?;
        let mut offset = 0;
        for w in self.wanted.get(src).ok_or_else(bad)? {
            if w.start <= range.start && range.end <= w.end {
                let at = offset + (range.start - w.start);
                return frame.bytes().get(at..at + range.len()).ok_or_else(bad);
            }
            offset += w.len();
        }
        Err(bad())
    }
}

impl Transport for TcpTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.n
    }

    fn capacity(&self) -> usize {
        self.cap
    }

    fn round(
        &mut self,
        round: &Round<'_>,
        input: &[u8],
        out: &mut [u8],
        consume: &mut Consume<'_>,
    ) -> Result<(), CommError> {
        let (n, me) = (self.n, self.rank);
        let during = format!("{} round {}", round.header, round.header.extra);
        let segs = resolve(&round.publish, input, out).map_err(|r| CommError::Protocol {
            comm: self.comm.clone(),
            what: format!("publication range {r:?} is outside the buffers"),
        })?;
        // Round frames that arrived while this rank waited for something else are already in the stash.
        let mut frames: Vec<Option<Frame>> = (0..n)
            .map(|src| {
                let i = self.stash[src].iter().position(|f| f.kind == KIND_ROUND)?;
                self.stash[src].remove(i)
            })
            .collect();
        let mut other: Vec<(usize, Frame)> = Vec::new();
        let outgoing: Vec<(usize, Vec<&[u8]>)> = (1..n)
            .map(|k| (me + k) % n)
            .map(|dst| (dst, slices(&segs, &(round.wants)(me, dst))))
            .collect();
        let header = round.header;
        let this = &*self;
        let result = std::thread::scope(|scope| {
            let (outgoing, during) = (&outgoing, &during);
            let sender = scope.spawn(move || -> Result<(), CommError> {
                for (dst, parts) in outgoing {
                    let (dst, parts) = (*dst, parts);
                    write_frame(this.stream(dst)?, KIND_ROUND, &header, parts)
                        .map_err(|e| this.failure(dst, e, during))?;
                }
                Ok(())
            });
            let received = (|| {
                for k in 1..n {
                    let src = (me + n - k) % n;
                    let mut reads = 0u32;
                    while frames[src].is_none() {
                        let f = this.read_frame(src, during)?;
                        if f.kind == KIND_ROUND {
                            frames[src] = Some(f);
                        } else {
                            other.push((src, f));
                        }
                        reads += 1;
                        if reads > 1_000_000 {
                            return Err(CommError::Protocol {
                                comm: this.comm.clone(),
                                what: format!("rank {src} flooded frames of another kind"),
                            });
                        }
                    }
                }
                Ok(())
            })();
            let sent = sender.join().unwrap_or_else(|_| {
                Err(CommError::Protocol {
                    comm: this.comm.clone(),
                    what: "the sender thread panicked".into(),
                })
            });
            received.and(sent)
        });
        for (src, f) in other {
            self.stash[src].push_back(f);
        }
        result?;
        let headers: Vec<Header> = (0..n)
            .map(|r| frames[r].as_ref().map_or(round.header, |f| f.header))
            .collect();
        if let Some(calls) = disagreement(&headers) {
            return Err(CommError::mismatch(&self.comm, Vec::new(), calls));
        }
        let wanted = (0..n)
            .map(|src| {
                if src == me {
                    vec![]
                } else {
                    (round.wants)(src, me)
                }
            })
            .collect();
        let peers = TcpPeers {
            comm: &self.comm,
            frames: &frames,
            wanted,
        };
        consume(out, &peers)
    }

    fn exchange_some(
        &mut self,
        messages: &mut [Message<'_>],
        progress: &mut Progress,
        pause: &dyn Fn() -> bool,
    ) -> Result<bool, CommError> {
        self.exchange_step(messages, progress, pause)
    }

    fn sever(&mut self, peer: usize) -> Result<(), CommError> {
        // Shutting the socket down, unlike dropping it, leaves the slot in place, so later calls see a broken
        // connection rather than a missing one: what a dropped network connection looks like.
        self.stream(peer)?
            .shutdown(std::net::Shutdown::Both)
            .map_err(|source| CommError::Io {
                comm: self.comm.clone(),
                what: format!("shutting down the connection to rank {peer}"),
                source,
            })
    }

    fn abort(&mut self) {
        let header = Header {
            seq: 0,
            kind: super::header::OpKind::Barrier,
            dtype: None,
            op: None,
            root: None,
            count: 0,
            extra: 0,
            window: None,
        };
        for s in self.peers.iter().flatten() {
            let _ = s.set_write_timeout(Some(Duration::from_millis(100)));
            let _ = write_frame(s, KIND_ABORT, &header, &[]);
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}
