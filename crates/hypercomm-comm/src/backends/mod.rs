//! Backends behind the one [`Communicator`](crate::Communicator) face.
//!
//! - [`host`]: CPU memory; shared memory between ranks on one machine, TCP otherwise.

pub(crate) mod host;
