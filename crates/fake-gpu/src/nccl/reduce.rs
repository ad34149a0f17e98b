//! Element-wise reductions over every rank's bytes, per NCCL element type and operation, as NCCL defines them:
//! integer sums and products wrap, `ncclAvg` divides the sum by the rank count (integer division for integer
//! types), 16-bit floats are combined in `f32` and rounded back. A created premulsum multiplies each rank's
//! input by its scalar first ([`pre_multiply`], each product rounded to the type as NCCL's pre-op does), then
//! sums.

use half::{bf16, f16};

/// The width in bytes of an NCCL element type; `None` for types the fake does not reduce (the fp8 types) or
/// unknown codes.
pub(crate) fn width(dtype: i32) -> Option<usize> {
    Some(match dtype {
        0 | 1 => 1,
        6 | 9 => 2,
        10 | 11 => 1,
        2 | 3 | 7 => 4,
        4 | 5 | 8 => 8,
        _ => return None,
    })
}

/// The name of an NCCL element type, for messages.
pub(crate) fn type_name(dtype: i32) -> &'static str {
    match dtype {
        0 => "int8",
        1 => "uint8",
        2 => "int32",
        3 => "uint32",
        4 => "int64",
        5 => "uint64",
        6 => "float16",
        7 => "float32",
        8 => "float64",
        9 => "bfloat16",
        10 => "float8e4m3",
        11 => "float8e5m2",
        _ => "unknown type",
    }
}

/// The name of an NCCL reduction, for messages.
pub(crate) fn op_name(op: i32) -> &'static str {
    match op {
        0 => "sum",
        1 => "prod",
        2 => "max",
        3 => "min",
        4 => "avg",
        5 => "premulsum",
        _ => "unknown reduction",
    }
}

trait Element: Copy {
    fn read(b: &[u8]) -> Self;
    fn write(self, out: &mut [u8]);
    fn combine(self, other: Self, op: i32) -> Self;
    fn divide(self, n: usize) -> Self;
    /// `self * by`, rounded to the type (integers wrap).
    fn scale(self, by: Self) -> Self;
}

macro_rules! integer {
    ($t:ty) => {
        impl Element for $t {
            fn read(b: &[u8]) -> Self {
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(b);
                <$t>::from_le_bytes(a)
            }
            fn write(self, out: &mut [u8]) {
                out.copy_from_slice(&self.to_le_bytes());
            }
            fn combine(self, other: Self, op: i32) -> Self {
                match op {
                    1 => self.wrapping_mul(other),
                    2 => self.max(other),
                    3 => self.min(other),
                    _ => self.wrapping_add(other),
                }
            }
            fn divide(self, n: usize) -> Self {
                self / (n as $t)
            }
            fn scale(self, by: Self) -> Self {
                self.wrapping_mul(by)
            }
        }
    };
}
integer!(i8);
integer!(u8);
integer!(i32);
integer!(u32);
integer!(i64);
integer!(u64);

macro_rules! float {
    ($t:ty, $to:expr, $from:expr) => {
        impl Element for $t {
            fn read(b: &[u8]) -> Self {
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(b);
                <$t>::from_le_bytes(a)
            }
            fn write(self, out: &mut [u8]) {
                out.copy_from_slice(&self.to_le_bytes());
            }
            fn combine(self, other: Self, op: i32) -> Self {
                let (a, b) = ($to(self), $to(other));
                $from(match op {
                    1 => a * b,
                    2 => a.max(b),
                    3 => a.min(b),
                    _ => a + b,
                })
            }
            fn divide(self, n: usize) -> Self {
                $from($to(self) / n as f64)
            }
            fn scale(self, by: Self) -> Self {
                // Exact in f64 for every type but f64 itself, so rounding once gives the type's own product.
                $from($to(self) * $to(by))
            }
        }
    };
}
float!(f32, f64::from, |v: f64| v as f32);
float!(f64, |v: f64| v, |v: f64| v);
float!(f16, |v: f16| f64::from(v.to_f32()), |v: f64| f16::from_f32(
    v as f32
));
float!(bf16, |v: bf16| f64::from(v.to_f32()), |v: f64| {
    bf16::from_f32(v as f32)
});

/// The 8-bit floats (NCCL 2.24's `ncclFloat8e4m3`, `ncclFloat8e5m2`), reduced in f32 and rounded once, as NCCL does.
macro_rules! float8 {
    ($t:ty) => {
        impl Element for $t {
            fn read(b: &[u8]) -> Self {
                <$t>::from_bits(b[0])
            }
            fn write(self, out: &mut [u8]) {
                out[0] = self.to_bits();
            }
            fn combine(self, other: Self, op: i32) -> Self {
                let (a, b) = (self.to_f32(), other.to_f32());
                <$t>::from_f32(match op {
                    1 => a * b,
                    2 => a.max(b),
                    3 => a.min(b),
                    _ => a + b,
                })
            }
            fn divide(self, n: usize) -> Self {
                <$t>::from_f32(self.to_f32() / n as f32)
            }
            fn scale(self, by: Self) -> Self {
                // Exact in f32, as in the half precision NCCL multiplies 8-bit floats in.
                <$t>::from_f32(self.to_f32() * by.to_f32())
            }
        }
    };
}
float8!(float8::F8E4M3);
float8!(float8::F8E5M2);

fn reduce_as<T: Element>(inputs: &[&[u8]], op: i32) -> Vec<u8> {
    let w = std::mem::size_of::<T>();
    let mut out = inputs[0].to_vec();
    for (i, chunk) in out.chunks_exact_mut(w).enumerate() {
        let at = i * w..(i + 1) * w;
        let mut acc = T::read(&inputs[0][at.clone()]);
        for input in &inputs[1..] {
            acc = acc.combine(T::read(&input[at.clone()]), op);
        }
        if op == 4 {
            acc = acc.divide(inputs.len());
        }
        acc.write(chunk);
    }
    out
}

fn scale_as<T: Element>(scalar: &[u8], input: &[u8]) -> Vec<u8> {
    let w = std::mem::size_of::<T>();
    let by = T::read(&scalar[..w]);
    let mut out = input.to_vec();
    for (o, x) in out.chunks_exact_mut(w).zip(input.chunks_exact(w)) {
        T::read(x).scale(by).write(o);
    }
    out
}

/// One rank's `input` with every element multiplied by `scalar` (one element of `dtype`, its bytes first).
pub(crate) fn pre_multiply(dtype: i32, scalar: [u8; 8], input: &[u8]) -> Result<Vec<u8>, String> {
    let s = &scalar[..];
    Ok(match dtype {
        0 => scale_as::<i8>(s, input),
        1 => scale_as::<u8>(s, input),
        2 => scale_as::<i32>(s, input),
        3 => scale_as::<u32>(s, input),
        4 => scale_as::<i64>(s, input),
        5 => scale_as::<u64>(s, input),
        6 => scale_as::<f16>(s, input),
        7 => scale_as::<f32>(s, input),
        8 => scale_as::<f64>(s, input),
        9 => scale_as::<bf16>(s, input),
        10 => scale_as::<float8::F8E4M3>(s, input),
        11 => scale_as::<float8::F8E5M2>(s, input),
        _ => return Err(format!("the fake cannot scale {}", type_name(dtype))),
    })
}

/// Reduces equally long `inputs` (one per rank, in rank order) element-wise.
pub(crate) fn reduce(dtype: i32, op: i32, inputs: &[&[u8]]) -> Result<Vec<u8>, String> {
    if !(0..=4).contains(&op) {
        return Err(format!("reduction {op} is not one the fake knows"));
    }
    let Some(first) = inputs.first() else {
        return Ok(Vec::new());
    };
    if inputs.iter().any(|i| i.len() != first.len()) {
        return Err("ranks contributed different byte counts".into());
    }
    Ok(match dtype {
        0 => reduce_as::<i8>(inputs, op),
        1 => reduce_as::<u8>(inputs, op),
        2 => reduce_as::<i32>(inputs, op),
        3 => reduce_as::<u32>(inputs, op),
        4 => reduce_as::<i64>(inputs, op),
        5 => reduce_as::<u64>(inputs, op),
        6 => reduce_as::<f16>(inputs, op),
        7 => reduce_as::<f32>(inputs, op),
        8 => reduce_as::<f64>(inputs, op),
        9 => reduce_as::<bf16>(inputs, op),
        10 => reduce_as::<float8::F8E4M3>(inputs, op),
        11 => reduce_as::<float8::F8E5M2>(inputs, op),
        _ => return Err(format!("the fake cannot reduce {}", type_name(dtype))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes<T: Copy>(v: &[T]) -> Vec<u8> {
        // SAFETY: plain numbers; reading their bytes is always valid.
        unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
            .to_vec()
    }

    #[test]
    fn each_type_and_op_reduces_by_its_own_rule() {
        let (a, b) = (bytes(&[3i32, -7]), bytes(&[5i32, 2]));
        assert_eq!(reduce(2, 0, &[&a, &b]).unwrap(), bytes(&[8i32, -5]));
        assert_eq!(reduce(2, 1, &[&a, &b]).unwrap(), bytes(&[15i32, -14]));
        assert_eq!(reduce(2, 2, &[&a, &b]).unwrap(), bytes(&[5i32, 2]));
        assert_eq!(reduce(2, 3, &[&a, &b]).unwrap(), bytes(&[3i32, -7]));
        assert_eq!(reduce(2, 4, &[&a, &b]).unwrap(), bytes(&[4i32, -2]));
        // The same bytes as f32 mean something else entirely: a type mix-up shows.
        assert_ne!(
            reduce(7, 0, &[&a, &b]).unwrap(),
            reduce(2, 0, &[&a, &b]).unwrap()
        );
        let (x, y) = (bytes(&[1.5f32, -2.0]), bytes(&[2.0f32, 8.0]));
        assert_eq!(reduce(7, 4, &[&x, &y]).unwrap(), bytes(&[1.75f32, 3.0]));
        let (x, y) = (bytes(&[f16::from_f32(1.5)]), bytes(&[f16::from_f32(2.25)]));
        assert_eq!(
            reduce(6, 0, &[&x, &y]).unwrap(),
            bytes(&[f16::from_f32(3.75)])
        );
        // The 8-bit floats, each by its own encoding: 1.5 + 2 = 3.5 in both.
        let e4m3: fn(f32) -> u8 = |v| float8::F8E4M3::from_f32(v).to_bits();
        let e5m2: fn(f32) -> u8 = |v| float8::F8E5M2::from_f32(v).to_bits();
        for (dtype, enc) in [(10, e4m3), (11, e5m2)] {
            let (x, y) = ([enc(1.5)], [enc(2.0)]);
            assert_eq!(reduce(dtype, 0, &[&x, &y]).unwrap(), [enc(3.5)]);
            assert_eq!(width(dtype), Some(1));
        }
        // f16 and bf16 bytes differ for the same value.
        let (x, y) = (
            bytes(&[bf16::from_f32(1.5)]),
            bytes(&[bf16::from_f32(2.25)]),
        );
        assert_eq!(
            reduce(9, 0, &[&x, &y]).unwrap(),
            bytes(&[bf16::from_f32(3.75)])
        );
        assert_eq!(reduce(1, 0, &[&[200u8][..], &[100u8][..]]).unwrap(), [44u8]);
        assert!(reduce(12, 0, &[&[1u8][..]]).is_err(), "a type NCCL lacks");
        assert!(reduce(2, 5, &[&a]).is_err());
    }

    #[test]
    fn a_premulsum_scales_each_element_in_its_own_type() {
        let word = |b: &[u8]| {
            let mut w = [0u8; 8];
            w[..b.len()].copy_from_slice(b);
            w
        };
        // i32 wraps; u8 wraps: 3 * 100 = 44 mod 256.
        let x = bytes(&[7i32, i32::MAX]);
        assert_eq!(
            pre_multiply(2, word(&bytes(&[-2i32])), &x).unwrap(),
            bytes(&[-14i32, 2])
        );
        assert_eq!(pre_multiply(1, word(&[3]), &[100, 2]).unwrap(), [44, 6]);
        // f16: 0.1 rounds to 0.0999755859375; 3 * that rounds to f16 once.
        let tenth = f16::from_f64(0.1);
        let got = pre_multiply(6, word(&bytes(&[tenth])), &bytes(&[f16::from_f32(3.0)])).unwrap();
        assert_eq!(got, bytes(&[f16::from_f64(3.0 * tenth.to_f64())]));
        let quarter = word(&bytes(&[0.25f64]));
        assert_eq!(
            pre_multiply(8, quarter, &bytes(&[4.0f64, -1.0])).unwrap(),
            bytes(&[1.0f64, -0.25])
        );
        assert!(pre_multiply(12, quarter, &[0]).is_err());
    }
}
