//! Memory of the fake driver: device memory is host memory ([`crate::memory`]); copies follow CUDA's rules for
//! pageable host memory (host-to-device takes its bytes at the call, device-to-host waits for the stream).

use std::ffi::c_void;

use super::{CuResult, INVALID_VALUE, OUT_OF_MEMORY, SUCCESS, failed, on_stream, put};
use crate::knobs;
use crate::memory;
use crate::stream;

/// `cuMemAllocAsync`: zeroed host memory.
///
/// # Safety
///
/// `address` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync(
    address: *mut u64,
    bytes: usize,
    _stream: *mut c_void,
) -> CuResult {
    knobs::trace_call("cuMemAllocAsync");
    match memory::allocate(bytes) {
        // SAFETY: the caller's contract.
        Some(a) => unsafe { put(address, a) },
        None => OUT_OF_MEMORY,
    }
}

/// `cuMemAlloc_v2`.
///
/// # Safety
///
/// `address` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(address: *mut u64, bytes: usize) -> CuResult {
    // SAFETY: the caller's contract, passed on.
    unsafe { cuMemAllocAsync(address, bytes, std::ptr::null_mut()) }
}

/// `cuMemFreeAsync`: the memory is released when the stream reaches the free.
///
/// # Safety
///
/// `address` came from an allocation here and is not used again; `s` is null or a live stream.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync(address: u64, s: *mut c_void) -> CuResult {
    knobs::trace_call("cuMemFreeAsync");
    if address == 0 {
        return INVALID_VALUE;
    }
    let free = Box::new(move || {
        // SAFETY: the caller's contract: nothing uses `address` any more.
        if unsafe { memory::free(address) } {
            Ok(())
        } else {
            Err(format!(
                "freeing {address:#x}, which is not a live allocation"
            ))
        }
    });
    // SAFETY: the caller's contract.
    unsafe { on_stream("cuMemFreeAsync", s, free) }
}

/// `cuMemFree_v2`.
///
/// # Safety
///
/// As [`cuMemFreeAsync`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFree_v2(address: u64) -> CuResult {
    // SAFETY: the caller's contract, passed on.
    unsafe { cuMemFreeAsync(address, std::ptr::null_mut()) }
}

/// `cuMemsetD8Async`, in stream order.
///
/// # Safety
///
/// `address` holds `n` bytes until the stream reaches the memset.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemsetD8Async(
    address: u64,
    value: u8,
    n: usize,
    s: *mut c_void,
) -> CuResult {
    knobs::trace_call("cuMemsetD8Async");
    let set = Box::new(move || {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::write_bytes(address as usize as *mut u8, value, n) };
        Ok(())
    });
    // SAFETY: the caller's contract.
    unsafe { on_stream("cuMemsetD8Async", s, set) }
}

/// `cuMemcpyHtoDAsync_v2` from pageable memory: the bytes are taken now and land in stream order.
///
/// # Safety
///
/// `src` holds `n` readable bytes now; `dst` holds `n` writable bytes until the stream reaches the copy.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: u64,
    src: *const c_void,
    n: usize,
    s: *mut c_void,
) -> CuResult {
    knobs::trace_call("cuMemcpyHtoDAsync_v2");
    let bytes = if n == 0 {
        Vec::new()
    } else {
        // SAFETY: the caller's contract: `src` holds `n` bytes.
        unsafe { std::slice::from_raw_parts(src.cast::<u8>(), n) }.to_vec()
    };
    let land = Box::new(move || {
        memory::check(dst, n, "a host-to-device copy")?;
        // SAFETY: `dst` holds `n` bytes of a live allocation (checked).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst as usize as *mut u8, n) };
        Ok(())
    });
    // SAFETY: the caller's contract.
    unsafe { on_stream("cuMemcpyHtoDAsync", s, land) }
}

/// `cuMemcpyDtoHAsync_v2` to pageable memory: waits for the stream, then copies before returning.
///
/// # Safety
///
/// `src` holds `n` readable bytes and `dst` `n` writable ones; `s` is null or a live stream.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: u64,
    n: usize,
    s: *mut c_void,
) -> CuResult {
    knobs::trace_call("cuMemcpyDtoHAsync_v2");
    // SAFETY: the caller's contract.
    if let Err(e) = unsafe { stream::drain(s) } {
        return failed("cuMemcpyDtoHAsync", e);
    }
    if let Err(e) = memory::check(src, n, "a device-to-host copy") {
        return failed("cuMemcpyDtoHAsync", e);
    }
    // SAFETY: `src` holds `n` bytes of a live allocation (checked), `dst` by the caller's contract; `copy`
    // allows overlap.
    unsafe { std::ptr::copy(src as usize as *const u8, dst.cast::<u8>(), n) };
    SUCCESS
}

/// `cuMemcpyDtoDAsync_v2`, in stream order.
///
/// # Safety
///
/// Both addresses hold `n` bytes until the stream reaches the copy.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoDAsync_v2(
    dst: u64,
    src: u64,
    n: usize,
    s: *mut c_void,
) -> CuResult {
    knobs::trace_call("cuMemcpyDtoDAsync_v2");
    let copy = Box::new(move || {
        memory::check(src, n, "a device-to-device copy's source")?;
        memory::check(dst, n, "a device-to-device copy's destination")?;
        // SAFETY: both ranges lie in live allocations (checked); `copy` allows overlap.
        unsafe { std::ptr::copy(src as usize as *const u8, dst as usize as *mut u8, n) };
        Ok(())
    });
    // SAFETY: the caller's contract.
    unsafe { on_stream("cuMemcpyDtoDAsync", s, copy) }
}
