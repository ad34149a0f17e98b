//! The operation descriptor every rank attaches to every round, so that disagreeing ranks are caught before any
//! data is consumed.

use std::fmt;

use crate::CommError;
use crate::element::{DType, ReduceOp};
use crate::error::Call;

/// Bytes a header occupies in a shared-memory buffer or a TCP frame.
pub(crate) const HEADER_BYTES: usize = 64;

/// Which operation a round belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum OpKind {
    AllReduce = 1,
    Broadcast = 2,
    Reduce = 3,
    AllGather = 4,
    ReduceScatter = 5,
    AllToAll = 6,
    AllToAllV = 7,
    Gather = 8,
    Scatter = 9,
    Barrier = 10,
    Send = 11,
    AllReduceSymmetric = 12,
    AllGatherSymmetric = 13,
    ReduceScatterSymmetric = 14,
}

impl OpKind {
    const ALL: [OpKind; 14] = [
        OpKind::AllReduce,
        OpKind::Broadcast,
        OpKind::Reduce,
        OpKind::AllGather,
        OpKind::ReduceScatter,
        OpKind::AllToAll,
        OpKind::AllToAllV,
        OpKind::Gather,
        OpKind::Scatter,
        OpKind::Barrier,
        OpKind::Send,
        OpKind::AllReduceSymmetric,
        OpKind::AllGatherSymmetric,
        OpKind::ReduceScatterSymmetric,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            OpKind::AllReduce => "all_reduce",
            OpKind::Broadcast => "broadcast",
            OpKind::Reduce => "reduce",
            OpKind::AllGather => "all_gather",
            OpKind::ReduceScatter => "reduce_scatter",
            OpKind::AllToAll => "all_to_all",
            OpKind::AllToAllV => "all_to_all_v",
            OpKind::Gather => "gather",
            OpKind::Scatter => "scatter",
            OpKind::Barrier => "barrier",
            OpKind::Send => "send",
            OpKind::AllReduceSymmetric => "all_reduce_symmetric",
            OpKind::AllGatherSymmetric => "all_gather_symmetric",
            OpKind::ReduceScatterSymmetric => "reduce_scatter_symmetric",
        }
    }
}

/// What an operation is, as every participating rank must agree on it.
///
/// `count` is the per-rank element count the operation is defined by (the all-reduce length, the all-gather input
/// length); `extra` carries a tag for point-to-point messages and the round's index within the operation;
/// `window` is where an operation on symmetric buffers finds them: their byte offset in every rank's window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    /// Collective sequence number on this communicator (point-to-point messages: per-pair message number).
    pub seq: u64,
    pub kind: OpKind,
    pub dtype: Option<DType>,
    pub op: Option<ReduceOp>,
    pub root: Option<usize>,
    pub count: u64,
    pub extra: u64,
    pub window: Option<u64>,
}

impl Header {
    pub(crate) fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut out = [0u8; HEADER_BYTES];
        // Word 7 stays free: the shared-memory transport keeps the payload length there. The kind, the element
        // type and the reduction (small tags all) share word 1; word 2 holds a premulsum's factor, bit for bit, so
        // that ranks passing different factors disagree.
        let tags = self.kind as u64
            | self.dtype.map_or(0, |d| d as u64) << 16
            | self.op.map_or(0, |o| u64::from(o.tag())) << 32;
        let words: [u64; 7] = [
            self.seq,
            tags,
            self.op.map_or(0, ReduceOp::scalar_bits),
            self.window.unwrap_or(u64::MAX),
            self.root.map_or(u64::MAX, |r| r as u64),
            self.count,
            self.extra,
        ];
        for (i, w) in words.iter().enumerate() {
            out[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
        }
        out
    }

    /// Parses a header; `None` when a tag is not one this version writes.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Header> {
        let word = |i: usize| -> Option<u64> {
            let b: [u8; 8] = bytes.get(i * 8..i * 8 + 8)?.try_into().ok()?;
            Some(u64::from_le_bytes(b))
        };
        let tags = word(1)?;
        let kind = OpKind::ALL
            .into_iter()
            .find(|k| *k as u64 == tags & 0xffff)?;
        let dtype = match (tags >> 16) & 0xffff {
            0 => None,
            t => Some(DType::from_tag(u32::try_from(t).ok()?)?),
        };
        let scalar = word(2)?;
        let op = match tags >> 32 {
            0 if scalar == 0 => None,
            0 => return None,
            t => Some(ReduceOp::from_tag(u32::try_from(t).ok()?, scalar)?),
        };
        let window = Some(word(3)?).filter(|&w| w != u64::MAX);
        let root = match word(4)? {
            u64::MAX => None,
            r => Some(usize::try_from(r).ok()?),
        };
        Some(Header {
            seq: word(0)?,
            kind,
            dtype,
            op,
            root,
            count: word(5)?,
            extra: word(6)?,
            window,
        })
    }
}

impl fmt::Display for Header {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}(#{}", self.kind.name(), self.seq)?;
        if let Some(d) = self.dtype {
            write!(f, ", dtype={d}")?;
        }
        write!(f, ", count={}", self.count)?;
        if let Some(o) = self.op {
            write!(f, ", op={o}")?;
        }
        if let Some(r) = self.root {
            write!(f, ", root={r}")?;
        }
        if let Some(w) = self.window {
            write!(f, ", window offset={w}")?;
        }
        if self.kind == OpKind::Send {
            write!(f, ", tag={}", self.extra)?;
        }
        f.write_str(")")
    }
}

/// Groups the ranks (positions) by the header they published; `None` when all agree. Every rank that saw the
/// same headers gets the same sides, so every rank describes (and blames) the disagreement identically.
pub(crate) fn disagreement(headers: &[Header]) -> Option<Vec<Call>> {
    let mut sides: Vec<(Header, Vec<usize>)> = Vec::new();
    for (r, h) in headers.iter().enumerate() {
        match sides.iter_mut().find(|(seen, _)| seen == h) {
            Some((_, ranks)) => ranks.push(r),
            None => sides.push((*h, vec![r])),
        }
    }
    (sides.len() > 1).then(|| {
        sides
            .into_iter()
            .map(|(h, ranks)| Call {
                ranks,
                call: h.to_string(),
            })
            .collect()
    })
}

/// A receive that found another message than it expected: `me` expected `expected` from `peer`, which sent
/// `got`. Positions, as every backend error.
pub(crate) fn p2p_mismatch(
    comm: &str,
    me: usize,
    expected: &Header,
    peer: usize,
    got: &Header,
) -> CommError {
    CommError::mismatch(
        comm,
        Vec::new(),
        vec![
            Call {
                ranks: vec![me],
                call: format!("recv expecting {expected}"),
            },
            Call {
                ranks: vec![peer],
                call: format!("{got}"),
            },
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_disagreements_name_both_sides() {
        let h = Header {
            seq: 9,
            kind: OpKind::AllReduce,
            dtype: Some(DType::BF16),
            op: Some(ReduceOp::Max),
            root: None,
            count: 5,
            extra: 0,
            window: None,
        };
        assert_eq!(Header::decode(&h.encode()), Some(h));
        let symmetric = Header {
            kind: OpKind::AllReduceSymmetric,
            window: Some(4096),
            extra: 3,
            ..h
        };
        assert_eq!(Header::decode(&symmetric.encode()), Some(symmetric));
        assert_eq!(
            symmetric.to_string(),
            "all_reduce_symmetric(#9, dtype=bf16, count=5, op=max, window offset=4096)"
        );
        let other = Header { count: 6, ..h };
        let sides = disagreement(&[h, other, h]).unwrap();
        assert_eq!(
            sides,
            vec![
                Call {
                    ranks: vec![0, 2],
                    call: "all_reduce(#9, dtype=bf16, count=5, op=max)".into()
                },
                Call {
                    ranks: vec![1],
                    call: "all_reduce(#9, dtype=bf16, count=6, op=max)".into()
                },
            ]
        );
        assert_eq!(disagreement(&[h, h]), None);
        assert_eq!(Header::decode(&[0xff; 64]), None);
    }

    #[test]
    fn a_premulsum_factor_travels_bit_for_bit_and_different_factors_disagree() {
        let quarter = Header {
            seq: 3,
            kind: OpKind::ReduceScatter,
            dtype: Some(DType::F32),
            op: Some(ReduceOp::pre_mul_sum(0.25)),
            root: None,
            count: 8,
            extra: 0,
            window: None,
        };
        assert_eq!(Header::decode(&quarter.encode()), Some(quarter));
        // -0.0 and 0.0 are different factors; 1/3 keeps every bit.
        for f in [-0.0, 0.0, 1.0 / 3.0, -1e300] {
            let h = Header {
                op: Some(ReduceOp::pre_mul_sum(f)),
                ..quarter
            };
            let back = Header::decode(&h.encode()).unwrap();
            assert_eq!(back.op.map(ReduceOp::scalar_bits), Some(f.to_bits()));
        }
        let half = Header {
            op: Some(ReduceOp::pre_mul_sum(0.5)),
            ..quarter
        };
        let sum = Header {
            op: Some(ReduceOp::Sum),
            ..quarter
        };
        let sides = disagreement(&[quarter, half, sum, quarter]).unwrap();
        let calls: Vec<(&[usize], &str)> = sides
            .iter()
            .map(|c| (c.ranks.as_slice(), c.call.as_str()))
            .collect();
        assert_eq!(
            calls,
            [
                (
                    &[0, 3][..],
                    "reduce_scatter(#3, dtype=f32, count=8, op=premulsum(0.25))"
                ),
                (
                    &[1][..],
                    "reduce_scatter(#3, dtype=f32, count=8, op=premulsum(0.5))"
                ),
                (&[2][..], "reduce_scatter(#3, dtype=f32, count=8, op=sum)"),
            ]
        );
        // A factor beside a reduction that takes none is not a header this version writes.
        let mut bytes = sum.encode();
        bytes[16..24].copy_from_slice(&0.5f64.to_bits().to_le_bytes());
        assert_eq!(Header::decode(&bytes), None);
    }
}
