//! Symmetric buffers: host memory that every rank of a communicator on the same machine reads in place, so that a
//! collective over it moves each byte once instead of staging it through the shared-memory slots.
//!
//! An ordinary host collective copies every rank's contribution into a slot of the communicator's shared segment,
//! and the peers read it from there: the caller's buffer lives in private memory that no other process can see.
//! A communicator created with [`CommOptions::symmetric_bytes`](crate::CommOptions::symmetric_bytes) set also
//! gives each rank a *window* of that many bytes in its segment, mapped by every rank on the host.
//! [`Communicator::symmetric_buffer`](crate::Communicator::symmetric_buffer) allocates a [`SymmetricBuffer`] in
//! this rank's window, and the collectives that take one
//! ([`Communicator::all_reduce_symmetric`](crate::Communicator::all_reduce_symmetric)) read the peers' buffers
//! where they are: no copy into a slot. It is the host counterpart of NCCL's user-buffer registration and of
//! symmetric memory in PyTorch and NCCL.
//!
//! The contract is NCCL's for symmetric memory: every rank allocates the same buffers, in the same order, with the
//! same lengths. Allocation is local and deterministic (first fit in 64-byte units), so ranks that do so get their
//! buffers at the same offset of their windows, and a collective names that offset in the header every rank
//! checks: ranks that pass buffers at different offsets, or of different lengths, fail with
//! [`CommError::Mismatch`] before anyone reads anything.
//!
//! Ranks that do not share memory (the TCP transport, or [`CommOptions::force_tcp`](crate::CommOptions)) get a
//! window in private memory, and the same calls run the ordinary algorithms over it: code written for symmetric
//! buffers runs everywhere, and is zero-copy where the ranks share a host.
//!
//! A buffer is the peers' to read (and, in an all-reduce, to write) only inside a collective that takes it; between
//! collectives it is this rank's alone, like a `Vec`. A collective that fails leaves its buffer's memory out of
//! later allocations, since a peer that has not noticed the failure may still be using it.
//!
//! What it buys: each rank reads and writes the data once, with no slot in between, so from a few KiB up the
//! collectives over symmetric buffers take a fraction of the staged ones' time, and at sizes past the cache they
//! run near the memory's speed. Smaller operations stay staged (one barrier instead of two), so they cost the same
//! either way. The figures: `docs/perf/host-collectives.md` ("Symmetric buffers").
//!
//! The window is memory of the communicator's segment: [`CommOptions::symmetric_bytes`](crate::CommOptions) bytes
//! per rank, mapped by every rank, taken from the system only as pages are touched and returned when the last
//! rank's communicator and buffers are gone.

use std::marker::PhantomData;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use memmap2::MmapMut;

use crate::CommError;
use crate::backends::host::{Segment, window_bytes};
use crate::element::Element;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every critical section leaves the free list consistent before anything can panic.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Allocation granularity and alignment within a window: a cache line, so that no two buffers share one.
const UNIT: usize = 64;

/// Where the windows live.
enum Backing {
    /// Every rank's window, in the communicator's shared segment.
    Shared(Arc<Segment>),
    /// This rank's window alone, in private memory: its peers cannot map it (TCP).
    Private { _map: MmapMut, base: *mut u8 },
}

/// The symmetric windows of one communicator, as this rank sees them, and the allocator of its own.
pub(crate) struct Windows {
    comm: String,
    rank: usize,
    bytes: usize,
    backing: Backing,
    /// Start of every rank's window where it is mapped here (only this rank's with a private window), worked out
    /// once: buffers index through this on every element access.
    starts: Vec<Option<*mut u8>>,
    /// Free ranges of this rank's window, ascending and disjoint, never adjacent (merged on free).
    free: Mutex<Vec<Range<usize>>>,
}

// SAFETY: `Backing::Private::base` points into the mapping the same value owns; every access through it and
// through the shared segment's windows follows the rules above (a buffer's bytes are touched by its owner's user
// side, or by collectives that hold the buffer), which do not depend on the thread.
unsafe impl Send for Windows {}
// SAFETY: as for `Send`; `&Windows` gives out only raw pointers and the allocator behind its mutex.
unsafe impl Sync for Windows {}

impl std::fmt::Debug for Windows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Windows")
            .field("comm", &self.comm)
            .field("rank", &self.rank)
            .field("bytes", &self.bytes)
            .field("shared", &self.is_shared())
            .finish()
    }
}

impl Windows {
    /// The windows of the shared segment `seg` (which has them: `seg.window > 0`), for rank `rank`.
    pub(crate) fn shared(comm: &str, rank: usize, seg: Arc<Segment>) -> Windows {
        let bytes = seg.window;
        Windows::with(comm, rank, bytes, Backing::Shared(seg))
    }

    /// A window of `bytes` (rounded up to a page) in this process's private memory.
    pub(crate) fn private(comm: &str, rank: usize, bytes: usize) -> Result<Windows, CommError> {
        let bytes = window_bytes(bytes).ok_or_else(|| CommError::InvalidArgument {
            comm: comm.to_owned(),
            what: format!("a symmetric window of {bytes} bytes overflows usize"),
        })?;
        let mut map = MmapMut::map_anon(bytes).map_err(|source| CommError::Io {
            comm: comm.to_owned(),
            what: format!("mapping a {bytes}-byte symmetric window"),
            source,
        })?;
        let base = map.as_mut_ptr();
        Ok(Windows::with(
            comm,
            rank,
            bytes,
            Backing::Private { _map: map, base },
        ))
    }

    fn with(comm: &str, rank: usize, bytes: usize, backing: Backing) -> Windows {
        let starts = match &backing {
            Backing::Shared(seg) if bytes > 0 => (0..seg.n).map(|r| Some(seg.window(r))).collect(),
            Backing::Shared(seg) => vec![None; seg.n],
            Backing::Private { base, .. } => {
                (0..=rank).map(|r| (r == rank).then_some(*base)).collect()
            }
        };
        Windows {
            starts,
            comm: comm.to_owned(),
            rank,
            bytes,
            backing,
            // One free range, the whole window (none for an empty one).
            free: Mutex::new(
                std::iter::once(0..bytes)
                    .filter(|r| !r.is_empty())
                    .collect(),
            ),
        }
    }

    /// Whether the peers' windows are mapped here (shared memory), so collectives can read them in place.
    pub(crate) fn is_shared(&self) -> bool {
        matches!(self.backing, Backing::Shared(_))
    }

    /// Start of this rank's window.
    pub(crate) fn own(&self) -> *mut u8 {
        // `starts` has an entry for every rank up to this one (see `with`). An empty shared window has no start;
        // nothing is ever allocated in it, so nothing dereferences the null that stands for it.
        self.starts
            .get(self.rank)
            .copied()
            .flatten()
            .unwrap_or(std::ptr::null_mut())
    }

    /// Start of rank `r`'s window, where it is mapped here (shared windows are mapped writable by every rank).
    pub(crate) fn of(&self, r: usize) -> Option<*mut u8> {
        self.starts.get(r).copied().flatten()
    }

    /// Takes `bytes` (at least one unit) from the first free range that holds them; the offset.
    fn alloc(&self, bytes: usize) -> Result<usize, CommError> {
        let want = bytes
            .max(1)
            .checked_next_multiple_of(UNIT)
            .unwrap_or(usize::MAX);
        let mut free = lock(&self.free);
        let Some(i) = free.iter().position(|r| r.len() >= want) else {
            let available: usize = free.iter().map(Range::len).sum();
            let largest = free.iter().map(Range::len).max().unwrap_or(0);
            return Err(CommError::InvalidArgument {
                comm: self.comm.clone(),
                what: format!(
                    "a symmetric buffer of {bytes} bytes does not fit this rank's {}-byte window \
                     ({available} bytes free, the largest free run {largest}); raise \
                     CommOptions::symmetric_bytes or drop buffers no longer used",
                    self.bytes
                ),
            });
        };
        let at = free[i].start;
        free[i].start += want;
        if free[i].is_empty() {
            free.remove(i);
        }
        Ok(at)
    }

    /// Returns `[at, at + bytes)` (as [`alloc`](Self::alloc) rounded it) to the free list, merging neighbours.
    fn release(&self, at: usize, bytes: usize) {
        let end = at + bytes.max(1).next_multiple_of(UNIT);
        let mut free = lock(&self.free);
        let i = free.partition_point(|r| r.start < at);
        let mut range = at..end;
        if i < free.len() && free[i].start == end {
            range.end = free.remove(i).end;
        }
        if i > 0 && free[i - 1].end == at {
            free[i - 1].end = range.end;
        } else {
            free.insert(i, range);
        }
    }

    /// Bytes of this rank's window not held by any buffer.
    fn available(&self) -> usize {
        lock(&self.free).iter().map(Range::len).sum()
    }
}

/// A buffer of `T` in this rank's symmetric window: a `[T]` (through `Deref`) that the collectives taking it read
/// in place from every rank on the host. Made by
/// [`Communicator::symmetric_buffer`](crate::Communicator::symmetric_buffer); see the [module docs](self).
///
/// ```
/// use std::sync::Arc;
/// use hypercomm_comm::{CommOptions, Communicator, ReduceOp};
/// use hypercomm_store::MemoryStore;
///
/// let store = Arc::new(MemoryStore::new());
/// let ranks: Vec<_> = (0..2)
///     .map(|me| {
///         let store = Arc::clone(&store);
///         std::thread::spawn(move || {
///             let options = CommOptions { symmetric_bytes: 1 << 20, ..CommOptions::named("sym-doc") };
///             let comm = Communicator::new(store, vec![0, 1], me, options)?;
///             let mut grads = comm.symmetric_buffer(1000, 0.0f32)?;
///             grads.fill(me as f32 + 1.0);
///             let grads = comm.all_reduce_symmetric(grads, ReduceOp::Sum)?.wait()?;
///             assert!(grads.iter().all(|&g| g == 3.0));
///             Ok::<_, hypercomm_comm::CommError>(())
///         })
///     })
///     .collect();
/// for r in ranks {
///     r.join().unwrap()?;
/// }
/// # Ok::<(), hypercomm_comm::CommError>(())
/// ```
pub struct SymmetricBuffer<T: Element> {
    windows: Arc<Windows>,
    /// The first element: `offset` bytes into this rank's window.
    ptr: *mut T,
    /// Byte offset in the window.
    offset: usize,
    /// Elements.
    len: usize,
    /// Set when a collective over the buffer failed: its bytes then stay out of the free list (see the module
    /// docs).
    retired: bool,
    _t: PhantomData<T>,
}

impl<T: Element> SymmetricBuffer<T> {
    /// A buffer of `len` copies of `value` in `windows`.
    pub(crate) fn new(windows: Arc<Windows>, len: usize, value: T) -> Result<Self, CommError> {
        let bytes = len
            .checked_mul(size_of::<T>())
            .ok_or_else(|| CommError::InvalidArgument {
                comm: windows.comm.clone(),
                what: format!("a symmetric buffer of {len} elements overflows usize"),
            })?;
        let offset = windows.alloc(bytes)?;
        // SAFETY: the allocator handed out `[offset, offset + bytes)` inside this rank's window.
        let ptr = unsafe { windows.own().add(offset) }.cast::<T>();
        let mut buf = SymmetricBuffer {
            windows,
            ptr,
            offset,
            len,
            retired: false,
            _t: PhantomData,
        };
        buf.fill(value);
        Ok(buf)
    }

    /// The buffer's byte offset in every rank's window (the same on every rank that allocated alike).
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Whether the other ranks read this buffer in place (they share this host's memory); otherwise, over TCP, the
    /// collectives taking it run the ordinary algorithms on it.
    pub fn is_shared(&self) -> bool {
        self.windows.is_shared()
    }

    /// Bytes of this rank's window not held by any buffer (this one included as held).
    pub fn window_available(&self) -> usize {
        self.windows.available()
    }

    /// The windows it lives in.
    pub(crate) fn windows(&self) -> &Arc<Windows> {
        &self.windows
    }

    /// Byte length.
    pub(crate) fn bytes(&self) -> usize {
        self.len * size_of::<T>()
    }

    /// Keeps the buffer's bytes out of later allocations when it is dropped (after a failed collective).
    pub(crate) fn retire(&mut self) {
        self.retired = true;
    }
}

// SAFETY: the buffer owns its range of the window as a `Box<[T]>` owns its allocation (the `Arc<Windows>` keeps
// the mapping alive, and no other buffer overlaps the range), and `T: Element` is `Send + Sync`.
unsafe impl<T: Element> Send for SymmetricBuffer<T> {}
// SAFETY: as for `Send`: `&SymmetricBuffer` gives out only `&[T]`.
unsafe impl<T: Element> Sync for SymmetricBuffer<T> {}

impl<T: Element> std::ops::Deref for SymmetricBuffer<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        // SAFETY: `[offset, offset + len * size_of::<T>())` lies inside this rank's window (the allocator gave
        // it), which the `Arc<Windows>` keeps mapped; the start is 64-byte aligned within a page-aligned window,
        // enough for every `Element`; the bytes were initialized with `T` values by `new` and are written only as
        // `T` since. No other buffer overlaps them, and peers read them only inside a collective, which owns the
        // buffer (so no `&self` exists meanwhile).
        unsafe { std::slice::from_raw_parts(self.ptr.cast_const(), self.len) }
    }
}

impl<T: Element> std::ops::DerefMut for SymmetricBuffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`; `&mut self` makes this the only reference into the range.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl<T: Element> Drop for SymmetricBuffer<T> {
    fn drop(&mut self) {
        if !self.retired {
            self.windows.release(self.offset, self.bytes());
        }
    }
}

impl<T: Element> std::fmt::Debug for SymmetricBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SymmetricBuffer")
            .field("comm", &self.windows.comm)
            .field("offset", &self.offset)
            .field("len", &self.len)
            .field("shared", &self.windows.is_shared())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn windows(bytes: usize) -> Arc<Windows> {
        Arc::new(Windows::private("w", 0, bytes).unwrap())
    }

    #[test]
    fn allocation_is_first_fit_in_cache_lines_and_freed_space_is_merged_and_reused() {
        let w = windows(4096);
        let a = SymmetricBuffer::new(Arc::clone(&w), 10, 1u8).unwrap();
        let b = SymmetricBuffer::new(Arc::clone(&w), 100, 2.0f32).unwrap();
        let c = SymmetricBuffer::new(Arc::clone(&w), 1, 3u64).unwrap();
        assert_eq!((a.offset(), b.offset(), c.offset()), (0, 64, 512));
        assert_eq!(w.available(), 4096 - 576);
        assert!(a.iter().all(|&x| x == 1) && b.iter().all(|&x| x == 2.0) && c[0] == 3);
        drop(a);
        drop(b);
        // The two freed runs merged into one of 512 bytes at 0: a 500-byte buffer fits there.
        let d = SymmetricBuffer::new(Arc::clone(&w), 500, 0u8).unwrap();
        assert_eq!(d.offset(), 0);
        drop((c, d));
        assert_eq!(w.available(), 4096);
        assert_eq!(
            lock(&w.free).len(),
            1,
            "the freed runs merged back into one"
        );
    }

    #[test]
    fn a_buffer_too_large_for_the_window_says_how_much_is_free() {
        let w = windows(4096);
        let _a = SymmetricBuffer::new(Arc::clone(&w), 1000, 0u8).unwrap();
        let err = SymmetricBuffer::new(Arc::clone(&w), 1000, 0.0f32)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("4000 bytes does not fit this rank's 4096-byte window (3072 bytes free"),
            "{err}"
        );
        let none = windows(0);
        let err = SymmetricBuffer::new(none, 1, 0u8).unwrap_err().to_string();
        assert!(err.contains("0-byte window"), "{err}");
    }

    #[test]
    fn a_retired_buffer_stays_out_of_the_free_list() {
        let w = windows(4096);
        let mut a = SymmetricBuffer::new(Arc::clone(&w), 64, 0u8).unwrap();
        a.retire();
        drop(a);
        assert_eq!(w.available(), 4096 - 64);
        assert_eq!(
            SymmetricBuffer::new(Arc::clone(&w), 1, 0u8)
                .unwrap()
                .offset(),
            64
        );
    }

    #[test]
    fn writes_through_the_buffer_land_in_the_window() {
        let w = windows(4096);
        let _pad = SymmetricBuffer::new(Arc::clone(&w), 3, 0u8).unwrap();
        let mut b = SymmetricBuffer::new(Arc::clone(&w), 4, 0i32).unwrap();
        b.copy_from_slice(&[1, 2, 3, 4]);
        // SAFETY: bytes 64..80 of the window are `b`'s, initialized, and no `&mut` to them is live.
        let raw = unsafe { std::slice::from_raw_parts(w.own().add(64).cast::<i32>(), 4) };
        assert_eq!(raw, [1, 2, 3, 4]);
    }
}
