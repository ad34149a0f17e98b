//! The store's wire format: length-prefixed binary frames, and the codec that reads and writes them.
//!
//! A frame is a little-endian `u32` body length followed by the body: one type byte, then the fields of that type.
//! Byte strings travel as a `u32` length and the bytes; keys as the bytes of [`Key::encode`]; optional byte
//! strings as a presence byte (0 or 1) and then the string; integers little-endian; durations as whole
//! milliseconds in a `u64`.
//!
//! Decoding never trusts a length: a frame longer than the reader's maximum is refused before any allocation, the
//! body is read only as far as bytes actually arrive, and every field length is checked against the bytes left in
//! the body. So no input, however hostile, makes the decoder panic or allocate more than the frame it was given.

use std::io::{self, Read, Write};
use std::time::Duration;

use crate::mac::DIGEST_LEN;
use crate::{Key, KeyDecodeError};

/// The largest frame body accepted by default: 64 MiB.
pub const DEFAULT_MAX_FRAME: u32 = 64 << 20;

/// Version of the handshake and frame layout; a server refuses a client speaking another.
pub const PROTOCOL_VERSION: u8 = 1;

/// Length of a handshake nonce in bytes.
pub const NONCE_LEN: usize = 32;

/// One message between a store client and server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    // ----- handshake -----
    /// Server → client, first frame on a connection.
    Hello {
        /// The server's [`PROTOCOL_VERSION`].
        version: u8,
        /// Whether the server demands the shared secret.
        auth_required: bool,
        /// Fresh random bytes the client must key-hash.
        nonce: [u8; NONCE_LEN],
    },
    /// Client → server, answering `Hello`.
    Auth {
        /// The client's [`PROTOCOL_VERSION`].
        version: u8,
        /// Fresh random bytes the server must key-hash back, proving it knows the secret too.
        nonce: [u8; NONCE_LEN],
        /// The client's proof, present when the client holds a secret.
        mac: Option<[u8; DIGEST_LEN]>,
    },
    /// Server → client: the connection is accepted.
    Welcome {
        /// The server's proof, present when the server holds a secret.
        mac: Option<[u8; DIGEST_LEN]>,
    },
    /// Server → client: the connection is refused; the server closes it after this frame.
    Refused {
        /// Why, for the client's error message.
        reason: String,
    },

    // ----- requests -----
    /// Write a value.
    Set {
        /// The key.
        key: Key,
        /// The value.
        value: Vec<u8>,
    },
    /// Read a value without waiting.
    TryGet {
        /// The key.
        key: Key,
    },
    /// Read a value, waiting up to `timeout` for it.
    Get {
        /// The key.
        key: Key,
        /// How long the server may wait.
        timeout: Duration,
    },
    /// Wait until every key exists.
    Wait {
        /// The keys.
        keys: Vec<Key>,
        /// How long the server may wait.
        timeout: Duration,
    },
    /// Atomically add to a counter.
    Add {
        /// The counter's key.
        key: Key,
        /// The increment.
        delta: i64,
    },
    /// Atomically replace a value if it matches.
    CompareSet {
        /// The key.
        key: Key,
        /// The value required now (`None`: absent).
        expected: Option<Vec<u8>>,
        /// The value to write.
        desired: Vec<u8>,
    },
    /// Remove a key.
    Delete {
        /// The key.
        key: Key,
    },
    /// Count the keys.
    NumKeys,

    // ----- replies -----
    /// The request succeeded and returns nothing.
    Done,
    /// A value, or `None` for an absent key.
    Value(Option<Vec<u8>>),
    /// A counter value.
    Int(i64),
    /// A yes/no answer (whether a deleted key existed).
    Bool(bool),
    /// The outcome of a compare-and-set.
    Swapped {
        /// Whether the value was written.
        swapped: bool,
        /// The value afterwards.
        current: Option<Vec<u8>>,
    },
    /// A key count.
    Count(u64),
    /// A wait ran out of time.
    TimedOut {
        /// Keys still missing.
        missing: Vec<Key>,
        /// How long the server waited.
        after: Duration,
    },
    /// `Add` found a value that is not a counter.
    NotACounter {
        /// The key.
        key: Key,
        /// Its value.
        value: Vec<u8>,
    },
    /// `Add` would overflow.
    Overflow {
        /// The key.
        key: Key,
        /// Its current value.
        current: i64,
        /// The increment.
        delta: i64,
    },
    /// Any other failure, as text.
    Failed {
        /// What went wrong.
        message: String,
    },
}

mod tag {
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

/// Why [`read_frame`] returned no frame.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The peer closed the connection cleanly between frames.
    #[error("connection closed")]
    Closed,
    /// The socket failed, timed out, or closed in the middle of a frame.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The bytes that arrived are not a valid frame.
    #[error("{0}")]
    Frame(#[from] FrameError),
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

/// The frame with its length prefix, ready to send. Fails when the body exceeds `max`.
pub fn encode_frame(frame: &Frame, max: u32) -> Result<Vec<u8>, FrameError> {
    let body = frame.encode_body();
    let len = u32::try_from(body.len())
        .ok()
        .filter(|&len| len <= max)
        .ok_or(FrameError::TooLarge {
            len: body.len() as u64,
            max,
        })?;
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

/// Writes `frame` with its length prefix. Fails with `InvalidInput` (wrapping [`FrameError::TooLarge`]) when the
/// body exceeds `max`, before writing anything.
pub fn write_frame(w: &mut impl Write, frame: &Frame, max: u32) -> io::Result<()> {
    let bytes =
        encode_frame(frame, max).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    w.write_all(&bytes)?;
    w.flush()
}

/// Reads one frame of at most `max` body bytes.
///
/// The body buffer grows only as bytes arrive, so a peer that claims a large frame and sends little costs little.
pub fn read_frame(r: &mut impl Read, max: u32) -> Result<Frame, ReadError> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Err(ReadError::Closed),
            Ok(0) => {
                return Err(ReadError::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed inside a frame's length prefix",
                )));
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ReadError::Io(e)),
        }
    }
    let len = u32::from_le_bytes(len);
    if len > max {
        return Err(FrameError::TooLarge {
            len: u64::from(len),
            max,
        }
        .into());
    }
    let mut body = Vec::new();
    r.take(u64::from(len)).read_to_end(&mut body)?;
    if body.len() < len as usize {
        return Err(ReadError::Io(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!(
                "connection closed after {} of a frame's {len} bytes",
                body.len()
            ),
        )));
    }
    Ok(Frame::decode_body(&body)?)
}

/// Decodes the first frame at the start of `buf`, for readers that collect bytes as they arrive (the event-driven
/// server): `Ok(Some((frame, consumed)))` when a whole frame is there, `Ok(None)` when more bytes are needed.
///
/// A length prefix over `max` is refused as soon as its four bytes are in, so a caller that appends only what
/// arrives never buffers more than one frame of at most `max` bytes plus what follows it.
pub fn split_frame(buf: &[u8], max: u32) -> Result<Option<(Frame, usize)>, FrameError> {
    let Some((prefix, rest)) = buf.split_first_chunk::<4>() else {
        return Ok(None);
    };
    let len = u32::from_le_bytes(*prefix);
    if len > max {
        return Err(FrameError::TooLarge {
            len: u64::from(len),
            max,
        });
    }
    // `len <= max <= u32::MAX`, which fits in usize on every platform this crate builds for (64- and 32-bit).
    let len = len as usize;
    match rest.get(..len) {
        Some(body) => Ok(Some((Frame::decode_body(body)?, 4 + len))),
        None => Ok(None),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::KeyPart;
    use proptest::prelude::*;

    fn arb_key() -> impl Strategy<Value = Key> {
        proptest::collection::vec(
            prop_oneof![
                ".{0,8}".prop_map(KeyPart::Str),
                any::<u64>().prop_map(KeyPart::Int)
            ],
            0..4,
        )
        .prop_map(|parts| {
            parts
                .into_iter()
                .fold(Key::empty(), |key, part| key.push(part))
        })
    }

    fn arb_bytes() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(any::<u8>(), 0..32)
    }

    fn arb_duration() -> impl Strategy<Value = Duration> {
        any::<u64>().prop_map(Duration::from_millis)
    }

    fn arb_frame() -> impl Strategy<Value = Frame> {
        prop_oneof![
            (any::<u8>(), any::<bool>(), any::<[u8; NONCE_LEN]>()).prop_map(
                |(version, auth_required, nonce)| Frame::Hello {
                    version,
                    auth_required,
                    nonce
                }
            ),
            (
                any::<u8>(),
                any::<[u8; NONCE_LEN]>(),
                proptest::option::of(any::<[u8; DIGEST_LEN]>())
            )
                .prop_map(|(version, nonce, mac)| Frame::Auth {
                    version,
                    nonce,
                    mac
                }),
            proptest::option::of(any::<[u8; DIGEST_LEN]>()).prop_map(|mac| Frame::Welcome { mac }),
            ".{0,16}".prop_map(|reason| Frame::Refused { reason }),
            (arb_key(), arb_bytes()).prop_map(|(key, value)| Frame::Set { key, value }),
            arb_key().prop_map(|key| Frame::TryGet { key }),
            (arb_key(), arb_duration()).prop_map(|(key, timeout)| Frame::Get { key, timeout }),
            (proptest::collection::vec(arb_key(), 0..4), arb_duration())
                .prop_map(|(keys, timeout)| Frame::Wait { keys, timeout }),
            (arb_key(), any::<i64>()).prop_map(|(key, delta)| Frame::Add { key, delta }),
            (arb_key(), proptest::option::of(arb_bytes()), arb_bytes()).prop_map(
                |(key, expected, desired)| Frame::CompareSet {
                    key,
                    expected,
                    desired
                }
            ),
            arb_key().prop_map(|key| Frame::Delete { key }),
            Just(Frame::NumKeys),
            Just(Frame::Done),
            proptest::option::of(arb_bytes()).prop_map(Frame::Value),
            any::<i64>().prop_map(Frame::Int),
            any::<bool>().prop_map(Frame::Bool),
            (any::<bool>(), proptest::option::of(arb_bytes()))
                .prop_map(|(swapped, current)| Frame::Swapped { swapped, current }),
            any::<u64>().prop_map(Frame::Count),
            (proptest::collection::vec(arb_key(), 0..4), arb_duration())
                .prop_map(|(missing, after)| Frame::TimedOut { missing, after }),
            (arb_key(), arb_bytes()).prop_map(|(key, value)| Frame::NotACounter { key, value }),
            (arb_key(), any::<i64>(), any::<i64>()).prop_map(|(key, current, delta)| {
                Frame::Overflow {
                    key,
                    current,
                    delta,
                }
            }),
            ".{0,16}".prop_map(|message| Frame::Failed { message }),
        ]
    }

    /// A reader that hands out one byte per call, to exercise partial reads.
    struct Trickle<'a>(&'a [u8]);

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            match (self.0.split_first(), buf.first_mut()) {
                (Some((&b, rest)), Some(slot)) => {
                    *slot = b;
                    self.0 = rest;
                    Ok(1)
                }
                _ => Ok(0),
            }
        }
    }

    proptest! {
        #[test]
        fn frames_round_trip(frame in arb_frame()) {
            let mut wire = Vec::new();
            write_frame(&mut wire, &frame, DEFAULT_MAX_FRAME).unwrap();
            let back = read_frame(&mut Trickle(&wire), DEFAULT_MAX_FRAME).unwrap();
            prop_assert_eq!(back, frame);
        }

        #[test]
        fn arbitrary_bodies_never_panic(body in proptest::collection::vec(any::<u8>(), 0..256)) {
            // Any decoded frame must re-encode to the same bytes: the format has exactly one encoding per frame.
            if let Ok(frame) = Frame::decode_body(&body) {
                prop_assert_eq!(frame.encode_body(), body);
            }
        }

        #[test]
        fn arbitrary_streams_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256), max in 0u32..512) {
            let mut reader = Trickle(&bytes);
            // Keep reading until the stream is exhausted or an error; each call consumes at least one byte or stops.
            for _ in 0..bytes.len() + 1 {
                if read_frame(&mut reader, max).is_err() {
                    break;
                }
            }
        }

        #[test]
        fn tag_byte_followed_by_noise_never_panics(
            tag in prop_oneof![0x01u8..=0x13, 0x81u8..=0x8a],
            rest in proptest::collection::vec(any::<u8>(), 0..96),
        ) {
            let mut body = vec![tag];
            body.extend(rest);
            if let Ok(frame) = Frame::decode_body(&body) {
                prop_assert_eq!(frame.encode_body(), body);
            }
        }
    }

    proptest! {
        #[test]
        fn split_frame_needs_every_byte_and_no_more(frame in arb_frame(), extra in arb_bytes()) {
            let mut wire = encode_frame(&frame, DEFAULT_MAX_FRAME).unwrap();
            let whole = wire.len();
            for cut in 0..whole {
                prop_assert_eq!(split_frame(&wire[..cut], DEFAULT_MAX_FRAME), Ok(None));
            }
            wire.extend_from_slice(&extra);
            prop_assert_eq!(split_frame(&wire, DEFAULT_MAX_FRAME), Ok(Some((frame, whole))));
        }
    }

    #[test]
    fn split_frame_refuses_an_oversized_prefix_without_the_body() {
        let wire = 1025u32.to_le_bytes();
        assert_eq!(
            split_frame(&wire, 1024),
            Err(FrameError::TooLarge {
                len: 1025,
                max: 1024
            })
        );
    }

    #[test]
    fn oversized_length_is_refused_before_reading_the_body() {
        let mut wire = (DEFAULT_MAX_FRAME + 1).to_le_bytes().to_vec();
        wire.extend_from_slice(&[0u8; 16]);
        match read_frame(&mut wire.as_slice(), DEFAULT_MAX_FRAME) {
            Err(ReadError::Frame(FrameError::TooLarge { len, max })) => {
                assert_eq!(len, u64::from(DEFAULT_MAX_FRAME) + 1);
                assert_eq!(max, DEFAULT_MAX_FRAME);
            }
            other => panic!("expected TooLarge, got {other:?}"),
        }
    }

    #[test]
    fn huge_claimed_length_with_few_bytes_is_a_truncation_not_an_allocation() {
        // Claims the full 64 MiB, delivers 3 bytes: must fail with EOF after buffering only what arrived.
        let mut wire = DEFAULT_MAX_FRAME.to_le_bytes().to_vec();
        wire.extend_from_slice(&[tag::SET, 1, 2]);
        match read_frame(&mut wire.as_slice(), DEFAULT_MAX_FRAME) {
            Err(ReadError::Io(e)) => assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof),
            other => panic!("expected EOF, got {other:?}"),
        }
    }

    #[test]
    fn huge_key_count_is_a_truncation() {
        let mut body = vec![tag::WAIT];
        body.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            Frame::decode_body(&body),
            Err(FrameError::Truncated { .. })
        ));
    }

    #[test]
    fn clean_close_between_frames_is_reported_as_closed() {
        assert!(matches!(
            read_frame(&mut [].as_slice(), DEFAULT_MAX_FRAME),
            Err(ReadError::Closed)
        ));
        assert!(matches!(
            read_frame(&mut [1u8, 0].as_slice(), DEFAULT_MAX_FRAME),
            Err(ReadError::Io(_))
        ));
    }

    #[test]
    fn writing_an_oversized_frame_fails_without_writing() {
        let frame = Frame::Set {
            key: Key::new("k"),
            value: vec![0; 100],
        };
        let mut wire = Vec::new();
        let err = write_frame(&mut wire, &frame, 50).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert!(
            err.to_string().contains("exceeds the maximum of 50"),
            "{err}"
        );
        assert!(wire.is_empty());
    }

    #[test]
    fn trailing_bytes_and_bad_flags_are_rejected() {
        assert_eq!(
            Frame::decode_body(&[tag::DONE, 0]),
            Err(FrameError::Trailing(1))
        );
        assert_eq!(
            Frame::decode_body(&[tag::BOOL, 2]),
            Err(FrameError::BadFlag {
                field: "bool",
                byte: 2
            })
        );
        assert_eq!(
            Frame::decode_body(&[0x7f]),
            Err(FrameError::UnknownType(0x7f))
        );
        assert_eq!(Frame::decode_body(&[]), Err(FrameError::Empty));
    }
}
