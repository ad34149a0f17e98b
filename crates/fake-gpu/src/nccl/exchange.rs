//! How the ranks of a fake communicator meet: files in the communicator's directory (under
//! [`knobs::exchange_root`]), published whole by an atomic rename and polled for by their readers. The same
//! code serves ranks that are threads of one process and ranks that are processes.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::knobs;
use crate::stream::poll_until;

/// Why a wait for a peer's file ended without it.
#[derive(Debug)]
pub(crate) enum Missing {
    /// The communicator was aborted meanwhile.
    Aborted,
    /// Nothing came within the peer timeout.
    TimedOut(Duration),
    /// The file system failed.
    Io(String),
}

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Missing::Aborted => write!(f, "the communicator was aborted"),
            Missing::TimedOut(t) => write!(f, "nothing came within {t:?} (a real nccl would hang)"),
            Missing::Io(e) => write!(f, "{e}"),
        }
    }
}

/// Publishes `bytes` as `dir/name`, whole: readers never see a partial file.
pub(crate) fn publish(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), String> {
    let tmp = dir.join(format!(
        ".{name}.{}.{:?}.tmp",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::write(&tmp, bytes).map_err(|e| format!("writing {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, dir.join(name)).map_err(|e| format!("publishing {name}: {e}"))
}

/// Publishes `dir/name` only if nobody has: false when it already exists.
pub(crate) fn publish_once(dir: &Path, name: &str, bytes: &[u8]) -> Result<bool, String> {
    use std::io::Write;
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.{}.once", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(|e| format!("writing {}: {e}", tmp.display()))?;
    // A hard link fails when the target exists, which makes the claim atomic.
    let claimed = match std::fs::hard_link(&tmp, &path) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
        Err(e) => return Err(format!("publishing {name}: {e}")),
    };
    let _ = std::fs::remove_file(&tmp);
    let _ = std::io::stderr().flush();
    Ok(claimed)
}

/// Waits for `dir/name` and reads it, giving up when `aborted` is set or after the peer timeout.
pub(crate) fn await_file(dir: &Path, name: &str, aborted: &AtomicBool) -> Result<Vec<u8>, Missing> {
    let path = dir.join(name);
    let limit = knobs::peer_timeout();
    let mut outcome = Err(Missing::TimedOut(limit));
    poll_until(limit, || {
        if aborted.load(Ordering::Acquire) {
            outcome = Err(Missing::Aborted);
            return true;
        }
        match std::fs::read(&path) {
            Ok(b) => {
                outcome = Ok(b);
                true
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => {
                outcome = Err(Missing::Io(format!("reading {}: {e}", path.display())));
                true
            }
        }
    });
    outcome
}

/// A fresh directory for a new communicator, named by `token`.
pub(crate) fn directory(token: &str) -> PathBuf {
    knobs::exchange_root().join(format!("fake-nccl-{token}"))
}

/// A random token from the kernel (unique ids must differ across processes and calls).
pub(crate) fn random_token() -> String {
    let mut bytes = [0u8; 12];
    let ok = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .is_ok();
    if !ok {
        // No /dev/urandom: the process id and the time still make collisions unlikely.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        bytes[..4].copy_from_slice(&std::process::id().to_le_bytes());
        bytes[4..].copy_from_slice(&(nanos as u64).to_le_bytes());
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
