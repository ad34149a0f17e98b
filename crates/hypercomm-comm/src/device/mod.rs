//! Collectives on GPU memory, and routing between host and device communicators.
//!
//! 1. [`DeviceRuntime::probe`] once per process: a driver, a device and an NCCL, or
//!    [`CommError::Unavailable`](crate::CommError::Unavailable) saying which is missing. Nothing panics on a
//!    machine without a GPU.
//! 2. [`Gpu::open`] a device; allocate [`DeviceBuffer`]s on it ([`Gpu::alloc_zeros`], [`Gpu::upload`]).
//! 3. [`DeviceCommunicator::new`] over the same store, ranks and [`CommOptions`](crate::CommOptions) as a host
//!    communicator; every NCCL knob of the options is honoured or refused by name.
//! 4. Issue collectives; each returns a [`DeviceWork`] whose `wait(stream)` orders a stream after it and whose
//!    `synchronize()` blocks the CPU. Strided views ([`StridedLayout`]) are packed and unpacked by kernels.
//! 5. Measure with [`bench`](mod@bench) (`hypercomm bench --backend nccl`): bandwidth per size, and the host time each
//!    call costs against calling NCCL directly.
//! 6. Or hold both in a [`ProcessGroup`], which sends host buffers to the host communicator and device buffers to
//!    NCCL (PyTorch's `cpu:gloo,cuda:nccl`).
//!
//! What has run where: the translation, probing, routing and layout logic is tested on machines without a GPU;
//! the NCCL and CUDA paths are written against cudarc 0.19 and NCCL 2.28 but have not yet run on a GPU (see
//! `docs/gpu-validation.md`).

mod routing;

pub use crate::backends::nccl::DeviceRuntime;
pub use crate::backends::nccl::bench;
pub use crate::backends::nccl::communicator::{DeviceCommunicator, DeviceInOut, DeviceWork};
pub use crate::backends::nccl::gpu::{DeviceBuffer, Gpu};
pub use crate::backends::nccl::probe::{DriverInfo, MIN_DRIVER_VERSION};
pub use crate::strided::StridedLayout;
pub use routing::{
    DeviceSide, GroupWork, Location, OneBufWork, Placed, PlacedBuf, ProcessGroup, Route,
    TwoBufWork, route,
};
