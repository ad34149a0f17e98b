//! Local reductions: combine the contributions of several ranks into one buffer.
//!
//! Every reduction is a left fold over the ranks' values in rank order: `op(op(op(r0, r1), r2), ...)`, element by
//! element; a premulsum first multiplies each rank's value by its factor (`s*r0 + s*r1 + ...`). Rank order is
//! fixed, so every rank that reduces the same inputs gets bit-identical results. One or two contributions (every
//! two-rank step) take a single pass that reads both and writes the result; more go through an accumulator block
//! that stays in L1, the last contribution combined on the way out. `f16` and `bf16` accumulate in `f32` and round
//! once when stored. The inner loops are plain zipped iterations that the compiler vectorises.

use crate::element::{DType, Element, ReduceOp, Scalar, as_bytes_mut, typed, typed_mut};

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
    /// The host does not reduce this type (the 8-bit floats; the face refuses such calls before they run).
    Unsupported(DType),
    /// A premulsum factor that is no value of the element type (the face refuses such calls before they run).
    Scalar(String),
}

/// Reduces `srcs` (one per contributing rank, in rank order) into `out` with `op`. `ranks` is the divisor for
/// [`ReduceOp::Avg`]. A [`ReduceOp::PreMulSum`] multiplies by its factor as a value of `dtype`
/// ([`Scalar::element_bytes`](crate::element::Scalar::element_bytes)).
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
        DType::F8E4M3 | DType::F8E5M2 => Err(ReduceFault::Unsupported(dtype)),
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

/// A source of values in the pass that writes `out`.
#[derive(Clone, Copy)]
enum Left<'a, T: Kernel> {
    /// Accumulated values of the ranks before the last one.
    Acc(&'a [T::A]),
    /// A rank's values held elsewhere.
    View(&'a [T]),
    /// The output's own current values.
    Out,
}

/// How one reduction treats the values: `pre` on each rank's value as it is read (a premulsum's factor; the
/// identity otherwise), `op` to combine two, `finish` on the combined value before it is stored.
#[derive(Clone, Copy)]
struct Steps<P, O, F> {
    pre: P,
    op: O,
    finish: F,
}

/// The pass that writes `out`: `out[j] = narrow(finish(op(left[j], pre(right[j]))))`, where `right: None` is the
/// output's own values and `left` is read through `pre` unless it is the accumulator (which holds values that
/// went through it already). Reading and writing `out[j]` in the same step is how in-place sources stay a single
/// pass.
#[inline(always)]
fn final_pass<T: Kernel, P, O, F>(
    left: Left<'_, T>,
    right: Option<&[T]>,
    out: &mut [T],
    steps: Steps<P, O, F>,
) where
    P: Fn(T::A) -> T::A + Copy,
    O: Fn(T::A, T::A) -> T::A + Copy,
    F: Fn(T::A) -> T::A + Copy,
{
    let Steps { pre, op, finish } = steps;
    let f = |a: T::A, b: T::A| T::narrow(finish(op(a, b)));
    let read = |x: T| pre(x.widen());
    match (left, right) {
        (Left::Acc(acc), Some(r)) => out
            .iter_mut()
            .zip(acc.iter().zip(r))
            .for_each(|(o, (a, b))| *o = f(*a, read(*b))),
        (Left::Acc(acc), None) => out
            .iter_mut()
            .zip(acc)
            .for_each(|(o, a)| *o = f(*a, read(*o))),
        (Left::View(l), Some(r)) => out
            .iter_mut()
            .zip(l.iter().zip(r))
            .for_each(|(o, (a, b))| *o = f(read(*a), read(*b))),
        (Left::View(l), None) => out
            .iter_mut()
            .zip(l)
            .for_each(|(o, a)| *o = f(read(*a), read(*o))),
        (Left::Out, Some(r)) => out
            .iter_mut()
            .zip(r)
            .for_each(|(o, b)| *o = f(read(*o), read(*b))),
        // Only this rank's source is the output, so it appears once; two `Out`s would combine it with itself.
        (Left::Out, None) => out.iter_mut().for_each(|o| *o = f(read(*o), read(*o))),
    }
}

/// Combines `views` (rank order; `None` is the output's own values) into `out` by `steps`: each value through
/// `pre`, combined with `op`, the result through `finish`.
///
/// One or two sources take a single streaming pass. More go block by block through an accumulator that stays in
/// L1: the first two combined into it, the middle ones folded in, the last one combined on the way out. The
/// operations and their order are those of a left fold over the ranks whatever the count.
#[inline(always)]
fn fold<T: Kernel, P, O, F>(views: &[Option<&[T]>], out: &mut [T], steps: Steps<P, O, F>)
where
    P: Fn(T::A) -> T::A + Copy,
    O: Fn(T::A, T::A) -> T::A + Copy,
    F: Fn(T::A) -> T::A + Copy,
{
    let Steps { pre, op, finish } = steps;
    let read = |x: T| pre(x.widen());
    match views {
        [] => {}
        [Some(v)] => out
            .iter_mut()
            .zip(*v)
            .for_each(|(o, s)| *o = T::narrow(finish(read(*s)))),
        [None] => out
            .iter_mut()
            .for_each(|o| *o = T::narrow(finish(read(*o)))),
        [first, second] => {
            let left = first.map_or(Left::Out, Left::View);
            final_pass::<T, P, O, F>(left, *second, out, steps);
        }
        [first, second, middle @ .., last] => {
            let mut acc = [T::A::default(); BLOCK];
            let mut start = 0;
            while start < out.len() {
                let end = (start + BLOCK).min(out.len());
                let acc = &mut acc[..end - start];
                let block = &mut out[start..end];
                // The output block is read-only until the last pass, so an in-place source is just a slice.
                let a: &[T] = first.map_or(&*block, |v| &v[start..end]);
                let b: &[T] = second.map_or(&*block, |v| &v[start..end]);
                acc.iter_mut()
                    .zip(a.iter().zip(b))
                    .for_each(|(x, (p, q))| *x = op(read(*p), read(*q)));
                for m in middle {
                    let src: &[T] = m.map_or(&*block, |v| &v[start..end]);
                    acc.iter_mut()
                        .zip(src)
                        .for_each(|(x, s)| *x = op(*x, read(*s)));
                }
                final_pass::<T, P, O, F>(
                    Left::Acc(acc),
                    last.map(|v| &v[start..end]),
                    block,
                    steps,
                );
                start = end;
            }
        }
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
    // The operator is chosen once, outside the loops, so that each loop is compiled (and vectorised) for it.
    let keep = |a: T::A| a;
    let add = |a: T::A, b: T::A| a.add(b);
    match op {
        ReduceOp::Sum => fold(
            &views,
            out,
            Steps {
                pre: keep,
                op: add,
                finish: keep,
            },
        ),
        ReduceOp::Avg => fold(
            &views,
            out,
            Steps {
                pre: keep,
                op: add,
                finish: |a: T::A| a.div_ranks(ranks),
            },
        ),
        ReduceOp::Prod => fold(
            &views,
            out,
            Steps {
                pre: keep,
                op: |a: T::A, b| a.mul(b),
                finish: keep,
            },
        ),
        ReduceOp::Min => fold(
            &views,
            out,
            Steps {
                pre: keep,
                op: |a: T::A, b| a.min(b),
                finish: keep,
            },
        ),
        ReduceOp::Max => fold(
            &views,
            out,
            Steps {
                pre: keep,
                op: |a: T::A, b| a.max(b),
                finish: keep,
            },
        ),
        ReduceOp::PreMulSum(s) => {
            let factor = factor::<T>(s)?;
            let pre = move |a: T::A| a.mul(factor);
            fold(
                &views,
                out,
                Steps {
                    pre,
                    op: add,
                    finish: keep,
                },
            );
        }
    }
    Ok(())
}

/// A premulsum's factor as a value of `T`, widened to its accumulator.
fn factor<T: Kernel>(s: Scalar) -> Result<T::A, ReduceFault> {
    let bytes = s.element_bytes(T::DTYPE).map_err(ReduceFault::Scalar)?;
    let mut value = T::default();
    as_bytes_mut(std::slice::from_mut(&mut value)).copy_from_slice(&bytes[..T::DTYPE.size()]);
    Ok(value.widen())
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

    /// The definition: a left fold in rank order, element by element, in the accumulator type.
    fn reference<T: Kernel>(op: ReduceOp, inputs: &[Vec<T>]) -> Vec<T> {
        let pre = |x: T::A| match op {
            ReduceOp::PreMulSum(s) => x.mul(factor::<T>(s).unwrap()),
            _ => x,
        };
        (0..inputs[0].len())
            .map(|j| {
                let mut acc = pre(inputs[0][j].widen());
                for v in &inputs[1..] {
                    let x = pre(v[j].widen());
                    acc = match op {
                        ReduceOp::Sum | ReduceOp::Avg | ReduceOp::PreMulSum(_) => acc.add(x),
                        ReduceOp::Prod => acc.mul(x),
                        ReduceOp::Min => acc.min(x),
                        ReduceOp::Max => acc.max(x),
                    };
                }
                if op == ReduceOp::Avg {
                    acc = acc.div_ranks(inputs.len());
                }
                T::narrow(acc)
            })
            .collect()
    }

    /// Every operation, 1 to 5 ranks, every rank as the one reducing in place, lengths around the block size:
    /// bit-identical to the fold, so that the single-pass and accumulator paths agree with each other too.
    fn check_against_reference<T: Kernel>(value: impl Fn(usize, usize) -> T) {
        let ops = [
            ReduceOp::Sum,
            ReduceOp::Avg,
            ReduceOp::Prod,
            ReduceOp::Min,
            ReduceOp::Max,
            // A factor every type holds exactly, and one that 16-bit floats round.
            ReduceOp::pre_mul_sum(3.0),
            ReduceOp::pre_mul_sum(if T::DTYPE.is_integer() { 7.0 } else { 0.1 }),
        ];
        for n in 1..=5 {
            for len in [0, 1, 7, BLOCK, 2 * BLOCK + 517] {
                let inputs: Vec<Vec<T>> = (0..n)
                    .map(|r| (0..len).map(|j| value(r, j)).collect())
                    .collect();
                for op in ops {
                    let want = reference(op, &inputs);
                    for own in 0..n {
                        let got = run(op, &inputs, own);
                        // Compare bit patterns: NaN never equals itself, and -0.0 equals 0.0.
                        assert_eq!(
                            as_bytes(&got),
                            as_bytes(&want),
                            "{op:?} n={n} len={len} own={own} ({})",
                            std::any::type_name::<T>()
                        );
                    }
                    // Out of place: every source held elsewhere.
                    let srcs: Vec<Src<'_>> =
                        inputs.iter().map(|v| Src::Bytes(as_bytes(v))).collect();
                    let mut out = vec![T::default(); len];
                    reduce(T::DTYPE, op, &srcs, as_bytes_mut(&mut out), n).unwrap();
                    assert_eq!(
                        as_bytes(&out),
                        as_bytes(&want),
                        "{op:?} n={n} len={len} out of place"
                    );
                }
            }
        }
    }

    #[test]
    fn every_path_equals_the_rank_order_fold() {
        // Values whose sums and products round differently in different orders.
        check_against_reference::<f32>(|r, j| {
            ((j * 7 + r * 13) % 17) as f32 * 0.1 + 1e-7 * (r + 1) as f32
        });
        check_against_reference::<f64>(|r, j| 1.0 / ((j % 29 + r * 3 + 1) as f64));
        check_against_reference::<half::f16>(|r, j| {
            half::f16::from_f32(((j + 3 * r) % 11) as f32 * 0.37)
        });
        check_against_reference::<half::bf16>(|r, j| {
            half::bf16::from_f32(((j * 5 + r) % 13) as f32 - 6.5)
        });
        check_against_reference::<i32>(|r, j| (j as i32 * 7919 - r as i32 * 104_729) % 1_000_003);
        check_against_reference::<u8>(|r, j| (j * 31 + r * 7) as u8);
    }

    #[test]
    fn premulsum_scales_every_rank_then_sums() {
        // 0.25 * (1 + 2 + 5), 0.25 * (-4 + 8 + 0.5): exact in every float type.
        let quarter = ReduceOp::pre_mul_sum(0.25);
        let inputs = vec![vec![1.0f32, -4.0], vec![2.0, 8.0], vec![5.0, 0.5]];
        assert_eq!(run(quarter, &inputs, 1), vec![2.0, 1.125]);
        let inputs: Vec<Vec<half::bf16>> = [[1.0f32, -4.0], [2.0, 8.0], [5.0, 0.5]]
            .iter()
            .map(|v| v.iter().map(|&x| half::bf16::from_f32(x)).collect())
            .collect();
        let got: Vec<f32> = run(quarter, &inputs, 0)
            .iter()
            .map(|x| x.to_f32())
            .collect();
        assert_eq!(got, [2.0, 1.125]);
        // One rank: the input times the factor.
        assert_eq!(
            run(ReduceOp::pre_mul_sum(-2.0), &[vec![1.5f64, 3.0]], 0),
            [-3.0, -6.0]
        );
        // Integers multiply by a whole factor and wrap as Sum does: 3 * (100 + 60) = 480 = 224 mod 256.
        let inputs = vec![vec![100u8, 1], vec![60, 2]];
        assert_eq!(run(ReduceOp::pre_mul_sum(3.0), &inputs, 0), [224, 9]);
        let inputs = vec![vec![-7i64, i64::MAX], vec![2, 1]];
        assert_eq!(run(ReduceOp::pre_mul_sum(-1.0), &inputs, 1), [5, i64::MIN]);
        // A factor the type does not hold is a fault, not a guess (the face refuses it before it runs).
        let mut out = [0u8; 4];
        let err = reduce(
            DType::I32,
            ReduceOp::pre_mul_sum(0.5),
            &[Src::Bytes(&[0; 4])],
            &mut out,
            1,
        )
        .unwrap_err();
        assert!(
            matches!(&err, ReduceFault::Scalar(why) if why.contains("0.5")),
            "{err:?}"
        );
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
