//! The large all-reduce, all-gather and reduce-scatter on ordinary buffers, reading the peers' buffers where they
//! are ([`cross_memory`](super::cross_memory)) instead of staging them through the shared-memory slots.
//!
//! Staged, every byte a rank receives is copied twice: by its owner into a slot, and by the rank out of it (or read
//! by a reduction). Direct, the kernel copies it once, from the owner's buffer into the reader's. Each operation
//! starts with a round in which every rank publishes where its buffer is (a [`Record`]); the work follows, with
//! barriers (rounds that carry no data) between its phases and before anyone returns, so that no rank reads a
//! buffer its owner is still writing or has already handed back:
//!
//! - all-reduce: each rank reduces its part `me` (`1/n` of the buffer) of every rank's buffer into its own, the
//!   peers' bytes read in steps of [`STEP_BYTES`] into a scratch that stays in the cache; barrier; each rank reads
//!   every peer's reduced part into its own buffer; barrier. Results are the rank-order fold, bit-identical to the
//!   staged algorithms'.
//! - all-gather: each rank reads every peer's contribution straight into its output; barrier.
//! - reduce-scatter: each rank reduces block `me` of every rank's input, the peers' read as in the all-reduce;
//!   barrier.
//!
//! Rank `me` writes only what no peer reads during the same phase: its part `me` while the peers read their parts
//! of its buffer, the other parts once every part is reduced (the all-reduce); blocks other than the one it
//! contributes (an in-place all-gather); its output (a reduce-scatter, whose peers read its input, or in place its
//! blocks other than `me`).
//!
//! The first direct operation of a communicator also finds out whether the ranks may read each other's memory
//! (see [`cross_memory`](super::cross_memory)); where they may not, it and every later one run the staged
//! algorithm, on every rank alike.

use std::cmp::Ordering;
use std::ops::{Range, RangeInclusive};

use super::collective::{Ctx, all, fault, part, pieces, scale, shift};
use super::cross_memory::{Agreement, RECORD_BYTES, Record};
use super::liveness::process_alive;
use super::stream_copy;
use super::transport::Seg;
use crate::CommError;
use crate::element::{DType, ReduceOp, as_bytes, as_bytes_mut};
use crate::options::Algorithm;
use crate::reduce::{Src, reduce};

/// The sizes (bytes of the operation's largest buffer) at which [`Algorithm::Auto`] runs the all-reduce direct:
/// where it measured faster than staging. Below, the staged pipeline's pieces stay in the cache and the direct
/// path's extra rounds and system calls do not pay; above, the kernel's copy, which pays per 4 KiB page (it pins the
/// peer's pages a few at a time), falls behind. On buffers of 2 MiB pages it keeps winning at larger sizes, which
/// `Auto` cannot tell. The measurements: `docs/perf/host-collectives.md` ("The figures behind the code's choices").
pub(crate) const ALL_REDUCE_WINDOW: RangeInclusive<usize> = (2 << 20)..=(32 << 20);

/// As [`ALL_REDUCE_WINDOW`], for the all-gather (bytes of its output), which gains from direct reads sooner: it
/// only copies, so the peers' inputs read straight into the output save a whole staged copy.
pub(crate) const ALL_GATHER_WINDOW: RangeInclusive<usize> = (512 << 10)..=(16 << 20);

/// As [`ALL_REDUCE_WINDOW`], for the reduce-scatter (bytes of its input).
pub(crate) const REDUCE_SCATTER_WINDOW: RangeInclusive<usize> = (2 << 20)..=(16 << 20);

/// Bytes of each peer's contribution read into the scratch per reduction step.
pub(crate) const STEP_BYTES: usize = 256 * 1024;

/// The `extra` word of the rounds of direct operations, apart from the staged algorithms' piece numbers, so that
/// ranks that took different paths would fail with a mismatch rather than exchange the wrong bytes.
const ROUND: u64 = 1 << 40;

/// Whether an operation whose largest buffer is `bytes` asks to run direct: forced by [`Algorithm::Direct`], or
/// inside its collective's `window` (such as [`ALL_REDUCE_WINDOW`]) under [`Algorithm::Auto`]. It runs direct
/// only if the ranks may also read each other's memory.
pub(crate) fn wanted(cx: &Ctx<'_>, bytes: usize, window: &RangeInclusive<usize>) -> bool {
    cx.t.size() > 1
        && match cx.algorithm {
            Algorithm::Direct => true,
            Algorithm::Auto => window.contains(&bytes),
            Algorithm::Latency | Algorithm::Bandwidth => false,
        }
}

/// Direct round `index` that carries no data ([`Ctx::barrier`]).
fn barrier(cx: &mut Ctx<'_>, index: u64) -> Result<(), CommError> {
    cx.barrier(ROUND + index)
}

/// Publishes this rank's buffer (`len` bytes at `addr`) and returns every rank's record, in rank order; `None`
/// when the ranks may not read each other's memory (every rank returns `None` alike, and the operation must run
/// staged). The first call on a communicator probes every peer and agrees on the answer in a second round.
fn records(
    cx: &mut Ctx<'_>,
    addr: *const u8,
    len: usize,
) -> Result<Option<Vec<Record>>, CommError> {
    let (n, me) = (cx.t.size(), cx.t.rank());
    let Some(attach) = cx.t.attach() else {
        return Ok(None);
    };
    let agreement = attach.agreement;
    if agreement == Agreement::Refused {
        return Ok(None);
    }
    let own = attach.record(addr, len);
    let encoded = own.encode();
    let comm = cx.comm.to_owned();
    let mut records = vec![own; n];
    cx.run(
        ROUND,
        vec![Seg::In(0..RECORD_BYTES)],
        &|_, _| all(RECORD_BYTES),
        &encoded,
        &mut [],
        &mut |_, peers| {
            for r in (0..n).filter(|&r| r != me) {
                records[r] = Record::decode(peers.get(r, 0..RECORD_BYTES)?).ok_or_else(|| {
                    CommError::Protocol {
                        comm: comm.clone(),
                        what: format!("rank {r} published an undecodable buffer record"),
                    }
                })?;
            }
            Ok(())
        },
    )?;
    if agreement == Agreement::Untested {
        let reached = (0..n).all(|r| r == me || records[r].reachable());
        let mut everyone = reached;
        cx.run(
            ROUND + 1,
            vec![Seg::In(0..1)],
            &|_, _| all(1),
            &[u8::from(reached)],
            &mut [],
            &mut |_, peers| {
                for r in (0..n).filter(|&r| r != me) {
                    everyone &= peers.get(r, 0..1)? == [1];
                }
                Ok(())
            },
        )?;
        if !reached {
            tracing::debug!(
                comm = cx.comm,
                "this rank cannot read its peers' memory (process_vm_readv): collectives stage through shared memory"
            );
        }
        if let Some(attach) = cx.t.attach() {
            attach.agreement = if everyone {
                Agreement::Works
            } else {
                Agreement::Refused
            };
        }
        if !everyone {
            return Ok(None);
        }
    }
    Ok(Some(records))
}

/// Reads bytes `at` of rank `r`'s buffer into `dst`. A read fails when its peer left the operation: it died (a
/// process being killed loses its memory before it turns into a zombie, so the read fails with ESRCH or EFAULT while
/// the process still looks alive), or it gave up after a failure of its own and released its buffer. So a failed read
/// watches for either for up to [`PEER_GRACE`]: a death is [`CommError::PeerDied`] naming rank `r`, an abort the
/// peer's [`CommError::AbortedByPeer`] with its root cause, as a wait would report them; only a peer that does
/// neither leaves the read's own I/O error.
fn read(
    cx: &Ctx<'_>,
    records: &[Record],
    r: usize,
    at: usize,
    dst: &mut [u8],
) -> Result<(), CommError> {
    let end = at + dst.len();
    records[r].read(at, dst).map_err(|source| {
        let pid = records[r].pid;
        let during = format!("reading bytes {at}..{end} of rank {r}'s buffer in process {pid}");
        let deadline = std::time::Instant::now() + PEER_GRACE;
        // Bounded by the deadline.
        loop {
            if !process_alive(pid) {
                return CommError::peer_died(cx.comm, vec![r], during);
            }
            if let Err(aborted) = cx.t.peer_aborted(&during) {
                return aborted;
            }
            if std::time::Instant::now() >= deadline {
                return CommError::Io {
                    comm: cx.comm.to_owned(),
                    what: during,
                    source,
                };
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    })
}

/// How long a failed read watches its peer for a death or an abort before it reports its own I/O error.
const PEER_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// Reduces bytes `at` of every rank's buffer, in rank order, into `out` (whose length is `at`'s): this rank's
/// contribution is `own` (`None`: `out` holds it), the peers' are read in steps of [`STEP_BYTES`].
fn reduce_from_peers(
    cx: &Ctx<'_>,
    records: &[Record],
    at: Range<usize>,
    own: Option<&[u8]>,
    out: &mut [u8],
    dtype: DType,
    op: ReduceOp,
) -> Result<(), CommError> {
    let (n, me, s) = (cx.t.size(), cx.t.rank(), dtype.size());
    let step = (STEP_BYTES / s).max(1);
    // One scratch per peer, of u64 so that every element type is aligned in it.
    let mut scratch: Vec<Vec<u64>> = (0..n - 1)
        .map(|_| vec![0u64; (step * s).div_ceil(8)])
        .collect();
    for piece in pieces(at.len() / s, step) {
        let bytes = scale(piece, s);
        let len = bytes.len();
        for (k, r) in (0..n).filter(|&r| r != me).enumerate() {
            let dst = &mut as_bytes_mut(&mut scratch[k])[..len];
            read(cx, records, r, at.start + bytes.start, dst)?;
        }
        // Scratch `k` holds the k-th peer in rank order, so rank r's is r's position among the ranks but `me`.
        let srcs: Vec<Src<'_>> = (0..n)
            .map(|r| match r.cmp(&me) {
                Ordering::Equal => own.map_or(Src::Out, |own| Src::Bytes(&own[bytes.clone()])),
                Ordering::Less => Src::Bytes(&as_bytes(&scratch[r])[..len]),
                Ordering::Greater => Src::Bytes(&as_bytes(&scratch[r - 1])[..len]),
            })
            .collect();
        reduce(dtype, op, &srcs, &mut out[bytes], n).map_err(|f| fault(cx.comm, f))?;
    }
    Ok(())
}

/// In-place all-reduce of `buf`, direct. `Ok(false)`: the ranks may not read each other's memory, nothing was
/// changed, and the caller runs the staged algorithm.
pub(crate) fn all_reduce(
    cx: &mut Ctx<'_>,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
) -> Result<bool, CommError> {
    let Some(records) = records(cx, buf.as_ptr(), buf.len())? else {
        return Ok(false);
    };
    let (n, me, s) = (cx.t.size(), cx.t.rank(), dtype.size());
    let mine = scale(part(buf.len() / s, n, me), s);
    reduce_from_peers(cx, &records, mine.clone(), None, &mut buf[mine], dtype, op)?;
    barrier(cx, 2)?;
    for r in (0..n).filter(|&r| r != me) {
        let theirs = scale(part(buf.len() / s, n, r), s);
        read(cx, &records, r, theirs.start, &mut buf[theirs])?;
    }
    barrier(cx, 3)?;
    Ok(true)
}

/// All-gather of `per_rank` bytes from each rank into `out`, direct (`input: None`: in place, this rank's
/// contribution at block `me` of `out`). `Ok(false)` as for [`all_reduce`].
pub(crate) fn all_gather(
    cx: &mut Ctx<'_>,
    input: Option<&[u8]>,
    out: &mut [u8],
    per_rank: usize,
) -> Result<bool, CommError> {
    let (n, me) = (cx.t.size(), cx.t.rank());
    let block = |r: usize| shift(0..per_rank, r * per_rank);
    let contribution = input.map_or_else(|| out[block(me)].as_ptr(), <[u8]>::as_ptr);
    let Some(records) = records(cx, contribution, per_rank)? else {
        return Ok(false);
    };
    if let Some(input) = input {
        let stream = stream_copy::bypass_cache(out.len());
        stream_copy::copy(&mut out[block(me)], input, stream);
    }
    for r in (0..n).filter(|&r| r != me) {
        read(cx, &records, r, 0, &mut out[block(r)])?;
    }
    barrier(cx, 2)?;
    Ok(true)
}

/// Reduce-scatter of `n` blocks of `block` bytes, direct: block `me` of every rank's input reduced into `out`
/// (`input: None`: in place, `out` holds the blocks and block `me` is reduced). `Ok(false)` as for [`all_reduce`].
pub(crate) fn reduce_scatter(
    cx: &mut Ctx<'_>,
    input: Option<&[u8]>,
    out: &mut [u8],
    block: usize,
    dtype: DType,
    op: ReduceOp,
) -> Result<bool, CommError> {
    let me = cx.t.rank();
    let (addr, len) = input.map_or((out.as_ptr(), out.len()), |i| (i.as_ptr(), i.len()));
    let Some(records) = records(cx, addr, len)? else {
        return Ok(false);
    };
    let mine = shift(0..block, me * block);
    // Out of place, this rank's block comes from its input and the result fills `out`; in place, both are
    // block `me` of `out`.
    let (own, target) = match input {
        Some(input) => (Some(&input[mine.clone()]), 0..block),
        None => (None, mine.clone()),
    };
    reduce_from_peers(cx, &records, mine, own, &mut out[target], dtype, op)?;
    barrier(cx, 2)?;
    Ok(true)
}
