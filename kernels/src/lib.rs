//! CUDA C sources of hypercomm's device kernels, as text for NVRTC.
//!
//! Nothing here compiles CUDA: the NCCL backend of `hypercomm-comm` hands these sources to NVRTC at first use and
//! caches the module per device. Keeping the sources in their own crate lets this crate's tests check them on any
//! machine (every kernel the backend looks up is declared `extern "C"` in the source it names, and the sources
//! need no header), while the compile itself is checked where NVRTC is present.
//!
//! - [`PACK`] (`pack.cu`): copy a 2-D strided view into a contiguous staging buffer and back, one kernel per
//!   element width. Collectives on a non-contiguous view run on the staging buffer and unpack the result into the
//!   caller's view, so a result is never written to a temporary copy and dropped.
//! - [`FILL_VERIFY`] (`fill_verify.cu`): write the pattern `a * (i % 61) + b` into a buffer, and count the
//!   elements that differ from it, one pair of kernels per element type. Tests and benchmarks use it to check a
//!   collective's result on the device.
//!
//! ```
//! use hypercomm_kernels::{FILL_VERIFY, PACK, pack_kernel, fill_kernel};
//!
//! assert_eq!(pack_kernel(4), Some("hypercomm_pack_4"));
//! assert!(PACK.declares(pack_kernel(4).unwrap()));
//! assert!(FILL_VERIFY.declares(&fill_kernel("bf16")));
//! ```

/// One `.cu` file: its name (for NVRTC's messages) and its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelSource {
    /// The file name, e.g. `"pack.cu"`; NVRTC uses it in error messages.
    pub name: &'static str,
    /// The CUDA C source.
    pub text: &'static str,
    /// Every `extern "C"` kernel the file defines, in file order.
    pub kernels: &'static [&'static str],
}

impl KernelSource {
    /// Whether the source defines the `extern "C"` kernel `symbol` (as the expansion of one of its macros or
    /// directly). Checked against the text by this crate's tests, so a renamed kernel fails here, not on a GPU.
    pub fn declares(&self, symbol: &str) -> bool {
        self.kernels.contains(&symbol)
    }
}

/// Strided pack/unpack kernels (`kernels/pack.cu`).
pub const PACK: KernelSource = KernelSource {
    name: "pack.cu",
    text: include_str!("../pack.cu"),
    kernels: &[
        "hypercomm_pack_1",
        "hypercomm_unpack_1",
        "hypercomm_pack_2",
        "hypercomm_unpack_2",
        "hypercomm_pack_4",
        "hypercomm_unpack_4",
        "hypercomm_pack_8",
        "hypercomm_unpack_8",
    ],
};

/// Fill/verify kernels (`kernels/fill_verify.cu`).
pub const FILL_VERIFY: KernelSource = KernelSource {
    name: "fill_verify.cu",
    text: include_str!("../fill_verify.cu"),
    kernels: &[
        "hypercomm_fill_f32",
        "hypercomm_verify_f32",
        "hypercomm_fill_f64",
        "hypercomm_verify_f64",
        "hypercomm_fill_f16",
        "hypercomm_verify_f16",
        "hypercomm_fill_bf16",
        "hypercomm_verify_bf16",
        "hypercomm_fill_i8",
        "hypercomm_verify_i8",
        "hypercomm_fill_u8",
        "hypercomm_verify_u8",
        "hypercomm_fill_i32",
        "hypercomm_verify_i32",
        "hypercomm_fill_i64",
        "hypercomm_verify_i64",
        "hypercomm_fill_u32",
        "hypercomm_verify_u32",
        "hypercomm_fill_u64",
        "hypercomm_verify_u64",
    ],
};

/// Every source file.
pub const ALL: [KernelSource; 2] = [PACK, FILL_VERIFY];

/// The pattern modulus of `fill_verify.cu`: element `i` holds `a * (i % PATTERN_PERIOD) + b`.
pub const PATTERN_PERIOD: u64 = 61;

/// The pack kernel for elements of `width` bytes (1, 2, 4 or 8), or `None` for another width.
pub fn pack_kernel(width: usize) -> Option<&'static str> {
    Some(match width {
        1 => "hypercomm_pack_1",
        2 => "hypercomm_pack_2",
        4 => "hypercomm_pack_4",
        8 => "hypercomm_pack_8",
        _ => return None,
    })
}

/// The unpack kernel for elements of `width` bytes (1, 2, 4 or 8), or `None` for another width.
pub fn unpack_kernel(width: usize) -> Option<&'static str> {
    Some(match width {
        1 => "hypercomm_unpack_1",
        2 => "hypercomm_unpack_2",
        4 => "hypercomm_unpack_4",
        8 => "hypercomm_unpack_8",
        _ => return None,
    })
}

/// The fill kernel for the element type named `dtype` (`"f32"`, `"bf16"`, ...; hypercomm's `DType::name`).
pub fn fill_kernel(dtype: &str) -> String {
    format!("hypercomm_fill_{dtype}")
}

/// The verify kernel for the element type named `dtype`.
pub fn verify_kernel(dtype: &str) -> String {
    format!("hypercomm_verify_{dtype}")
}

/// The value the fill kernel writes at index `i`: `a * (i % 61) + b` (host reference for tests).
pub fn pattern(i: u64, a: i64, b: i64) -> i64 {
    // i % 61 < 61 always fits an i64.
    a.wrapping_mul((i % PATTERN_PERIOD) as i64).wrapping_add(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernels a source defines, found by expanding its `HYPERCOMM_*(...)` macro invocations and reading its
    /// plain `extern "C" __global__ void name(` definitions.
    fn defined_kernels(source: &KernelSource) -> Vec<String> {
        let text = source.text;
        let mut found = Vec::new();
        for line in text.lines() {
            let line = line.trim();
            if let Some(rest) = line.strip_prefix("HYPERCOMM_PACK_WIDTH(") {
                let width = rest.split(',').next().unwrap().trim();
                found.push(format!("hypercomm_pack_{width}"));
                found.push(format!("hypercomm_unpack_{width}"));
            } else if let Some(rest) = line.strip_prefix("HYPERCOMM_FILL_VERIFY(") {
                let name = rest.split(',').next().unwrap().trim();
                found.push(format!("hypercomm_fill_{name}"));
                found.push(format!("hypercomm_verify_{name}"));
            } else if let Some(rest) = line.strip_prefix("extern \"C\" __global__ void ")
                && !rest.contains("##")
            {
                found.push(rest.split('(').next().unwrap().trim().to_owned());
            }
        }
        found
    }

    #[test]
    fn listed_kernels_are_exactly_those_defined() {
        for source in ALL {
            let defined = defined_kernels(&source);
            assert_eq!(defined, source.kernels, "{}", source.name);
        }
    }

    #[test]
    fn macros_define_kernels_with_extern_c_linkage() {
        // The macro bodies must give the kernels C linkage, or NVRTC mangles the names the backend looks up.
        assert!(
            PACK.text
                .contains("extern \"C\" __global__ void hypercomm_pack_##BYTES(")
        );
        assert!(
            PACK.text
                .contains("extern \"C\" __global__ void hypercomm_unpack_##BYTES(")
        );
        assert!(
            FILL_VERIFY
                .text
                .contains("extern \"C\" __global__ void hypercomm_fill_##NAME(")
        );
        assert!(
            FILL_VERIFY
                .text
                .contains("extern \"C\" __global__ void hypercomm_verify_##NAME(")
        );
    }

    #[test]
    fn sources_need_no_headers_and_are_balanced() {
        for source in ALL {
            assert!(!source.text.contains("#include"), "{}", source.name);
            // Outside comments, every bracket closes: a cheap guard against a truncated edit.
            let code: String = source
                .text
                .lines()
                .map(|l| l.split("//").next().unwrap())
                .collect::<Vec<_>>()
                .join("\n");
            for (open, close) in [('{', '}'), ('(', ')'), ('[', ']')] {
                let opens = code.matches(open).count();
                let closes = code.matches(close).count();
                assert_eq!(
                    opens, closes,
                    "{} has unbalanced {open}{close}",
                    source.name
                );
            }
        }
    }

    #[test]
    fn lookups_name_listed_kernels() {
        for width in [1, 2, 4, 8] {
            assert!(PACK.declares(pack_kernel(width).unwrap()));
            assert!(PACK.declares(unpack_kernel(width).unwrap()));
        }
        assert_eq!(pack_kernel(3), None);
        assert_eq!(unpack_kernel(16), None);
        for name in [
            "f32", "f64", "f16", "bf16", "i8", "u8", "i32", "i64", "u32", "u64",
        ] {
            assert!(FILL_VERIFY.declares(&fill_kernel(name)), "{name}");
            assert!(FILL_VERIFY.declares(&verify_kernel(name)), "{name}");
        }
        assert!(!FILL_VERIFY.declares("hypercomm_fill_f8"));
    }

    #[test]
    fn pattern_composes_under_sum() {
        // n ranks filling (a=1, b=r) sum to (a=n, b=n(n-1)/2): the rule the GPU tests rely on.
        let n = 4i64;
        for i in 0..200u64 {
            let sum: i64 = (0..n).map(|r| pattern(i, 1, r)).sum();
            assert_eq!(sum, pattern(i, n, n * (n - 1) / 2), "i={i}");
        }
        assert_eq!(pattern(61, 3, 5), 5);
        assert_eq!(pattern(62, 3, 5), 8);
    }
}
