//! Megatron's conjugate operations at the edges of a tensor-parallel region, as candle custom ops.
//!
//! - [`copy_to_tp_region`]: identity forward, all-reduce (sum) of the gradient backward. Put it where a
//!   replicated activation enters a column-parallel layer: each rank's shard contributes a part of the input's
//!   gradient, and the parts must be summed.
//! - [`reduce_from_tp_region`]: all-reduce (sum) forward, identity backward. Put it where a row-parallel layer's
//!   partial products leave: the sum is the full product, and its gradient is already replicated.
//!
//! candle runs a custom op's forward and backward on the calling thread, in the order its graph dictates; the
//! graph is the same on every rank of the group, so every rank issues the same collectives in the same order and
//! none waits on a collective the others never issue. A group of one rank needs no op: both are the identity.

use candle_core::{CpuStorage, CustomOp1, Layout, Shape, Tensor};
use hypercomm_comm::ReduceOp;

use crate::TensorGroup;
use crate::host::HostBuf;

struct CopyToTp {
    group: TensorGroup,
}

struct ReduceFromTp {
    group: TensorGroup,
}

impl CustomOp1 for CopyToTp {
    fn name(&self) -> &'static str {
        "hypercomm-copy-to-tp-region"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let buf = HostBuf::from_storage(storage, layout)?;
        Ok((buf.into_storage(), layout.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::backend::{BackendDevice, BackendStorage};
        // Identity: a contiguous copy on the device.
        let mut out = storage
            .device()
            .zeros_impl(layout.shape(), storage.dtype())?;
        storage.copy_strided_src(&mut out, 0, layout)?;
        Ok((out, layout.shape().clone()))
    }

    fn bwd(
        &self,
        _arg: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        self.group
            .all_reduce(grad_res, ReduceOp::Sum)
            .map(Some)
            .map_err(crate::Error::into_candle)
    }
}

impl CustomOp1 for ReduceFromTp {
    fn name(&self) -> &'static str {
        "hypercomm-reduce-from-tp-region"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let buf = HostBuf::from_storage(storage, layout)?;
        let comm = self.group.comm().map_err(crate::Error::into_candle)?;
        let reduced = buf
            .all_reduce(comm, ReduceOp::Sum)
            .and_then(|pending| pending.wait())
            .map_err(|source| self.group.comm_error(source).into_candle())?;
        Ok((reduced.into_storage(), layout.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        crate::device::cuda_fwd(
            &self.group,
            crate::kind::Kind::AllReduce(ReduceOp::Sum),
            storage,
            layout,
        )
        .map(|s| (s, layout.shape().clone()))
        .map_err(crate::Error::into_candle)
    }

    fn bwd(
        &self,
        _arg: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(grad_res.clone()))
    }
}

/// Identity forward, all-reduce (sum) over `group` of the gradient backward. Collective in the backward pass.
pub fn copy_to_tp_region(x: &Tensor, group: &TensorGroup) -> candle_core::Result<Tensor> {
    if group.size() == 1 {
        return Ok(x.clone());
    }
    crate::host::check_tensor(x, "copy_to_tp_region", group.name())
        .map_err(crate::Error::into_candle)?;
    x.contiguous()?.apply_op1(CopyToTp {
        group: group.clone(),
    })
}

/// All-reduce (sum) over `group` forward, identity backward. Collective in the forward pass.
pub fn reduce_from_tp_region(x: &Tensor, group: &TensorGroup) -> candle_core::Result<Tensor> {
    if group.size() == 1 {
        return Ok(x.clone());
    }
    crate::host::check_tensor(x, "reduce_from_tp_region", group.name())
        .map_err(crate::Error::into_candle)?;
    x.contiguous()?.apply_op1(ReduceFromTp {
        group: group.clone(),
    })
}
