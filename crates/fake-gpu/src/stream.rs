//! Streams: each one a worker thread that runs the work enqueued on it in order, later than the call that
//! enqueued it, as a GPU does. The null stream runs work at once on the calling thread.
//!
//! A stream whose work hangs (a wait on an event never reached, a collective whose peers never come) reports it
//! on stderr after [`knobs::hang_timeout`] or the NCCL peer timeout, and every later call on it fails: CUDA's
//! errors are sticky too.

use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use crate::knobs;

/// Work on a stream. It returns an error text when it failed, which breaks the stream.
pub(crate) type Work = Box<dyn FnOnce() -> Result<(), String> + Send>;

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves its value consistent; a poisoned lock still holds one.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Default)]
struct Queue {
    work: VecDeque<Work>,
    enqueued: u64,
    done: u64,
    closed: bool,
    failed: Option<String>,
}

/// One stream: its queue and the worker's progress.
pub(crate) struct Stream {
    /// The device whose context made it.
    device: usize,
    queue: Mutex<Queue>,
    changed: Condvar,
}

/// Every live stream of the process, for `cuCtxSynchronize`. The driver's context is process-wide state, which
/// this fake imitates; nothing of hypercomm's own is global.
fn registry() -> &'static Mutex<Vec<Weak<Stream>>> {
    static STREAMS: OnceLock<Mutex<Vec<Weak<Stream>>>> = OnceLock::new();
    STREAMS.get_or_init(|| Mutex::new(Vec::new()))
}

impl Stream {
    /// A new stream of `device`'s context, with its worker thread.
    pub(crate) fn spawn(device: usize) -> Option<Arc<Stream>> {
        let stream = Arc::new(Stream {
            device,
            queue: Mutex::new(Queue::default()),
            changed: Condvar::new(),
        });
        let worker = Arc::clone(&stream);
        std::thread::Builder::new()
            .name("fake-cuda-stream".into())
            .spawn(move || worker.run())
            .ok()?;
        let mut all = lock(registry());
        all.retain(|w| w.strong_count() > 0);
        all.push(Arc::downgrade(&stream));
        Some(stream)
    }

    fn run(&self) {
        loop {
            let work = {
                let mut q = lock(&self.queue);
                loop {
                    if let Some(w) = q.work.pop_front() {
                        break w;
                    }
                    if q.closed {
                        return;
                    }
                    q = self.changed.wait(q).unwrap_or_else(|p| p.into_inner());
                }
            };
            let delay = knobs::stream_delay();
            if !delay.is_zero() {
                std::thread::sleep(delay);
            }
            let skip = lock(&self.queue).failed.is_some();
            let result = if skip { Ok(()) } else { work() };
            let mut q = lock(&self.queue);
            if let Err(e) = result {
                eprintln!("fake-cuda: stream failed: {e}");
                q.failed.get_or_insert(e);
            }
            q.done += 1;
            self.changed.notify_all();
        }
    }

    /// Queues `work`; an error if the stream has failed.
    pub(crate) fn enqueue(&self, work: Work) -> Result<(), String> {
        let mut q = lock(&self.queue);
        if let Some(e) = &q.failed {
            return Err(e.clone());
        }
        q.work.push_back(work);
        q.enqueued += 1;
        self.changed.notify_all();
        Ok(())
    }

    /// Blocks until everything enqueued so far has run (bounded by the hang timeout).
    pub(crate) fn synchronize(&self) -> Result<(), String> {
        let deadline = Instant::now() + knobs::hang_timeout();
        let mut q = lock(&self.queue);
        let target = q.enqueued;
        while q.done < target {
            let now = Instant::now();
            if now >= deadline {
                let e = format!(
                    "synchronizing a stream: {} operation(s) still running after {:?}",
                    target - q.done,
                    knobs::hang_timeout()
                );
                q.failed.get_or_insert(e.clone());
                return Err(e);
            }
            q = self
                .changed
                .wait_timeout(q, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        match &q.failed {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Waits until everything enqueued so far has run, until `deadline` at most, without failing the stream; whether
    /// it has.
    fn run_by(&self, deadline: Instant) -> bool {
        let mut q = lock(&self.queue);
        let target = q.enqueued;
        while q.done < target {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            q = self
                .changed
                .wait_timeout(q, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }

    /// Whether everything enqueued has run.
    pub(crate) fn idle(&self) -> bool {
        let q = lock(&self.queue);
        q.done == q.enqueued
    }

    fn close(&self) {
        lock(&self.queue).closed = true;
        self.changed.notify_all();
    }
}

/// Synchronizes every live stream of `device`'s context (`cuCtxSynchronize`). Like CUDA's, it waits for other
/// threads' streams of that context too: with several ranks on one device, a rank that synchronizes its context
/// while a peer's collective waits for it deadlocks, on a GPU and here.
pub(crate) fn synchronize_all(device: usize) -> Result<(), String> {
    let streams: Vec<Arc<Stream>> = lock(registry())
        .iter()
        .filter_map(Weak::upgrade)
        .filter(|s| s.device == device)
        .collect();
    streams.iter().try_for_each(|s| s.synchronize())
}

/// Waits, up to `limit`, until every live stream of `device`'s context has run what was enqueued on it when this
/// was called, failing none: what freeing device memory does on a GPU, where it waits for the kernels running on
/// the device, whichever thread or communicator launched them. Whether they all did in time.
pub(crate) fn settle_device(device: usize, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    let streams: Vec<Arc<Stream>> = lock(registry())
        .iter()
        .filter_map(Weak::upgrade)
        .filter(|s| s.device == device)
        .collect();
    streams.iter().all(|s| s.run_by(deadline))
}

/// A stream handle as the C API passes it: null for the legacy default stream, else a boxed `Arc<Stream>`.
pub(crate) fn into_handle(stream: Arc<Stream>) -> *mut c_void {
    Box::into_raw(Box::new(stream)).cast()
}

/// Borrows the stream behind a handle; `None` for the null stream.
///
/// # Safety
///
/// `handle` is null or came from [`into_handle`] and was not destroyed.
pub(crate) unsafe fn from_handle<'a>(handle: *mut c_void) -> Option<&'a Arc<Stream>> {
    // SAFETY: by the contract a non-null handle is a live Box<Arc<Stream>>.
    unsafe { handle.cast::<Arc<Stream>>().as_ref() }
}

/// Destroys a handle: the stream finishes its queued work, then its worker exits (as `cuStreamDestroy`).
///
/// # Safety
///
/// `handle` came from [`into_handle`] and is not used again.
pub(crate) unsafe fn destroy(handle: *mut c_void) {
    // SAFETY: the contract.
    let stream = unsafe { Box::from_raw(handle.cast::<Arc<Stream>>()) };
    stream.close();
}

/// Runs `work` on the stream behind `handle`: queued on a stream, at once on the calling thread for the null
/// stream.
///
/// # Safety
///
/// As [`from_handle`].
pub(crate) unsafe fn submit(handle: *mut c_void, work: Work) -> Result<(), String> {
    // SAFETY: the contract.
    match unsafe { from_handle(handle) } {
        Some(s) => s.enqueue(work),
        None => work(),
    }
}

/// Blocks until the stream behind `handle` is idle (nothing to wait for on the null stream).
///
/// # Safety
///
/// As [`from_handle`].
pub(crate) unsafe fn drain(handle: *mut c_void) -> Result<(), String> {
    // SAFETY: the contract.
    match unsafe { from_handle(handle) } {
        Some(s) => s.synchronize(),
        None => Ok(()),
    }
}

/// Sleeps in growing steps while polling `ready`, up to `limit`; whether it became ready.
pub(crate) fn poll_until(limit: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    let mut pause = Duration::from_micros(20);
    loop {
        if ready() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(2));
    }
}
