//! [`DType`]: a parameter's element type, for the only thing a refit plan needs from it: its size in bytes.
//!
//! A plan never cuts inside an element, so that an executor may move bytes with typed sends too.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::RefitError;

/// An element type, named as in JSON and on the command line (`bf16`, `f32`, `f8e4m3`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum DType {
    /// 64-bit float.
    #[serde(rename = "f64")]
    F64,
    /// 32-bit float.
    #[serde(rename = "f32")]
    F32,
    /// bfloat16.
    #[serde(rename = "bf16")]
    Bf16,
    /// IEEE half.
    #[serde(rename = "f16")]
    F16,
    /// 8-bit float, 4 exponent and 3 mantissa bits.
    #[serde(rename = "f8e4m3")]
    F8E4m3,
    /// 8-bit float, 5 exponent and 2 mantissa bits.
    #[serde(rename = "f8e5m2")]
    F8E5m2,
    /// 64-bit signed integer.
    #[serde(rename = "i64")]
    I64,
    /// 32-bit signed integer.
    #[serde(rename = "i32")]
    I32,
    /// 32-bit unsigned integer.
    #[serde(rename = "u32")]
    U32,
    /// 16-bit signed integer.
    #[serde(rename = "i16")]
    I16,
    /// 8-bit unsigned integer.
    #[serde(rename = "u8")]
    U8,
}

impl DType {
    /// Every element type, widest first.
    pub const ALL: [DType; 11] = [
        DType::F64,
        DType::I64,
        DType::F32,
        DType::I32,
        DType::U32,
        DType::Bf16,
        DType::F16,
        DType::I16,
        DType::F8E4m3,
        DType::F8E5m2,
        DType::U8,
    ];

    /// The name used in JSON and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            DType::F64 => "f64",
            DType::F32 => "f32",
            DType::Bf16 => "bf16",
            DType::F16 => "f16",
            DType::F8E4m3 => "f8e4m3",
            DType::F8E5m2 => "f8e5m2",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::I16 => "i16",
            DType::U8 => "u8",
        }
    }

    /// The size of one element in bytes.
    pub fn size(self) -> u64 {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::Bf16 | DType::F16 | DType::I16 => 2,
            DType::F8E4m3 | DType::F8E5m2 | DType::U8 => 1,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = RefitError;

    /// Parses a name such as `bf16` (any case).
    fn from_str(text: &str) -> Result<DType, RefitError> {
        let lower = text.trim().to_ascii_lowercase();
        DType::ALL
            .into_iter()
            .find(|d| d.name() == lower)
            .ok_or_else(|| RefitError::Parse {
                what: "element type",
                text: text.to_owned(),
                why: format!(
                    "unknown (known: {})",
                    DType::ALL.map(DType::name).join(", ")
                ),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_parsing_and_serde() {
        for dtype in DType::ALL {
            assert_eq!(dtype.name().parse::<DType>().unwrap(), dtype);
            assert_eq!(
                serde_json::to_string(&dtype).unwrap(),
                format!("\"{}\"", dtype.name())
            );
        }
        assert_eq!("BF16".parse::<DType>().unwrap().size(), 2);
        let err = "f12".parse::<DType>().unwrap_err().to_string();
        assert!(
            err.starts_with("element type \"f12\": unknown (known: f64, i64"),
            "{err}"
        );
    }
}
