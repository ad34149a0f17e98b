//! The shared-memory transport: rounds through double-buffered per-rank slots, messages through per-pair mailboxes.
//!
//! Round `k` uses buffer `k % 2` of every rank. A rank writes its publication there, then stores `k` into its
//! `arrived` counter and rings the doorbell; it consumes once every peer's counter reaches `k`. Writing round
//! `k + 2` into the same buffer is safe because a rank only gets there after every peer arrived at round `k + 1`,
//! which each does only after it finished reading round `k`. One barrier per round, no separate "done" flags.
//!
//! Waiting spins briefly, then keeps checking with a `sched_yield` between bursts for up to [`YIELD_FOR`], then
//! sleeps on the doorbell futex in slices of a few milliseconds, so that more ranks than cores still make progress.
//! Between sleeps it checks the deadline, the abort flag and whether the ranks it waits for still have a live
//! process.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

use super::cross_memory::Attach;
use super::header::{HEADER_BYTES, Header, disagreement};
use super::liveness::process_alive;
use super::segment::{PREFIX, Segment};
use super::transport::{Consume, Message, Peers, Round, Transport, resolve};
use crate::CommError;
use crate::backend::{Payload, Progress};

/// Checks a waiting rank makes before its first `sched_yield`: a peer that is running arrives within them (a
/// few µs), so a small operation between ranks on cores of their own never leaves user space.
const SPINS: u32 = 300;
/// Checks between two `sched_yield`s while the wait is younger than [`YIELD_FOR`].
const SPINS_PER_YIELD: u32 = 64;
/// How long a waiting rank keeps checking, yielding between bursts of [`SPINS_PER_YIELD`] checks, before it sleeps
/// on the doorbell. A yield hands the core to any thread that is ready to run on it (a rank that shares the core,
/// which is how more ranks than cores make progress) and otherwise returns at once, so the core stays awake. Sleeping
/// sooner costs every late round a wake-up: on a virtual machine an idle virtual CPU is descheduled by the host, and
/// a futex wake-up reaches it tens of µs later. A shorter budget (300 checks and 20 yields) left a sizeable share
/// of a large all-reduce's rounds waiting on wake-ups; the figures are in `docs/perf/host-collectives.md` ("The
/// figures behind the code's choices").
const YIELD_FOR: Duration = Duration::from_micros(500);
const SLEEP_SLICE: Duration = Duration::from_millis(2);

/// Rounds and messages through one shared-memory [`Segment`].
pub(crate) struct ShmTransport {
    pub(super) seg: Arc<Segment>,
    pub(super) comm: String,
    pub(super) rank: usize,
    timeout: Duration,
    /// Number of the last completed round.
    round_no: u64,
    /// Process ids of the ranks, from the bootstrap records (for liveness checks before a rank attaches).
    pids: Vec<u32>,
    /// Direct reads of the peers' buffers.
    pub(super) attach: Attach,
    /// Per peer, whether it refused to read this rank's messages by address (see `shm_exchange`): they are
    /// streamed to it.
    pub(super) streams_to: Vec<bool>,
}

impl ShmTransport {
    pub(crate) fn new(
        seg: Arc<Segment>,
        comm: String,
        rank: usize,
        timeout: Duration,
        pids: Vec<u32>,
    ) -> Self {
        seg.rank_ctl(rank).pid.store(std::process::id(), SeqCst);
        ShmTransport {
            streams_to: vec![false; seg.n],
            seg,
            comm,
            rank,
            timeout,
            round_no: 0,
            pids,
            attach: Attach::new(),
        }
    }

    pub(super) fn ring(&self) {
        let h = self.seg.header();
        h.doorbell.fetch_add(1, SeqCst);
        if h.sleepers.load(SeqCst) > 0 {
            // Waking nobody is harmless; a failure here only delays waiters until their sleep slice ends.
            let _ = rustix::thread::futex::wake(
                &h.doorbell,
                rustix::thread::futex::Flags::empty(),
                u32::MAX,
            );
        }
    }

    /// Waits until `ready` holds. `blockers` names the ranks still awaited, for errors and liveness checks.
    fn wait(
        &self,
        during: &dyn Fn() -> String,
        ready: &dyn Fn() -> bool,
        blockers: &dyn Fn() -> Vec<usize>,
    ) -> Result<(), CommError> {
        self.wait_since(Instant::now(), during, ready, blockers)
    }

    /// [`wait`](Self::wait) for a wait that began at `since` (an exchange that stopped and went on): the timeout
    /// runs from there.
    pub(super) fn wait_since(
        &self,
        since: Instant,
        during: &dyn Fn() -> String,
        ready: &dyn Fn() -> bool,
        blockers: &dyn Fn() -> Vec<usize>,
    ) -> Result<(), CommError> {
        let start = Instant::now();
        // Once any rank has aborted, nothing more is consumed, even rounds whose data is all there.
        self.check_aborted(during)?;
        for _ in 0..SPINS {
            if ready() {
                return self.check_aborted(during);
            }
            std::hint::spin_loop();
        }
        while start.elapsed() < YIELD_FOR {
            std::thread::yield_now();
            for _ in 0..SPINS_PER_YIELD {
                if ready() {
                    return self.check_aborted(during);
                }
                std::hint::spin_loop();
            }
        }
        let h = self.seg.header();
        loop {
            let seen = h.doorbell.load(SeqCst);
            if ready() {
                return self.check_aborted(during);
            }
            self.check(during, blockers, since)?;
            h.sleepers.fetch_add(1, SeqCst);
            if ready() {
                h.sleepers.fetch_sub(1, SeqCst);
                return self.check_aborted(during);
            }
            let slice = rustix::thread::futex::Timespec {
                tv_sec: 0,
                tv_nsec: SLEEP_SLICE.as_nanos() as _,
            };
            // Spurious wake-ups, EAGAIN (doorbell already moved) and timeouts all just loop back to the checks.
            let _ = rustix::thread::futex::wait(
                &h.doorbell,
                rustix::thread::futex::Flags::empty(),
                seen,
                Some(&slice),
            );
            h.sleepers.fetch_sub(1, SeqCst);
        }
    }

    pub(super) fn check_aborted(&self, during: &dyn Fn() -> String) -> Result<(), CommError> {
        let by = self.seg.header().aborted_by.load(SeqCst);
        if by != 0 {
            return Err(CommError::aborted_by(
                &self.comm,
                (by - 1) as usize,
                during(),
            ));
        }
        Ok(())
    }

    /// Fails when a peer aborted, an awaited rank's process is gone, or the timeout has passed.
    fn check(
        &self,
        during: &dyn Fn() -> String,
        blockers: &dyn Fn() -> Vec<usize>,
        start: Instant,
    ) -> Result<(), CommError> {
        self.check_aborted(during)?;
        let missing = blockers();
        let dead: Vec<usize> = missing
            .iter()
            .copied()
            .filter(|&r| {
                let attached = self.seg.rank_ctl(r).pid.load(SeqCst);
                let pid = if attached != 0 {
                    attached
                } else {
                    self.pids[r]
                };
                !process_alive(pid)
            })
            .collect();
        if !dead.is_empty() {
            return Err(CommError::peer_died(&self.comm, dead, during()));
        }
        if start.elapsed() >= self.timeout {
            return Err(CommError::timeout(
                &self.comm,
                missing,
                self.timeout,
                during(),
            ));
        }
        Ok(())
    }

    /// Whether `m`'s next piece can move now: its mailbox is empty (a send) or full (a receive).
    pub(super) fn can_move(&self, m: &Message<'_>) -> bool {
        match m.payload {
            Payload::Out(_) => {
                let ctl = self.seg.mail_ctl(self.rank, m.peer);
                ctl.taken.load(SeqCst) == ctl.sent.load(SeqCst)
            }
            Payload::In(_) => {
                let ctl = self.seg.mail_ctl(m.peer, self.rank);
                ctl.sent.load(SeqCst) > ctl.taken.load(SeqCst)
            }
        }
    }

    pub(super) fn write_prefix(dst: *mut u8, header: &Header, len: usize) {
        Self::write_prefix_raw(dst, header, len as u64);
    }

    /// [`write_prefix`](Self::write_prefix) with any value in the length field (the point-to-point markers).
    pub(super) fn write_prefix_raw(dst: *mut u8, header: &Header, len: u64) {
        let mut prefix = [0u8; PREFIX];
        prefix[..HEADER_BYTES].copy_from_slice(&header.encode());
        prefix[HEADER_BYTES - 8..HEADER_BYTES].copy_from_slice(&len.to_le_bytes());
        // SAFETY: `dst` is the start of a buffer or mailbox owned (by protocol) by this rank right now, with at
        // least PREFIX bytes.
        unsafe { std::ptr::copy_nonoverlapping(prefix.as_ptr(), dst, PREFIX) };
    }

    /// Reads the header and payload length at `src`, which the protocol currently makes read-only.
    pub(super) fn read_prefix(
        &self,
        src: *const u8,
        from: usize,
    ) -> Result<(Header, usize), CommError> {
        let mut prefix = [0u8; PREFIX];
        // SAFETY: `src` is a buffer or mailbox the writer handed over via an atomic store we observed; nobody
        // writes it until we signal we are done.
        unsafe { std::ptr::copy_nonoverlapping(src, prefix.as_mut_ptr(), PREFIX) };
        let mut len = [0u8; 8];
        len.copy_from_slice(&prefix[HEADER_BYTES - 8..HEADER_BYTES]);
        prefix[HEADER_BYTES - 8..HEADER_BYTES].fill(0);
        let header = Header::decode(&prefix).ok_or_else(|| CommError::Protocol {
            comm: self.comm.clone(),
            what: format!("rank {from} wrote an undecodable operation header"),
        })?;
        Ok((header, u64::from_le_bytes(len) as usize))
    }
}

struct ShmPeers<'a> {
    t: &'a ShmTransport,
    which: usize,
    lens: Vec<usize>,
}

impl Peers for ShmPeers<'_> {
    fn get(&self, src: usize, range: Range<usize>) -> Result<&[u8], CommError> {
        if src == self.t.rank
            || src >= self.lens.len()
            || range.start > range.end
            || range.end > self.lens[src]
        {
            return Err(CommError::Protocol {
                comm: self.t.comm.clone(),
                what: format!(
                    "rank {} read bytes {range:?} of rank {src}'s publication of {} bytes",
                    self.t.rank,
                    self.lens.get(src).copied().unwrap_or(0)
                ),
            });
        }
        // SAFETY: the range lies within the payload rank `src` published for this round (checked above against
        // the length it wrote, itself at most the slot size); `src` does not write this buffer again before this
        // rank arrives at the next round, which happens after this borrow ends (it is tied to `&self`, which the
        // round holds only while consuming).
        Ok(unsafe {
            std::slice::from_raw_parts(
                self.t.seg.buffer(src, self.which).add(PREFIX + range.start),
                range.len(),
            )
        })
    }
}

impl Transport for ShmTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.seg.n
    }

    fn capacity(&self) -> usize {
        self.seg.slot
    }

    fn round(
        &mut self,
        round: &Round<'_>,
        input: &[u8],
        out: &mut [u8],
        consume: &mut Consume<'_>,
    ) -> Result<(), CommError> {
        let k = self.round_no + 1;
        let which = (k % 2) as usize;
        let n = self.seg.n;
        let me = self.rank;
        let segs = resolve(&round.publish, input, out).map_err(|r| CommError::Protocol {
            comm: self.comm.clone(),
            what: format!("publication range {r:?} is outside the buffers"),
        })?;
        let total: usize = segs.iter().map(|s| s.len()).sum();
        if total > self.seg.slot {
            return Err(CommError::Protocol {
                comm: self.comm.clone(),
                what: format!(
                    "publication of {total} bytes exceeds the {}-byte slot",
                    self.seg.slot
                ),
            });
        }
        let dst = self.seg.buffer(me, which);
        Self::write_prefix(dst, &round.header, total);
        let mut at = PREFIX;
        for s in &segs {
            // SAFETY: buffer `which` of this rank is ours to write in round k (see the module docs); the payload
            // fits in the slot (checked above); the source is a caller buffer, which cannot overlap the mapping.
            unsafe { std::ptr::copy_nonoverlapping(s.as_ptr(), dst.add(at), s.len()) };
            at += s.len();
        }
        self.seg.rank_ctl(me).arrived.store(k, SeqCst);
        self.ring();
        let seg = &self.seg;
        let ready = || (0..n).all(|r| seg.rank_ctl(r).arrived.load(SeqCst) >= k);
        let blockers = || {
            (0..n)
                .filter(|&r| seg.rank_ctl(r).arrived.load(SeqCst) < k)
                .collect()
        };
        let during = || format!("{} round {k}", round.header);
        self.wait(&during, &ready, &blockers)?;
        self.round_no = k;

        let mut headers = Vec::with_capacity(n);
        let mut lens = Vec::with_capacity(n);
        for r in 0..n {
            if r == me {
                headers.push(round.header);
                lens.push(total);
                continue;
            }
            let (h, len) = self.read_prefix(self.seg.buffer(r, which), r)?;
            if len > self.seg.slot {
                return Err(CommError::Protocol {
                    comm: self.comm.clone(),
                    what: format!(
                        "rank {r} declared a {len}-byte publication in a {}-byte slot",
                        self.seg.slot
                    ),
                });
            }
            headers.push(h);
            lens.push(len);
        }
        if let Some(calls) = disagreement(&headers) {
            return Err(CommError::mismatch(&self.comm, Vec::new(), calls));
        }
        let peers = ShmPeers {
            t: self,
            which,
            lens,
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

    fn peer_aborted(&self, during: &str) -> Result<(), CommError> {
        self.check_aborted(&|| during.to_owned())
    }

    fn attach(&mut self) -> Option<&mut Attach> {
        Some(&mut self.attach)
    }

    fn sever(&mut self, peer: usize) -> Result<(), CommError> {
        Err(CommError::InvalidArgument {
            comm: self.comm.clone(),
            what: format!(
                "cannot drop the connection to rank {peer}: shared memory has no connections (use force_tcp)"
            ),
        })
    }

    fn abort(&mut self) {
        let _ =
            self.seg
                .header()
                .aborted_by
                .compare_exchange(0, self.rank as u64 + 1, SeqCst, SeqCst);
        self.ring();
    }
}
