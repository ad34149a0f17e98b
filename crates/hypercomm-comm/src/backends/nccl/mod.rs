//! The NCCL flavor of a [`Communicator`](crate::Communicator): operations on GPU memory, through cudarc (contexts, streams, events, buffers, NVRTC) and
//! `nccl-sys` (the runtime-loaded NCCL API).
//!
//! Layers, as in cudarc: [`raw`] is every NCCL call as a `Result` (all the `unsafe` NCCL calls are there);
//! [`comm`] owns one communicator (serialised calls, polling, abort on timeout, release on drop), and [`abort`]
//! frees one its owner let go of, alone or in one NCCL group with others; the rest is safe code. Using it:
//!
//! 1. [`probe::DeviceRuntime::probe`]: is there a driver, a device, an NCCL? Any "no" is
//!    [`CommError::Unavailable`](crate::CommError::Unavailable); nothing panics.
//! 2. [`gpu::Gpu::open`]: a device, its event pool and its kernel cache; [`gpu::DeviceBuffer`]s live on it.
//! 3. [`communicator::DeviceCommunicator::new`], called by the face's one constructor: the unique id goes
//!    through the store ([`unique_id`]); the options become an `ncclConfig_t` and a stream priority ([`config`]).
//! 4. The face hands each checked operation to the executor in `communicator/collectives.rs`, which turns it into
//!    NCCL calls; the handle ([`communicator::DeviceWork`], inside the public `Work`) orders a stream after it or
//!    blocks until it is done.
//! 5. Every operation is numbered in its communicator's flight recorder ([`flight`]) and watched by its GPU's
//!    [`watchdog`] until it completes, whichever way its user waits: a timeout or an asynchronous error stops
//!    the communicator and its failure domain, naming the rank behind where the ranks' progress shows one
//!    ([`behind`]).

pub(crate) mod abort;
pub(crate) mod backoff;
pub(crate) mod behind;
pub(crate) mod comm;
pub(crate) mod communicator;
pub(crate) mod config;
pub(crate) mod events;
pub(crate) mod flight;
pub(crate) mod gpu;
pub(crate) mod placement;
pub(crate) mod probe;
pub(crate) mod progress;
pub(crate) mod raw;
pub(crate) mod unique_id;
pub(crate) mod waits;
pub(crate) mod watchdog;

pub use probe::DeviceRuntime;
