//! The store's wire format: length-prefixed binary frames, and the codec that reads and writes them.
//!
//! A frame is a little-endian `u32` body length followed by the body: one type byte, then the fields of that type.
//! Byte strings travel as a `u32` length and the bytes; keys as the bytes of [`Key::encode`](crate::Key::encode);
//! optional byte strings as a presence byte (0 or 1) and then the string; integers little-endian; durations as
//! whole milliseconds in a `u64`.
//!
//! Decoding never trusts a length: a frame longer than the reader's maximum is refused before any allocation, the
//! body is read only as far as bytes actually arrive, and every field length is checked against the bytes left in
//! the body. So no input, however hostile, makes the decoder panic or allocate more than the frame it was given.
//!
//! Three rooms behind this face: `message` holds the vocabulary (the [`Frame`] messages and the protocol's
//! constants), `codec` the bytes of one frame body ([`Frame::encode_body`], [`Frame::decode_body`],
//! [`FrameError`]), and `stream` the length-prefixed framing on a byte stream or buffer ([`read_frame`],
//! [`write_frame`], [`split_frame`]). Imports run one way, `stream` to `codec` to `message`; this file only
//! re-exports them.

mod codec;
mod message;
mod stream;

pub use codec::FrameError;
pub(crate) use message::frame_name;
pub use message::{DEFAULT_MAX_FRAME, Frame, NONCE_LEN, PROTOCOL_VERSION};
pub use stream::{ReadError, encode_frame, read_frame, split_frame, write_frame};

#[cfg(test)]
mod tests {
    use std::io::{self, Read};
    use std::time::Duration;

    use super::codec::tag;
    use super::*;
    use crate::mac::DIGEST_LEN;
    use crate::{Key, KeyPart};
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
