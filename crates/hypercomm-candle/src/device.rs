//! CUDA tensors on NCCL (feature `cuda`): the collectives of a [`TensorGroup`] for tensors on a CUDA device, as
//! device buffers on the group's communicator (which has a GPU in a collection built `with_gpu`).
//!
//! Each collective is a candle custom op, the public way to turn device memory into a tensor. Its CUDA forward
//! copies the (contiguous) input from candle's storage into a hypercomm device buffer on candle's stream, runs
//! the collective on the communicator's stream, and copies the result into new candle storage on candle's stream
//! again. Everything is stream-ordered, with no CPU wait and no trip through host memory: the communicator's
//! stream waits for the copy in, and candle's stream waits for the collective before the copy out, so candle's
//! next kernels see the result. The two device copies cost a little bandwidth (two passes over the data at
//! device-memory speed), and keep candle's storage and NCCL's buffers apart, which candle's immutable tensors
//! need anyway for a result.
//!
//! The element types are the host's ([`crate::host::SUPPORTED`]), each mapped to its Rust type once, in
//! [`for_dtype`]. f8e4m3 tensors need NCCL 2.24 or newer here (an older one refuses them, naming both versions)
//! and reduce, where the host only moves them.
//!
//! candle's `CudaDevice` and hypercomm's [`Gpu`](hypercomm_comm::device::Gpu) both retain the device's primary
//! context, so their memory and streams are interchangeable. A tensor on another device than the group's GPU is
//! an error naming both.
//!
//! Nothing here waits on the CPU, so nothing here bounds a collective whose peer never comes: the `Gpu`'s
//! watchdog does. Every collective these ops issue is watched like any device operation of the communicator;
//! past the group's timeout (or on an asynchronous NCCL error) the watchdog stops the communicator and every
//! communicator of the collection, candle's stream (ordered after the collective) goes on with undefined data in
//! that result, and the next collective, sync or host operation on any group fails with the recorded cause,
//! naming the rank behind where the ranks' progress shows one. Reading a tensor back to the host (`to_vec1`, a
//! loss value) blocks at most that long (the timeout, then the ranks' comparison of their progress) and is no
//! error: it returns the undefined values. So when a peer never joins an all-reduce (past the group's first
//! collective, which connects the peers: that one's enqueue waits for every rank, and is itself the timeout),
//! the all-reduce returns its tensor at once, a read of it returns after the timeout, and the group's next
//! collective is the [`Error::Comm`] whose [`CommError::Broken`] carries the timeout, naming the rank
//! (`rank(s) [1] did not respond within ..`); the collection's failure domain holds it as the root cause
//! (`FailureDomain::root_cause`, ranks by their world ranks). `crates/hypercomm-candle/tests/gpu.rs` checks this
//! for a tensor all-reduce and for [`GradSync`](crate::GradSync).
//!
//! A failure inside the op comes back as this crate's [`Error`] (typed: [`Error::Comm`] for the communicator's),
//! not as candle's text of it: candle passes a custom op's error out only as text, so the op keeps the error
//! for [`collective`] to return.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, ValidAsZeroBits};
use candle_core::cuda_backend::{CudaDType, CudaDevice, CudaStorage};
use candle_core::{CpuStorage, CustomOp1, DType, DeviceLocation, Layout, Shape, Tensor};
use float8::F8E4M3;
use half::{bf16, f16};
use hypercomm_comm::{CommError, Communicator, Element};

use crate::error::OpFailure;
use crate::host::SUPPORTED;
use crate::kind::Kind;
use crate::{Error, Result, TensorGroup};

/// The collective as a custom op with a CUDA forward only (no gradient: the callers that need one, the
/// tensor-parallel ops, define their own).
struct DeviceCollective {
    group: TensorGroup,
    kind: Kind,
    /// The result's shape.
    shape: Shape,
    /// Where a failed forward leaves its error.
    failure: OpFailure,
}

/// Runs `kind` on the CUDA tensor `t` (any layout: it is made contiguous first) and returns the result with
/// `shape`.
pub(crate) fn collective(
    group: &TensorGroup,
    t: &Tensor,
    kind: Kind,
    shape: Shape,
) -> Result<Tensor> {
    check_dtype(t.dtype(), kind.op(), group.name())?;
    let op = DeviceCollective {
        group: group.clone(),
        kind,
        shape,
        failure: OpFailure::default(),
    };
    // The forward's own error, typed, rather than candle's text of it.
    t.contiguous()?
        .apply_op1_no_bwd(&op)
        .map_err(|e| op.failure.take_or(e))
}

/// An element type that candle's CUDA storage and a hypercomm device buffer share.
pub(crate) trait CudaElement: Element + CudaDType + DeviceRepr + ValidAsZeroBits {}

impl<T: Element + CudaDType + DeviceRepr + ValidAsZeroBits> CudaElement for T {}

/// Work written once for every element type, which [`for_dtype`] runs with the type of a runtime dtype.
pub(crate) trait Typed {
    /// What the work gives back.
    type Out;
    /// Runs the work on elements of type `T`.
    fn run<T: CudaElement>(self) -> Result<Self::Out>;
}

/// Runs `work` with the element type of `dtype`: the one map from candle's dtypes to the element types a device
/// buffer carries (those of [`crate::host::SUPPORTED`]). Any other dtype is the error naming it.
pub(crate) fn for_dtype<W: Typed>(
    dtype: DType,
    op: &'static str,
    group: &str,
    work: W,
) -> Result<W::Out> {
    match dtype {
        DType::U8 => work.run::<u8>(),
        DType::U32 => work.run::<u32>(),
        DType::I32 => work.run::<i32>(),
        DType::I64 => work.run::<i64>(),
        DType::F16 => work.run::<f16>(),
        DType::BF16 => work.run::<bf16>(),
        DType::F8E4M3 => work.run::<F8E4M3>(),
        DType::F32 => work.run::<f32>(),
        DType::F64 => work.run::<f64>(),
        dtype => Err(Error::UnsupportedDType {
            op,
            group: group.to_owned(),
            dtype,
            supported: SUPPORTED,
        }),
    }
}

/// Why a device buffer cannot carry `dtype`, if it cannot.
fn check_dtype(dtype: DType, op: &'static str, group: &str) -> Result<()> {
    /// Work that only asks whether the type exists.
    struct Carried;
    impl Typed for Carried {
        type Out = ();
        fn run<T: CudaElement>(self) -> Result<()> {
            Ok(())
        }
    }
    for_dtype(dtype, op, group, Carried)
}

impl CustomOp1 for DeviceCollective {
    fn name(&self) -> &'static str {
        "hypercomm-device-collective"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        candle_core::bail!(
            "hypercomm: the device collective got a cpu tensor (cpu tensors go through the host backend)"
        )
    }

    fn cuda_fwd(
        &self,
        storage: &CudaStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        self.failure
            .keep(cuda_fwd(&self.group, self.kind, storage, layout))
            .map(|s| (s, self.shape.clone()))
    }
}

/// The CUDA forward of a collective on `storage` read through the contiguous `layout`: the result's storage.
/// Shared by [`DeviceCollective`] and the tensor-parallel ops.
pub(crate) fn cuda_fwd(
    group: &TensorGroup,
    kind: Kind,
    storage: &CudaStorage,
    layout: &Layout,
) -> Result<CudaStorage> {
    let Some((start, end)) = layout.contiguous_offsets() else {
        return Err(Error::Shape {
            op: kind.op(),
            group: group.name().to_owned(),
            what: format!("a device collective got a non-contiguous input ({layout:?})"),
        });
    };
    let run = Run {
        group,
        kind,
        storage,
        start,
        end,
    };
    for_dtype(storage.dtype(), kind.op(), group.name(), run)
}

/// One collective on one group, for [`cuda_fwd`]: elements `start..end` of `storage` in.
struct Run<'a> {
    group: &'a TensorGroup,
    kind: Kind,
    storage: &'a CudaStorage,
    start: usize,
    end: usize,
}

impl Run<'_> {
    fn comm_error(&self, source: CommError) -> Error {
        self.group.comm_error(source)
    }
}

impl Typed for Run<'_> {
    type Out = CudaStorage;

    /// Copy in, collective, copy out, all enqueued on the streams (see the module docs).
    fn run<T: CudaElement>(self) -> Result<CudaStorage> {
        let comm = self.group.comm()?;
        let dev: &CudaDevice = self.storage.device();
        let gpu = check_same_device(self.group, comm, self.kind.op(), dev)?;
        let stream = dev.cuda_stream();
        let n = self.end - self.start;
        let src = self
            .storage
            .as_cuda_slice::<T>()?
            .slice(self.start..self.end);
        let mut input = gpu.alloc_zeros::<T>(n).map_err(|e| self.comm_error(e))?;
        input
            .copy_from_device(&src, &stream)
            .map_err(|e| self.comm_error(e))?;
        let size = comm.size();
        let result = match self.kind {
            Kind::AllReduce(op) => comm.all_reduce(input, op).and_then(|w| w.wait_on(&stream)),
            Kind::Broadcast(root) => comm.broadcast(input, root).and_then(|w| w.wait_on(&stream)),
            Kind::AllGather => gpu.alloc_zeros::<T>(n * size).and_then(|out| {
                comm.all_gather_into(input, out)
                    .and_then(|w| w.wait_on(&stream))
                    .map(|(_, out)| out)
            }),
            Kind::ReduceScatter(op) => gpu.alloc_zeros::<T>(n / size).and_then(|out| {
                comm.reduce_scatter_into(input, out, op)
                    .and_then(|w| w.wait_on(&stream))
                    .map(|(_, out)| out)
            }),
        }
        .map_err(|e| self.comm_error(e))?;
        let mut out = dev.alloc_zeros::<T>(result.len())?;
        result
            .copy_to_device(&mut out.slice_mut(..), &stream)
            .map_err(|e| self.comm_error(e))?;
        Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
    }
}

/// The tensor's device must be the communicator's GPU; returns that GPU.
pub(crate) fn check_same_device<'c>(
    group: &TensorGroup,
    comm: &'c Communicator,
    op: &'static str,
    dev: &CudaDevice,
) -> Result<&'c std::sync::Arc<hypercomm_comm::device::Gpu>> {
    let Some(gpu) = comm.gpu() else {
        return Err(Error::UnsupportedDevice {
            op,
            group: group.name().to_owned(),
            device: "a cuda device".into(),
            why: "the group's communicator has no gpu; build its collection with_gpu".into(),
        });
    };
    let DeviceLocation::Cuda { gpu_id } = candle_core::backend::BackendDevice::location(dev) else {
        return Err(Error::UnsupportedDevice {
            op,
            group: group.name().to_owned(),
            device: "a non-cuda device".into(),
            why: "the device collective serves cuda tensors".into(),
        });
    };
    if gpu_id != gpu.ordinal() {
        return Err(Error::UnsupportedDevice {
            op,
            group: group.name().to_owned(),
            device: format!("cuda:{gpu_id}"),
            why: format!("the group's communicator is on cuda:{}", gpu.ordinal()),
        });
    }
    Ok(gpu)
}
