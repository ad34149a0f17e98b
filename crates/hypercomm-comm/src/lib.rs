//! Communicators for hypercomm: one [`Communicator`] face, backends behind it.
//!
//! 1. Pick element types: anything implementing the sealed [`Element`] trait (`f32`, `f64`, `half::f16`,
//!    `half::bf16`, `i8`, `u8`, `i32`, `i64`, `u32`, `u64`), and a [`ReduceOp`] for reducing collectives.
//! 2. Create a communicator collectively with [`Communicator::new`]: a [`BackendKind`], a shared
//!    [`Store`](hypercomm_store::Store), the member list, this rank's id and [`CommOptions`]. Options a backend
//!    cannot honour are rejected by name, never dropped.
//! 3. Issue collectives. Each takes its buffers by value and returns a [`Work`] handle whose
//!    [`wait`](Work::wait) gives them back; several may be in flight and they complete in issue order.
//! 4. On failure, a dead or stalled rank makes every other rank's operations fail within the timeout with an error
//!    naming the communicator, its members and the missing ranks, all as member ids (the ids passed to
//!    [`Communicator::new`]); the communicator is then broken and [`Communicator::abort`] releases it. Ranks stopped
//!    by the news (a peer's abort, a peer that exited after its own error) report the root cause that peer
//!    recorded ([`CommError::lost_ranks`], [`CommError::root_cause`]); communicators that share a
//!    [`FailureDomain`] record one root cause per rank and abort together.
//!
//! The host backend runs on CPU memory: shared memory on one machine, TCP across machines. See `backends/host`.
//! Buffers allocated with [`Communicator::symmetric_buffer`] live in memory every rank on the host has mapped, and
//! the collectives over them read the peers' buffers in place (see [`symmetric`]).
//! The NCCL backend runs on GPU memory; its face is [`device`], and [`device::ProcessGroup`] routes each
//! collective to the host or the device communicator by where its buffer lives.

mod backend;
mod backends;
// Measuring code shared by the `hypercomm bench` command and `benches/`, not part of the library's face: public so
// those two can reach it, hidden from the docs so users do not build on it.
#[doc(hidden)]
pub mod bench;
mod checks;
mod communicator;
pub mod device;
mod element;
mod error;
mod failure;
pub mod host_buffer;
mod nccl_options;
mod options;
mod reduce;
mod shrink;
mod steps;
mod strided;
pub mod symmetric;
mod work;

pub use communicator::{Communicator, InOut, Splits};
pub use element::{DType, Element, ReduceOp, as_bytes, as_bytes_mut};
pub use error::{Call, CommError, Fault, RootCause};
pub use failure::FailureDomain;
pub use nccl_options::NcclOptions;
pub use options::{Algorithm, BackendKind, CommOptions};
pub use steps::{Step, StepHook};
pub use symmetric::SymmetricBuffer;
pub use work::Work;

/// Bytes each rank may read from its peers in one host all-reduce before the selector switches from the latency
/// path to the bandwidth path (with [`Algorithm::Auto`]).
pub const HOST_LATENCY_READ_LIMIT: usize = backends::host::LATENCY_READ_LIMIT;
