//! Frames on a byte stream: a little-endian `u32` body length, then the body. A length over the maximum is refused
//! before anything is allocated, and a body buffer grows only as its bytes arrive.

use std::io::{self, Read, Write};

use super::codec::FrameError;
use super::message::Frame;

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
