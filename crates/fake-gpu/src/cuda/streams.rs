//! Streams and events of the fake driver: each stream runs its work on a worker thread ([`crate::stream`]), and an
//! event completes when its stream reaches it ([`crate::event`]).

use std::ffi::{c_int, c_uint, c_void};
use std::sync::Arc;

use super::{
    CuResult, INVALID_VALUE, NOT_READY, OUT_OF_MEMORY, SUCCESS, current_device, failed, put,
};
use crate::event::Event;
use crate::knobs;
use crate::stream::{self, Stream};

/// `cuStreamCreate`: a stream with its own worker thread.
///
/// # Safety
///
/// `stream` is valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreate(out: *mut *mut c_void, _flags: c_uint) -> CuResult {
    knobs::trace_call("cuStreamCreate");
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
    knobs::trace_call("cuStreamDestroy_v2");
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
    knobs::trace_call("cuStreamSynchronize");
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
    knobs::trace_call("cuStreamQuery");
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
    knobs::trace_call("cuStreamWaitEvent");
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
    knobs::trace_call("cuEventCreate");
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
    knobs::trace_call("cuEventRecord");
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
    knobs::trace_call("cuEventQuery");
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
    knobs::trace_call("cuEventSynchronize");
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
    knobs::trace_call("cuEventElapsedTime");
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
    knobs::trace_call("cuEventDestroy_v2");
    if e.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: a boxed Arc<Event> from cuEventCreate, destroyed once.
    drop(unsafe { Box::from_raw(e.cast::<Arc<Event>>()) });
    SUCCESS
}
