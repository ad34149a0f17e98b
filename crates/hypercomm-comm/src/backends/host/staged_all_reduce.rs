//! The staged all-reduce: its two paths through the transport's slots and the size-based selector between them.
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
//! Where the ranks may read each other's memory, the large all-reduce skips the slots altogether and reads the
//! peers' buffers where they are ([`direct`]).
//!
//! Measurements: `docs/perf/host-algorithms.md`.
//!
//! [`Algorithm::Auto`]: crate::options::Algorithm::Auto

use std::ops::Range;

use super::collective::{Ctx, all, fault, part, pieces, scale, shift};
use super::direct;
use super::staged::{copy_into, sources};
use super::transport::Seg;
use crate::CommError;
use crate::element::{DType, ReduceOp};
use crate::reduce::reduce;

/// The latency path's budget: bytes each rank may read from peers in one all-reduce (see the module docs).
pub(crate) const LATENCY_READ_LIMIT: usize = 256 * 1024;

/// The bandwidth path's largest piece. A round touches the piece in the caller's buffer, this rank's publication
/// and the peers' (each about a piece), so with the default 1 MiB slot (pieces of 2/3 MiB at two ranks) the round
/// no longer fits a 1 MiB L2 and the copies run at memory speed. Capped, the round's working set stays in the
/// core's cache; 256 KiB is the cap of those tried that runs fastest from 1 MiB up.
pub(crate) const PIPELINE_PIECE_BYTES: usize = 256 * 1024;

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
    // when whole pieces were published (filling the slot is slower), and at most PIPELINE_PIECE_BYTES, so that a
    // round's working set stays in the core's cache (see the constant).
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

/// Whether an all-reduce of `bytes` takes the latency path: each rank reading every peer's whole buffer stays
/// within [`LATENCY_READ_LIMIT`] (see the module docs), unless the algorithm is forced.
fn latency_path(cx: &Ctx<'_>, bytes: usize) -> bool {
    let n = cx.t.size();
    cx.small_path(bytes.saturating_mul(n - 1) <= LATENCY_READ_LIMIT)
}
