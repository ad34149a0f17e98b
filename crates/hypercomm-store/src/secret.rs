//! The shared secret that guards a [`TcpStore`](crate::TcpStore), and the challenge-response built on it.
//!
//! A server with a secret sends a fresh random nonce; the client answers with HMAC-SHA-256 of that nonce and one
//! of its own under the secret; the server checks it in constant time and answers with its own HMAC over both
//! nonces, so the client knows it reached a server that holds the secret too. The secret itself never crosses the
//! wire, and a recorded exchange cannot be replayed because each side's nonce is new for every connection.
//!
//! The secret comes from the environment variable [`SECRET_ENV`] through an injectable lookup, so tests never
//! touch the process environment.

use std::fmt;

use crate::frame::NONCE_LEN;
use crate::mac::{DIGEST_LEN, hmac_sha256, verify};

/// The environment variable holding the store's shared secret.
pub const SECRET_ENV: &str = "HYPERCOMM_STORE_SECRET";

const CLIENT_CONTEXT: &[u8] = b"hypercomm-store/v1/client";
const SERVER_CONTEXT: &[u8] = b"hypercomm-store/v1/server";

/// A shared secret. `Debug` never prints it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

/// Why a secret could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SecretError {
    /// The variable is set but empty, which would be a secret anyone can guess.
    #[error("{0} is set but empty; unset it or give it a value")]
    Empty(String),
    /// The operating system's randomness could not be read.
    #[error("cannot read random bytes from the kernel (getrandom): {0}")]
    Random(#[source] std::io::Error),
}

impl Secret {
    /// A secret made of these bytes. Fails on an empty secret.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Secret, SecretError> {
        let bytes = bytes.into();
        if bytes.is_empty() {
            return Err(SecretError::Empty("the secret".into()));
        }
        Ok(Secret(bytes))
    }

    /// The secret in [`SECRET_ENV`] as seen by `vars`, `None` when unset.
    ///
    /// ```
    /// use hypercomm_store::Secret;
    ///
    /// let vars = |name: &str| (name == "HYPERCOMM_STORE_SECRET").then(|| "s3cret".to_string());
    /// assert!(Secret::from_vars(&vars)?.is_some());
    /// assert!(Secret::from_vars(&|_: &str| None)?.is_none());
    /// # Ok::<(), hypercomm_store::SecretError>(())
    /// ```
    pub fn from_vars(
        vars: &impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Secret>, SecretError> {
        match vars(SECRET_ENV) {
            None => Ok(None),
            Some(value) if value.is_empty() => Err(SecretError::Empty(SECRET_ENV.into())),
            Some(value) => Ok(Some(Secret(value.into_bytes()))),
        }
    }

    /// The secret in the process environment's [`SECRET_ENV`], `None` when unset.
    pub fn from_env() -> Result<Option<Secret>, SecretError> {
        Secret::from_vars(&|name| std::env::var(name).ok())
    }

    /// A fresh random secret, printable (64 hex digits), for a launcher to hand to the ranks it starts.
    pub fn random() -> Result<Secret, SecretError> {
        let bytes: [u8; 32] = random_bytes()?;
        Ok(Secret(
            bytes
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
                .into_bytes(),
        ))
    }

    /// The secret's bytes, to pass on to a child process's environment.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }

    /// The client's proof for this pair of nonces.
    pub(crate) fn client_proof(
        &self,
        server_nonce: &[u8; NONCE_LEN],
        client_nonce: &[u8; NONCE_LEN],
    ) -> [u8; DIGEST_LEN] {
        hmac_sha256(&self.0, &[CLIENT_CONTEXT, server_nonce, client_nonce])
    }

    /// Whether `proof` is the client's proof for this pair of nonces (compared in constant time).
    pub(crate) fn client_proof_matches(
        &self,
        server_nonce: &[u8; NONCE_LEN],
        client_nonce: &[u8; NONCE_LEN],
        proof: &[u8],
    ) -> bool {
        verify(
            &self.0,
            &[CLIENT_CONTEXT, server_nonce, client_nonce],
            proof,
        )
    }

    /// Whether `proof` is the server's proof for this pair of nonces (compared in constant time).
    pub(crate) fn server_proof_matches(
        &self,
        server_nonce: &[u8; NONCE_LEN],
        client_nonce: &[u8; NONCE_LEN],
        proof: &[u8],
    ) -> bool {
        verify(
            &self.0,
            &[SERVER_CONTEXT, server_nonce, client_nonce],
            proof,
        )
    }

    /// The server's proof for this pair of nonces. Distinct from the client's, so neither can be reflected back.
    pub(crate) fn server_proof(
        &self,
        server_nonce: &[u8; NONCE_LEN],
        client_nonce: &[u8; NONCE_LEN],
    ) -> [u8; DIGEST_LEN] {
        hmac_sha256(&self.0, &[SERVER_CONTEXT, server_nonce, client_nonce])
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret(<{} bytes, redacted>)", self.0.len())
    }
}

/// `N` bytes from the kernel's random number generator.
pub(crate) fn random_bytes<const N: usize>() -> Result<[u8; N], SecretError> {
    // getrandom(2) needs no file descriptor (a server near its open-file limit still greets clients) and costs one
    // system call instead of open, read and close. It may return fewer bytes than asked, so fill in a loop; each
    // pass makes progress or fails.
    let mut out = [0u8; N];
    let mut filled = 0;
    while filled < N {
        match rustix::rand::getrandom(&mut out[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(0) => {
                return Err(SecretError::Random(
                    std::io::ErrorKind::UnexpectedEof.into(),
                ));
            }
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(SecretError::Random(e.into())),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_does_not_leak_the_secret() {
        let secret = Secret::new("hunter2").unwrap();
        let shown = format!("{secret:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("7 bytes"), "{shown}");
    }

    #[test]
    fn empty_secrets_are_refused_naming_the_variable() {
        let err = Secret::from_vars(&|_: &str| Some(String::new())).unwrap_err();
        assert!(err.to_string().contains(SECRET_ENV), "{err}");
        assert!(Secret::new("").is_err());
    }

    #[test]
    fn proofs_depend_on_secret_nonces_and_side() {
        let a = Secret::new("a").unwrap();
        let b = Secret::new("b").unwrap();
        let n1 = [1u8; NONCE_LEN];
        let n2 = [2u8; NONCE_LEN];
        let proof = a.client_proof(&n1, &n2);
        assert!(a.client_proof_matches(&n1, &n2, &proof));
        assert!(!b.client_proof_matches(&n1, &n2, &proof), "another secret");
        assert!(!a.client_proof_matches(&n2, &n1, &proof), "nonces swapped");
        assert!(
            !a.server_proof_matches(&n1, &n2, &proof),
            "the other side's proof"
        );
        assert!(a.server_proof_matches(&n1, &n2, &a.server_proof(&n1, &n2)));
    }

    #[test]
    fn random_secrets_differ_and_are_printable() {
        let a = Secret::random().unwrap();
        let b = Secret::random().unwrap();
        assert_ne!(a, b);
        assert_eq!(a.expose().len(), 64);
        assert!(a.expose().iter().all(u8::is_ascii_hexdigit));
    }
}
