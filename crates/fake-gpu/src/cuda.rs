//! The driver half: devices, the primary context, streams, events and memory, all synchronous on the host.
//!
//! Signatures follow `cuda.h` of CUDA 13; enums travel as their `int` values and handles as pointers this module
//! boxes (streams: a byte; events: the instant they were recorded).

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::Mutex;
use std::time::Instant;

use crate::memory;

type CuResult = c_uint;
const SUCCESS: CuResult = 0;
const INVALID_VALUE: CuResult = 1;
const OUT_OF_MEMORY: CuResult = 2;
const NOT_READY: CuResult = 600;
const NOT_SUPPORTED: CuResult = 801;

/// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR` / `_MINOR` and `_MEMORY_POOLS_SUPPORTED`.
const ATTRIBUTE_CC_MAJOR: c_int = 75;
const ATTRIBUTE_CC_MINOR: c_int = 76;
const ATTRIBUTE_MEMORY_POOLS: c_int = 115;

fn env_int(name: &str, default: i64) -> i64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn devices() -> c_int {
    c_int::try_from(env_int("FAKE_GPU_DEVICES", 1)).unwrap_or(1)
}

/// Writes `value` through `out` unless it is null; `INVALID_VALUE` for null.
///
/// # Safety
///
/// `out` is null or valid for one write of `T`.
unsafe fn put<T>(out: *mut T, value: T) -> CuResult {
    if out.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: non-null and valid for a write by the contract.
    unsafe { out.write(value) };
    SUCCESS
}

/// `cuInit`.
#[unsafe(no_mangle)]
pub extern "C" fn cuInit(_flags: c_uint) -> CuResult {
    SUCCESS
}

/// `cuDriverGetVersion`: CUDA 13.0.
///
/// # Safety
///
/// `version` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CuResult {
    // SAFETY: the caller's contract.
    unsafe { put(version, 13000) }
}

/// `cuDeviceGetCount`: `FAKE_GPU_DEVICES`.
///
/// # Safety
///
/// `count` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CuResult {
    // SAFETY: the caller's contract.
    unsafe { put(count, devices()) }
}

/// `cuDeviceGet`: a device is its ordinal.
///
/// # Safety
///
/// `device` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(device: *mut c_int, ordinal: c_int) -> CuResult {
    if !(0..devices()).contains(&ordinal) {
        return INVALID_VALUE;
    }
    // SAFETY: the caller's contract.
    unsafe { put(device, ordinal) }
}

/// `cuDeviceGetAttribute`: compute capability 9.0, memory pools supported, 0 for anything else.
///
/// # Safety
///
/// `value` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    value: *mut c_int,
    attribute: c_int,
    _device: c_int,
) -> CuResult {
    let v = match attribute {
        ATTRIBUTE_CC_MAJOR => 9,
        ATTRIBUTE_CC_MINOR => 0,
        ATTRIBUTE_MEMORY_POOLS => 1,
        _ => 0,
    };
    // SAFETY: the caller's contract.
    unsafe { put(value, v) }
}

/// `cuDevicePrimaryCtxRetain`: the context of device `d` is the non-null token `d + 1`.
///
/// # Safety
///
/// `context` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(
    context: *mut *mut c_void,
    device: c_int,
) -> CuResult {
    let token = std::ptr::without_provenance_mut::<c_void>(device as usize + 1);
    // SAFETY: the caller's contract.
    unsafe { put(context, token) }
}

/// `cuDevicePrimaryCtxRelease_v2`.
#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(_device: c_int) -> CuResult {
    SUCCESS
}

/// `cuCtxSetCurrent`.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetCurrent(_context: *mut c_void) -> CuResult {
    SUCCESS
}

/// `cuCtxGetCurrent`: device 0's context (the token 1, as [`cuDevicePrimaryCtxRetain`] makes it).
///
/// # Safety
///
/// `context` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCurrent(context: *mut *mut c_void) -> CuResult {
    let token = std::ptr::without_provenance_mut::<c_void>(1);
    // SAFETY: the caller's contract.
    unsafe { put(context, token) }
}

/// `cuCtxSynchronize`: nothing is ever in flight.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize() -> CuResult {
    SUCCESS
}

/// `cuCtxSynchronize_v2` (CUDA 13's name).
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize_v2(_context: *mut c_void) -> CuResult {
    SUCCESS
}

/// `cuCtxGetStreamPriorityRange`: 0 (least) to -5 (greatest).
///
/// # Safety
///
/// Each pointer is null or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetStreamPriorityRange(
    least: *mut c_int,
    greatest: *mut c_int,
) -> CuResult {
    // SAFETY: the caller's contract; null pointers are skipped.
    unsafe {
        if !least.is_null() {
            least.write(0);
        }
        if !greatest.is_null() {
            greatest.write(-5);
        }
    }
    SUCCESS
}

/// `cuStreamCreate`: a boxed byte as the handle.
///
/// # Safety
///
/// `stream` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreate(stream: *mut *mut c_void, _flags: c_uint) -> CuResult {
    let handle = Box::into_raw(Box::new(0u8)).cast::<c_void>();
    // SAFETY: the caller's contract.
    unsafe { put(stream, handle) }
}

/// `cuStreamCreateWithPriority`.
///
/// # Safety
///
/// `stream` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    stream: *mut *mut c_void,
    flags: c_uint,
    _priority: c_int,
) -> CuResult {
    // SAFETY: the caller's contract, passed on.
    unsafe { cuStreamCreate(stream, flags) }
}

/// `cuStreamDestroy_v2`.
///
/// # Safety
///
/// `stream` came from [`cuStreamCreate`] and is not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamDestroy_v2(stream: *mut c_void) -> CuResult {
    if stream.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: the handle is a boxed u8 from cuStreamCreate, destroyed once.
    drop(unsafe { Box::from_raw(stream.cast::<u8>()) });
    SUCCESS
}

/// `cuStreamSynchronize`, `cuStreamQuery`: always idle.
#[unsafe(no_mangle)]
pub extern "C" fn cuStreamSynchronize(_stream: *mut c_void) -> CuResult {
    SUCCESS
}

/// `cuStreamQuery`.
#[unsafe(no_mangle)]
pub extern "C" fn cuStreamQuery(_stream: *mut c_void) -> CuResult {
    SUCCESS
}

/// `cuStreamWaitEvent`: an event that was never recorded is an error here, as waiting on it would be pointless.
#[unsafe(no_mangle)]
pub extern "C" fn cuStreamWaitEvent(
    _stream: *mut c_void,
    event: *mut c_void,
    _flags: c_uint,
) -> CuResult {
    if event.is_null() {
        INVALID_VALUE
    } else {
        SUCCESS
    }
}

struct Event {
    recorded: Mutex<Option<Instant>>,
}

/// Borrows an event handle.
///
/// # Safety
///
/// `event` came from [`cuEventCreate`] and is not destroyed.
unsafe fn event<'a>(event: *mut c_void) -> Option<&'a Event> {
    // SAFETY: by the contract the pointer is a live boxed Event (or null).
    unsafe { event.cast::<Event>().as_ref() }
}

/// `cuEventCreate`.
///
/// # Safety
///
/// `out` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventCreate(out: *mut *mut c_void, _flags: c_uint) -> CuResult {
    let handle = Box::into_raw(Box::new(Event {
        recorded: Mutex::new(None),
    }));
    // SAFETY: the caller's contract.
    unsafe { put(out, handle.cast::<c_void>()) }
}

/// `cuEventRecord`: completes at once.
///
/// # Safety
///
/// `e` is a live event.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventRecord(e: *mut c_void, _stream: *mut c_void) -> CuResult {
    // SAFETY: the caller's contract.
    match unsafe { event(e) } {
        Some(e) => {
            *e.recorded.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
            SUCCESS
        }
        None => INVALID_VALUE,
    }
}

/// `cuEventRecordWithFlags`.
///
/// # Safety
///
/// `e` is a live event.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventRecordWithFlags(
    e: *mut c_void,
    stream: *mut c_void,
    _flags: c_uint,
) -> CuResult {
    // SAFETY: the caller's contract, passed on.
    unsafe { cuEventRecord(e, stream) }
}

/// `cuEventQuery`, `cuEventSynchronize`: complete.
#[unsafe(no_mangle)]
pub extern "C" fn cuEventQuery(e: *mut c_void) -> CuResult {
    if e.is_null() { INVALID_VALUE } else { SUCCESS }
}

/// `cuEventSynchronize`.
#[unsafe(no_mangle)]
pub extern "C" fn cuEventSynchronize(e: *mut c_void) -> CuResult {
    cuEventQuery(e)
}

/// `cuEventElapsedTime`: milliseconds between the two recordings (`NOT_READY` if either was never recorded).
///
/// # Safety
///
/// `ms` is valid for one write; both events are live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventElapsedTime(
    ms: *mut f32,
    start: *mut c_void,
    end: *mut c_void,
) -> CuResult {
    // SAFETY: the caller's contract.
    let (Some(s), Some(e)) = (unsafe { event(start) }, unsafe { event(end) }) else {
        return INVALID_VALUE;
    };
    let at = |e: &Event| *e.recorded.lock().unwrap_or_else(|p| p.into_inner());
    match (at(s), at(e)) {
        (Some(a), Some(b)) => {
            let millis = b.saturating_duration_since(a).as_secs_f64() * 1e3;
            // SAFETY: the caller's contract.
            unsafe { put(ms, millis as f32) }
        }
        _ => NOT_READY,
    }
}

/// `cuEventElapsedTime_v2` (CUDA 13's name).
///
/// # Safety
///
/// As [`cuEventElapsedTime`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventElapsedTime_v2(
    ms: *mut f32,
    start: *mut c_void,
    end: *mut c_void,
) -> CuResult {
    // SAFETY: the caller's contract, passed on.
    unsafe { cuEventElapsedTime(ms, start, end) }
}

/// `cuEventDestroy_v2`.
///
/// # Safety
///
/// `e` came from [`cuEventCreate`] and is not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventDestroy_v2(e: *mut c_void) -> CuResult {
    if e.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: a boxed Event from cuEventCreate, destroyed once.
    drop(unsafe { Box::from_raw(e.cast::<Event>()) });
    SUCCESS
}

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

/// `cuMemFreeAsync`.
///
/// # Safety
///
/// `address` came from an allocation here and is not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync(address: u64, _stream: *mut c_void) -> CuResult {
    // SAFETY: the caller's contract.
    if unsafe { memory::free(address) } {
        SUCCESS
    } else {
        INVALID_VALUE
    }
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

/// `cuMemsetD8Async`.
///
/// # Safety
///
/// `address` holds `n` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemsetD8Async(
    address: u64,
    value: u8,
    n: usize,
    _stream: *mut c_void,
) -> CuResult {
    // SAFETY: the caller's contract.
    unsafe { std::ptr::write_bytes(address as usize as *mut u8, value, n) };
    SUCCESS
}

/// Copies `n` bytes between two addresses (device or host: both are host memory here).
///
/// # Safety
///
/// `src` holds `n` readable bytes and `dst` `n` writable ones.
unsafe fn copy(dst: usize, src: usize, n: usize) -> CuResult {
    // SAFETY: the caller's contract; `copy` allows overlap.
    unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, n) };
    SUCCESS
}

/// `cuMemcpyHtoDAsync_v2`.
///
/// # Safety
///
/// As [`copy`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: u64,
    src: *const c_void,
    n: usize,
    _stream: *mut c_void,
) -> CuResult {
    // SAFETY: the caller's contract.
    unsafe { copy(dst as usize, src as usize, n) }
}

/// `cuMemcpyDtoHAsync_v2`.
///
/// # Safety
///
/// As [`copy`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: u64,
    n: usize,
    _stream: *mut c_void,
) -> CuResult {
    // SAFETY: the caller's contract.
    unsafe { copy(dst as usize, src as usize, n) }
}

/// `cuMemcpyDtoDAsync_v2`.
///
/// # Safety
///
/// As [`copy`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoDAsync_v2(
    dst: u64,
    src: u64,
    n: usize,
    _stream: *mut c_void,
) -> CuResult {
    // SAFETY: the caller's contract.
    unsafe { copy(dst as usize, src as usize, n) }
}

/// `cuModuleLoadData`: kernels do not run here.
#[unsafe(no_mangle)]
pub extern "C" fn cuModuleLoadData(_module: *mut *mut c_void, _image: *const c_void) -> CuResult {
    NOT_SUPPORTED
}

/// `cuGetErrorString`, `cuGetErrorName`: one static text.
///
/// # Safety
///
/// `text` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorString(_error: CuResult, text: *mut *const c_char) -> CuResult {
    // SAFETY: the caller's contract.
    unsafe { put(text, c"error from the fake cuda driver".as_ptr()) }
}

/// `cuGetErrorName`.
///
/// # Safety
///
/// `text` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorName(_error: CuResult, text: *mut *const c_char) -> CuResult {
    // SAFETY: the caller's contract.
    unsafe { put(text, c"FAKE_CUDA_ERROR".as_ptr()) }
}
