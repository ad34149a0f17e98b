//! [`Shard`]: where one tensor-parallel shard of a parameter lies in the full tensor, and the [`Runs`] that copy
//! the bytes two shards share.
//!
//! A parameter of shape `[d0, d1, ...]` split `n` ways along dim `s` in `b` blocks cuts `d_s` into `b` equal
//! blocks and each block into `n` equal parts; shard `t` holds part `t` of every block, the blocks one after
//! another along `s` (Megatron's gated `linear_fc1`: `[gate; up]`, each rank `[gate_t; up_t]`). So a shard is `b`
//! boxes of the full tensor, each at a known place in the shard's own row-major layout. Two shards share the
//! intersection of their boxes; each intersection is a box that is strided runs in both layouts.

use crate::runs::{Runs, Stride};

/// One box of a shard: `lo..hi` per dimension in the full tensor, starting at `origin` in the shard.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Piece {
    lo: Vec<u64>,
    hi: Vec<u64>,
    origin: Vec<u64>,
}

/// One local shard of a parameter: its shape and the boxes of the full tensor it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Shard {
    elem: u64,
    local_shape: Vec<u64>,
    pieces: Vec<Piece>,
}

impl Shard {
    /// Shard `index` of `parts` of a tensor of `shape` (a scalar's shape may be empty) with `elem`-byte elements,
    /// split along `split = (dim, blocks)`, or whole when `split` is `None` (then `parts` and `index` are
    /// ignored). The caller has checked that `dim < shape.len()` and that `parts · blocks` divides `shape[dim]`.
    pub(crate) fn new(
        shape: &[u64],
        elem: u64,
        split: Option<(usize, u64)>,
        parts: u64,
        index: u64,
    ) -> Shard {
        let shape: Vec<u64> = if shape.is_empty() {
            vec![1]
        } else {
            shape.to_vec()
        };
        let zeros = vec![0; shape.len()];
        let Some((dim, blocks)) = split else {
            return Shard {
                elem,
                local_shape: shape.clone(),
                pieces: vec![Piece {
                    lo: zeros.clone(),
                    hi: shape,
                    origin: zeros,
                }],
            };
        };
        let block = shape[dim] / blocks;
        let part = block / parts;
        let mut local_shape = shape.clone();
        local_shape[dim] = part * blocks;
        let pieces = (0..blocks)
            .map(|j| {
                let (mut lo, mut hi, mut origin) = (zeros.clone(), shape.clone(), zeros.clone());
                lo[dim] = j * block + index * part;
                hi[dim] = lo[dim] + part;
                origin[dim] = j * part;
                Piece { lo, hi, origin }
            })
            .collect();
        Shard {
            elem,
            local_shape,
            pieces,
        }
    }

    /// The shard's size in bytes.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> u64 {
        self.elem * self.local_shape.iter().product::<u64>()
    }

    /// The byte stride of each dimension in the shard's row-major layout.
    fn strides(&self) -> Vec<u64> {
        let mut strides = vec![self.elem; self.local_shape.len()];
        for i in (0..strides.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * self.local_shape[i + 1];
        }
        strides
    }

    /// The bytes this shard (the sender) shares with `dst` (the receiver, a shard of the same parameter), as
    /// normalised runs from this shard's layout into `dst`'s: one per pair of intersecting boxes, in `dst`'s box
    /// order.
    pub(crate) fn overlap(&self, dst: &Shard) -> Vec<Runs> {
        let (src_strides, dst_strides) = (self.strides(), dst.strides());
        let mut out = Vec::new();
        for q in &dst.pieces {
            for p in &self.pieces {
                let lo: Vec<u64> = p.lo.iter().zip(&q.lo).map(|(a, b)| *a.max(b)).collect();
                let hi: Vec<u64> = p.hi.iter().zip(&q.hi).map(|(a, b)| *a.min(b)).collect();
                if lo.iter().zip(&hi).any(|(l, h)| l >= h) {
                    continue;
                }
                let offset = |piece: &Piece, strides: &[u64]| -> u64 {
                    (0..lo.len())
                        .map(|i| (lo[i] - piece.lo[i] + piece.origin[i]) * strides[i])
                        .sum()
                };
                let repeat = (0..lo.len())
                    .map(|i| Stride {
                        count: hi[i] - lo[i],
                        src: src_strides[i],
                        dst: dst_strides[i],
                    })
                    .collect();
                out.push(
                    Runs {
                        src_offset: offset(p, &src_strides),
                        dst_offset: offset(q, &dst_strides),
                        len: self.elem,
                        repeat,
                    }
                    .normalized(),
                );
            }
        }
        out
    }

    /// The byte of the full tensor (row-major) that the shard's byte `offset` holds; `None` past the shard.
    #[cfg(test)]
    pub(crate) fn full_byte(&self, shape: &[u64], offset: u64) -> Option<u64> {
        if offset >= self.bytes() {
            return None;
        }
        let strides = self.strides();
        let local: Vec<u64> = (0..strides.len())
            .map(|i| (offset / strides[i]) % self.local_shape[i])
            .collect();
        let piece = self.pieces.iter().find(|p| {
            (0..local.len())
                .all(|i| local[i] >= p.origin[i] && local[i] - p.origin[i] < p.hi[i] - p.lo[i])
        })?;
        let mut full_strides = vec![self.elem; local.len()];
        for i in (0..local.len().saturating_sub(1)).rev() {
            full_strides[i] = full_strides[i + 1] * shape[i + 1];
        }
        Some(
            (0..local.len())
                .map(|i| (local[i] - piece.origin[i] + piece.lo[i]) * full_strides[i])
                .sum::<u64>()
                + offset % self.elem,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every byte the runs copy, as (full-tensor byte read, full-tensor byte written).
    fn mapped(shape: &[u64], src: &Shard, dst: &Shard) -> Vec<(u64, u64)> {
        src.overlap(dst)
            .iter()
            .flat_map(|r| r.iter().collect::<Vec<_>>())
            .flat_map(|(s, d, len)| (0..len).map(move |i| (s + i, d + i)))
            .map(|(s, d)| {
                (
                    src.full_byte(shape, s).unwrap(),
                    dst.full_byte(shape, d).unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn column_shards_are_one_contiguous_run() {
        // A [8, 4] f32 weight, column-parallel over 2 into 4: shard 1 of 4 is the second half of shard 0 of 2.
        let shape = [8, 4];
        let src = Shard::new(&shape, 4, Some((0, 1)), 2, 0);
        let dst = Shard::new(&shape, 4, Some((0, 1)), 4, 1);
        assert_eq!(src.overlap(&dst), [Runs::contiguous(32, 0, 32)]);
        assert_eq!(dst.bytes(), 32);
    }

    #[test]
    fn row_shards_are_strided_runs_and_map_byte_for_byte() {
        // A [3, 8] bf16 weight, row-parallel (split along dim 1) over 2, into the whole tensor.
        let shape = [3, 8];
        let src = Shard::new(&shape, 2, Some((1, 1)), 2, 1);
        let dst = Shard::new(&shape, 2, None, 1, 0);
        let runs = src.overlap(&dst);
        assert_eq!(
            runs,
            [Runs {
                src_offset: 0,
                dst_offset: 8,
                len: 8,
                repeat: vec![Stride {
                    count: 3,
                    src: 8,
                    dst: 16
                }],
            }]
        );
        for (read, written) in mapped(&shape, &src, &dst) {
            assert_eq!(read, written);
        }
    }

    #[test]
    fn blocks_split_each_block_and_shards_agree_across_sizes() {
        // A gated fc1 [8, 2]: blocks gate = rows 0..4, up = rows 4..8; over tp 2 shard 1 holds rows 2,3,6,7.
        let shape = [8, 2];
        let shard = Shard::new(&shape, 1, Some((0, 2)), 2, 1);
        let rows: Vec<u64> = (0..4)
            .map(|r| shard.full_byte(&shape, r * 2).unwrap() / 2)
            .collect();
        assert_eq!(rows, [2, 3, 6, 7]);
        // Every pair of tp sizes and split dims: each destination byte comes from the same full-tensor byte, and
        // the shards of one source cover each destination byte exactly once.
        let shape = [4, 6, 2];
        for (src_split, src_parts) in [
            (None, 1),
            (Some((1, 1)), 2),
            (Some((0, 2)), 2),
            (Some((1, 3)), 2),
        ] {
            for (dst_split, dst_parts) in [
                (None, 1),
                (Some((0, 1)), 4),
                (Some((1, 1)), 3),
                (Some((2, 1)), 2),
            ] {
                for d in 0..dst_parts {
                    let dst = Shard::new(&shape, 2, dst_split, dst_parts, d);
                    let mut written = Vec::new();
                    for s in 0..src_parts {
                        let src = Shard::new(&shape, 2, src_split, src_parts, s);
                        for (read, wrote) in mapped(&shape, &src, &dst) {
                            assert_eq!(
                                read, wrote,
                                "{src_split:?}/{src_parts} -> {dst_split:?}/{dst_parts}"
                            );
                            written.push(wrote);
                        }
                    }
                    written.sort_unstable();
                    let expected: Vec<u64> = (0..dst.bytes())
                        .map(|o| dst.full_byte(&shape, o).unwrap())
                        .collect();
                    let mut expected_sorted = expected.clone();
                    expected_sorted.sort_unstable();
                    assert_eq!(written, expected_sorted);
                }
            }
        }
    }

    #[test]
    fn scalars_are_one_element() {
        let scalar = Shard::new(&[], 8, None, 1, 0);
        assert_eq!(scalar.bytes(), 8);
        assert_eq!(scalar.overlap(&scalar), [Runs::contiguous(0, 0, 8)]);
    }
}
