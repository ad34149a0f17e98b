//! Element types a collective moves: the sealed [`Element`] trait, its [`DType`] tag, and byte views.
//!
//! Backends see buffers as bytes plus a [`DType`]; users see typed slices. The conversion between the two lives
//! here and nowhere else, so the one `unsafe` cast it needs is audited once.

use std::fmt;

/// The element type of a buffer, as a runtime tag. Every [`Element`] has one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum DType {
    /// IEEE 754 single precision (`f32`).
    F32 = 1,
    /// IEEE 754 double precision (`f64`).
    F64 = 2,
    /// IEEE 754 half precision (`half::f16`); reductions run in `f32` and round once.
    F16 = 3,
    /// Brain floating point (`half::bf16`); reductions run in `f32` and round once.
    BF16 = 4,
    /// Signed 8-bit integer.
    I8 = 5,
    /// Unsigned 8-bit integer.
    U8 = 6,
    /// Signed 32-bit integer.
    I32 = 7,
    /// Signed 64-bit integer.
    I64 = 8,
    /// Unsigned 32-bit integer.
    U32 = 9,
    /// Unsigned 64-bit integer.
    U64 = 10,
    /// 8-bit float, 4 exponent and 3 mantissa bits (`float8::F8E4M3`, OCP's E4M3FN). Moved by every operation;
    /// reduced only on a device (NCCL 2.24 or newer): a host reduction of it is refused.
    F8E4M3 = 11,
    /// 8-bit float, 5 exponent and 2 mantissa bits (`float8::F8E5M2`). As [`DType::F8E4M3`].
    F8E5M2 = 12,
}

impl DType {
    /// Every element type, in tag order.
    pub const ALL: [DType; 12] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::U8,
        DType::I32,
        DType::I64,
        DType::U32,
        DType::U64,
        DType::F8E4M3,
        DType::F8E5M2,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DType::I8 | DType::U8 | DType::F8E4M3 | DType::F8E5M2 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
        }
    }

    /// The lowercase name used in messages and benchmark output (`"f32"`, `"bf16"`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U32 => "u32",
            DType::U64 => "u64",
            DType::F8E4M3 => "f8e4m3",
            DType::F8E5M2 => "f8e5m2",
        }
    }

    /// Whether the type is an integer (affects [`ReduceOp::Avg`]).
    pub const fn is_integer(self) -> bool {
        !matches!(
            self,
            DType::F32 | DType::F64 | DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2
        )
    }

    /// Whether the type is one of the 8-bit floats, which the host flavor moves but does not reduce.
    pub const fn is_float8(self) -> bool {
        matches!(self, DType::F8E4M3 | DType::F8E5M2)
    }

    /// The tag for a wire value, if it names a type.
    pub fn from_tag(tag: u32) -> Option<DType> {
        DType::ALL.into_iter().find(|d| *d as u32 == tag)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a reducing collective combines the ranks' values.
///
/// Integer `Sum` and `Prod` wrap on overflow (two's complement), as NCCL's do. `Avg` is the sum divided by the
/// number of ranks: for floats in floating point, for integers as the wrapping integer sum divided by the rank
/// count, rounding toward zero (so `avg(1, 2) == 1` and `avg(-1, -2) == -1`). `Min`/`Max` on floats follow
/// `f32::min`/`f32::max`: a NaN loses against a number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ReduceOp {
    /// Sum.
    Sum = 1,
    /// Product.
    Prod = 2,
    /// Minimum.
    Min = 3,
    /// Maximum.
    Max = 4,
    /// Sum divided by the number of ranks (see the type docs for integers).
    Avg = 5,
}

impl ReduceOp {
    /// Every reduction, in tag order.
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];

    /// The lowercase name used in messages.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A type a collective can carry: `f32`, `f64`, `half::f16`, `half::bf16`, `i8`, `u8`, `i32`, `i64`, `u32`, `u64`,
/// `float8::F8E4M3`, `float8::F8E5M2`.
///
/// The trait is sealed. Every implementor is plain old data: no padding, no invalid bit patterns, alignment equal
/// to its size. [`as_bytes`] and [`as_bytes_mut`] rely on that.
pub trait Element:
    Copy + Send + Sync + PartialEq + fmt::Debug + Default + 'static + sealed::Sealed
{
    /// The runtime tag of this type.
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
        }
    )*};
}

element!(
    f32 => F32, f64 => F64, half::f16 => F16, half::bf16 => BF16, i8 => I8, u8 => U8,
    i32 => I32, i64 => I64, u32 => U32, u64 => U64, float8::F8E4M3 => F8E4M3, float8::F8E5M2 => F8E5M2,
);

/// The bytes of a typed slice.
pub fn as_bytes<T: Element>(s: &[T]) -> &[u8] {
    // SAFETY: `Element` is sealed and implemented only for primitive numeric types without padding, so every byte
    // of the slice is initialised; the byte slice covers exactly the same memory and borrows it immutably for the
    // same lifetime.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u8>(), std::mem::size_of_val(s)) }
}

/// The bytes of a typed slice, writable.
pub fn as_bytes_mut<T: Element>(s: &mut [T]) -> &mut [u8] {
    let len = std::mem::size_of_val(s);
    // SAFETY: as in `as_bytes`; in addition every bit pattern is a valid value of every `Element`, so any bytes
    // written through the view leave valid `T`s behind. The mutable borrow of `s` is moved into the result.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<u8>(), len) }
}

/// A typed view of bytes, or `None` when `bytes` is misaligned for `T` or not a whole number of elements.
pub(crate) fn typed<T: Element>(bytes: &[u8]) -> Option<&[T]> {
    let size = std::mem::size_of::<T>();
    if bytes.len() % size != 0 || bytes.as_ptr().align_offset(std::mem::align_of::<T>()) != 0 {
        return None;
    }
    // SAFETY: alignment and length were checked above; every bit pattern is a valid `T` (sealed POD types); the
    // result borrows `bytes` immutably.
    Some(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<T>(), bytes.len() / size) })
}

/// A writable typed view of bytes, or `None` when misaligned or not a whole number of elements.
pub(crate) fn typed_mut<T: Element>(bytes: &mut [u8]) -> Option<&mut [T]> {
    let size = std::mem::size_of::<T>();
    if bytes.len() % size != 0 || bytes.as_ptr().align_offset(std::mem::align_of::<T>()) != 0 {
        return None;
    }
    // SAFETY: as in `typed`; the mutable borrow of `bytes` moves into the result.
    Some(unsafe {
        std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<T>(), bytes.len() / size)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_rust_types() {
        assert_eq!(DType::F16.size(), std::mem::size_of::<half::f16>());
        assert_eq!(DType::U64.size(), std::mem::size_of::<u64>());
        assert_eq!(DType::F8E4M3.size(), std::mem::size_of::<float8::F8E4M3>());
        assert_eq!(DType::F8E5M2.size(), std::mem::size_of::<float8::F8E5M2>());
        assert_eq!(<float8::F8E5M2 as Element>::DTYPE, DType::F8E5M2);
        assert!(
            DType::F8E4M3.is_float8() && !DType::F8E4M3.is_integer() && !DType::BF16.is_float8()
        );
        assert_eq!(<i8 as Element>::DTYPE, DType::I8);
        for d in DType::ALL {
            assert_eq!(DType::from_tag(d as u32), Some(d));
        }
        assert_eq!(DType::from_tag(0), None);
    }

    #[test]
    fn byte_views_round_trip() {
        let mut v = vec![1.5f32, -2.0];
        assert_eq!(
            as_bytes(&v),
            [1.5f32.to_ne_bytes(), (-2.0f32).to_ne_bytes()].concat()
        );
        as_bytes_mut(&mut v)[..4].copy_from_slice(&3.0f32.to_ne_bytes());
        assert_eq!(v[0], 3.0);
        let bytes = as_bytes(&v).to_vec();
        // A Vec<u8> may be misaligned for f32 in principle; only check when it is not.
        if let Some(t) = typed::<f32>(&bytes) {
            assert_eq!(t, &v[..]);
        }
        assert!(typed::<f32>(&bytes[..3]).is_none());
    }
}
