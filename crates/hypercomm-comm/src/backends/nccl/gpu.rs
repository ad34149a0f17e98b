//! [`Gpu`]: one device's context, its pool of CUDA events, its NVRTC kernels (compiled at first use), its
//! watchdog (started with the first device operation), and [`DeviceBuffer`]s on it.
//!
//! Everything cached per device lives in the `Gpu` value, not in a global: two `Gpu`s of the same ordinal (say in
//! two tests) each compile their own kernels, and dropping the `Gpu` drops its cache.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtrMut,
    DeviceRepr,
};

use super::events::{EventPool, SharedEvent};
use super::probe::{DeviceRuntime, nvrtc_present};
use super::watchdog::Watchdog;
use crate::CommError;
use crate::element::{DType, Element, as_bytes, as_bytes_mut};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Critical sections push, pop or replace one value; a poisoned lock still holds a consistent one.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One CUDA device, opened after a successful [`DeviceRuntime::probe`].
pub struct Gpu {
    runtime: Arc<DeviceRuntime>,
    ctx: Arc<CudaContext>,
    ordinal: usize,
    /// Held for the `Gpu`'s lifetime so that the context always has a stream: cudarc synchronizes the whole
    /// context when one of its `CudaContext`s makes its first stream, and with several ranks on one device that
    /// would wait for a peer's collective that waits for this rank (a deadlock the fake GPU showed). Made here,
    /// before this rank belongs to any communicator, the synchronize waits for nothing of its own.
    _first_stream: Arc<CudaStream>,
    events: Arc<EventPool>,
    kernels: Mutex<Option<Arc<Kernels>>>,
    /// Watches every in-flight operation of every communicator on this device; its thread stops when the `Gpu`
    /// is dropped.
    watchdog: Watchdog,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("ordinal", &self.ordinal)
            .finish_non_exhaustive()
    }
}

/// A CUDA driver error as a [`CommError::Device`].
pub(crate) fn cuda_err(
    comm: &str,
    what: &str,
) -> impl FnOnce(cudarc::driver::DriverError) -> CommError {
    let (comm, what) = (comm.to_owned(), what.to_owned());
    move |e| CommError::Device {
        comm,
        what: format!("{what}: {e}"),
    }
}

/// The compiled kernels of one device.
pub(crate) struct Kernels {
    /// `hypercomm_pack_{1,2,4,8}` by log2 of the width.
    pack: [CudaFunction; 4],
    unpack: [CudaFunction; 4],
    fill: Vec<(DType, CudaFunction)>,
    verify: Vec<(DType, CudaFunction)>,
}

fn width_index(width: usize) -> Option<usize> {
    [1, 2, 4, 8].iter().position(|&w| w == width)
}

impl Kernels {
    pub(crate) fn pack(&self, width: usize) -> Option<&CudaFunction> {
        width_index(width).map(|i| &self.pack[i])
    }
    pub(crate) fn unpack(&self, width: usize) -> Option<&CudaFunction> {
        width_index(width).map(|i| &self.unpack[i])
    }
    pub(crate) fn fill(&self, dtype: DType) -> Option<&CudaFunction> {
        self.fill.iter().find(|(d, _)| *d == dtype).map(|(_, f)| f)
    }
    pub(crate) fn verify(&self, dtype: DType) -> Option<&CudaFunction> {
        self.verify
            .iter()
            .find(|(d, _)| *d == dtype)
            .map(|(_, f)| f)
    }
}

impl Gpu {
    /// Opens device `ordinal` (its primary context).
    pub fn open(runtime: Arc<DeviceRuntime>, ordinal: usize) -> Result<Arc<Gpu>, CommError> {
        if ordinal >= runtime.device_count() {
            return Err(CommError::Unavailable {
                what: format!("cuda device {ordinal}"),
                why: format!("this process sees {} device(s)", runtime.device_count()),
            });
        }
        let ctx = CudaContext::new(ordinal).map_err(cuda_err(
            &format!("gpu{ordinal}"),
            "creating the cuda context",
        ))?;
        let first_stream = ctx.new_stream().map_err(cuda_err(
            &format!("gpu{ordinal}"),
            "creating the first stream",
        ))?;
        Ok(Arc::new(Gpu {
            runtime,
            ctx,
            ordinal,
            _first_stream: first_stream,
            events: Arc::new(EventPool::default()),
            kernels: Mutex::new(None),
            watchdog: Watchdog::new(ordinal),
        }))
    }

    /// Checks `options` for a device communicator on this device without creating one: every NCCL knob must be
    /// one the loaded NCCL honours, with a valid value, and no host-only knob may be set. The error names the
    /// option (see [`CommOptions`](crate::CommOptions)).
    pub fn check_options(&self, options: &crate::CommOptions) -> Result<(), CommError> {
        super::config::translate(options, self.runtime.nccl().version()).map(|_| ())
    }

    /// The runtime this device was opened with.
    pub fn runtime(&self) -> &Arc<DeviceRuntime> {
        &self.runtime
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The cudarc context, for interoperating with other cudarc code.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    fn label(&self) -> String {
        format!("gpu{}", self.ordinal)
    }

    /// A new non-blocking stream, at the context's greatest priority when `high_priority`.
    pub(crate) fn stream(&self, high_priority: bool) -> Result<Arc<CudaStream>, CommError> {
        let label = self.label();
        if high_priority {
            self.ctx
                .bind_to_thread()
                .map_err(cuda_err(&label, "binding the context"))?;
            let (_, greatest) = cudarc::driver::result::stream::get_priority_range()
                .map_err(cuda_err(&label, "reading the stream priority range"))?;
            self.ctx
                .new_stream_with_priority(greatest)
                .map_err(cuda_err(&label, "creating a high-priority stream"))
        } else {
            self.ctx
                .new_stream()
                .map_err(cuda_err(&label, "creating a stream"))
        }
    }

    /// An event from the pool (creating one costs several microseconds; reusing one costs nothing). It returns to
    /// the pool when its last holder drops it.
    pub(crate) fn take_event(&self) -> Result<SharedEvent, CommError> {
        let event = match self.events.pop() {
            Some(e) => e,
            None => self
                .ctx
                .new_event(None)
                .map_err(cuda_err(&self.label(), "creating an event"))?,
        };
        Ok(self.events.share(event))
    }

    /// Lets go of an event of the pool: it returns there once no other holder (the watchdog) has it.
    pub(crate) fn return_event(&self, event: SharedEvent) {
        drop(event);
    }

    /// Events waiting in the pool (for tests).
    pub fn pooled_events(&self) -> usize {
        self.events.len()
    }

    /// Device operations the watchdog is watching now: enqueued, and not yet seen complete by it (for tests).
    pub fn watched_operations(&self) -> usize {
        self.watchdog.in_flight()
    }

    /// The watchdog of this device's operations.
    pub(crate) fn watchdog(&self) -> &Watchdog {
        &self.watchdog
    }

    /// The kernels, compiled with NVRTC on first use and kept for this `Gpu`'s lifetime.
    pub(crate) fn kernels(&self) -> Result<Arc<Kernels>, CommError> {
        let mut slot = lock(&self.kernels);
        if let Some(k) = slot.as_ref() {
            return Ok(Arc::clone(k));
        }
        if !nvrtc_present() {
            return Err(CommError::Unavailable {
                what: "nvrtc".into(),
                why: "libnvrtc could not be opened; strided views and fill/verify need it (put the folder of \
                      libnvrtc.so.13 on LD_LIBRARY_PATH, e.g. from pip install nvidia-cuda-nvrtc)"
                    .into(),
            });
        }
        let label = self.label();
        let (major, minor) = self
            .ctx
            .compute_capability()
            .map_err(cuda_err(&label, "reading the compute capability"))?;
        let load = |source: &hypercomm_kernels::KernelSource| {
            let opts = cudarc::nvrtc::CompileOptions {
                options: vec![format!("--gpu-architecture=compute_{major}{minor}")],
                name: Some(source.name.to_owned()),
                ..Default::default()
            };
            let ptx = cudarc::nvrtc::compile_ptx_with_opts(source.text, opts).map_err(|e| {
                CommError::Device {
                    comm: label.clone(),
                    what: format!("nvrtc compiling {}: {e:?}", source.name),
                }
            })?;
            self.ctx
                .load_module(ptx)
                .map_err(cuda_err(&label, &format!("loading {}", source.name)))
        };
        let pack_mod = load(&hypercomm_kernels::PACK)?;
        let fill_mod = load(&hypercomm_kernels::FILL_VERIFY)?;
        let function = |module: &Arc<cudarc::driver::CudaModule>, name: &str| {
            module
                .load_function(name)
                .map_err(cuda_err(&label, &format!("loading kernel {name}")))
        };
        let by_width =
            |f: fn(usize) -> Option<&'static str>| -> Result<[CudaFunction; 4], CommError> {
                let mut out = Vec::with_capacity(4);
                for w in [1, 2, 4, 8] {
                    // pack_kernel/unpack_kernel name a kernel for each of these widths (tested in hypercomm-kernels).
                    let name = f(w).unwrap_or("hypercomm_missing_kernel");
                    out.push(function(&pack_mod, name)?);
                }
                out.try_into().map_err(|_| CommError::Device {
                    comm: label.clone(),
                    what: "expected four pack kernels".into(),
                })
            };
        let pack = by_width(hypercomm_kernels::pack_kernel)?;
        let unpack = by_width(hypercomm_kernels::unpack_kernel)?;
        let mut fill = Vec::new();
        let mut verify = Vec::new();
        // The pattern kernels cover the types with arithmetic in CUDA C; the 8-bit floats have none there.
        for d in DType::ALL.into_iter().filter(|d| !d.is_float8()) {
            fill.push((
                d,
                function(&fill_mod, &hypercomm_kernels::fill_kernel(d.name()))?,
            ));
            verify.push((
                d,
                function(&fill_mod, &hypercomm_kernels::verify_kernel(d.name()))?,
            ));
        }
        let k = Arc::new(Kernels {
            pack,
            unpack,
            fill,
            verify,
        });
        *slot = Some(Arc::clone(&k));
        Ok(k)
    }

    /// A zeroed buffer of `len` elements.
    pub fn alloc_zeros<T: Element>(
        self: &Arc<Self>,
        len: usize,
    ) -> Result<DeviceBuffer<T>, CommError> {
        let bytes = len
            .checked_mul(T::DTYPE.size())
            .ok_or_else(|| CommError::InvalidArgument {
                comm: self.label(),
                what: format!("{len} elements of {} overflow usize bytes", T::DTYPE),
            })?;
        let stream = self.ctx.default_stream();
        let slice = stream
            .alloc_zeros::<u8>(bytes.max(1))
            .map_err(cuda_err(&self.label(), "allocating device memory"))?;
        Ok(DeviceBuffer {
            gpu: Arc::clone(self),
            slice,
            len,
            unrecorded: None,
            used_elsewhere: AtomicBool::new(false),
            _element: PhantomData,
        })
    }

    /// A buffer holding a copy of `data`.
    pub fn upload<T: Element>(self: &Arc<Self>, data: &[T]) -> Result<DeviceBuffer<T>, CommError> {
        let mut buf = self.alloc_zeros::<T>(data.len())?;
        let stream = self.ctx.default_stream();
        let bytes = as_bytes(data);
        stream
            .memcpy_htod(bytes, &mut buf.slice_mut().slice_mut(..bytes.len()))
            .map_err(cuda_err(&self.label(), "copying to the device"))?;
        Ok(buf)
    }
}

/// The error for `bytes` of a buffer too short to view as `len` elements of `S` (which the size checks before rule
/// out).
fn unviewable<S>(label: &str, bytes: usize, len: usize) -> CommError {
    CommError::InvalidArgument {
        comm: label.to_owned(),
        what: format!(
            "the buffer's {bytes} bytes cannot be viewed as {len} elements of {} bytes",
            std::mem::size_of::<S>()
        ),
    }
}

/// `len` elements of `T` in device memory of one [`Gpu`]. Stream-ordered: using it on another stream (or dropping
/// it) waits for work already enqueued on it.
///
/// How the ordering is kept, cheaply: cudarc gives every allocation a read and a write event, and each use through
/// cudarc makes the stream wait on both and records one after (three driver calls). A collective does not need
/// them while the buffer stays on one stream, which is the common case (a communicator's stream, call after call):
/// the stream's own order covers it. So a collective takes the address through `DeviceBuffer::address_on`, which
/// goes through cudarc's events only when the stream changes, and otherwise remembers the stream as
/// `unrecorded`: work there that cudarc's events do not cover yet. Any later use through cudarc first records
/// them on that stream (or orders its own stream after it), and so does the release.
pub struct DeviceBuffer<T: Element> {
    pub(crate) gpu: Arc<Gpu>,
    /// At least `len * size_of::<T>()` bytes (one byte for an empty buffer: CUDA cannot allocate zero). Used
    /// through cudarc only via [`DeviceBuffer::slice_mut`] and [`DeviceBuffer::slice_after`].
    slice: CudaSlice<u8>,
    len: usize,
    /// The stream (and the buffer's address) of work that cudarc's events do not cover yet: a collective got the
    /// address through [`DeviceBuffer::address_on`]. `None`: cudarc's events cover every use.
    unrecorded: Option<(Arc<CudaStream>, u64)>,
    /// Set when cudarc used the buffer on another stream than `unrecorded`'s (a copy reading it, with `&self`),
    /// after which the next [`DeviceBuffer::address_on`] must not skip cudarc's events: they now hold that use.
    used_elsewhere: AtomicBool,
    _element: PhantomData<T>,
}

impl<T: Element> std::fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("dtype", &T::DTYPE)
            .field("len", &self.len)
            .field("device", &self.gpu.ordinal)
            .finish()
    }
}

impl<T: Element> DeviceBuffer<T> {
    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device it lives on.
    pub fn device(&self) -> usize {
        self.gpu.ordinal
    }

    /// The [`Gpu`] it lives on.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// The device address of the buffer for work the caller enqueues on `stream` itself: an NCCL call through
    /// [`DeviceCommunicator::with_raw_comm`](crate::device::DeviceCommunicator::with_raw_comm), a kernel of
    /// one's own. `stream` is ordered after every earlier use of the buffer, and every later use through
    /// hypercomm (an operation on another stream, a download, the release) is ordered after the work enqueued on
    /// `stream`.
    ///
    /// Free when the last use was on `stream` too (stream order covers it); otherwise `stream` waits on cudarc's
    /// events (after they are recorded for the previous stream's unrecorded work).
    ///
    /// The address is valid while the buffer lives. Enqueue the work on `stream` before the buffer is used on any
    /// other stream or dropped (holding `&mut self` until then ensures it), and read or write at most
    /// [`len`](Self::len) elements there.
    pub fn address_on(&mut self, stream: &Arc<CudaStream>) -> u64 {
        let elsewhere = std::mem::take(self.used_elsewhere.get_mut());
        if let Some((last, addr)) = &self.unrecorded
            && last.cu_stream() == stream.cu_stream()
            && !elsewhere
        {
            return *addr;
        }
        self.record_unrecorded();
        let (addr, guard) = self.slice.device_ptr_mut(stream);
        // The guard would record the write event now, before the work; instead the work stays unrecorded until
        // the next use through cudarc or the release records it (after the work, on the same stream).
        std::mem::forget(guard);
        self.unrecorded = Some((Arc::clone(stream), addr));
        addr
    }

    /// Records cudarc's events on the stream of the unrecorded work, so that they cover it.
    fn record_unrecorded(&mut self) {
        if let Some((stream, _)) = self.unrecorded.take() {
            // Waits on the old events (in stream order already) and records the write event when the guard drops.
            drop(self.slice.device_ptr_mut(&stream));
        }
    }

    /// The allocation for a use through cudarc that may write it (a kernel launch, a copy into it): cudarc's
    /// events cover every earlier use once this returns.
    pub(crate) fn slice_mut(&mut self) -> &mut CudaSlice<u8> {
        self.record_unrecorded();
        *self.used_elsewhere.get_mut() = false;
        &mut self.slice
    }

    /// The allocation for a use through cudarc on `stream` that only reads it: `stream` is ordered after the
    /// unrecorded work first (an event of the pool recorded there and waited on).
    pub(crate) fn slice_after(&self, stream: &CudaStream) -> Result<&CudaSlice<u8>, CommError> {
        if let Some((last, _)) = &self.unrecorded
            && last.cu_stream() != stream.cu_stream()
        {
            let event = self.gpu.take_event()?;
            let ordered = event.record(last).and_then(|()| stream.wait(&event));
            self.gpu.return_event(event);
            ordered.map_err(cuda_err(
                &self.gpu.label(),
                "ordering a stream after a buffer's last use",
            ))?;
            // cudarc records this read on `stream`; a later write on `last` must wait for it.
            self.used_elsewhere.store(true, Ordering::Relaxed);
        }
        Ok(&self.slice)
    }

    /// Bytes used by the elements.
    pub(crate) fn byte_len(&self) -> usize {
        self.len * T::DTYPE.size()
    }

    /// Copies `src`, device memory of this buffer's device that another cudarc user owns (a candle tensor's
    /// storage, say), into this buffer, enqueued on `stream` (no CPU block). `S` must have the element size of
    /// `T` and `src` exactly `len()` elements. Stream-ordered like every use of the buffer: a collective on it
    /// afterwards, on any stream, waits for the copy.
    pub fn copy_from_device<S: DeviceRepr>(
        &mut self,
        src: &CudaView<'_, S>,
        stream: &Arc<CudaStream>,
    ) -> Result<(), CommError> {
        self.check_foreign::<S>(src.len(), "copy_from_device source")?;
        if self.len == 0 {
            return Ok(());
        }
        let label = self.gpu.label();
        let (bytes, len) = (self.slice.len(), self.len);
        // SAFETY: the slice holds at least `len * T::DTYPE.size()` bytes, which is `len` elements of `S`
        // (same size, checked above); both are plain data, and the view only moves bytes.
        let mut dst = unsafe { self.slice_mut().transmute_mut::<S>(len) }
            .ok_or_else(|| unviewable::<S>(&label, bytes, len))?;
        stream
            .memcpy_dtod(src, &mut dst)
            .map_err(cuda_err(&label, "copying device memory into a buffer"))
    }

    /// Copies this buffer into `dst`, device memory of this buffer's device that another cudarc user owns,
    /// enqueued on `stream` (no CPU block); the copy waits for work on this buffer (a collective) first. `S`
    /// must have the element size of `T` and `dst` exactly `len()` elements.
    pub fn copy_to_device<S: DeviceRepr>(
        &self,
        dst: &mut CudaViewMut<'_, S>,
        stream: &Arc<CudaStream>,
    ) -> Result<(), CommError> {
        self.check_foreign::<S>(dst.len(), "copy_to_device destination")?;
        if self.len == 0 {
            return Ok(());
        }
        let label = self.gpu.label();
        // SAFETY: as in `copy_from_device`; the view is only read.
        let src = unsafe { self.slice_after(stream)?.transmute::<S>(self.len) }
            .ok_or_else(|| unviewable::<S>(&label, self.slice.len(), self.len))?;
        stream
            .memcpy_dtod(&src, dst)
            .map_err(cuda_err(&label, "copying a buffer into device memory"))
    }

    /// Elements the allocation holds: [`set_len`](Self::set_len) changes the length up to them without
    /// allocating.
    pub fn capacity(&self) -> usize {
        self.slice.len() / T::DTYPE.size()
    }

    /// Sets the length to `len` elements of the allocation, for reusing a buffer (a staging buffer, say) for a
    /// message of another size. Elements past the old length hold what the allocation last held (zeros if never
    /// written). Fails when `len` exceeds [`capacity`](Self::capacity).
    pub fn set_len(&mut self, len: usize) -> Result<(), CommError> {
        if len > self.capacity() {
            return Err(CommError::InvalidArgument {
                comm: self.gpu.label(),
                what: format!(
                    "length {len} exceeds the buffer's capacity of {} {} elements",
                    self.capacity(),
                    T::DTYPE
                ),
            });
        }
        self.len = len;
        Ok(())
    }

    /// Copies `len` bytes of `src`, from its byte `src_offset`, into this buffer at byte `dst_offset`, enqueued
    /// on `stream` (no CPU block). Stream-ordered like every use of either buffer: the copy waits for earlier work
    /// on both (a collective on another stream included), and later work on either, on any stream, waits for it.
    /// Offsets are in bytes whatever the element types, so that strided runs of a shard (one copy each) can
    /// be packed into a byte buffer and back; each copy is one `cuMemcpyDtoDAsync` plus cudarc's event waits and
    /// records, several microseconds of CPU time, so many small runs cost more than one kernel over them.
    ///
    /// Fails, enqueuing nothing, when `src` lives on another device or either range ends past its buffer.
    pub fn copy_range_from<S: Element>(
        &mut self,
        src: &DeviceBuffer<S>,
        src_offset: usize,
        dst_offset: usize,
        len: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<(), CommError> {
        let label = self.gpu.label();
        let invalid = |what: String| CommError::InvalidArgument {
            comm: label.clone(),
            what,
        };
        if src.device() != self.device() {
            return Err(invalid(format!(
                "copy_range_from: the source lives on device {}, this buffer on device {}",
                src.device(),
                self.device()
            )));
        }
        for (side, offset, bytes) in [
            ("source", src_offset, src.byte_len()),
            ("destination", dst_offset, self.byte_len()),
        ] {
            if offset.checked_add(len).is_none_or(|end| end > bytes) {
                return Err(invalid(format!(
                    "copy_range_from: {len} bytes from byte {offset} end past the {side}'s {bytes} bytes"
                )));
            }
        }
        if len == 0 {
            return Ok(());
        }
        let from = src.slice_after(stream)?.slice(src_offset..src_offset + len);
        let mut to = self.slice_mut().slice_mut(dst_offset..dst_offset + len);
        stream
            .memcpy_dtod(&from, &mut to)
            .map_err(cuda_err(&label, "copying a byte range between buffers"))
    }

    fn check_foreign<S>(&self, len: usize, what: &str) -> Result<(), CommError> {
        if std::mem::size_of::<S>() != T::DTYPE.size() || len != self.len {
            return Err(CommError::InvalidArgument {
                comm: self.gpu.label(),
                what: format!(
                    "{what}: {len} elements of {} bytes do not match a buffer of {} {} elements",
                    std::mem::size_of::<S>(),
                    self.len,
                    T::DTYPE
                ),
            });
        }
        Ok(())
    }

    /// Copies the buffer to the host, waiting for work on it to finish (blocks the CPU).
    pub fn download(&self) -> Result<Vec<T>, CommError> {
        let mut out = vec![T::default(); self.len];
        let stream = self.gpu.ctx.default_stream();
        let n = self.byte_len();
        stream
            .memcpy_dtoh(
                &self.slice_after(&stream)?.slice(..n),
                as_bytes_mut(&mut out),
            )
            .map_err(cuda_err(&self.gpu.label(), "copying to the host"))?;
        stream
            .synchronize()
            .map_err(cuda_err(&self.gpu.label(), "synchronizing the copy"))?;
        Ok(out)
    }
}

impl<T: Element> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        // The allocation is freed in its stream's order after cudarc's events: they must cover the last work.
        self.record_unrecorded();
    }
}
