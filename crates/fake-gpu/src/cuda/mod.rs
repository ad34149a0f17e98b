//! The driver half: devices, the primary context, streams, events and memory on the host.
//!
//! Signatures follow `cuda.h` of CUDA 13; enums travel as their `int` values and handles as pointers this module
//! boxes. Work on a stream runs later, on the stream's worker ([`crate::stream`]), and events complete when the
//! stream reaches them ([`crate::event`]), so code that forgets to wait reads stale memory here as on a GPU.
//! Copies follow CUDA's rules for pageable host memory: host-to-device takes its bytes at the call and lands in
//! stream order; device-to-host waits for the stream, then copies before returning.
//!
//! Three rooms: this one holds the result codes, devices and the primary context (and the few calls that fit
//! nowhere else); `streams` holds streams and events; `device_memory` holds allocation, memset and copies.

mod device_memory;
mod streams;

// The entry points are found by symbol name (`no_mangle`); the unit tests call them through this path.
#[cfg(test)]
pub use device_memory::*;
#[cfg(test)]
pub use streams::*;

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::knobs;
use crate::stream;

type CuResult = c_uint;
const SUCCESS: CuResult = 0;
const INVALID_VALUE: CuResult = 1;
const OUT_OF_MEMORY: CuResult = 2;
const NOT_READY: CuResult = 600;
const NOT_SUPPORTED: CuResult = 801;
/// `CUDA_ERROR_LAUNCH_FAILED`: what a stream whose work failed or hung answers from then on.
const LAUNCH_FAILED: CuResult = 719;

/// The driver's answer for a stream or event call that failed (the text went to stderr).
fn failed(what: &str, e: String) -> CuResult {
    eprintln!("fake-cuda: {what}: {e}");
    LAUNCH_FAILED
}

/// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR` / `_MINOR` and `_MEMORY_POOLS_SUPPORTED`.
const ATTRIBUTE_CC_MAJOR: c_int = 75;
const ATTRIBUTE_CC_MINOR: c_int = 76;
const ATTRIBUTE_MEMORY_POOLS: c_int = 115;

fn devices() -> c_int {
    knobs::devices()
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

/// Queues `work` on stream `s`, answering as the driver does.
///
/// # Safety
///
/// `s` is null or a live stream.
unsafe fn on_stream(what: &str, s: *mut c_void, work: stream::Work) -> CuResult {
    // SAFETY: the caller's contract.
    match unsafe { stream::submit(s, work) } {
        Ok(()) => SUCCESS,
        Err(e) => failed(what, e),
    }
}

/// `cuInit`.
#[unsafe(no_mangle)]
pub extern "C" fn cuInit(_flags: c_uint) -> CuResult {
    knobs::trace_call("cuInit");
    SUCCESS
}

/// `cuDriverGetVersion`: CUDA 13.0.
///
/// # Safety
///
/// `version` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CuResult {
    knobs::trace_call("cuDriverGetVersion");
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
    knobs::trace_call("cuDeviceGetCount");
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
    knobs::trace_call("cuDeviceGet");
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
    knobs::trace_call("cuDeviceGetAttribute");
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
    knobs::trace_call("cuDevicePrimaryCtxRetain");
    let token = std::ptr::without_provenance_mut::<c_void>(device as usize + 1);
    // SAFETY: the caller's contract.
    unsafe { put(context, token) }
}

/// `cuDevicePrimaryCtxRelease_v2`.
#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(_device: c_int) -> CuResult {
    knobs::trace_call("cuDevicePrimaryCtxRelease_v2");
    SUCCESS
}

thread_local! {
    /// The calling thread's current context, as the driver keeps it: the device's token (ordinal + 1), or 0 for
    /// none.
    static CURRENT: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The device of the calling thread's current context (device 0 when none was made current).
pub(crate) fn current_device() -> usize {
    CURRENT.with(|c| c.get()).saturating_sub(1)
}

/// `cuCtxSetCurrent`: the context becomes the calling thread's.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetCurrent(context: *mut c_void) -> CuResult {
    knobs::trace_call("cuCtxSetCurrent");
    CURRENT.with(|c| c.set(context as usize));
    SUCCESS
}

/// `cuCtxGetCurrent`: the calling thread's context (null when none).
///
/// # Safety
///
/// `context` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCurrent(context: *mut *mut c_void) -> CuResult {
    knobs::trace_call("cuCtxGetCurrent");
    let token = std::ptr::without_provenance_mut::<c_void>(CURRENT.with(|c| c.get()));
    // SAFETY: the caller's contract.
    unsafe { put(context, token) }
}

/// `cuCtxSynchronize`: waits for every stream of the calling thread's context.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize() -> CuResult {
    knobs::trace_call("cuCtxSynchronize");
    match stream::synchronize_all(current_device()) {
        Ok(()) => SUCCESS,
        Err(e) => failed("cuCtxSynchronize", e),
    }
}

/// `cuCtxSynchronize_v2` (CUDA 13's name).
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize_v2(_context: *mut c_void) -> CuResult {
    cuCtxSynchronize()
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
    knobs::trace_call("cuCtxGetStreamPriorityRange");
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

/// `cuModuleLoadData`: kernels do not run here.
#[unsafe(no_mangle)]
pub extern "C" fn cuModuleLoadData(_module: *mut *mut c_void, _image: *const c_void) -> CuResult {
    knobs::trace_call("cuModuleLoadData");
    NOT_SUPPORTED
}

/// `cuGetErrorString`, `cuGetErrorName`: one static text.
///
/// # Safety
///
/// `text` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorString(_error: CuResult, text: *mut *const c_char) -> CuResult {
    knobs::trace_call("cuGetErrorString");
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
    knobs::trace_call("cuGetErrorName");
    // SAFETY: the caller's contract.
    unsafe { put(text, c"FAKE_CUDA_ERROR".as_ptr()) }
}
