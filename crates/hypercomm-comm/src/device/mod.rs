//! GPUs and device memory: what a [`Communicator`](crate::Communicator) needs to run operations on a GPU.
//!
//! 1. [`DeviceRuntime::probe`] once per process: a driver, a device and an NCCL, or
//!    [`CommError::Unavailable`](crate::CommError::Unavailable) saying which is missing. Nothing panics on a
//!    machine without a GPU.
//! 2. [`Gpu::open`] a device; allocate [`DeviceBuffer`]s on it ([`Gpu::alloc_zeros`], [`Gpu::upload`]).
//! 3. [`Communicator::with_gpu`](crate::Communicator::with_gpu) over a store, ranks and
//!    [`CommOptions`](crate::CommOptions), or a collection built `with_gpu`: every NCCL knob of the options is
//!    honoured or refused by name.
//! 4. Call the communicator's operations with device buffers, exactly as with host vectors; each returns a
//!    [`Work`](crate::Work) whose `wait_on(&stream)` orders a stream after it and whose `wait()` blocks the CPU.
//! 5. For what only NCCL has, [`Communicator::nccl`](crate::Communicator::nccl) gives the [`DeviceCommunicator`]:
//!    its stream, a health check, the strided all-reduce ([`StridedLayout`], packed and unpacked by kernels), and
//!    for calls hypercomm does not make, the raw NCCL communicator
//!    ([`DeviceCommunicator::with_raw_comm`], with [`DeviceBuffer::address_on`] for the buffers' addresses).
//!
//! 6. Nothing hangs silently: each GPU's watchdog thread watches every operation in flight, however it is
//!    waited for, and past the communicator's timeout (or on an asynchronous NCCL error) stops the communicator
//!    and every communicator of its failure domain, with an error naming the rank behind where the ranks'
//!    progress shows one. [`DeviceCommunicator::flight_record`] gives the last operations ([`FlightRecord`]),
//!    also written as JSON when a communicator breaks ([`FLIGHT_RECORDER_DIR_ENV`]).
//!
//! Several ranks on one machine: [`placement`] gives each rank its device, one each where there are enough, and
//! says what is missing when there are not (several ranks per GPU need NCCL [`MULTI_RANK_GPU_VERSION`]).
//!
//! `hypercomm bench --backend nccl` (the `hypercomm-bench` crate) measures bandwidth per size and the host time
//! each call costs against calling NCCL directly. What has run on a GPU, and with which NCCL, is in
//! `docs/gpu-validation.md`.

pub use crate::backends::nccl::DeviceRuntime;
pub use crate::backends::nccl::communicator::DeviceCommunicator;
pub use crate::backends::nccl::flight::{
    DEFAULT_FLIGHT_RECORDER_LEN, FLIGHT_RECORDER_DIR_ENV, FlightEntry, FlightRecord, OpState,
};
pub use crate::backends::nccl::gpu::{DeviceBuffer, Gpu};
pub use crate::backends::nccl::placement::{MULTI_RANK_GPU_VERSION, placement};
pub use crate::backends::nccl::probe::{DriverInfo, MIN_DRIVER_VERSION};
pub use crate::strided::StridedLayout;
