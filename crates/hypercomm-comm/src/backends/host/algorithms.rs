//! The host collectives, each written once against [`Transport`] rounds, and the size-based algorithm selector.
//!
//! Every collective runs at least one round, so ranks that disagree are caught even for empty buffers. Large
//! buffers are cut into pieces that fit the transport's per-round capacity.
//!
//! All-reduce has two paths:
//! - latency: each round every rank publishes a whole piece and every rank reduces all of them (in rank order, so
//!   results are bit-identical everywhere). One synchronisation per piece; each rank reads `n` times the data.
//! - bandwidth: reduce-scatter plus all-gather, pipelined: in round `t` each rank publishes its reduced chunk of
//!   piece `t - 1` together with the peers' chunks of piece `t` (not its own, which only it reduces), reduces its
//!   own chunk of piece `t`, and copies the peers' reduced chunks of piece `t - 1`. Each rank copies one piece
//!   into shared memory per round, reads about twice the data and reduces only `1/n` of it.
//!
//! The selector ([`Algorithm::Auto`]) takes the latency path while `bytes * (n - 1) <= LATENCY_READ_LIMIT`, the
//! point where reading every peer's whole buffer starts to cost more than the bandwidth path's extra round.
//!
//! Where the ranks may read each other's memory, the large all-reduce, all-gather and reduce-scatter skip the
//! slots altogether and read the peers' buffers where they are ([`direct`]).

// A publication's wanted ranges are lists that often hold one range; indexing the count matrix by rank pairs reads
// better than iterator chains.
#![allow(clippy::single_range_in_vec_init, clippy::needless_range_loop)]

use std::ops::Range;

use super::direct;
use super::header::{Header, OpKind};
use super::stream_copy;
use super::transport::{Consume, Peers, Round, Seg, Transport};
use crate::CommError;
use crate::element::{DType, ReduceOp};
use crate::error::Call;
use crate::options::Algorithm;
use crate::reduce::{ReduceFault, Src, reduce};
use crate::symmetric::Windows;

/// The latency path's budget: bytes each rank may read from peers in one all-reduce (see the module docs).
pub(crate) const LATENCY_READ_LIMIT: usize = 256 * 1024;

/// The bandwidth path's largest piece. A round touches the piece in the caller's buffer, this rank's publication
/// and the peers' (each about a piece), so with the default 1 MiB slot (pieces of 2/3 MiB at two ranks) the round
/// no longer fits a 1 MiB L2 and the copies run at memory speed. Measured on the 2-core development machine
/// (2026-11-23, `hypercomm bench --backend host -n 2 --op all_reduce --sizes 512KiB:16MiB --runs 3`, eight
/// rounds alternating caps of 128, 256 and 384 KiB with none, medians of the rounds): 256 KiB was fastest from
/// 1 MiB up, 8.73 / 8.59 / 8.63 / 6.51 / 4.71 GB/s busbw at 1 / 2 / 4 / 8 / 16 MiB against 8.26 / 7.77 / 7.87 /
/// 5.51 / 4.19 without a cap, and faster than no cap in 5 to 7 of the 8 rounds at each size.
pub(crate) const PIPELINE_PIECE_BYTES: usize = 256 * 1024;

/// The in-place (symmetric) all-reduce's step: it reduces this many bytes of its part into its own buffer, then
/// copies them into every peer's while they are still in the first-level cache. Measured on the 2-core development
/// machine (2026-11-24 00:50 UTC, `hypercomm bench --backend host -n 2 --op all_reduce --symmetric --sizes
/// 512KiB:32MiB`, three rounds alternating steps of 4, 8, 16 and 32 KiB, busbw): 16 KiB was fastest or within 5%
/// of the fastest at 16 MiB (19.2-20.0 GB/s, against 18.4-18.9 with 4 KiB and 17.5-17.8 with 32 KiB) and at
/// 512 KiB-1 MiB; steps of 64 and 256 KiB ran 12.7-14.2 GB/s at 32 MiB where 16 KiB ran 16.5-20.4.
pub(crate) const SYMMETRIC_STEP_BYTES: usize = 16 * 1024;

/// The largest symmetric collective (whole buffer, bytes) that [`Algorithm::Auto`] still stages through the slots:
/// working in place takes two barriers (one for the data, one before anybody may return) where a staged round
/// takes one, and below this the barrier costs more than the copy saves. Measured on the 2-core development
/// machine: all-gather and reduce-scatter 2026-11-23 22:47 UTC (ten alternations of `hypercomm bench --backend
/// host -n 2 --sizes 8B:16MiB`, with and without `--symmetric`, medians): all-gather 1.5 µs staged against 1.9 in
/// place at 4 KiB, 2.8 against 1.9 at 8 KiB; reduce-scatter 1.7 against 1.9 at 4 KiB, 1.9 against 2.0 at 8 KiB,
/// 2.6 against 2.4 at 16 KiB. All-reduce 2026-11-24 00:52 UTC (three alternations, in place forced against the
/// staged latency path, medians of 200 iterations): 2.4-2.5 µs staged against 2.7-3.0 in place at 4 KiB, 3.2-3.3
/// against 3.0-3.2 at 8 KiB, 4.9 against 3.6-3.8 at 16 KiB, 31-34 against 11.5-11.9 at 256 KiB.
pub(crate) const SYMMETRIC_STAGED_LIMIT: usize = 4096;

/// Elements `[i * len / n, (i + 1) * len / n)`: the `i`-th of `n` nearly equal parts of `len`.
pub(super) fn part(len: usize, n: usize, i: usize) -> Range<usize> {
    (i * len / n)..((i + 1) * len / n)
}

pub(super) fn scale(r: Range<usize>, s: usize) -> Range<usize> {
    r.start * s..r.end * s
}

pub(super) fn shift(r: Range<usize>, by: usize) -> Range<usize> {
    r.start + by..r.end + by
}

/// Pieces of `len` elements of at most `piece` each; at least one (possibly empty) piece.
pub(super) fn pieces(len: usize, piece: usize) -> Vec<Range<usize>> {
    let piece = piece.max(1);
    if len == 0 {
        return vec![0..0];
    }
    (0..len.div_ceil(piece))
        .map(|i| i * piece..((i + 1) * piece).min(len))
        .collect()
}

pub(super) fn fault(comm: &str, f: ReduceFault) -> CommError {
    CommError::Protocol {
        comm: comm.to_owned(),
        what: format!("local reduction failed: {f:?}"),
    }
}

/// Copies `from` to `out[at]`, bypassing the cache when `stream` is set (see [`stream_copy`]).
fn copy_into(out: &mut [u8], at: Range<usize>, from: &[u8], stream: bool) {
    stream_copy::copy(&mut out[at], from, stream);
}

/// Everything a collective needs besides its buffers.
pub(crate) struct Ctx<'a> {
    pub t: &'a mut dyn Transport,
    pub comm: &'a str,
    pub header: Header,
    pub algorithm: Algorithm,
}

impl Ctx<'_> {
    /// Whether to take the small-message path: forced by [`Algorithm::Latency`] or [`Algorithm::Bandwidth`],
    /// else `small` (the size-based choice of [`Algorithm::Auto`]).
    fn small_path(&self, small: bool) -> bool {
        match self.algorithm {
            Algorithm::Latency => true,
            Algorithm::Bandwidth | Algorithm::Direct => false,
            Algorithm::Auto => small,
        }
    }

    pub(super) fn run(
        &mut self,
        index: u64,
        publish: Vec<Seg>,
        wants: &dyn Fn(usize, usize) -> Vec<Range<usize>>,
        input: &[u8],
        out: &mut [u8],
        consume: &mut Consume<'_>,
    ) -> Result<(), CommError> {
        let header = Header {
            extra: index,
            ..self.header
        };
        self.t.round(
            &Round {
                header,
                publish,
                wants,
            },
            input,
            out,
            consume,
        )
    }

    /// A round that carries no data (round `index`): every rank has arrived when it returns, and the header
    /// every rank checks still catches ranks that called different operations.
    pub(super) fn barrier(&mut self, index: u64) -> Result<(), CommError> {
        self.run(index, vec![], &|_, _| vec![], &[], &mut [], &mut |_, _| {
            Ok(())
        })
    }

    fn elems_per_round(&self, s: usize) -> usize {
        (self.t.capacity() / s).max(1)
    }
}

pub(super) fn all(src_len: usize) -> Vec<Range<usize>> {
    vec![0..src_len]
}

/// In-place all-reduce of `buf`.
pub(crate) fn all_reduce(
    cx: &mut Ctx<'_>,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
) -> Result<(), CommError> {
    let n = cx.t.size();
    if latency_path(cx, buf.len()) || n == 1 {
        all_reduce_latency(cx, buf, dtype, op)
    } else if direct::wanted(cx, buf.len(), &direct::ALL_REDUCE_WINDOW)
        && direct::all_reduce(cx, buf, dtype, op)?
    {
        Ok(())
    } else {
        all_reduce_bandwidth(cx, buf, dtype, op)
    }
}

fn all_reduce_latency(
    cx: &mut Ctx<'_>,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
) -> Result<(), CommError> {
    let (n, me, s) = (cx.t.size(), cx.t.rank(), dtype.size());
    let comm = cx.comm.to_owned();
    for (i, p) in pieces(buf.len() / s, cx.elems_per_round(s))
        .into_iter()
        .enumerate()
    {
        let bytes = scale(p, s);
        let len = bytes.len();
        cx.run(
            i as u64,
            vec![Seg::Out(bytes.clone())],
            &|_, _| all(len),
            &[],
            buf,
            &mut |out, peers| {
                let srcs = sources(n, me, None, peers, |_| 0..len)?;
                reduce(dtype, op, &srcs, &mut out[bytes.clone()], n).map_err(|f| fault(&comm, f))
            },
        )?;
    }
    Ok(())
}

fn all_reduce_bandwidth(
    cx: &mut Ctx<'_>,
    buf: &mut [u8],
    dtype: DType,
    op: ReduceOp,
) -> Result<(), CommError> {
    let (n, me, s) = (cx.t.size(), cx.t.rank(), dtype.size());
    let comm = cx.comm.to_owned();
    // A publication holds this rank's reduced chunk of the previous piece plus the current piece without its own
    // chunk (which only this rank reduces): at most piece + 1 elements. Pieces stay at n/(n+1) of the slot, as
    // when whole pieces were published (filling the slot measured 10-30% slower), and at most
    // PIPELINE_PIECE_BYTES, so that a round's working set stays in the core's cache (see the constant).
    let room = cx.elems_per_round(s).saturating_sub(1);
    let piece = (room * n / (n + 1)).min(PIPELINE_PIECE_BYTES / s).max(1);
    let ps = pieces(buf.len() / s, piece);
    // Chunk `i` of a piece, in elements from the piece's start.
    let chunk = |c: &Range<usize>, i: usize| part(c.len(), n, i);
    // Bytes of `dst`'s chunk of piece `c` within the current-piece part of `src`'s publication, which leaves out
    // `src`'s own chunk.
    let cur_at = |c: &Range<usize>, src: usize, dst: usize| {
        let r = scale(chunk(c, dst), s);
        let skip = if dst > src {
            chunk(c, src).len() * s
        } else {
            0
        };
        r.start - skip..r.end - skip
    };
    for t in 0..=ps.len() {
        let prev = t.checked_sub(1).map(|i| ps[i].clone());
        let cur = ps.get(t).cloned();
        // Byte length of `src`'s reduced chunk of the previous piece (the first part of its publication).
        let prev_len = |src: usize| prev.as_ref().map_or(0, |p| chunk(p, src).len() * s);
        let mut publish = Vec::with_capacity(3);
        if let Some(p) = &prev {
            publish.push(Seg::Out(scale(shift(chunk(p, me), p.start), s)));
        }
        if let Some(c) = &cur {
            let mine = chunk(c, me);
            publish.push(Seg::Out(scale(shift(0..mine.start, c.start), s)));
            publish.push(Seg::Out(scale(shift(mine.end..c.len(), c.start), s)));
        }
        let wants = |src: usize, dst: usize| {
            let mut w = Vec::with_capacity(2);
            if prev.is_some() {
                w.push(0..prev_len(src));
            }
            if let Some(c) = cur.as_ref().filter(|_| src != dst) {
                w.push(shift(cur_at(c, src, dst), prev_len(src)));
            }
            w
        };
        cx.run(t as u64, publish, &wants, &[], buf, &mut |out, peers| {
            if let Some(p) = &prev {
                for src in (0..n).filter(|&r| r != me) {
                    let at = scale(shift(chunk(p, src), p.start), s);
                    // This rank read these bytes (its peers' part of the piece) a round ago: they are cached.
                    copy_into(out, at, peers.get(src, 0..prev_len(src))?, false);
                }
            }
            if let Some(c) = &cur {
                let srcs = sources(n, me, None, peers, |r| shift(cur_at(c, r, me), prev_len(r)))?;
                let target = scale(shift(chunk(c, me), c.start), s);
                reduce(dtype, op, &srcs, &mut out[target], n).map_err(|f| fault(&comm, f))?;
            }
            Ok(())
        })?;
    }
    Ok(())
}

/// Where an operation over symmetric buffers reads in place: every rank's window, when the peers' are mapped here
/// (shared memory) and there are peers. `None`: run the ordinary algorithm over this rank's buffer instead.
fn peer_windows(cx: &Ctx<'_>, win: &Windows) -> Option<Vec<*mut u8>> {
    let n = cx.t.size();
    if !win.is_shared() || n == 1 {
        return None;
    }
    (0..n).map(|r| win.of(r)).collect()
}

/// The operands of reducing bytes `range` of every rank's symmetric buffer into this rank's, in rank order: this
/// rank's own in place ([`Src::Out`]), the peers' read from their windows at `bases`.
///
/// # Safety
///
/// `range` must lie inside every rank's buffer, and no peer may write it while the returned slices live.
unsafe fn window_sources(bases: &[*mut u8], me: usize, range: Range<usize>) -> Vec<Src<'_>> {
    (0..bases.len())
        .map(|r| {
            if r == me {
                Src::Out
            } else {
                // SAFETY: inside rank r's mapped window (the caller's promise), and unwritten meanwhile.
                Src::Bytes(unsafe {
                    std::slice::from_raw_parts(bases[r].add(range.start), range.len())
                })
            }
        })
        .collect()
}

/// The rounds of an operation over symmetric buffers read in place: `work` in the first, which starts once every
/// rank has entered the operation (its buffer holds its input, and no earlier operation on it is still running),
/// and an empty second, which keeps every rank in until every peer is done reading and writing its buffer. Rounds
/// carry no data, only the barrier and the header every rank checks.
fn in_place_rounds(
    cx: &mut Ctx<'_>,
    work: &mut dyn FnMut() -> Result<(), CommError>,
) -> Result<(), CommError> {
    cx.run(0, vec![], &|_, _| vec![], &[], &mut [], &mut |_, _| work())?;
    cx.barrier(1)
}

/// Whether an all-reduce of `bytes` takes the latency path: each rank reading every peer's whole buffer stays
/// within [`LATENCY_READ_LIMIT`] (see the module docs), unless the algorithm is forced.
fn latency_path(cx: &Ctx<'_>, bytes: usize) -> bool {
    let n = cx.t.size();
    cx.small_path(bytes.saturating_mul(n - 1) <= LATENCY_READ_LIMIT)
}

/// Whether a symmetric collective of `bytes` goes through the slots after all: forced by [`Algorithm::Latency`],
/// or small enough under [`Algorithm::Auto`] (see [`SYMMETRIC_STAGED_LIMIT`]).
fn staged(cx: &Ctx<'_>, bytes: usize) -> bool {
    cx.small_path(bytes <= SYMMETRIC_STAGED_LIMIT)
}

/// This rank's symmetric buffer at bytes `at` of its window, for the ordinary algorithms.
///
/// # Safety
///
/// `at` must be the range of the buffer whose collective the caller runs (the job owns the buffer, so no other
/// reference to it exists in this process), and no peer may read it meanwhile, which holds because the ordinary
/// algorithms never read the peers' windows.
// A `&mut` out of `&Windows` is this function's purpose: the window is memory that collectives hand back and
// forth, and exclusivity comes from the caller's job owning the buffer, as the contract above says.
#[allow(clippy::mut_from_ref)]
unsafe fn own_buffer(win: &Windows, at: Range<usize>) -> &mut [u8] {
    // SAFETY: the range lies inside this rank's mapped window (the allocator gave it); exclusivity is the
    // caller's promise above.
    unsafe { std::slice::from_raw_parts_mut(win.own().add(at.start), at.len()) }
}

/// In-place all-reduce of the symmetric buffers at bytes `at` of every rank's window (see [`crate::symmetric`]).
///
/// Where the peers' windows are mapped (shared memory) and the buffer is past [`staged`]'s size, it is one round
/// (after the barrier that says every rank's buffer holds its input) in which each rank reduces its part `me` of
/// every rank's buffer, in rank order as the ordinary algorithm does, and writes the result into every buffer,
/// this rank's and the peers'; a second round keeps every rank in until everybody has written into its buffer.
/// The part goes in steps of [`SYMMETRIC_STEP_BYTES`]: reduced into this rank's buffer, then copied into the
/// peers' while still in the first-level cache. Per rank that is reading the data once and writing it once, as a
/// local in-place pass would: nothing is staged, and nothing is copied twice.
///
/// Why it is safe: a rank reads and writes only part `me` of the buffers, which no other rank reads or writes
/// during the operation; the first round's barrier says every peer has entered it (its buffer is ready and no
/// earlier operation on it is still running), and the second's that every write into this rank's buffer is done
/// (each peer's arrival is a sequentially consistent store after its writes, which this rank loads).
///
/// Otherwise (private windows, one rank, a small buffer) the ordinary algorithm runs over this rank's buffer.
pub(crate) fn all_reduce_symmetric(
    cx: &mut Ctx<'_>,
    win: &Windows,
    at: Range<usize>,
    dtype: DType,
    op: ReduceOp,
) -> Result<(), CommError> {
    let (n, me, s) = (cx.t.size(), cx.t.rank(), dtype.size());
    let Some(bases) = peer_windows(cx, win).filter(|_| !staged(cx, at.len())) else {
        // SAFETY: `at` is this collective's buffer, and the ordinary algorithm reads no peer's window.
        return all_reduce(cx, unsafe { own_buffer(win, at) }, dtype, op);
    };
    let comm = cx.comm.to_owned();
    let part_bytes = shift(scale(part(at.len() / s, n, me), s), at.start);
    in_place_rounds(cx, &mut || {
        for step in pieces(part_bytes.len() / s, (SYMMETRIC_STEP_BYTES / s).max(1)) {
            let bytes = shift(scale(step, s), part_bytes.start);
            // SAFETY: part `me` of every buffer, which no peer reads or writes during the operation.
            let srcs = unsafe { window_sources(&bases, me, bytes.clone()) };
            // SAFETY: part `me` of this rank's buffer, which no peer touches during the operation and no other
            // reference in this process covers (the job owns the buffer).
            let out =
                unsafe { std::slice::from_raw_parts_mut(bases[me].add(bytes.start), bytes.len()) };
            reduce(dtype, op, &srcs, out, n).map_err(|f| fault(&comm, f))?;
            for r in (0..n).filter(|&r| r != me) {
                // SAFETY: part `me` of rank r's buffer, which only this rank writes during the operation
                // (rank r reads and writes only its own part); distinct windows, so it does not overlap `out`.
                let theirs = unsafe {
                    std::slice::from_raw_parts_mut(bases[r].add(bytes.start), bytes.len())
                };
                theirs.copy_from_slice(out);
            }
        }
        Ok(())
    })
}

/// In-place all-gather over symmetric buffers of `n` blocks: block `r` of every rank's buffer becomes rank `r`'s.
///
/// Read in place, it is one round (after the barrier that says every rank's block is in) in which each rank
/// copies block `r` straight out of rank `r`'s buffer, and a second that keeps every rank in until nobody reads
/// its buffer. No rank writes its own block, and no rank reads another block than the owner's, so the copies never
/// meet a write. Otherwise (private windows, one rank, a buffer that [`staged`] keeps in the slots), the ordinary
/// algorithm over this rank's buffer.
pub(crate) fn all_gather_symmetric(
    cx: &mut Ctx<'_>,
    win: &Windows,
    at: Range<usize>,
    dtype: DType,
) -> Result<(), CommError> {
    let (n, me) = (cx.t.size(), cx.t.rank());
    let block = at.len() / n;
    let Some(bases) = peer_windows(cx, win).filter(|_| !staged(cx, at.len())) else {
        // SAFETY: `at` is this collective's buffer, and the ordinary algorithm reads no peer's window.
        return all_gather(cx, None, unsafe { own_buffer(win, at) }, block, dtype);
    };
    let own = win.own();
    // Blocks copied into a buffer past the cache are written with non-temporal stores, which skip reading each
    // line first (see `stream_copy`). The whole buffer decides, not the bytes copied: every rank's buffer competes
    // for the cache. Measured on the 2-core development machine (2026-11-23 23:13 UTC, `hypercomm bench --backend
    // host -n 2 --op all_gather --symmetric --sizes S`, twelve alternations in both orders, median busbw): 8 MiB
    // 11.16 ordinary stores against 9.60 non-temporal (slower in 12 of 12), 12 MiB 6.89 against 9.19, 16 MiB
    // 5.42 against 7.08, 24 MiB 4.45 against 5.68 (faster in 12 of 12 each).
    let stream = at.len() > stream_copy::STREAM_OUTPUT_BYTES;
    in_place_rounds(cx, &mut || {
        for r in (0..n).filter(|&r| r != me) {
            let b = at.start + r * block;
            // SAFETY: block r of rank r's buffer, which nobody writes during the operation, and block r of
            // this rank's, which nobody else reads or writes and no other reference in this process covers;
            // distinct windows, so the two do not overlap.
            let (from, to) = unsafe {
                (
                    std::slice::from_raw_parts(bases[r].add(b), block),
                    std::slice::from_raw_parts_mut(own.add(b), block),
                )
            };
            stream_copy::copy(to, from, stream);
        }
        Ok(())
    })
}

/// In-place reduce-scatter over symmetric buffers of `n` blocks: block `me` of this rank's buffer becomes the
/// reduction of every rank's block `me`; the other blocks stay as they were.
///
/// Read in place, it is one round in which each rank reduces block `me` of every buffer (in rank order, as the
/// ordinary algorithm does) into its own, and a second that keeps every rank in until nobody reads its buffer. A
/// rank writes only its own block `me` and reads only blocks `me`, which no other rank writes. Otherwise (as for
/// the all-gather), the ordinary algorithm over this rank's buffer.
pub(crate) fn reduce_scatter_symmetric(
    cx: &mut Ctx<'_>,
    win: &Windows,
    at: Range<usize>,
    dtype: DType,
    op: ReduceOp,
) -> Result<(), CommError> {
    let (n, me) = (cx.t.size(), cx.t.rank());
    let block = at.len() / n;
    let Some(bases) = peer_windows(cx, win).filter(|_| !staged(cx, at.len())) else {
        // SAFETY: `at` is this collective's buffer, and the ordinary algorithm reads no peer's window.
        return reduce_scatter(cx, None, unsafe { own_buffer(win, at) }, block, dtype, op);
    };
    let own = win.own();
    let comm = cx.comm.to_owned();
    let mine = at.start + me * block..at.start + (me + 1) * block;
    in_place_rounds(cx, &mut || {
        // SAFETY: block `me` of a buffer is read only by this rank's operation and written by nobody
        // during it.
        let srcs = unsafe { window_sources(&bases, me, mine.clone()) };
        // SAFETY: block `me` of this rank's buffer, which no peer reads or writes (each reads its own block of
        // every buffer) and no other reference in this process covers.
        let out = unsafe { std::slice::from_raw_parts_mut(own.add(mine.start), block) };
        reduce(dtype, op, &srcs, out, n).map_err(|f| fault(&comm, f))
    })
}

/// In-place broadcast of `buf` from `root`.
pub(crate) fn broadcast(
    cx: &mut Ctx<'_>,
    buf: &mut [u8],
    dtype: DType,
    root: usize,
) -> Result<(), CommError> {
    let (me, s) = (cx.t.rank(), dtype.size());
    let stream = stream_copy::bypass_cache(buf.len());
    for (i, p) in pieces(buf.len() / s, cx.elems_per_round(s))
        .into_iter()
        .enumerate()
    {
        let bytes = scale(p, s);
        let len = bytes.len();
        let publish = if me == root {
            vec![Seg::Out(bytes.clone())]
        } else {
            vec![]
        };
        let wants = |src: usize, _| if src == root { all(len) } else { vec![] };
        cx.run(i as u64, publish, &wants, &[], buf, &mut |out, peers| {
            if me != root {
                copy_into(out, bytes.clone(), peers.get(root, 0..len)?, stream);
            }
            Ok(())
        })?;
    }
    Ok(())
}

/// Reduce to `root`. `input` is this rank's contribution (`None`: it is in `out`, in place). Only the root's
/// `out` is written.
pub(crate) fn reduce_to_root(
    cx: &mut Ctx<'_>,
    input: Option<&[u8]>,
    out: &mut [u8],
    dtype: DType,
    op: ReduceOp,
    root: usize,
) -> Result<(), CommError> {
    let (n, me, s) = (cx.t.size(), cx.t.rank(), dtype.size());
    let comm = cx.comm.to_owned();
    let contribution_len = input.map_or(out.len(), <[u8]>::len);
    for (i, p) in pieces(contribution_len / s, cx.elems_per_round(s))
        .into_iter()
        .enumerate()
    {
        let bytes = scale(p, s);
        let len = bytes.len();
        let publish = vec![if input.is_some() {
            Seg::In(bytes.clone())
        } else {
            Seg::Out(bytes.clone())
        }];
        let wants = |_, dst: usize| if dst == root { all(len) } else { vec![] };
        cx.run(
            i as u64,
            publish,
            &wants,
            input.unwrap_or(&[]),
            out,
            &mut |out, peers| {
                if me != root {
                    return Ok(());
                }
                let own = input.map(|inp| &inp[bytes.clone()]);
                let srcs = sources(n, me, own, peers, |_| 0..len)?;
                reduce(dtype, op, &srcs, &mut out[bytes.clone()], n).map_err(|f| fault(&comm, f))
            },
        )?;
    }
    Ok(())
}

/// The operands of one reduction on rank `me` of `n`: its own contribution (`own`, or `None` when it already sits
/// in the output) and each peer's publication bytes in `range(peer)`.
fn sources<'a>(
    n: usize,
    me: usize,
    own: Option<&'a [u8]>,
    peers: &'a dyn Peers,
    range: impl Fn(usize) -> Range<usize>,
) -> Result<Vec<Src<'a>>, CommError> {
    (0..n)
        .map(|r| {
            Ok(if r == me {
                own.map_or(Src::Out, Src::Bytes)
            } else {
                Src::Bytes(peers.get(r, range(r))?)
            })
        })
        .collect()
}

/// All-gather of `per_rank` bytes from each rank into `out` (`n * per_rank` bytes). `input: None` means in place:
/// this rank's contribution already sits at `out[me * per_rank..]`.
pub(crate) fn all_gather(
    cx: &mut Ctx<'_>,
    input: Option<&[u8]>,
    out: &mut [u8],
    per_rank: usize,
    dtype: DType,
) -> Result<(), CommError> {
    if direct::wanted(cx, out.len(), &direct::ALL_GATHER_WINDOW)
        && direct::all_gather(cx, input, out, per_rank)?
    {
        return Ok(());
    }
    let (n, me, s) = (cx.t.size(), cx.t.rank(), dtype.size());
    let stream = stream_copy::bypass_cache(out.len());
    for (i, p) in pieces(per_rank / s, cx.elems_per_round(s))
        .into_iter()
        .enumerate()
    {
        let bytes = scale(p, s);
        let len = bytes.len();
        let publish = vec![match input {
            Some(_) => Seg::In(bytes.clone()),
            None => Seg::Out(shift(bytes.clone(), me * per_rank)),
        }];
        cx.run(
            i as u64,
            publish,
            &|_, _| all(len),
            input.unwrap_or(&[]),
            out,
            &mut |out, peers| {
                for src in 0..n {
                    let at = shift(bytes.clone(), src * per_rank);
                    match (src == me, input) {
                        (true, Some(inp)) => copy_into(out, at, &inp[bytes.clone()], stream),
                        (true, None) => {}
                        (false, _) => copy_into(out, at, peers.get(src, 0..len)?, stream),
                    }
                }
                Ok(())
            },
        )?;
    }
    Ok(())
}

/// Publication of piece `p` (bytes within a block) of each of `n` blocks of `block` bytes.
fn per_dest(input: bool, n: usize, block: usize, p: &Range<usize>) -> Vec<Seg> {
    (0..n)
        .map(|d| {
            let r = shift(p.clone(), d * block);
            if input { Seg::In(r) } else { Seg::Out(r) }
        })
        .collect()
}

/// Publication of piece `p` (bytes within a block) of the blocks for every rank but `me`, in rank order: the
/// piece for rank `d` sits at position [`peer_slot`]`(me, d)` of the publication.
fn per_peer(input: bool, n: usize, me: usize, block: usize, p: &Range<usize>) -> Vec<Seg> {
    (0..n)
        .filter(|&d| d != me)
        .map(|d| {
            let r = shift(p.clone(), d * block);
            if input { Seg::In(r) } else { Seg::Out(r) }
        })
        .collect()
}

/// Where the piece for `dst` (not `src`) sits among the `n - 1` pieces `src` publishes with [`per_peer`].
fn peer_slot(src: usize, dst: usize) -> usize {
    if dst < src {
        dst
    } else {
        dst.saturating_sub(1)
    }
}

/// Reduce-scatter: each rank contributes `n` blocks of `block` bytes and receives the reduction of block `me`.
/// Out of place (`input: Some`): `out` is one block. In place: `out` holds all blocks and block `me` is reduced.
///
/// A rank publishes only the blocks its peers reduce, never its own (which it reads from its own buffer), so
/// each round moves `n - 1` pieces through shared memory instead of `n`, and a piece may be `1/(n-1)` of the slot.
pub(crate) fn reduce_scatter(
    cx: &mut Ctx<'_>,
    input: Option<&[u8]>,
    out: &mut [u8],
    block: usize,
    dtype: DType,
    op: ReduceOp,
) -> Result<(), CommError> {
    let (n, me, s) = (cx.t.size(), cx.t.rank(), dtype.size());
    if direct::wanted(cx, block * n, &direct::REDUCE_SCATTER_WINDOW)
        && direct::reduce_scatter(cx, input, out, block, dtype, op)?
    {
        return Ok(());
    }
    let comm = cx.comm.to_owned();
    let per_piece = (cx.elems_per_round(s) / (n - 1).max(1)).max(1);
    for (i, p) in pieces(block / s, per_piece).into_iter().enumerate() {
        let bytes = scale(p, s);
        let len = bytes.len();
        let publish = if n == 1 {
            Vec::new()
        } else {
            per_peer(input.is_some(), n, me, block, &bytes)
        };
        let wants = |src: usize, dst: usize| {
            if src == dst {
                return Vec::new();
            }
            let at = peer_slot(src, dst);
            vec![at * len..(at + 1) * len]
        };
        cx.run(
            i as u64,
            publish,
            &wants,
            input.unwrap_or(&[]),
            out,
            &mut |out, peers| {
                let own = input.map(|inp| &inp[shift(bytes.clone(), me * block)]);
                let srcs = sources(n, me, own, peers, |r| {
                    let at = peer_slot(r, me);
                    at * len..(at + 1) * len
                })?;
                let target = if input.is_some() {
                    bytes.clone()
                } else {
                    shift(bytes.clone(), me * block)
                };
                reduce(dtype, op, &srcs, &mut out[target], n).map_err(|f| fault(&comm, f))
            },
        )?;
    }
    Ok(())
}

/// All-to-all with equal blocks of `block` bytes: block `d` of rank `s` lands in block `s` of rank `d`.
/// `input: None` means in place on `out`.
pub(crate) fn all_to_all(
    cx: &mut Ctx<'_>,
    input: Option<&[u8]>,
    out: &mut [u8],
    block: usize,
    dtype: DType,
) -> Result<(), CommError> {
    let (n, me, s) = (cx.t.size(), cx.t.rank(), dtype.size());
    let per_piece = (cx.elems_per_round(s) / n).max(1);
    let stream = stream_copy::bypass_cache(out.len());
    for (i, p) in pieces(block / s, per_piece).into_iter().enumerate() {
        let bytes = scale(p, s);
        let len = bytes.len();
        let publish = per_dest(input.is_some(), n, block, &bytes);
        let wants = |_, dst: usize| vec![dst * len..(dst + 1) * len];
        cx.run(
            i as u64,
            publish,
            &wants,
            input.unwrap_or(&[]),
            out,
            &mut |out, peers| {
                for src in 0..n {
                    let at = shift(bytes.clone(), src * block);
                    match (src == me, input) {
                        (true, Some(inp)) => copy_into(out, at.clone(), &inp[at], stream),
                        (true, None) => {}
                        (false, _) => {
                            copy_into(out, at, peers.get(src, me * len..(me + 1) * len)?, stream)
                        }
                    }
                }
                Ok(())
            },
        )?;
    }
    Ok(())
}

/// All-to-all with per-peer element counts. `input` holds the blocks for ranks 0, 1, ... back to back
/// (`send[d]` elements each); `out` receives the blocks from ranks 0, 1, ... back to back (`recv[s]` each).
pub(crate) fn all_to_all_v(
    cx: &mut Ctx<'_>,
    input: &[u8],
    send: &[usize],
    out: &mut [u8],
    recv: &[usize],
    dtype: DType,
) -> Result<(), CommError> {
    let (n, me, s) = (cx.t.size(), cx.t.rank(), dtype.size());
    if cx.t.capacity() < 16 * n {
        return Err(CommError::InvalidArgument {
            comm: cx.comm.to_owned(),
            what: format!(
                "all_to_all_v needs {} bytes of scratch for {n} ranks' counts",
                16 * n
            ),
        });
    }
    // Round 0: everyone publishes its send and receive counts, so every rank can check the whole matrix.
    let mut counts = Vec::with_capacity(16 * n);
    for c in send.iter().chain(recv) {
        counts.extend_from_slice(&(*c as u64).to_le_bytes());
    }
    let mut matrix: Vec<Vec<u64>> = Vec::new();
    cx.run(
        0,
        vec![Seg::In(0..counts.len())],
        &|_, _| all(16 * n),
        &counts,
        &mut [],
        &mut |_, peers| {
            for r in 0..n {
                let bytes = if r == me {
                    &counts[..]
                } else {
                    peers.get(r, 0..16 * n)?
                };
                matrix.push(
                    bytes
                        .chunks_exact(8)
                        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                        .collect(),
                );
            }
            Ok(())
        },
    )?;
    for a in 0..n {
        for b in 0..n {
            let (sent, expected) = (matrix[a][b], matrix[b][n + a]);
            if sent != expected {
                return Err(CommError::mismatch(
                    cx.comm,
                    Vec::new(),
                    vec![
                        Call {
                            ranks: vec![a],
                            call: format!("all_to_all_v sending {sent} elements to rank {b}"),
                        },
                        Call {
                            ranks: vec![b],
                            call: format!(
                                "all_to_all_v expecting {expected} elements from rank {a}"
                            ),
                        },
                    ],
                ));
            }
        }
    }
    let count = |src: usize, dst: usize| matrix[src][dst] as usize;
    let sdispl: Vec<usize> = send
        .iter()
        .scan(0, |acc, c| {
            let d = *acc;
            *acc += c;
            Some(d)
        })
        .collect();
    let rdispl: Vec<usize> = recv
        .iter()
        .scan(0, |acc, c| {
            let d = *acc;
            *acc += c;
            Some(d)
        })
        .collect();
    let per = (cx.elems_per_round(s) / n).max(1);
    let stream = stream_copy::bypass_cache(out.len());
    let rounds = (0..n)
        .flat_map(|a| (0..n).map(move |b| (a, b)))
        .map(|(a, b)| count(a, b).div_ceil(per))
        .max()
        .unwrap_or(0);
    // Elements of the (src -> dst) block that travel in round t.
    let window = |src: usize, dst: usize, t: usize| {
        (t * per).min(count(src, dst))..((t + 1) * per).min(count(src, dst))
    };
    for t in 0..rounds {
        let publish = (0..n)
            .map(|d| Seg::In(scale(shift(window(me, d, t), sdispl[d]), s)))
            .collect();
        let wants = |src: usize, dst: usize| {
            let before: usize = (0..dst).map(|d| window(src, d, t).len()).sum();
            vec![scale(before..before + window(src, dst, t).len(), s)]
        };
        cx.run(
            1 + t as u64,
            publish,
            &wants,
            input,
            out,
            &mut |out, peers| {
                for src in 0..n {
                    let w = window(src, me, t);
                    let at = scale(shift(w.clone(), rdispl[src]), s);
                    if src == me {
                        copy_into(out, at, &input[scale(shift(w, sdispl[me]), s)], stream);
                    } else {
                        let before: usize = (0..me).map(|d| window(src, d, t).len()).sum();
                        let from = peers.get(src, scale(before..before + w.len(), s))?;
                        copy_into(out, at, from, stream);
                    }
                }
                Ok(())
            },
        )?;
    }
    Ok(())
}

/// Gather `input` from every rank into the root's `out` (`n * input.len()` bytes there; ignored elsewhere).
pub(crate) fn gather(
    cx: &mut Ctx<'_>,
    input: &[u8],
    out: &mut [u8],
    dtype: DType,
    root: usize,
) -> Result<(), CommError> {
    let (n, me, s) = (cx.t.size(), cx.t.rank(), dtype.size());
    let per_rank = input.len();
    let stream = stream_copy::bypass_cache(out.len());
    for (i, p) in pieces(per_rank / s, cx.elems_per_round(s))
        .into_iter()
        .enumerate()
    {
        let bytes = scale(p, s);
        let len = bytes.len();
        let wants = |_, dst: usize| if dst == root { all(len) } else { vec![] };
        cx.run(
            i as u64,
            vec![Seg::In(bytes.clone())],
            &wants,
            input,
            out,
            &mut |out, peers| {
                if me != root {
                    return Ok(());
                }
                for src in 0..n {
                    let at = shift(bytes.clone(), src * per_rank);
                    let from = if src == me {
                        &input[bytes.clone()]
                    } else {
                        peers.get(src, 0..len)?
                    };
                    copy_into(out, at, from, stream);
                }
                Ok(())
            },
        )?;
    }
    Ok(())
}

/// Scatter the root's `input` (`n` blocks of `out.len()` bytes) so that rank `d` receives block `d` in `out`.
pub(crate) fn scatter(
    cx: &mut Ctx<'_>,
    input: &[u8],
    out: &mut [u8],
    dtype: DType,
    root: usize,
) -> Result<(), CommError> {
    let (n, me, s) = (cx.t.size(), cx.t.rank(), dtype.size());
    let block = out.len();
    let per_piece = (cx.elems_per_round(s) / n).max(1);
    let stream = stream_copy::bypass_cache(block);
    for (i, p) in pieces(block / s, per_piece).into_iter().enumerate() {
        let bytes = scale(p, s);
        let len = bytes.len();
        let publish = if me == root {
            per_dest(true, n, block, &bytes)
        } else {
            vec![]
        };
        let wants = |src: usize, dst: usize| {
            if src == root {
                vec![dst * len..(dst + 1) * len]
            } else {
                vec![]
            }
        };
        cx.run(i as u64, publish, &wants, input, out, &mut |out, peers| {
            let from = if me == root {
                &input[shift(bytes.clone(), me * block)]
            } else {
                peers.get(root, me * len..(me + 1) * len)?
            };
            copy_into(out, bytes.clone(), from, stream);
            Ok(())
        })?;
    }
    Ok(())
}

/// A round with no data: returns once every rank has entered it.
pub(crate) fn barrier(cx: &mut Ctx<'_>) -> Result<(), CommError> {
    cx.run(0, vec![], &|_, _| vec![], &[], &mut [], &mut |_, _| Ok(()))
}

/// The header every rank must agree on for one operation.
pub(crate) fn header(
    seq: u64,
    kind: OpKind,
    dtype: Option<DType>,
    op: Option<ReduceOp>,
    root: Option<usize>,
    count: usize,
) -> Header {
    Header {
        seq,
        kind,
        dtype,
        op,
        root,
        count: count as u64,
        extra: 0,
        window: None,
    }
}
