//! Communicators for hypercomm: one [`Communicator`] face, flavors behind it.
//!
//! 1. Pick element types: anything implementing the sealed [`Element`] trait (`f32`, `f64`, `half::f16`,
//!    `half::bf16`, `i8`, `u8`, `i32`, `i64`, `u32`, `u64`, and the 8-bit floats `float8::F8E4M3` and
//!    `float8::F8E5M2`, which the host moves but reduces only on a device), and a [`ReduceOp`] for reducing
//!    collectives.
//! 2. Create a communicator collectively with [`Communicator::new`] (host memory only) or
//!    [`Communicator::with_gpu`] (host memory and one GPU's): a shared [`Store`](hypercomm_store::Store), the
//!    member list, this rank's id and [`CommOptions`]. Options a flavor cannot honour are rejected by name, never
//!    dropped.
//! 3. Issue operations. Each takes its buffers by value, a host `Vec<T>` or a
//!    [`DeviceBuffer<T>`](device::DeviceBuffer) (any [`Buffer`]), runs on the flavor the buffer's type names, and
//!    returns a [`Work`] handle that gives the same buffers back: [`Work::wait`] blocks until done,
//!    [`Work::wait_on`] orders a CUDA stream after a device operation instead. Several may be in flight; on one
//!    flavor they complete in issue order, except host sends and receives issued back to back, which progress
//!    together and complete each on its own. An [`OpGroup`] issues operations on one or several communicators
//!    together, on device buffers as one NCCL group.
//! 4. On failure, a dead or stalled rank makes every other rank's operations fail within the timeout with an error
//!    naming the communicator, its members and the missing ranks, all as member ids (the ids passed to
//!    [`Communicator::new`]); the communicator is then broken and [`Communicator::abort`] releases it. Ranks stopped
//!    by the news (a peer's abort, a peer that exited after its own error) report the root cause that peer
//!    recorded ([`CommError::lost_ranks`], [`CommError::root_cause`]); communicators that share a
//!    [`FailureDomain`] record one root cause per rank and abort together. On a GPU, each device's watchdog bounds
//!    every operation in flight by its communicator's timeout however it is waited for, and names the rank behind
//!    (see [`device`]).
//!
//! The flavors: the host one runs on CPU memory, shared memory on one machine and TCP across machines (see
//! `backends/host`); buffers allocated with [`Communicator::symmetric_buffer`] live in memory every rank on the
//! host has mapped, and the collectives over them read the peers' buffers in place (see [`symmetric`]). The NCCL
//! one runs on GPU memory (see [`device`] for probing, GPUs and device buffers); [`Communicator::nccl`] reaches it
//! for what only NCCL has. Every operation is described once (an internal `Op`), checked once on the face, and
//! executed by each flavor.

mod backend;
mod backends;
mod buffer;
mod checks;
mod communicator;
pub mod device;
mod element;
mod error;
mod failure;
pub mod host_buffer;
mod host_work;
mod member_ids;
mod nccl_options;
mod op;
mod options;
mod reduce;
mod shrink;
mod steps;
mod strided;
pub mod symmetric;
mod work;

pub use buffer::{Buffer, Location};
pub use communicator::batch::P2p;
pub use communicator::group::OpGroup;
pub use communicator::splits::Splits;
pub use communicator::{Communicator, InOut};
pub use element::{DType, Element, ReduceOp, Scalar, as_bytes, as_bytes_mut};
pub use error::{Call, CommError, Fault, RootCause};
pub use failure::FailureDomain;
pub use nccl_options::NcclOptions;
pub use options::{Algorithm, CommOptions};
pub use steps::{Step, StepHook};
pub use symmetric::SymmetricBuffer;
pub use work::Work;

/// Bytes each rank may read from its peers in one host all-reduce before the selector switches from the latency
/// path to the bandwidth path (with [`Algorithm::Auto`]).
pub const HOST_LATENCY_READ_LIMIT: usize = backends::host::LATENCY_READ_LIMIT;
