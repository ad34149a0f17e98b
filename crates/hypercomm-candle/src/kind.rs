//! [`Kind`]: which collective a tensor collective runs, shared by the host path, the device path and the
//! tensor-parallel ops.

use hypercomm_comm::ReduceOp;

/// Which collective a device collective runs, on a flat input of `n` elements (read only by the `cuda`
/// feature's device path).
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) enum Kind {
    /// In place: `n` elements out.
    AllReduce(ReduceOp),
    /// In place from group rank `root`: `n` elements out.
    Broadcast(usize),
    /// `n * size` elements out, rank blocks in order.
    AllGather,
    /// The input holds `size` blocks; `n / size` elements out.
    ReduceScatter(ReduceOp),
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
impl Kind {
    pub(crate) fn op(self) -> &'static str {
        match self {
            Kind::AllReduce(_) => "all_reduce",
            Kind::Broadcast(_) => "broadcast",
            Kind::AllGather => "all_gather",
            Kind::ReduceScatter(_) => "reduce_scatter",
        }
    }
}
