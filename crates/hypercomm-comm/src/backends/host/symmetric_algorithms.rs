//! The collectives over symmetric buffers ([`crate::symmetric`]): the all-reduce, all-gather and reduce-scatter of
//! the buffer at the same bytes of every rank's window, read and written in place.
//!
//! Where the peers' windows are mapped here (shared memory), a rank reads the peers' buffers where they are and
//! writes its results straight into the buffers they belong in: nothing goes through the slots, and nothing is
//! copied twice. Every operation is two rounds that carry no data ([`in_place_rounds`]): the work runs in the
//! first, once every rank has entered the operation, and the second keeps every rank in until nobody reads or
//! writes its buffer any more. A rank reads and writes only what no other rank writes during the operation; each
//! function says which bytes those are.
//!
//! Otherwise (private windows, one rank, a buffer up to [`SYMMETRIC_STAGED_LIMIT`], or the latency path forced),
//! the same call runs the staged algorithm ([`staged`](super::staged), [`staged_all_reduce`](super::staged_all_reduce))
//! over this rank's buffer.
//!
//! Measurements: `docs/perf/host-algorithms.md`.

use std::ops::Range;

use super::collective::{Ctx, fault, part, pieces, scale, shift};
use super::staged::{all_gather, reduce_scatter};
use super::staged_all_reduce::all_reduce;
use super::stream_copy;
use crate::CommError;
use crate::element::{DType, ReduceOp};
use crate::reduce::{Src, reduce};
use crate::symmetric::Windows;

/// The in-place (symmetric) all-reduce's step: it reduces this many bytes of its part into its own buffer, then
/// copies them into every peer's while they are still in the first-level cache. Larger steps no longer stay in
/// that cache and run slower; 16 KiB is the step of those tried that runs fastest, or close to it, at every size
/// measured.
pub(crate) const SYMMETRIC_STEP_BYTES: usize = 16 * 1024;

/// The largest symmetric collective (whole buffer, bytes) that [`Algorithm::Auto`] still stages through the slots:
/// working in place takes two barriers (one for the data, one before anybody may return) where a staged round
/// takes one, and below this the barrier costs more than the copy saves.
///
/// [`Algorithm::Auto`]: crate::options::Algorithm::Auto
pub(crate) const SYMMETRIC_STAGED_LIMIT: usize = 4096;

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

/// Whether a symmetric collective of `bytes` goes through the slots after all: forced by [`Algorithm::Latency`],
/// or small enough under [`Algorithm::Auto`] (see [`SYMMETRIC_STAGED_LIMIT`]).
///
/// [`Algorithm::Latency`]: crate::options::Algorithm::Latency
/// [`Algorithm::Auto`]: crate::options::Algorithm::Auto
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
    // for the cache (measurements: docs/perf/host-algorithms.md).
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
