//! The bytes of one frame body: a type byte, then the fields of that type (see the [module above](super) for the
//! layout). Decoding checks every length against the bytes left, so no input makes it panic or over-allocate.

use std::time::Duration;

use super::message::Frame;
use crate::mac::DIGEST_LEN;
use crate::{Key, KeyDecodeError};

pub(super) mod tag {
    pub const HELLO: u8 = 0x10;
    pub const AUTH: u8 = 0x11;
    pub const WELCOME: u8 = 0x12;
    pub const REFUSED: u8 = 0x13;
    pub const SET: u8 = 0x01;
    pub const TRY_GET: u8 = 0x02;
    pub const GET: u8 = 0x03;
    pub const WAIT: u8 = 0x04;
    pub const ADD: u8 = 0x05;
    pub const COMPARE_SET: u8 = 0x06;
    pub const DELETE: u8 = 0x07;
    pub const NUM_KEYS: u8 = 0x08;
    pub const DONE: u8 = 0x81;
    pub const VALUE: u8 = 0x82;
    pub const INT: u8 = 0x83;
    pub const BOOL: u8 = 0x84;
    pub const SWAPPED: u8 = 0x85;
    pub const COUNT: u8 = 0x86;
    pub const TIMED_OUT: u8 = 0x87;
    pub const NOT_A_COUNTER: u8 = 0x88;
    pub const OVERFLOW: u8 = 0x89;
    pub const FAILED: u8 = 0x8a;
}

/// Why bytes are not a valid frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The length prefix claims more than the maximum frame size.
    #[error("frame of {len} bytes exceeds the maximum of {max} bytes")]
    TooLarge {
        /// The claimed or encoded body length.
        len: u64,
        /// The maximum in force.
        max: u32,
    },
    /// The body ended in the middle of a field.
    #[error("frame body ends inside field {field} (needs {needed} more bytes, {left} left)")]
    Truncated {
        /// The field being read.
        field: &'static str,
        /// Bytes the field needs.
        needed: u64,
        /// Bytes left in the body.
        left: usize,
    },
    /// The body is empty, so it has no type byte.
    #[error("empty frame body")]
    Empty,
    /// The type byte names no known frame.
    #[error("unknown frame type {0:#04x}")]
    UnknownType(u8),
    /// Bytes remain after the last field.
    #[error("{0} unexpected trailing byte(s) after the frame's fields")]
    Trailing(usize),
    /// A boolean or presence byte is neither 0 nor 1.
    #[error("field {field} holds {byte:#04x}, expected 0 or 1")]
    BadFlag {
        /// The field.
        field: &'static str,
        /// The byte found.
        byte: u8,
    },
    /// A key field is not the wire form of a key.
    #[error("malformed key: {0}")]
    BadKey(#[from] KeyDecodeError),
    /// A text field is not UTF-8.
    #[error("field {0} is not valid UTF-8")]
    NotUtf8(&'static str),
}

impl Frame {
    /// The frame's body (without the length prefix).
    pub fn encode_body(&self) -> Vec<u8> {
        let mut e = Encoder(Vec::new());
        match self {
            Frame::Hello {
                version,
                auth_required,
                nonce,
            } => {
                e.u8(tag::HELLO);
                e.u8(*version);
                e.flag(*auth_required);
                e.raw(nonce);
            }
            Frame::Auth {
                version,
                nonce,
                mac,
            } => {
                e.u8(tag::AUTH);
                e.u8(*version);
                e.raw(nonce);
                e.opt_digest(mac.as_ref());
            }
            Frame::Welcome { mac } => {
                e.u8(tag::WELCOME);
                e.opt_digest(mac.as_ref());
            }
            Frame::Refused { reason } => {
                e.u8(tag::REFUSED);
                e.bytes(reason.as_bytes());
            }
            Frame::Set { key, value } => {
                e.u8(tag::SET);
                e.key(key);
                e.bytes(value);
            }
            Frame::TryGet { key } => {
                e.u8(tag::TRY_GET);
                e.key(key);
            }
            Frame::Get { key, timeout } => {
                e.u8(tag::GET);
                e.key(key);
                e.duration(*timeout);
            }
            Frame::Wait { keys, timeout } => {
                e.u8(tag::WAIT);
                e.keys(keys);
                e.duration(*timeout);
            }
            Frame::Add { key, delta } => {
                e.u8(tag::ADD);
                e.key(key);
                e.i64(*delta);
            }
            Frame::CompareSet {
                key,
                expected,
                desired,
            } => {
                e.u8(tag::COMPARE_SET);
                e.key(key);
                e.opt_bytes(expected.as_deref());
                e.bytes(desired);
            }
            Frame::Delete { key } => {
                e.u8(tag::DELETE);
                e.key(key);
            }
            Frame::NumKeys => e.u8(tag::NUM_KEYS),
            Frame::Done => e.u8(tag::DONE),
            Frame::Value(value) => {
                e.u8(tag::VALUE);
                e.opt_bytes(value.as_deref());
            }
            Frame::Int(n) => {
                e.u8(tag::INT);
                e.i64(*n);
            }
            Frame::Bool(b) => {
                e.u8(tag::BOOL);
                e.flag(*b);
            }
            Frame::Swapped { swapped, current } => {
                e.u8(tag::SWAPPED);
                e.flag(*swapped);
                e.opt_bytes(current.as_deref());
            }
            Frame::Count(n) => {
                e.u8(tag::COUNT);
                e.u64(*n);
            }
            Frame::TimedOut { missing, after } => {
                e.u8(tag::TIMED_OUT);
                e.keys(missing);
                e.duration(*after);
            }
            Frame::NotACounter { key, value } => {
                e.u8(tag::NOT_A_COUNTER);
                e.key(key);
                e.bytes(value);
            }
            Frame::Overflow {
                key,
                current,
                delta,
            } => {
                e.u8(tag::OVERFLOW);
                e.key(key);
                e.i64(*current);
                e.i64(*delta);
            }
            Frame::Failed { message } => {
                e.u8(tag::FAILED);
                e.bytes(message.as_bytes());
            }
        }
        e.0
    }

    /// Parses a frame body. Never panics; allocates at most `body.len()` bytes in total.
    pub fn decode_body(body: &[u8]) -> Result<Frame, FrameError> {
        let mut d = Decoder { body, at: 0 };
        let frame = match d.u8("type").map_err(|_| FrameError::Empty)? {
            tag::HELLO => Frame::Hello {
                version: d.u8("version")?,
                auth_required: d.flag("auth_required")?,
                nonce: d.array("nonce")?,
            },
            tag::AUTH => Frame::Auth {
                version: d.u8("version")?,
                nonce: d.array("nonce")?,
                mac: d.opt_digest("mac")?,
            },
            tag::WELCOME => Frame::Welcome {
                mac: d.opt_digest("mac")?,
            },
            tag::REFUSED => Frame::Refused {
                reason: d.string("reason")?,
            },
            tag::SET => Frame::Set {
                key: d.key()?,
                value: d.bytes("value")?,
            },
            tag::TRY_GET => Frame::TryGet { key: d.key()? },
            tag::GET => Frame::Get {
                key: d.key()?,
                timeout: d.duration("timeout")?,
            },
            tag::WAIT => Frame::Wait {
                keys: d.keys()?,
                timeout: d.duration("timeout")?,
            },
            tag::ADD => Frame::Add {
                key: d.key()?,
                delta: d.i64("delta")?,
            },
            tag::COMPARE_SET => Frame::CompareSet {
                key: d.key()?,
                expected: d.opt_bytes("expected")?,
                desired: d.bytes("desired")?,
            },
            tag::DELETE => Frame::Delete { key: d.key()? },
            tag::NUM_KEYS => Frame::NumKeys,
            tag::DONE => Frame::Done,
            tag::VALUE => Frame::Value(d.opt_bytes("value")?),
            tag::INT => Frame::Int(d.i64("int")?),
            tag::BOOL => Frame::Bool(d.flag("bool")?),
            tag::SWAPPED => Frame::Swapped {
                swapped: d.flag("swapped")?,
                current: d.opt_bytes("current")?,
            },
            tag::COUNT => Frame::Count(d.u64("count")?),
            tag::TIMED_OUT => Frame::TimedOut {
                missing: d.keys()?,
                after: d.duration("after")?,
            },
            tag::NOT_A_COUNTER => Frame::NotACounter {
                key: d.key()?,
                value: d.bytes("value")?,
            },
            tag::OVERFLOW => Frame::Overflow {
                key: d.key()?,
                current: d.i64("current")?,
                delta: d.i64("delta")?,
            },
            tag::FAILED => Frame::Failed {
                message: d.string("message")?,
            },
            other => return Err(FrameError::UnknownType(other)),
        };
        match d.body.len() - d.at {
            0 => Ok(frame),
            left => Err(FrameError::Trailing(left)),
        }
    }
}

struct Encoder(Vec<u8>);

impl Encoder {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn flag(&mut self, v: bool) {
        self.0.push(u8::from(v));
    }
    fn raw(&mut self, v: &[u8]) {
        self.0.extend_from_slice(v);
    }
    fn u64(&mut self, v: u64) {
        self.raw(&v.to_le_bytes());
    }
    fn i64(&mut self, v: i64) {
        self.raw(&v.to_le_bytes());
    }
    fn duration(&mut self, d: Duration) {
        self.u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    }
    fn bytes(&mut self, v: &[u8]) {
        // A field over 4 GiB cannot fit in a frame; saturating makes the frame's own size check reject it.
        self.raw(&u32::try_from(v.len()).unwrap_or(u32::MAX).to_le_bytes());
        self.raw(v);
    }
    fn opt_bytes(&mut self, v: Option<&[u8]>) {
        match v {
            None => self.flag(false),
            Some(v) => {
                self.flag(true);
                self.bytes(v);
            }
        }
    }
    fn opt_digest(&mut self, v: Option<&[u8; DIGEST_LEN]>) {
        match v {
            None => self.flag(false),
            Some(v) => {
                self.flag(true);
                self.raw(v);
            }
        }
    }
    fn key(&mut self, key: &Key) {
        self.bytes(&key.encode());
    }
    fn keys(&mut self, keys: &[Key]) {
        self.raw(&u32::try_from(keys.len()).unwrap_or(u32::MAX).to_le_bytes());
        for key in keys {
            self.key(key);
        }
    }
}

struct Decoder<'a> {
    body: &'a [u8],
    at: usize,
}

impl<'a> Decoder<'a> {
    fn take(&mut self, n: u64, field: &'static str) -> Result<&'a [u8], FrameError> {
        let left = self.body.len() - self.at;
        let n_usize =
            usize::try_from(n)
                .ok()
                .filter(|&n| n <= left)
                .ok_or(FrameError::Truncated {
                    field,
                    needed: n,
                    left,
                })?;
        let out = &self.body[self.at..self.at + n_usize];
        self.at += n_usize;
        Ok(out)
    }
    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], FrameError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64, field)?);
        Ok(out)
    }
    fn u8(&mut self, field: &'static str) -> Result<u8, FrameError> {
        Ok(self.array::<1>(field)?[0])
    }
    fn flag(&mut self, field: &'static str) -> Result<bool, FrameError> {
        match self.u8(field)? {
            0 => Ok(false),
            1 => Ok(true),
            byte => Err(FrameError::BadFlag { field, byte }),
        }
    }
    fn u32(&mut self, field: &'static str) -> Result<u32, FrameError> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }
    fn u64(&mut self, field: &'static str) -> Result<u64, FrameError> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }
    fn i64(&mut self, field: &'static str) -> Result<i64, FrameError> {
        Ok(i64::from_le_bytes(self.array(field)?))
    }
    fn duration(&mut self, field: &'static str) -> Result<Duration, FrameError> {
        Ok(Duration::from_millis(self.u64(field)?))
    }
    fn slice(&mut self, field: &'static str) -> Result<&'a [u8], FrameError> {
        let len = self.u32(field)?;
        self.take(u64::from(len), field)
    }
    fn bytes(&mut self, field: &'static str) -> Result<Vec<u8>, FrameError> {
        Ok(self.slice(field)?.to_vec())
    }
    fn string(&mut self, field: &'static str) -> Result<String, FrameError> {
        let bytes = self.slice(field)?;
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| FrameError::NotUtf8(field))
    }
    fn opt_bytes(&mut self, field: &'static str) -> Result<Option<Vec<u8>>, FrameError> {
        if self.flag(field)? {
            self.bytes(field).map(Some)
        } else {
            Ok(None)
        }
    }
    fn opt_digest(&mut self, field: &'static str) -> Result<Option<[u8; DIGEST_LEN]>, FrameError> {
        if self.flag(field)? {
            self.array(field).map(Some)
        } else {
            Ok(None)
        }
    }
    fn key(&mut self) -> Result<Key, FrameError> {
        Ok(Key::decode(self.slice("key")?)?)
    }
    fn keys(&mut self) -> Result<Vec<Key>, FrameError> {
        let count = self.u32("key count")?;
        // No `with_capacity(count)`: the count is untrusted. Each key costs at least its 4-byte length, so the
        // loop ends (with an error) long before `count` when the body is short.
        let mut keys = Vec::new();
        for _ in 0..count {
            keys.push(self.key()?);
        }
        Ok(keys)
    }
}
