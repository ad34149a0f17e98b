//! HMAC-SHA-256 for the store's challenge-response ([`crate::secret`]), from RustCrypto's `hmac` and `sha2`,
//! with a constant-time check of a received tag. Security code is not where we write our own.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// Bytes of a SHA-256 digest, and so of every proof.
pub(crate) const DIGEST_LEN: usize = 32;

fn keyed(key: &[u8], parts: &[&[u8]]) -> Hmac<Sha256> {
    // HMAC takes keys of any length (longer ones are hashed first): new_from_slice cannot fail for it.
    let mut mac =
        <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC accepts keys of every length");
    for part in parts {
        mac.update(part);
    }
    mac
}

/// HMAC-SHA-256 of the concatenation of `parts` under `key`.
pub(crate) fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; DIGEST_LEN] {
    keyed(key, parts).finalize().into_bytes().into()
}

/// Whether `tag` is the HMAC-SHA-256 of `parts` under `key`, compared in constant time.
pub(crate) fn verify(key: &[u8], parts: &[&[u8]], tag: &[u8]) -> bool {
    keyed(key, parts).verify_slice(tag).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    // RFC 4231 test cases 1, 2 and 6 (a key longer than the block).
    #[test]
    fn rfc_4231_vectors() {
        assert_eq!(
            hex(&hmac_sha256(&[0x0b; 20], &[b"Hi There"])),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
        );
        assert_eq!(
            hex(&hmac_sha256(
                b"Jefe",
                &[b"what do ya want ", b"for nothing?"]
            )),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(
            hex(&hmac_sha256(
                &[0xaa; 131],
                &[b"Test Using Larger Than Block-Size Key - Hash Key First"]
            )),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn verify_accepts_the_tag_and_nothing_else() {
        let tag = hmac_sha256(b"key", &[b"a", b"b"]);
        assert!(verify(b"key", &[b"ab"], &tag), "parts concatenate");
        assert!(!verify(b"other", &[b"ab"], &tag));
        assert!(!verify(b"key", &[b"ab"], &tag[..31]), "a short tag");
        let mut flipped = tag;
        flipped[31] ^= 1;
        assert!(!verify(b"key", &[b"ab"], &flipped));
    }
}
