//! Structured store keys.
//!
//! A [`Key`] is an ordered list of [`KeyPart`]s, each a string or an unsigned integer. Keys compare and hash by
//! their parts, and their wire form ([`Key::encode`]) tags and length-prefixes every part, so the mapping from parts
//! to bytes is injective: `("foo1", 23)` and `("foo12", 3)` are different keys everywhere, in memory and on the wire.
//! The string shown by `Display` is for people only; never parse it back.

use std::fmt;

use serde::{Deserialize, Serialize};

/// One part of a [`Key`]: a string or an unsigned integer. A string `"3"` and the integer `3` are different parts.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum KeyPart {
    /// A textual part, such as a collection name or a group kind.
    Str(String),
    /// A numeric part, such as a group index or a counter.
    Int(u64),
}

impl From<&str> for KeyPart {
    fn from(s: &str) -> Self {
        KeyPart::Str(s.to_owned())
    }
}

impl From<String> for KeyPart {
    fn from(s: String) -> Self {
        KeyPart::Str(s)
    }
}

impl From<&String> for KeyPart {
    fn from(s: &String) -> Self {
        KeyPart::Str(s.clone())
    }
}

impl From<u64> for KeyPart {
    fn from(n: u64) -> Self {
        KeyPart::Int(n)
    }
}

impl From<u32> for KeyPart {
    fn from(n: u32) -> Self {
        KeyPart::Int(u64::from(n))
    }
}

impl From<usize> for KeyPart {
    fn from(n: usize) -> Self {
        // usize is at most 64 bits on every platform Rust supports.
        KeyPart::Int(n as u64)
    }
}

/// A structured key: an ordered list of typed parts.
///
/// ```
/// use hypercomm_store::Key;
///
/// let a = Key::new("uniqueid").push("foo1").push(23u64);
/// let b = Key::new("uniqueid").push("foo12").push(3u64);
/// assert_ne!(a, b);
/// assert_ne!(a.encode(), b.encode());
/// assert_eq!(Key::decode(&a.encode()).unwrap(), a);
/// assert_eq!(a.to_string(), "uniqueid/foo1/#23");
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Key {
    parts: Vec<KeyPart>,
}

/// Why a byte string is not the wire form of a [`Key`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyDecodeError {
    /// The bytes end inside a part.
    #[error("key bytes end inside part {part} (offset {offset})")]
    Truncated {
        /// Index of the part being decoded.
        part: usize,
        /// Byte offset where more input was expected.
        offset: usize,
    },
    /// A part starts with a tag that is neither string nor integer.
    #[error("unknown key part tag {tag:#04x} at offset {offset}")]
    UnknownTag {
        /// The tag byte found.
        tag: u8,
        /// Its byte offset.
        offset: usize,
    },
    /// A string part is not valid UTF-8.
    #[error("key part {part} is not valid UTF-8")]
    NotUtf8 {
        /// Index of the offending part.
        part: usize,
    },
}

const TAG_STR: u8 = b's';
const TAG_INT: u8 = b'i';

impl Key {
    /// A key with one part.
    pub fn new(first: impl Into<KeyPart>) -> Self {
        Key {
            parts: vec![first.into()],
        }
    }

    /// The key with no parts. Useful as the root of a [`Key::join`] chain and as an empty prefix.
    pub fn empty() -> Self {
        Key::default()
    }

    /// This key with one more part at the end.
    #[must_use]
    pub fn push(mut self, part: impl Into<KeyPart>) -> Self {
        self.parts.push(part.into());
        self
    }

    /// This key followed by all parts of `suffix`.
    #[must_use]
    pub fn join(&self, suffix: &Key) -> Key {
        let mut parts = self.parts.clone();
        parts.extend(suffix.parts.iter().cloned());
        Key { parts }
    }

    /// The rest of this key after `prefix`, or `None` when it does not start with `prefix`.
    pub fn strip_prefix(&self, prefix: &Key) -> Option<Key> {
        self.parts
            .strip_prefix(prefix.parts.as_slice())
            .map(|rest| Key {
                parts: rest.to_vec(),
            })
    }

    /// Whether this key starts with all parts of `prefix`.
    pub fn starts_with(&self, prefix: &Key) -> bool {
        self.parts.starts_with(&prefix.parts)
    }

    /// The parts, in order.
    pub fn parts(&self) -> &[KeyPart] {
        &self.parts
    }

    /// Whether the key has no parts.
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    /// The injective wire form: per part a tag byte, then a little-endian `u32` length and UTF-8 bytes for
    /// strings, or a little-endian `u64` for integers.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len());
        for part in &self.parts {
            match part {
                KeyPart::Str(s) => {
                    out.push(TAG_STR);
                    // A part longer than 4 GiB cannot be framed by any store; saturate and let the frame limit
                    // reject it rather than wrap silently.
                    let len = u32::try_from(s.len()).unwrap_or(u32::MAX);
                    out.extend_from_slice(&len.to_le_bytes());
                    out.extend_from_slice(s.as_bytes());
                }
                KeyPart::Int(n) => {
                    out.push(TAG_INT);
                    out.extend_from_slice(&n.to_le_bytes());
                }
            }
        }
        out
    }

    /// Length in bytes of [`Key::encode`]'s output.
    pub fn encoded_len(&self) -> usize {
        self.parts
            .iter()
            .map(|p| match p {
                KeyPart::Str(s) => 1 + 4 + s.len(),
                KeyPart::Int(_) => 1 + 8,
            })
            .sum()
    }

    /// Parses the wire form produced by [`Key::encode`]. Never panics and never allocates more than `bytes.len()`.
    pub fn decode(bytes: &[u8]) -> Result<Key, KeyDecodeError> {
        let mut parts = Vec::new();
        let mut at = 0usize;
        while at < bytes.len() {
            let part = parts.len();
            let tag = bytes[at];
            at += 1;
            match tag {
                TAG_STR => {
                    let len = take::<4>(bytes, &mut at, part)?;
                    let len = u32::from_le_bytes(len) as usize;
                    let end = at
                        .checked_add(len)
                        .filter(|&end| end <= bytes.len())
                        .ok_or(KeyDecodeError::Truncated { part, offset: at })?;
                    let s = std::str::from_utf8(&bytes[at..end])
                        .map_err(|_| KeyDecodeError::NotUtf8 { part })?;
                    parts.push(KeyPart::Str(s.to_owned()));
                    at = end;
                }
                TAG_INT => {
                    let n = take::<8>(bytes, &mut at, part)?;
                    parts.push(KeyPart::Int(u64::from_le_bytes(n)));
                }
                tag => {
                    return Err(KeyDecodeError::UnknownTag {
                        tag,
                        offset: at - 1,
                    });
                }
            }
        }
        Ok(Key { parts })
    }
}

fn take<const N: usize>(
    bytes: &[u8],
    at: &mut usize,
    part: usize,
) -> Result<[u8; N], KeyDecodeError> {
    let chunk = bytes
        .get(*at..*at + N)
        .ok_or(KeyDecodeError::Truncated { part, offset: *at })?;
    *at += N;
    let mut out = [0u8; N];
    out.copy_from_slice(chunk);
    Ok(out)
}

impl fmt::Display for Key {
    /// Parts joined by `/`; integers are written `#N` so that they stand out from strings.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, part) in self.parts.iter().enumerate() {
            if i > 0 {
                f.write_str("/")?;
            }
            match part {
                KeyPart::Str(s) => f.write_str(s)?,
                KeyPart::Int(n) => write!(f, "#{n}")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_part() -> impl Strategy<Value = KeyPart> {
        prop_oneof![
            ".{0,12}".prop_map(KeyPart::Str),
            any::<u64>().prop_map(KeyPart::Int),
        ]
    }

    fn arb_key() -> impl Strategy<Value = Key> {
        proptest::collection::vec(arb_part(), 0..6).prop_map(|parts| Key { parts })
    }

    #[test]
    fn concatenation_collision_from_the_mscclpp_review_cannot_happen() {
        let a = Key::new("mscclpp_uniqueid").push("foo1").push(23u64);
        let b = Key::new("mscclpp_uniqueid").push("foo12").push(3u64);
        assert_ne!(a.encode(), b.encode());
    }

    #[test]
    fn string_and_integer_parts_differ() {
        assert_ne!(Key::new("3").encode(), Key::new(3u64).encode());
    }

    #[test]
    fn prefix_join_and_strip_are_inverse() {
        let prefix = Key::new("job").push(7u64);
        let key = Key::new("x").push("y");
        let joined = prefix.join(&key);
        assert!(joined.starts_with(&prefix));
        assert_eq!(joined.strip_prefix(&prefix), Some(key.clone()));
        assert_eq!(key.strip_prefix(&prefix), None);
    }

    proptest! {
        #[test]
        fn encoding_round_trips(key in arb_key()) {
            let bytes = key.encode();
            prop_assert_eq!(bytes.len(), key.encoded_len());
            prop_assert_eq!(Key::decode(&bytes).unwrap(), key);
        }

        #[test]
        fn encoding_is_injective(a in arb_key(), b in arb_key()) {
            prop_assert_eq!(a == b, a.encode() == b.encode());
        }

        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(key) = Key::decode(&bytes) {
                prop_assert_eq!(key.encode(), bytes);
            }
        }
    }
}
