//! The host collectives staged through the transport's slots, each written once against
//! [`Transport`](super::transport::Transport) rounds. The all-reduce, which has two paths and a selector between
//! them, is in `staged_all_reduce`; it builds on the helpers here.
//!
//! Every collective runs at least one round, so ranks that disagree are caught even for empty buffers. Large
//! buffers are cut into pieces that fit the transport's per-round capacity.
//!
//! Where the ranks may read each other's memory, the large all-gather and reduce-scatter skip the slots altogether
//! and read the peers' buffers where they are ([`direct`]).
//!
//! Collectives over symmetric buffers read in place (`symmetric_algorithms`) fall back on the algorithms here where
//! the peers' windows are not mapped or the buffer is small.

// A publication's wanted ranges are lists that often hold one range; indexing the count matrix by rank pairs reads
// better than iterator chains.
#![allow(clippy::single_range_in_vec_init, clippy::needless_range_loop)]

use std::ops::Range;

use super::collective::{Ctx, all, fault, pieces, scale, shift};
use super::direct;
use super::stream_copy;
use super::transport::{Peers, Seg};
use crate::CommError;
use crate::element::{DType, ReduceOp};
use crate::error::Call;
use crate::reduce::{Src, reduce};

/// Copies `from` to `out[at]`, bypassing the cache when `stream` is set (see [`stream_copy`]).
pub(super) fn copy_into(out: &mut [u8], at: Range<usize>, from: &[u8], stream: bool) {
    stream_copy::copy(&mut out[at], from, stream);
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
pub(super) fn sources<'a>(
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
