//! Backends behind the one [`Communicator`](crate::Communicator) face.
//!
//! - [`host`]: CPU memory; shared memory between ranks on one machine, TCP otherwise.
//! - [`nccl`]: GPU memory through NCCL; its public face is [`crate::device`].

pub(crate) mod host;
pub(crate) mod nccl;
