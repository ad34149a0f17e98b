//! "Device" memory: zeroed host allocations whose size sits in a header before the address handed out.

use std::alloc::{Layout, alloc_zeroed, dealloc};

const HEADER: usize = 16;

fn layout(bytes: usize) -> Option<Layout> {
    Layout::from_size_align(bytes.checked_add(HEADER)?, HEADER).ok()
}

/// Allocates `bytes` zeroed bytes; the address, or `None` when the size is absurd or memory is exhausted.
pub(crate) fn allocate(bytes: usize) -> Option<u64> {
    let layout = layout(bytes)?;
    // SAFETY: the layout has a non-zero size (at least the header).
    let base = unsafe { alloc_zeroed(layout) };
    if base.is_null() {
        return None;
    }
    // SAFETY: `base` holds at least HEADER bytes, aligned to 16, so a usize fits at its start.
    unsafe { base.cast::<usize>().write(bytes) };
    Some(base as u64 + HEADER as u64)
}

/// Frees an address from [`allocate`]. Returns false for 0.
///
/// # Safety
///
/// `address` is 0 or came from [`allocate`] and was not freed since.
pub(crate) unsafe fn free(address: u64) -> bool {
    if address == 0 {
        return false;
    }
    let base = (address - HEADER as u64) as usize as *mut u8;
    // SAFETY: by the contract, `base` is the start of a live allocation whose first usize is its size.
    let bytes = unsafe { base.cast::<usize>().read() };
    if let Some(layout) = layout(bytes) {
        // SAFETY: `base` was allocated with exactly this layout.
        unsafe { dealloc(base, layout) };
    }
    true
}
