//! "Device" memory: zeroed host allocations whose size sits in a header before the address handed out, and the
//! map of live allocations, so that work touching memory already released fails loudly (a GPU faults, or worse,
//! reads another allocation) instead of corrupting the host heap.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

use crate::stream::lock;

const HEADER: usize = 16;

/// Every live allocation, address to size: the device's memory map, process-wide as the driver's is (nothing of
/// hypercomm's own is global).
fn live() -> &'static Mutex<BTreeMap<u64, usize>> {
    static LIVE: OnceLock<Mutex<BTreeMap<u64, usize>>> = OnceLock::new();
    LIVE.get_or_init(|| Mutex::new(BTreeMap::new()))
}

/// Fails unless `[address, address + n)` lies inside one live allocation (`what` names the access for the error).
pub(crate) fn check(address: u64, n: usize, what: &str) -> Result<(), String> {
    if n == 0 {
        return Ok(());
    }
    let map = lock(live());
    match map.range(..=address).next_back() {
        Some((&base, &size)) if address + n as u64 <= base + size as u64 => Ok(()),
        _ => Err(format!(
            "{what} of {n} bytes at {address:#x}: not inside a live allocation (released too early?)"
        )),
    }
}

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
    let address = base as u64 + HEADER as u64;
    lock(live()).insert(address, bytes);
    Some(address)
}

/// Frees an address from [`allocate`]. Returns false, freeing nothing, for an address that is not a live
/// allocation (0, or one freed already).
///
/// # Safety
///
/// `address` is not in use by anything else (work still reading it, say).
pub(crate) unsafe fn free(address: u64) -> bool {
    if lock(live()).remove(&address).is_none() {
        return false;
    }
    let base = (address - HEADER as u64) as usize as *mut u8;
    // SAFETY: `address` was live (in the map), so `base` is the start of an allocation whose first usize is its
    // size.
    let bytes = unsafe { base.cast::<usize>().read() };
    if let Some(layout) = layout(bytes) {
        // SAFETY: `base` was allocated with exactly this layout.
        unsafe { dealloc(base, layout) };
    }
    true
}
