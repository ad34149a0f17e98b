//! What every host collective is built from, whether it stages through the slots, reads the peers' buffers
//! directly or works in place on symmetric buffers: its context ([`Ctx`]: the transport, the header every rank
//! checks, the algorithm the options ask for), the rounds it runs (one that carries data, [`Ctx::run`], and one
//! that carries none, [`Ctx::barrier`]), the header of one operation ([`header`]), and the arithmetic that cuts a
//! buffer into parts (one per rank, [`part`]) and pieces (one per round, [`pieces`]).
//!
//! The staged algorithms (`staged`), the direct reads (`direct`) and the symmetric-buffer algorithms
//! (`symmetric_algorithms`) import this module; it imports none of them.

// A publication's wanted ranges are lists that often hold one range.
#![allow(clippy::single_range_in_vec_init)]

use std::ops::Range;

use super::header::{Header, OpKind};
use super::transport::{Consume, Round, Seg, Transport};
use crate::CommError;
use crate::element::{DType, ReduceOp};
use crate::options::Algorithm;
use crate::reduce::ReduceFault;

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
    pub(super) fn small_path(&self, small: bool) -> bool {
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

    pub(super) fn elems_per_round(&self, s: usize) -> usize {
        (self.t.capacity() / s).max(1)
    }
}

pub(super) fn all(src_len: usize) -> Vec<Range<usize>> {
    vec![0..src_len]
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
