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
//! | symmetric windows, 1 per rank (often empty) | window each, page aligned | the owning rank | everyone, inside operations on symmetric buffers |
//!
//! Lifetime: the segment is an anonymous `memfd`, with no name in any file system at any moment. Rank 0 creates it,
//! seals its size (so no process can shrink it under another's mapping) and hands the descriptor to the ranks of
//! its host over a nameless socket (`fdpass`). The kernel frees the memory when the last mapping and descriptor
//! go, however the processes end: a rank killed at any point of a bootstrap leaves nothing to clean up.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64};

use rustix::fs::{MemfdFlags, SealFlags};

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
    /// Written by the creator before it shares the segment; read by joiners to validate.
    pub magic: AtomicU64,
    /// Rank count. Creator writes once; joiners validate.
    pub ranks: AtomicU64,
    /// Payload bytes per round buffer. Creator writes once; joiners validate.
    pub slot_bytes: AtomicU64,
    /// Payload bytes per mailbox. Creator writes once; joiners validate.
    pub mailbox_bytes: AtomicU64,
    /// Bytes of every rank's symmetric window (see `crate::symmetric`). Creator writes once; joiners validate.
    pub window_bytes: AtomicU64,
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
    pub window: usize,
}

// SAFETY: the raw pointer is into a mapping owned by the `Segment`; the segment is moved between threads as a
// whole (to the progress thread) and all shared access goes through atomics or the round protocol.
unsafe impl Send for Segment {}

// SAFETY: `&Segment` hands out only atomics (sound to share) and raw pointers, whose every dereference is covered
// by the round protocol, as it is between processes; the symmetric windows are shared with the communicator's
// user side this way (see `crate::symmetric`).
unsafe impl Sync for Segment {}

#[derive(Clone, Copy)]
struct Layout {
    ctl: usize,
    mail_ctl: usize,
    bufs: usize,
    mail: usize,
    windows: usize,
    total: usize,
}

/// Alignment of the symmetric windows: a page, so that each starts where the kernel maps memory in.
const WINDOW_ALIGN: usize = 4096;

/// The size of each rank's symmetric window for `requested` bytes: rounded up to a page (0 stays 0, no window);
/// `None` when that overflows. Every place that sizes a window goes through this, so they agree.
pub(crate) fn window_bytes(requested: usize) -> Option<usize> {
    requested.checked_next_multiple_of(WINDOW_ALIGN)
}

fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to) * to
}

fn layout(n: usize, slot: usize, mailbox: usize, window: usize) -> Option<Layout> {
    let ctl = HEADER_REGION;
    let mail_ctl = ctl.checked_add(n.checked_mul(CTL)?)?;
    let bufs = mail_ctl.checked_add(n.checked_mul(n)?.checked_mul(CTL)?)?;
    let mail = bufs.checked_add(n.checked_mul(2)?.checked_mul(PREFIX + slot)?)?;
    let mail_end = mail.checked_add(n.checked_mul(n)?.checked_mul(PREFIX + mailbox)?)?;
    let windows = mail_end.checked_next_multiple_of(WINDOW_ALIGN)?;
    let total = if window == 0 {
        mail_end
    } else {
        windows.checked_add(n.checked_mul(window)?)?
    };
    Some(Layout {
        ctl,
        mail_ctl,
        bufs,
        mail,
        windows,
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

    /// Creates a new anonymous segment, sized and sealed, and maps it. Returns the descriptor to share with the
    /// peers (see `fdpass`); dropping it once they have theirs leaves the mappings as the only references.
    /// `window` is each rank's symmetric window, rounded up to a page (0: none).
    pub(crate) fn create(
        comm: &str,
        n: usize,
        slot: usize,
        mailbox: usize,
        window: usize,
    ) -> Result<(Segment, OwnedFd), CommError> {
        let slot = round_up(slot, 64);
        let mailbox = round_up(mailbox, 64);
        let lay = window_bytes(window)
            .and_then(|window| Some((window, layout(n, slot, mailbox, window)?)));
        let (window, lay) = lay.ok_or_else(|| CommError::InvalidArgument {
            comm: comm.to_owned(),
            what: format!(
                "shared-memory segment for {n} ranks with {slot}-byte slots and {window}-byte symmetric \
                 windows overflows usize"
            ),
        })?;
        let errno = |what: String| {
            move |e: rustix::io::Errno| CommError::Io {
                comm: comm.to_owned(),
                what,
                source: std::io::Error::from_raw_os_error(e.raw_os_error()),
            }
        };
        let fd = rustix::fs::memfd_create(
            "hypercomm-segment",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )
        .map_err(errno("creating shared memory (memfd_create)".into()))?;
        rustix::fs::ftruncate(&fd, lay.total as u64).map_err(errno(format!(
            "sizing shared memory to {} bytes",
            lay.total
        )))?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
            .map_err(errno("sealing the shared memory's size".into()))?;
        let seg = Segment::map(comm, &fd, lay, n, slot, mailbox, window)?;
        let h = seg.header();
        h.ranks
            .store(n as u64, std::sync::atomic::Ordering::Relaxed);
        h.slot_bytes
            .store(slot as u64, std::sync::atomic::Ordering::Relaxed);
        h.mailbox_bytes
            .store(mailbox as u64, std::sync::atomic::Ordering::Relaxed);
        h.window_bytes
            .store(window as u64, std::sync::atomic::Ordering::Relaxed);
        h.magic.store(MAGIC, std::sync::atomic::Ordering::SeqCst);
        Ok((seg, fd))
    }

    /// Maps a segment received from rank 0 and checks that it is what rank 0 said: a size-sealed memory file
    /// holding a hypercomm segment for `n` ranks, as large as its declared geometry.
    pub(crate) fn from_fd(comm: &str, fd: &OwnedFd, n: usize) -> Result<Segment, CommError> {
        let bad = |what: String| CommError::Protocol {
            comm: comm.to_owned(),
            what: format!("the segment from rank 0 {what}"),
        };
        let errno = |what: &'static str| {
            move |e: rustix::io::Errno| CommError::Io {
                comm: comm.to_owned(),
                what: what.to_owned(),
                source: std::io::Error::from_raw_os_error(e.raw_os_error()),
            }
        };
        let seals = rustix::fs::fcntl_get_seals(fd)
            .map_err(errno("reading the seals of the segment from rank 0"))?;
        if !seals.contains(SealFlags::SHRINK) {
            return Err(bad(format!(
                "can shrink (seals {seals:?}): a mapping of it could fault"
            )));
        }
        let len = rustix::fs::fstat(fd)
            .map_err(errno("inspecting the segment from rank 0"))?
            .st_size;
        let len = u64::try_from(len).unwrap_or(0);
        if len < HEADER_REGION as u64 {
            return Err(bad(format!("is {len} bytes, smaller than a header")));
        }
        // Map the header alone first to learn the geometry.
        let header_only = Layout {
            ctl: 0,
            mail_ctl: 0,
            bufs: 0,
            mail: 0,
            windows: 0,
            total: HEADER_REGION,
        };
        let probe = Segment::map(comm, fd, header_only, 0, 0, 0, 0)?;
        let h = probe.header();
        use std::sync::atomic::Ordering::SeqCst;
        if h.magic.load(SeqCst) != MAGIC || h.ranks.load(SeqCst) != n as u64 {
            return Err(bad(format!("is not a hypercomm segment for {n} ranks")));
        }
        let slot = usize::try_from(h.slot_bytes.load(SeqCst)).unwrap_or(usize::MAX);
        let mailbox = usize::try_from(h.mailbox_bytes.load(SeqCst)).unwrap_or(usize::MAX);
        let window = usize::try_from(h.window_bytes.load(SeqCst)).unwrap_or(usize::MAX);
        drop(probe);
        let lay = layout(n, slot, mailbox, window)
            .filter(|l| l.total as u64 <= len)
            .ok_or_else(|| {
                bad(format!(
                    "({len} bytes) is too small for its declared geometry"
                ))
            })?;
        Segment::map(comm, fd, lay, n, slot, mailbox, window)
    }

    #[allow(clippy::too_many_arguments)]
    fn map(
        comm: &str,
        fd: &impl AsFd,
        lay: Layout,
        n: usize,
        slot: usize,
        mailbox: usize,
        window: usize,
    ) -> Result<Segment, CommError> {
        let fd = fd.as_fd();
        // SAFETY: the descriptor is an anonymous memory file shared only with the ranks of this communicator (over
        // a socket, see `fdpass`), which access it through atomics and the round protocol. Its size is sealed
        // against shrinking (checked by `from_fd`, set by `create` before the file is shared), so the mapping never
        // outgrows the file.
        let mut map = unsafe { memmap2::MmapOptions::new().len(lay.total).map_mut(&fd) }.map_err(
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
            window,
        })
    }

    fn lay(&self) -> Layout {
        // The geometry was validated when the segment was mapped.
        layout(self.n, self.slot, self.mailbox, self.window).unwrap_or(Layout {
            ctl: 0,
            mail_ctl: 0,
            bufs: 0,
            mail: 0,
            windows: 0,
            total: 0,
        })
    }

    pub(crate) fn header(&self) -> &SegHeader {
        // SAFETY: offset 0 of a page-aligned mapping of at least HEADER_REGION bytes; SegHeader is made of atomics,
        // valid for any bit pattern (the memory file starts zeroed) and sound to share between processes.
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

    /// Start of rank `r`'s symmetric window, [`window`](Self::window) bytes, page aligned.
    pub(crate) fn window(&self, r: usize) -> *mut u8 {
        debug_assert!(r < self.n && self.window > 0);
        // SAFETY: r < n keeps the offset inside the window region of the mapping (which exists when `window > 0`).
        unsafe { self.base.add(self.lay().windows + r * self.window) }
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::SeqCst;

    use super::*;

    #[test]
    fn a_mapping_from_the_descriptor_sees_the_creators_writes_and_its_size_is_sealed() {
        let (created, fd) = Segment::create("seg", 3, 100, 64, 5000).unwrap();
        let joined = Segment::from_fd("seg", &fd, 3).unwrap();
        assert_eq!(
            (joined.slot, joined.mailbox),
            (created.slot, created.mailbox)
        );
        created.rank_ctl(2).pid.store(4242, SeqCst);
        assert_eq!(joined.rank_ctl(2).pid.load(SeqCst), 4242);
        // SAFETY: rank 1's round buffer 0 lies inside both mappings; nothing else touches it in this test.
        unsafe { created.buffer(1, 0).add(PREFIX).write(7) };
        // SAFETY: as above.
        assert_eq!(unsafe { joined.buffer(1, 0).add(PREFIX).read() }, 7);
        // Windows are whole pages, after everything else, and the last one ends at the end of the file.
        assert_eq!((joined.window, created.window), (8192, 8192));
        assert_eq!(created.window(0) as usize % 4096, 0);
        let end = created.window(2) as usize + 8192 - created.header() as *const _ as usize;
        assert_eq!(end as u64, rustix::fs::fstat(&fd).unwrap().st_size as u64);
        assert!(created.window(0) > created.mailbox(2, 2));
        // SAFETY: the last byte of rank 2's window lies inside both mappings; nothing else touches it.
        unsafe { created.window(2).add(8191).write(9) };
        // SAFETY: as above.
        assert_eq!(unsafe { joined.window(2).add(8191).read() }, 9);
        assert!(
            rustix::fs::ftruncate(&fd, 64).is_err(),
            "shrinking must be sealed"
        );
    }

    #[test]
    fn descriptors_that_are_not_a_sealed_segment_for_n_ranks_are_refused() {
        let (_, fd) = Segment::create("seg", 2, 64, 64, 0).unwrap();
        let err = Segment::from_fd("seg", &fd, 3).err().unwrap().to_string();
        assert!(err.contains("not a hypercomm segment for 3 ranks"), "{err}");
        let loose = rustix::fs::memfd_create("loose", MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&loose, 1 << 16).unwrap();
        let err = Segment::from_fd("seg", &loose, 2)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("can shrink"), "{err}");
    }
}
