//! Host buffers for large collectives: vectors whose memory the kernel is asked to back with 2 MiB pages.
//!
//! A collective over a buffer that has left the cache streams through it, and every 4 KiB page it enters costs a
//! TLB miss; under a hypervisor each miss walks two sets of page tables. Backed by 2 MiB pages the same buffer
//! needs 512 times fewer translations. Linux gives a process huge pages for ordinary memory only where it asked
//! for them (`madvise(MADV_HUGEPAGE)`, when transparent huge pages are in `madvise` mode, the default of many
//! distributions), and only for memory not yet touched: the advice has to come between allocating the buffer and
//! filling it, which [`huge_page_vec`] does. The result is an ordinary `Vec`, allocated and freed by the global
//! allocator; only its page backing differs, and only in the whole aligned 2 MiB runs it contains.
//!
//! Passes over large buffers run faster on huge pages, most of all in a virtual machine, and the host collectives'
//! direct reads, which the kernel copies page by page, gain the most. The figures, with and without
//! (`hypercomm bench --huge-pages`): `docs/perf/host-collectives.md`.

use std::ffi::c_void;

/// The huge-page size the advice aims at (x86-64 and AArch64 with 4 KiB base pages).
pub const HUGE_PAGE_BYTES: usize = 2 << 20;

/// What the kernel was asked for a buffer made by [`huge_page_vec`], and what it said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PageAdvice {
    /// This many bytes (the whole aligned 2 MiB runs inside the buffer) were advised to use huge pages. Advice,
    /// not a promise: the kernel backs them with huge pages when it has free ones.
    HugePages {
        /// Bytes advised.
        bytes: usize,
    },
    /// The buffer holds no whole aligned 2 MiB run, so there was nothing to advise.
    TooSmall,
    /// The kernel refused the advice (transparent huge pages disabled, or a kernel without them); the buffer is
    /// still valid, on ordinary pages.
    Refused {
        /// The kernel's error.
        error: String,
    },
}

/// A vector of `len` copies of `value` whose memory the kernel was asked, before it was first touched, to back with
/// 2 MiB pages; the advice and the kernel's answer come with it.
///
/// ```
/// use hypercomm_comm::host_buffer::{PageAdvice, huge_page_vec};
///
/// let (buf, advice) = huge_page_vec(8 << 20, 1.0f32); // 32 MiB
/// assert_eq!(buf.len(), 8 << 20);
/// assert!(buf.iter().all(|&x| x == 1.0));
/// assert!(!matches!(advice, PageAdvice::TooSmall));
///
/// let (small, advice) = huge_page_vec(16, 0u8);
/// assert_eq!((small.len(), advice), (16, PageAdvice::TooSmall));
/// ```
pub fn huge_page_vec<T: Copy>(len: usize, value: T) -> (Vec<T>, PageAdvice) {
    let mut buf: Vec<T> = Vec::with_capacity(len);
    let start = buf.as_mut_ptr() as usize;
    let end = start + len * size_of::<T>();
    let first = start.next_multiple_of(HUGE_PAGE_BYTES);
    let last = end / HUGE_PAGE_BYTES * HUGE_PAGE_BYTES;
    let advice = if last <= first {
        PageAdvice::TooSmall
    } else {
        // SAFETY: [first, last) lies inside the allocation `buf` owns (capacity `len`), page-aligned because both
        // ends are multiples of 2 MiB. MADV_HUGEPAGE changes only how the kernel backs the range, never its
        // contents or its mapping, so no reference is invalidated (and none exists yet: `buf` is empty).
        match unsafe {
            rustix::mm::madvise(
                first as *mut c_void,
                last - first,
                rustix::mm::Advice::LinuxHugepage,
            )
        } {
            Ok(()) => PageAdvice::HugePages {
                bytes: last - first,
            },
            Err(e) => PageAdvice::Refused {
                error: e.to_string(),
            },
        }
    };
    buf.resize(len, value);
    (buf, advice)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advises_exactly_the_whole_aligned_runs_inside_the_buffer() {
        let len = 5 * HUGE_PAGE_BYTES + 12345;
        let (buf, advice) = huge_page_vec(len, 7u8);
        assert_eq!(buf.len(), len);
        assert!(buf.iter().all(|&b| b == 7));
        let start = buf.as_ptr() as usize;
        let runs =
            ((start + len) / HUGE_PAGE_BYTES).saturating_sub(start.div_ceil(HUGE_PAGE_BYTES));
        match advice {
            PageAdvice::HugePages { bytes } => assert_eq!(bytes, runs * HUGE_PAGE_BYTES),
            PageAdvice::Refused { error } => assert!(!error.is_empty()),
            PageAdvice::TooSmall => panic!("{len} bytes hold at least {runs} whole runs"),
        }
    }

    #[test]
    fn a_buffer_below_one_run_is_too_small_to_advise() {
        let (buf, advice) = huge_page_vec(HUGE_PAGE_BYTES / 4 - 1, 0.5f32);
        assert_eq!(advice, PageAdvice::TooSmall);
        assert_eq!(buf.len(), HUGE_PAGE_BYTES / 4 - 1);
    }
}
