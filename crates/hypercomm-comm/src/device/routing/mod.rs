//! [`ProcessGroup`]: one host communicator and, when a GPU is present, one device communicator over the same
//! ranks; each collective runs where its buffer lives (PyTorch's `cpu:gloo,cuda:nccl`).
//!
//! - [`location`]: where a buffer lives and which half runs a collective on it ([`route`]);
//! - [`side`]: the device half as a trait ([`DeviceSide`]), so the routing is tested with a fake device;
//! - [`group`]: the process group itself and its pending work.
//!
//! What `wait` means, once for both halves: on a host [`Work`](crate::Work), `wait` blocks until the collective is
//! done; on a [`DeviceWork`](crate::device::DeviceWork), `wait(stream)` orders `stream` after the collective
//! without blocking the CPU, and `synchronize()` blocks. [`GroupWork::synchronize`] blocks for either half.

mod group;
mod location;
mod side;
#[cfg(test)]
mod tests;

pub use group::{GroupWork, OneBufWork, Placed, PlacedBuf, ProcessGroup, TwoBufWork};
pub use location::{Location, Route, route};
pub use side::DeviceSide;
