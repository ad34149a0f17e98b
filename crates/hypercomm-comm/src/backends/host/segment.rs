//! The shared-memory segment of one communicator: its `#[repr(C)]` layout, creation, attachment and cleanup.
//!
//! Layout (all offsets multiples of 64):
//!
//! | region | size | written by | read by |
//! |---|---|---|---|
//! | [`SegHeader`] | 128 | creator once; any rank for abort/doorbell | everyone |
//! | [`RankCtl`] per rank | 64 each | the owning rank | everyone |
//! | [`MailCtl`] per ordered pair | 64 each | `sent`: sender, `taken`: receiver | both |
//! | round buffers, 2 per rank | 64 + slot each | the owning rank | everyone, between barriers |
//! | mailboxes, 1 per ordered pair | 64 + mailbox each | the sender | the receiver |
//!
//! Cleanup: the file lives in `/dev/shm`. The creator unlinks it as soon as every rank has attached (see
//! `bootstrap`), so its name is gone while the communicator runs and the kernel frees the memory when the last
//! mapping goes, however the processes end. The creator also unlinks on drop, covering failed bootstraps, and
//! creating a segment first removes files whose creator process is gone (a creator killed mid-bootstrap).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64};

use memmap2::MmapMut;

use crate::CommError;

/// Identifies a hypercomm segment (and its layout version).
const MAGIC: u64 = 0x6879_7063_6f6d_6d01;
const HEADER_REGION: usize = 128;
const CTL: usize = 64;
/// Bytes before the payload in every round buffer and mailbox (an encoded `Header` plus the payload length).
pub(crate) const PREFIX: usize = 64;

/// The segment's first bytes.
#[repr(C)]
pub(crate) struct SegHeader {
    /// Written by the creator before it publishes the path; read by joiners to validate.
    pub magic: AtomicU64,
    /// Rank count. Creator writes once; joiners validate.
    pub ranks: AtomicU64,
    /// Payload bytes per round buffer. Creator writes once; joiners validate.
    pub slot_bytes: AtomicU64,
    /// Payload bytes per mailbox. Creator writes once; joiners validate.
    pub mailbox_bytes: AtomicU64,
    /// 0, or 1 + the rank that aborted. Any rank writes (first writer wins); every waiter reads.
    pub aborted_by: AtomicU64,
    /// Bumped by any rank after it makes progress others may wait for; waiters sleep on it (futex).
    pub doorbell: AtomicU32,
    /// Number of ranks sleeping on `doorbell`. Waiters write; signallers read to skip needless wake calls.
    pub sleepers: AtomicU32,
}

/// One rank's control block.
#[repr(C, align(64))]
pub(crate) struct RankCtl {
    /// The owner's process id, written by the owner when it attaches (0 until then); read by peers for liveness.
    pub pid: AtomicU32,
    /// Written by the owner: the number of the last round whose publication is complete; read by peers.
    pub arrived: AtomicU64,
}

/// Control of the mailbox from one rank to another.
#[repr(C, align(64))]
pub(crate) struct MailCtl {
    /// Written by the sender: messages put into the mailbox so far.
    pub sent: AtomicU64,
    /// Written by the receiver: messages taken out so far.
    pub taken: AtomicU64,
}

const _: () = assert!(std::mem::size_of::<SegHeader>() <= HEADER_REGION);
const _: () = assert!(std::mem::size_of::<RankCtl>() == CTL);
const _: () = assert!(std::mem::size_of::<MailCtl>() == CTL);

/// A mapped segment.
///
/// Invariant: `base` points to the start of `map`, which is at least `layout.total` bytes, page aligned, and stays
/// mapped as long as `self` lives. All cross-rank access goes through the atomics in the control regions or
/// through buffers whose ownership the round/mailbox protocol hands over with those atomics.
pub(crate) struct Segment {
    _map: MmapMut,
    base: *mut u8,
    pub n: usize,
    pub slot: usize,
    pub mailbox: usize,
    /// Set while this rank created the file and has not unlinked it yet.
    path: Option<PathBuf>,
}

// SAFETY: the raw pointer is into a mapping owned by the `Segment`; the segment is moved between threads as a
// whole (to the progress thread) and all shared access goes through atomics or the round protocol.
unsafe impl Send for Segment {}

#[derive(Clone, Copy)]
struct Layout {
    ctl: usize,
    mail_ctl: usize,
    bufs: usize,
    mail: usize,
    total: usize,
}

fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to) * to
}

fn layout(n: usize, slot: usize, mailbox: usize) -> Option<Layout> {
    let ctl = HEADER_REGION;
    let mail_ctl = ctl.checked_add(n.checked_mul(CTL)?)?;
    let bufs = mail_ctl.checked_add(n.checked_mul(n)?.checked_mul(CTL)?)?;
    let mail = bufs.checked_add(n.checked_mul(2)?.checked_mul(PREFIX + slot)?)?;
    let total = mail.checked_add(n.checked_mul(n)?.checked_mul(PREFIX + mailbox)?)?;
    Some(Layout {
        ctl,
        mail_ctl,
        bufs,
        mail,
        total,
    })
}

impl Segment {
    fn io(comm: &str, what: String) -> impl FnOnce(std::io::Error) -> CommError + '_ {
        move |source| CommError::Io {
            comm: comm.to_owned(),
            what,
            source,
        }
    }

    /// Creates a new segment file in `/dev/shm` and maps it.
    pub(crate) fn create(
        comm: &str,
        n: usize,
        slot: usize,
        mailbox: usize,
    ) -> Result<Segment, CommError> {
        let slot = round_up(slot, 64);
        let mailbox = round_up(mailbox, 64);
        let lay = layout(n, slot, mailbox).ok_or_else(|| CommError::InvalidArgument {
            comm: comm.to_owned(),
            what: format!(
                "shared-memory segment for {n} ranks with {slot}-byte slots overflows usize"
            ),
        })?;
        let (file, path) = create_unique(comm)?;
        let mut seg = Segment::map(comm, &file, lay, n, slot, mailbox, Some(path))?;
        let h = seg.header();
        h.ranks
            .store(n as u64, std::sync::atomic::Ordering::Relaxed);
        h.slot_bytes
            .store(slot as u64, std::sync::atomic::Ordering::Relaxed);
        h.mailbox_bytes
            .store(mailbox as u64, std::sync::atomic::Ordering::Relaxed);
        h.magic.store(MAGIC, std::sync::atomic::Ordering::SeqCst);
        seg.path = seg.path.take();
        Ok(seg)
    }

    /// Maps an existing segment created by a peer and checks that it is what the peer said.
    pub(crate) fn open(comm: &str, path: &Path, n: usize) -> Result<Segment, CommError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(Self::io(
                comm,
                format!("opening shared memory {}", path.display()),
            ))?;
        let len = file
            .metadata()
            .map_err(Self::io(comm, format!("inspecting {}", path.display())))?
            .len();
        let bad = |what: String| CommError::Protocol {
            comm: comm.to_owned(),
            what,
        };
        if (len as usize) < HEADER_REGION {
            return Err(bad(format!(
                "{} is {len} bytes, smaller than a header",
                path.display()
            )));
        }
        // Map the header alone first to learn the geometry.
        let probe = Segment::map(
            comm,
            &file,
            layout(0, 0, 0).unwrap_or(Layout {
                ctl: 0,
                mail_ctl: 0,
                bufs: 0,
                mail: 0,
                total: HEADER_REGION,
            }),
            0,
            0,
            0,
            None,
        )?;
        let h = probe.header();
        use std::sync::atomic::Ordering::SeqCst;
        if h.magic.load(SeqCst) != MAGIC || h.ranks.load(SeqCst) != n as u64 {
            return Err(bad(format!(
                "{} is not a hypercomm segment for {n} ranks",
                path.display()
            )));
        }
        let slot = usize::try_from(h.slot_bytes.load(SeqCst)).unwrap_or(usize::MAX);
        let mailbox = usize::try_from(h.mailbox_bytes.load(SeqCst)).unwrap_or(usize::MAX);
        drop(probe);
        let lay = layout(n, slot, mailbox)
            .filter(|l| l.total as u64 <= len)
            .ok_or_else(|| {
                bad(format!(
                    "{} is too small for its declared geometry",
                    path.display()
                ))
            })?;
        Segment::map(comm, &file, lay, n, slot, mailbox, None)
    }

    fn map(
        comm: &str,
        file: &File,
        lay: Layout,
        n: usize,
        slot: usize,
        mailbox: usize,
        path: Option<PathBuf>,
    ) -> Result<Segment, CommError> {
        if path.is_some() {
            file.set_len(lay.total as u64).map_err(Self::io(
                comm,
                format!("sizing shared memory to {} bytes", lay.total),
            ))?;
        }
        // SAFETY: the file is a private-named tmpfs file shared only with the ranks of this communicator, which
        // access it through atomics and the round protocol; nobody truncates it while mapped (only the creator
        // sizes it, before publishing its name).
        let mut map = unsafe { memmap2::MmapOptions::new().len(lay.total).map_mut(file) }.map_err(
            Self::io(
                comm,
                format!("mapping {} bytes of shared memory", lay.total),
            ),
        )?;
        let base = map.as_mut_ptr();
        Ok(Segment {
            _map: map,
            base,
            n,
            slot,
            mailbox,
            path,
        })
    }

    fn lay(&self) -> Layout {
        // The geometry was validated when the segment was mapped.
        layout(self.n, self.slot, self.mailbox).unwrap_or(Layout {
            ctl: 0,
            mail_ctl: 0,
            bufs: 0,
            mail: 0,
            total: 0,
        })
    }

    /// The segment's path while this rank still owns the name.
    pub(crate) fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Removes the file name (the memory stays until the last mapping goes).
    pub(crate) fn unlink(&mut self) {
        if let Some(path) = self.path.take() {
            let _ = std::fs::remove_file(path);
        }
    }

    pub(crate) fn header(&self) -> &SegHeader {
        // SAFETY: offset 0 of a page-aligned mapping of at least HEADER_REGION bytes; SegHeader is made of atomics,
        // valid for any bit pattern (the file starts zeroed) and sound to share between processes.
        unsafe { &*self.base.cast::<SegHeader>() }
    }

    pub(crate) fn rank_ctl(&self, r: usize) -> &RankCtl {
        debug_assert!(r < self.n);
        // SAFETY: r < n, so the block lies inside the control region; 64-byte aligned; atomics only.
        unsafe { &*self.base.add(self.lay().ctl + r * CTL).cast::<RankCtl>() }
    }

    pub(crate) fn mail_ctl(&self, src: usize, dst: usize) -> &MailCtl {
        debug_assert!(src < self.n && dst < self.n);
        // SAFETY: src, dst < n, so the block lies inside the mailbox control region; 64-byte aligned; atomics only.
        unsafe {
            &*self
                .base
                .add(self.lay().mail_ctl + (src * self.n + dst) * CTL)
                .cast::<MailCtl>()
        }
    }

    /// Start of rank `r`'s round buffer `which` (0 or 1): `PREFIX` bytes of header, then `slot` bytes of payload.
    pub(crate) fn buffer(&self, r: usize, which: usize) -> *mut u8 {
        debug_assert!(r < self.n && which < 2);
        // SAFETY: r < n and which < 2 keep the offset inside the buffer region of the mapping.
        unsafe {
            self.base
                .add(self.lay().bufs + (r * 2 + which) * (PREFIX + self.slot))
        }
    }

    /// Start of the mailbox from `src` to `dst`: `PREFIX` bytes of header, then `mailbox` bytes of payload.
    pub(crate) fn mailbox(&self, src: usize, dst: usize) -> *mut u8 {
        debug_assert!(src < self.n && dst < self.n);
        // SAFETY: src, dst < n keep the offset inside the mailbox region of the mapping.
        unsafe {
            self.base
                .add(self.lay().mail + (src * self.n + dst) * (PREFIX + self.mailbox))
        }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        self.unlink();
    }
}

/// Removes segment files whose creating process is gone: a creator that died between creating its segment and
/// the end of the bootstrap (when the name is normally removed) cannot clean up after itself. Files are named
/// `hypercomm-<creator pid>-...`; a file whose pid belongs to a live process is left alone.
fn sweep_stale(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("hypercomm-"))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !super::liveness::process_alive(pid) {
            // Another rank may sweep the same file at the same moment; either removal is fine.
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

fn create_unique(comm: &str) -> Result<(File, PathBuf), CommError> {
    sweep_stale(Path::new("/dev/shm"));
    let pid = std::process::id();
    let mut last = None;
    for attempt in 0..16u32 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let local = 0u8;
        let salt = (&local as *const u8 as usize) ^ (attempt as usize);
        let path = PathBuf::from(format!("/dev/shm/hypercomm-{pid}-{nanos:x}-{salt:x}"));
        match OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
        {
            Ok(file) => return Ok((file, path)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => {
                return Err(CommError::Io {
                    comm: comm.to_owned(),
                    what: format!("creating shared memory {}", path.display()),
                    source: e,
                });
            }
        }
    }
    Err(CommError::Io {
        comm: comm.to_owned(),
        what: "creating a uniquely named shared-memory file after 16 attempts".to_owned(),
        source: last.unwrap_or_else(|| std::io::Error::other("name collisions")),
    })
}

#[cfg(test)]
mod sweep_tests {
    use super::*;

    #[test]
    fn sweep_removes_only_files_of_dead_creators() {
        let dir = std::env::temp_dir().join(format!("hypercomm-sweep-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // A child that has exited and been reaped: its pid is dead (unless reused in the meantime, which would only
        // make the sweep keep the file; the assertion below allows for that by re-checking liveness).
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let stale = dir.join(format!("hypercomm-{dead}-1-2"));
        let mine = dir.join(format!("hypercomm-{}-1-2", std::process::id()));
        let other = dir.join("unrelated-file");
        for f in [&stale, &mine, &other] {
            std::fs::write(f, b"x").unwrap();
        }
        sweep_stale(&dir);
        assert_eq!(stale.exists(), super::super::liveness::process_alive(dead));
        assert!(mine.exists());
        assert!(other.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
