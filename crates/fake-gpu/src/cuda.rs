//! The driver half: devices, the primary context, streams, events and memory on the host.
//!
//! Signatures follow `cuda.h` of CUDA 13; enums travel as their `int` values and handles as pointers this module
//! boxes. Work on a stream runs later, on the stream's worker ([`crate::stream`]), and events complete when the
//! stream reaches them ([`crate::event`]), so code that forgets to wait reads stale memory here as on a GPU.
//! Copies follow CUDA's rules for pageable host memory: host-to-device takes its bytes at the call and lands in
//! stream order; device-to-host waits for the stream, then copies before returning.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::Arc;

use crate::event::Event;
use crate::stream::{self, Stream};
use crate::{knobs, memory};

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
    let token = std::ptr::without_provenance_mut::<c_void>(CURRENT.with(|c| c.get()));
    // SAFETY: the caller's contract.
    unsafe { put(context, token) }
}

/// `cuCtxSynchronize`: waits for every stream of the calling thread's context.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize() -> CuResult {
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

/// `cuStreamCreate`: a stream with its own worker thread.
///
/// # Safety
///
/// `stream` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreate(out: *mut *mut c_void, _flags: c_uint) -> CuResult {
    if out.is_null() {
        return INVALID_VALUE;
    }
    let Some(s) = Stream::spawn(current_device()) else {
        return OUT_OF_MEMORY;
    };
    // SAFETY: the caller's contract.
    unsafe { put(out, stream::into_handle(s)) }
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

/// `cuStreamDestroy_v2`: returns at once; queued work still runs.
///
/// # Safety
///
/// `stream` came from [`cuStreamCreate`] and is not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamDestroy_v2(stream: *mut c_void) -> CuResult {
    if stream.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: the caller's contract.
    unsafe { stream::destroy(stream) };
    SUCCESS
}

/// `cuStreamSynchronize`: blocks until the stream's queued work has run.
///
/// # Safety
///
/// `s` is null or a live stream.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamSynchronize(s: *mut c_void) -> CuResult {
    // SAFETY: the caller's contract.
    match unsafe { stream::drain(s) } {
        Ok(()) => SUCCESS,
        Err(e) => failed("cuStreamSynchronize", e),
    }
}

/// `cuStreamQuery`: `CUDA_ERROR_NOT_READY` while work is queued.
///
/// # Safety
///
/// `s` is null or a live stream.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamQuery(s: *mut c_void) -> CuResult {
    // SAFETY: the caller's contract.
    match unsafe { stream::from_handle(s) } {
        Some(s) if !s.idle() => NOT_READY,
        _ => SUCCESS,
    }
}

/// Borrows an event handle.
///
/// # Safety
///
/// `event` is null or came from [`cuEventCreate`] and is not destroyed.
unsafe fn event<'a>(event: *mut c_void) -> Option<&'a Arc<Event>> {
    // SAFETY: by the contract the pointer is a live boxed Arc<Event> (or null).
    unsafe { event.cast::<Arc<Event>>().as_ref() }
}

/// `cuStreamWaitEvent`: later work on the stream waits until the event's latest record (at the time of this
/// call) is reached.
///
/// # Safety
///
/// `s` is null or a live stream; `e` is a live event.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamWaitEvent(
    s: *mut c_void,
    e: *mut c_void,
    _flags: c_uint,
) -> CuResult {
    // SAFETY: the caller's contract.
    let Some(e) = (unsafe { event(e) }) else {
        return INVALID_VALUE;
    };
    let (e, target) = (Arc::clone(e), e.target());
    let wait = Box::new(move || {
        let limit = knobs::hang_timeout();
        if e.wait_for(target, limit) {
            Ok(())
        } else {
            Err(format!(
                "a stream waited {limit:?} for an event that was never reached"
            ))
        }
    });
    // SAFETY: the caller's contract.
    match unsafe { stream::submit(s, wait) } {
        Ok(()) => SUCCESS,
        Err(e) => failed("cuStreamWaitEvent", e),
    }
}

/// `cuEventCreate`.
///
/// # Safety
///
/// `out` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventCreate(out: *mut *mut c_void, _flags: c_uint) -> CuResult {
    let handle = Box::into_raw(Box::new(Arc::new(Event::default())));
    // SAFETY: the caller's contract.
    unsafe { put(out, handle.cast::<c_void>()) }
}

/// `cuEventRecord`: the event completes when the stream reaches this point.
///
/// # Safety
///
/// `e` is a live event; `s` is null or a live stream.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventRecord(e: *mut c_void, s: *mut c_void) -> CuResult {
    // SAFETY: the caller's contract.
    let Some(e) = (unsafe { event(e) }) else {
        return INVALID_VALUE;
    };
    // SAFETY: the caller's contract.
    match unsafe { stream::submit(s, Box::new(e.record())) } {
        Ok(()) => SUCCESS,
        Err(e) => failed("cuEventRecord", e),
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

/// `cuEventQuery`: `CUDA_ERROR_NOT_READY` until the latest record is reached.
///
/// # Safety
///
/// `e` is a live event.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventQuery(e: *mut c_void) -> CuResult {
    // SAFETY: the caller's contract.
    match unsafe { event(e) } {
        Some(e) if e.complete() => SUCCESS,
        Some(_) => NOT_READY,
        None => INVALID_VALUE,
    }
}

/// `cuEventSynchronize`: blocks until the latest record is reached (bounded by `FAKE_GPU_HANG_SECS`).
///
/// # Safety
///
/// `e` is a live event.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventSynchronize(e: *mut c_void) -> CuResult {
    // SAFETY: the caller's contract.
    let Some(e) = (unsafe { event(e) }) else {
        return INVALID_VALUE;
    };
    if e.wait_for(e.target(), knobs::hang_timeout()) {
        SUCCESS
    } else {
        failed("cuEventSynchronize", "the event was never reached".into())
    }
}

/// `cuEventElapsedTime`: milliseconds between the two records (`NOT_READY` unless both were reached).
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
    match (s.reached_at(), e.reached_at()) {
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

/// `cuEventDestroy_v2`: work already queued that records or waits on it still runs.
///
/// # Safety
///
/// `e` came from [`cuEventCreate`] and is not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventDestroy_v2(e: *mut c_void) -> CuResult {
    if e.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: a boxed Arc<Event> from cuEventCreate, destroyed once.
    drop(unsafe { Box::from_raw(e.cast::<Arc<Event>>()) });
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

/// `cuMemFreeAsync`: the memory is released when the stream reaches the free.
///
/// # Safety
///
/// `address` came from an allocation here and is not used again; `s` is null or a live stream.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync(address: u64, s: *mut c_void) -> CuResult {
    if address == 0 {
        return INVALID_VALUE;
    }
    let free = Box::new(move || {
        // SAFETY: the caller's contract: `address` is a live allocation, freed once.
        unsafe { memory::free(address) };
        Ok(())
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
    let bytes = if n == 0 {
        Vec::new()
    } else {
        // SAFETY: the caller's contract: `src` holds `n` bytes.
        unsafe { std::slice::from_raw_parts(src.cast::<u8>(), n) }.to_vec()
    };
    let land = Box::new(move || {
        // SAFETY: the caller's contract: `dst` holds `n` bytes.
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
    // SAFETY: the caller's contract.
    if let Err(e) = unsafe { stream::drain(s) } {
        return failed("cuMemcpyDtoHAsync", e);
    }
    // SAFETY: the caller's contract; `copy` allows overlap.
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
    let copy = Box::new(move || {
        // SAFETY: the caller's contract; `copy` allows overlap.
        unsafe { std::ptr::copy(src as usize as *const u8, dst as usize as *mut u8, n) };
        Ok(())
    });
    // SAFETY: the caller's contract.
    unsafe { on_stream("cuMemcpyDtoDAsync", s, copy) }
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
