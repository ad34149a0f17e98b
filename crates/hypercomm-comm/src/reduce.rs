//! Local reductions: combine the contributions of several ranks into one buffer.
//!
//! Every reduction walks the output in blocks that stay in L1 cache. For each block it loads the first rank's
//! values into an accumulator, combines the other ranks' values in rank order, and stores the result. Rank order
//! is fixed, so every rank that reduces the same inputs gets bit-identical results. `f16` and `bf16` accumulate in
//! `f32` and round once when stored. The inner loops are plain zipped iterations that the compiler vectorises.

use crate::element::{DType, Element, ReduceOp, typed, typed_mut};

/// Elements per accumulator block.
const BLOCK: usize = 1024;

/// One rank's contribution to a reduction.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Src<'a> {
    /// Bytes held elsewhere (a peer's shared-memory slot, a received frame, the caller's input).
    Bytes(&'a [u8]),
    /// The output buffer itself holds this rank's contribution (in-place reduction).
    Out,
}

/// Why a reduction could not run. Both are internal invariants the algorithms uphold; the caller turns them into
/// an internal error rather than a panic.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ReduceFault {
    /// A source is misaligned for the element type or not a whole number of elements.
    Layout,
    /// A source's length differs from the output's.
    Length { expected: usize, got: usize },
}

/// Reduces `srcs` (one per contributing rank, in rank order) into `out` with `op`. `ranks` is the divisor for
/// [`ReduceOp::Avg`].
pub(crate) fn reduce(
    dtype: DType,
    op: ReduceOp,
    srcs: &[Src<'_>],
    out: &mut [u8],
    ranks: usize,
) -> Result<(), ReduceFault> {
    for s in srcs {
        if let Src::Bytes(b) = s
            && b.len() != out.len()
        {
            return Err(ReduceFault::Length {
                expected: out.len(),
                got: b.len(),
            });
        }
    }
    match dtype {
        DType::F32 => reduce_typed::<f32>(op, srcs, out, ranks),
        DType::F64 => reduce_typed::<f64>(op, srcs, out, ranks),
        DType::F16 => reduce_typed::<half::f16>(op, srcs, out, ranks),
        DType::BF16 => reduce_typed::<half::bf16>(op, srcs, out, ranks),
        DType::I8 => reduce_typed::<i8>(op, srcs, out, ranks),
        DType::U8 => reduce_typed::<u8>(op, srcs, out, ranks),
        DType::I32 => reduce_typed::<i32>(op, srcs, out, ranks),
        DType::I64 => reduce_typed::<i64>(op, srcs, out, ranks),
        DType::U32 => reduce_typed::<u32>(op, srcs, out, ranks),
        DType::U64 => reduce_typed::<u64>(op, srcs, out, ranks),
    }
}

/// The arithmetic of an accumulator type.
trait Acc: Copy + Default {
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn min(self, o: Self) -> Self;
    fn max(self, o: Self) -> Self;
    /// `self / n`: floating division for floats, truncating division for integers.
    fn div_ranks(self, n: usize) -> Self;
}

macro_rules! int_acc {
    ($($t:ty),*) => {$(
        impl Acc for $t {
            #[inline(always)] fn add(self, o: Self) -> Self { self.wrapping_add(o) }
            #[inline(always)] fn mul(self, o: Self) -> Self { self.wrapping_mul(o) }
            #[inline(always)] fn min(self, o: Self) -> Self { Ord::min(self, o) }
            #[inline(always)] fn max(self, o: Self) -> Self { Ord::max(self, o) }
            #[inline(always)]
            fn div_ranks(self, n: usize) -> Self {
                // n is a rank count (>= 1). When it does not fit the type (say 300 ranks averaging i8), every
                // value's magnitude is below n, so truncating division gives 0.
                match <$t>::try_from(n) { Ok(d) if d != 0 => self / d, _ => 0 }
            }
        }
    )*};
}
int_acc!(i8, u8, i32, i64, u32, u64);

macro_rules! float_acc {
    ($($t:ty),*) => {$(
        impl Acc for $t {
            #[inline(always)] fn add(self, o: Self) -> Self { self + o }
            #[inline(always)] fn mul(self, o: Self) -> Self { self * o }
            #[inline(always)] fn min(self, o: Self) -> Self { <$t>::min(self, o) }
            #[inline(always)] fn max(self, o: Self) -> Self { <$t>::max(self, o) }
            #[inline(always)] fn div_ranks(self, n: usize) -> Self { self / n as $t }
        }
    )*};
}
float_acc!(f32, f64);

/// An element type with its accumulator and the conversions between them.
trait Kernel: Element {
    type A: Acc;
    fn widen(self) -> Self::A;
    fn narrow(a: Self::A) -> Self;
}

macro_rules! identity_kernel {
    ($($t:ty),*) => {$(
        impl Kernel for $t {
            type A = $t;
            #[inline(always)] fn widen(self) -> $t { self }
            #[inline(always)] fn narrow(a: $t) -> $t { a }
        }
    )*};
}
identity_kernel!(f32, f64, i8, u8, i32, i64, u32, u64);

impl Kernel for half::f16 {
    type A = f32;
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn narrow(a: f32) -> Self {
        half::f16::from_f32(a)
    }
}

impl Kernel for half::bf16 {
    type A = f32;
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
    #[inline(always)]
    fn narrow(a: f32) -> Self {
        half::bf16::from_f32(a)
    }
}

#[inline(always)]
fn combine<T: Kernel>(op: ReduceOp, acc: &mut [T::A], src: &[T]) {
    let pairs = acc.iter_mut().zip(src);
    match op {
        ReduceOp::Sum | ReduceOp::Avg => pairs.for_each(|(a, s)| *a = a.add(s.widen())),
        ReduceOp::Prod => pairs.for_each(|(a, s)| *a = a.mul(s.widen())),
        ReduceOp::Min => pairs.for_each(|(a, s)| *a = a.min(s.widen())),
        ReduceOp::Max => pairs.for_each(|(a, s)| *a = a.max(s.widen())),
    }
}

fn reduce_typed<T: Kernel>(
    op: ReduceOp,
    srcs: &[Src<'_>],
    out: &mut [u8],
    ranks: usize,
) -> Result<(), ReduceFault> {
    let out = typed_mut::<T>(out).ok_or(ReduceFault::Layout)?;
    let mut views: Vec<Option<&[T]>> = Vec::with_capacity(srcs.len());
    for s in srcs {
        views.push(match s {
            Src::Bytes(b) => Some(typed::<T>(b).ok_or(ReduceFault::Layout)?),
            Src::Out => None,
        });
    }
    let mut acc = [T::A::default(); BLOCK];
    let mut start = 0;
    while start < out.len() {
        let end = (start + BLOCK).min(out.len());
        let acc = &mut acc[..end - start];
        for (i, view) in views.iter().enumerate() {
            let src = match view {
                Some(v) => &v[start..end],
                None => &out[start..end],
            };
            if i == 0 {
                acc.iter_mut().zip(src).for_each(|(a, s)| *a = s.widen());
            } else {
                combine::<T>(op, acc, src);
            }
        }
        if op == ReduceOp::Avg {
            acc.iter_mut().for_each(|a| *a = a.div_ranks(ranks));
        }
        if !views.is_empty() {
            out[start..end]
                .iter_mut()
                .zip(acc.iter())
                .for_each(|(o, a)| *o = T::narrow(*a));
        }
        start = end;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::element::{as_bytes, as_bytes_mut};

    fn run<T: Element>(op: ReduceOp, inputs: &[Vec<T>], own: usize) -> Vec<T> {
        let mut out = inputs[own].clone();
        let srcs: Vec<Src<'_>> = inputs
            .iter()
            .enumerate()
            .map(|(i, v)| {
                if i == own {
                    Src::Out
                } else {
                    Src::Bytes(as_bytes(v))
                }
            })
            .collect();
        reduce(T::DTYPE, op, &srcs, as_bytes_mut(&mut out), inputs.len()).unwrap();
        out
    }

    #[test]
    fn integer_ops_follow_the_documented_rules() {
        let inputs = vec![
            vec![1i32, -1, i32::MAX, 7],
            vec![2, -2, 1, 3],
            vec![4, 0, 0, -5],
        ];
        assert_eq!(run(ReduceOp::Sum, &inputs, 1), vec![7, -3, i32::MIN, 5]);
        assert_eq!(run(ReduceOp::Prod, &inputs, 0), vec![8, 0, 0, -105]);
        assert_eq!(run(ReduceOp::Min, &inputs, 2), vec![1, -2, 0, -5]);
        assert_eq!(run(ReduceOp::Max, &inputs, 2), vec![4, 0, i32::MAX, 7]);
        // Avg: wrapping sum divided by 3, truncating toward zero.
        assert_eq!(run(ReduceOp::Avg, &inputs, 0), vec![2, -1, i32::MIN / 3, 1]);
    }

    #[test]
    fn half_types_accumulate_in_f32() {
        // 2048 + 1 + 1 is 2050 in f32 but would stay 2048 when rounding to f16 after each step.
        let a = vec![half::f16::from_f32(2048.0); 3000];
        let b = vec![half::f16::from_f32(1.0); 3000];
        let out = run(ReduceOp::Sum, &[a, b.clone(), b], 0);
        assert!(out.iter().all(|x| x.to_f32() == 2050.0));
        let a = vec![half::bf16::from_f32(3.0); 5];
        let b = vec![half::bf16::from_f32(5.0); 5];
        assert!(
            run(ReduceOp::Avg, &[a, b], 1)
                .iter()
                .all(|x| x.to_f32() == 4.0)
        );
    }

    #[test]
    fn result_does_not_depend_on_which_rank_reduces() {
        let inputs: Vec<Vec<f32>> = (0..4)
            .map(|r| {
                (0..2500)
                    .map(|i| ((i * 7 + r * 13) % 17) as f32 * 0.1 + 1e-7 * r as f32)
                    .collect()
            })
            .collect();
        let first = run(ReduceOp::Sum, &inputs, 0);
        for own in 1..4 {
            assert_eq!(run(ReduceOp::Sum, &inputs, own), first);
        }
    }

    #[test]
    fn length_mismatch_is_reported() {
        let a = [1u8, 2, 3];
        let mut out = [0u8; 2];
        let err = reduce(DType::U8, ReduceOp::Sum, &[Src::Bytes(&a)], &mut out, 1).unwrap_err();
        assert_eq!(
            err,
            ReduceFault::Length {
                expected: 2,
                got: 3
            }
        );
    }
}
