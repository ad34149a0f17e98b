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
///
/// [`PreMulSum`](ReduceOp::PreMulSum) multiplies every rank's input by a factor, then sums: sharded data
/// parallelism's reduce-scatter that divides while it sums (`ReduceOp::pre_mul_sum(1.0 / dp as f64)`), in one
/// pass where `Sum` followed by a division would take two.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Sum divided by the number of ranks (see the type docs for integers).
    Avg,
    /// Every rank's input multiplied by the factor, then summed: `s * x0 + s * x1 + ...`, NCCL's
    /// `ncclRedOpCreatePreMulSum`.
    ///
    /// The factor is an `f64` that every reduction first turns into one value of the element type, as NCCL takes
    /// it: floats round it to the nearest value of the type (`0.1` as `f16` is `0.0999755859375`), and refuse a
    /// factor that is not finite or that overflows the type; integers take only a whole number in the type's
    /// range (`3.0` for `u8`; `0.25`, `-1.0` for `u32` or `300.0` for `i8` are refused, naming the factor),
    /// and multiply and sum wrapping, as `Sum` does. Dividing integers is `Avg`'s job.
    ///
    /// The host flavor multiplies and sums in the accumulator (`f32` for `f16` and `bf16`, where the product of
    /// two such values is exact) and rounds once, in rank order, as `Sum` does; NCCL rounds each product and each
    /// partial sum to the element type, so 16-bit results may differ from the host's in the last place.
    ///
    /// Every rank passes the same factor. The host flavor checks that with the rest of the operation (ranks that
    /// disagree fail with [`CommError::Mismatch`](crate::CommError::Mismatch)); NCCL does not exchange it, and
    /// scales each rank's input by that rank's own factor. On a device the communicator creates NCCL's operator
    /// once per element type and factor, and destroys it with the communicator.
    PreMulSum(Scalar),
}

impl ReduceOp {
    /// The parameterless reductions, in tag order. [`ReduceOp::PreMulSum`] takes a factor, so it is not among
    /// them.
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];

    /// [`ReduceOp::PreMulSum`] with the factor `scalar`.
    pub const fn pre_mul_sum(scalar: f64) -> ReduceOp {
        ReduceOp::PreMulSum(Scalar::new(scalar))
    }

    /// The lowercase name used in messages, without a factor (`"premulsum"`); `Display` shows the factor too.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
            ReduceOp::PreMulSum(_) => "premulsum",
        }
    }

    /// The wire tag of the reduction's kind (1 to 6); the factor travels separately.
    pub(crate) const fn tag(self) -> u32 {
        match self {
            ReduceOp::Sum => 1,
            ReduceOp::Prod => 2,
            ReduceOp::Min => 3,
            ReduceOp::Max => 4,
            ReduceOp::Avg => 5,
            ReduceOp::PreMulSum(_) => 6,
        }
    }

    /// The reduction a wire tag and factor bits name, if any: the bits must be 0 for a reduction without a factor.
    pub(crate) fn from_tag(tag: u32, scalar_bits: u64) -> Option<ReduceOp> {
        match tag {
            6 => Some(ReduceOp::PreMulSum(Scalar::from_bits(scalar_bits))),
            _ => ReduceOp::ALL
                .into_iter()
                .find(|o| o.tag() == tag)
                .filter(|_| scalar_bits == 0),
        }
    }

    /// The factor's bits for the wire: a [`ReduceOp::PreMulSum`]'s, 0 for the others.
    pub(crate) const fn scalar_bits(self) -> u64 {
        match self {
            ReduceOp::PreMulSum(s) => s.to_bits(),
            _ => 0,
        }
    }

    /// Whether the reduction has a meaning for elements of `dtype`: a [`ReduceOp::PreMulSum`] factor must be a
    /// value of the type ([`Scalar::element_bytes`]); every other reduction has one for every type. The error
    /// names the factor and the rule it broke.
    pub fn check_for(self, dtype: DType) -> Result<(), String> {
        match self {
            ReduceOp::PreMulSum(s) => s.element_bytes(dtype).map(|_| ()),
            _ => Ok(()),
        }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReduceOp::PreMulSum(s) => write!(f, "premulsum({s})"),
            op => f.write_str(op.name()),
        }
    }
}

/// The factor of a [`ReduceOp::PreMulSum`]: an `f64` held as its bits, so that a reduction stays `Copy`, `Eq`
/// and `Hash` and two ranks agree on a factor exactly when its bits agree (`0.0` and `-0.0` differ, as do the
/// results they give).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Scalar(u64);

impl Scalar {
    /// The factor `value`.
    pub const fn new(value: f64) -> Scalar {
        Scalar(value.to_bits())
    }

    /// The factor's value.
    pub const fn value(self) -> f64 {
        f64::from_bits(self.0)
    }

    /// The factor's bits (`f64::to_bits`).
    pub const fn to_bits(self) -> u64 {
        self.0
    }

    /// The factor with bits `bits` (`f64::from_bits`).
    pub const fn from_bits(bits: u64) -> Scalar {
        Scalar(bits)
    }

    /// The factor as one element of `dtype`: its bytes in native order, the first `dtype.size()` of the array
    /// (the rest zero). This is the value every flavor multiplies by: the host's reduction, and the host-immediate
    /// scalar handed to `ncclRedOpCreatePreMulSum`. Floats round the factor to the nearest value of the type;
    /// integers take only a whole number in the type's range. The error names the factor and the rule it broke.
    pub fn element_bytes(self, dtype: DType) -> Result<[u8; 8], String> {
        let v = self.value();
        let refuse = |why: String| Err(format!("premulsum factor {v} {why}"));
        if !v.is_finite() {
            return refuse(format!(
                "is not a number a {dtype} reduction can multiply by"
            ));
        }
        let mut out = [0u8; 8];
        let mut put = |b: &[u8]| out[..b.len()].copy_from_slice(b);
        if dtype.is_integer() {
            // Exact for every whole number an integer type holds: those are below 2^64 in magnitude.
            let whole = v as i128;
            if whole as f64 != v {
                return refuse(format!(
                    "is not a whole number: {dtype} reductions multiply by whole numbers (divide with avg)"
                ));
            }
            let out_of_range = || format!("is outside {dtype}'s range");
            macro_rules! int {
                ($t:ty) => {
                    match <$t>::try_from(whole) {
                        Ok(x) => put(&x.to_ne_bytes()),
                        Err(_) => return refuse(out_of_range()),
                    }
                };
            }
            match dtype {
                DType::I8 => int!(i8),
                DType::U8 => int!(u8),
                DType::I32 => int!(i32),
                DType::I64 => int!(i64),
                DType::U32 => int!(u32),
                DType::U64 => int!(u64),
                _ => return refuse(format!("has no {dtype} value")),
            }
            return Ok(out);
        }
        let (bytes, back): (Vec<u8>, f64) = match dtype {
            DType::F32 => ((v as f32).to_ne_bytes().to_vec(), f64::from(v as f32)),
            DType::F64 => (v.to_ne_bytes().to_vec(), v),
            DType::F16 => {
                let x = half::f16::from_f64(v);
                (x.to_ne_bytes().to_vec(), x.to_f64())
            }
            DType::BF16 => {
                let x = half::bf16::from_f64(v);
                (x.to_ne_bytes().to_vec(), x.to_f64())
            }
            // float8 saturates where the other types overflow to infinity: compare with the largest finite
            // values instead (E4M3FN 0x7E = 448, E5M2 0x7B = 57344).
            DType::F8E4M3 => {
                let x = float8::F8E4M3::from_f64(v);
                let back = if v.abs() > 448.0 {
                    f64::INFINITY
                } else {
                    x.to_f64()
                };
                (vec![x.to_bits()], back)
            }
            DType::F8E5M2 => {
                let x = float8::F8E5M2::from_f64(v);
                let back = if v.abs() > 57344.0 {
                    f64::INFINITY
                } else {
                    x.to_f64()
                };
                (vec![x.to_bits()], back)
            }
            _ => return refuse(format!("has no {dtype} value")),
        };
        if !back.is_finite() {
            return refuse(format!("overflows {dtype}"));
        }
        put(&bytes);
        Ok(out)
    }
}

impl From<f64> for Scalar {
    fn from(value: f64) -> Scalar {
        Scalar::new(value)
    }
}

impl fmt::Debug for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.value(), f)
    }
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.value(), f)
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
    fn a_premulsum_factor_becomes_one_element_of_each_type() {
        let bytes = |f: f64, d: DType| Scalar::new(f).element_bytes(d);
        assert_eq!(bytes(0.25, DType::F32).unwrap()[..4], 0.25f32.to_ne_bytes());
        assert_eq!(bytes(0.1, DType::F64).unwrap(), 0.1f64.to_ne_bytes());
        // Rounded to the nearest value of the type.
        let tenth = half::f16::from_f64(0.1);
        assert_eq!(bytes(0.1, DType::F16).unwrap()[..2], tenth.to_ne_bytes());
        assert_eq!(tenth.to_f64(), 0.0999755859375);
        assert_eq!(
            bytes(0.1, DType::BF16).unwrap()[..2],
            half::bf16::from_f64(0.1).to_ne_bytes()
        );
        assert_eq!(
            bytes(0.5, DType::F8E4M3).unwrap()[0],
            float8::F8E4M3::from_f64(0.5).to_bits()
        );
        assert_eq!(bytes(448.0, DType::F8E4M3).unwrap()[0], 0x7e);
        assert!(
            bytes(449.0, DType::F8E4M3)
                .unwrap_err()
                .contains("overflows f8e4m3")
        );
        assert!(bytes(57344.0, DType::F8E5M2).is_ok() && bytes(6e4, DType::F8E5M2).is_err());
        assert!(bytes(65504.0, DType::F16).is_ok());
        assert!(
            bytes(1e5, DType::F16)
                .unwrap_err()
                .contains("overflows f16")
        );
        assert!(bytes(1e300, DType::F32).is_err() && bytes(1e300, DType::F64).is_ok());
        // Integers: whole numbers in range, the rest zero.
        assert_eq!(bytes(3.0, DType::U8).unwrap(), [3, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(bytes(-2.0, DType::I64).unwrap(), (-2i64).to_ne_bytes());
        assert_eq!(bytes(-128.0, DType::I8).unwrap()[0], 0x80);
        assert_eq!(
            bytes(u64::MAX as f64 / 2.0, DType::U64).unwrap(),
            (1u64 << 63).to_ne_bytes()
        );
        assert!(bytes(2f64.powi(64), DType::U64).is_err());
        assert!(bytes(2f64.powi(63), DType::I64).is_err());
        assert!(
            bytes(256.0, DType::U8)
                .unwrap_err()
                .contains("outside u8's range")
        );
        assert!(
            bytes(-1.0, DType::U32)
                .unwrap_err()
                .contains("premulsum factor -1 is outside")
        );
        assert!(
            bytes(2.5, DType::I32)
                .unwrap_err()
                .contains("factor 2.5 is not a whole number")
        );
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            for d in DType::ALL {
                assert!(bytes(bad, d).is_err(), "{bad} as {d}");
            }
        }
    }

    #[test]
    fn reductions_name_themselves_and_round_trip_their_wire_tags() {
        let quarter = ReduceOp::pre_mul_sum(0.25);
        assert_eq!(quarter.to_string(), "premulsum(0.25)");
        assert_eq!(quarter.name(), "premulsum");
        assert_eq!(format!("{quarter:?}"), "PreMulSum(0.25)");
        assert_eq!(ReduceOp::Avg.to_string(), "avg");
        // Factors are equal exactly when their bits are.
        assert_eq!(quarter, ReduceOp::PreMulSum(Scalar::from(0.25)));
        assert_ne!(ReduceOp::pre_mul_sum(0.0), ReduceOp::pre_mul_sum(-0.0));
        for op in ReduceOp::ALL
            .into_iter()
            .chain([quarter, ReduceOp::pre_mul_sum(-3.0)])
        {
            assert_eq!(ReduceOp::from_tag(op.tag(), op.scalar_bits()), Some(op));
            assert!(op.check_for(DType::F32).is_ok());
        }
        assert_eq!(
            ReduceOp::from_tag(1, 0.5f64.to_bits()),
            None,
            "a sum has no factor"
        );
        assert_eq!(ReduceOp::from_tag(7, 0), None);
        assert!(quarter.check_for(DType::I32).is_err());
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
