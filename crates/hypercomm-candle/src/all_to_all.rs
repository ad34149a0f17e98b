//! [`TensorGroup::all_to_all_v`]: an all-to-all with per-rank split sizes along dimension 0, as PyTorch's
//! `all_to_all_single` with input and output split sizes. It is expert parallelism's token dispatch and combine:
//! each rank sends every expert's rank the rows (tokens) routed to it, and gets the results back the same way.
//!
//! Rank `r` cuts its input's rows into `send_splits[0]`, `send_splits[1]`, .. rows for group ranks 0, 1, ..; its
//! result is the rows from ranks 0, 1, .. back to back, `recv_splits[s]` of them from rank `s`. Every rank's
//! `send_splits[d]` must equal rank `d`'s `recv_splits` entry for it (MoE layers exchange their token counts
//! first, with an all-to-all of equal splits). Splits may be zero, and so may a whole input or result.
//!
//! Unlike the other tensor collectives, this one is differentiable: the all-to-all is its own adjoint with the
//! splits swapped, so the gradient of the result flows back through the reverse all-to-all (as Megatron's
//! `all_to_all` autograd function does). That backward is collective too: every rank of the group runs its
//! backward pass through the same all-to-alls in the same order, which ranks building the same graph do.
//!
//! CPU tensors go through the group's communicator as host vectors; CUDA tensors (feature `cuda`) as device
//! buffers, stream-ordered on candle's stream (copied in, exchanged by NCCL, copied out).

use candle_core::{CpuStorage, CustomOp1, Layout, Shape, Tensor};

use crate::collectives::on_device;
use crate::error::OpFailure;
use crate::host::{HostBuf, Pending};
use crate::{Error, Result, TensorGroup};

const OP: &str = "all_to_all_v";

impl TensorGroup {
    /// All-to-all with split sizes along dim 0 (see the module docs): the result holds `recv_splits[s]` rows from
    /// each group rank `s`, in rank order, each row shaped as `t`'s. `send_splits` and `recv_splits` have one entry
    /// per group rank, and `send_splits` sums to `t`'s rows; otherwise nothing is sent and the error names the
    /// splits. Differentiable: the gradient goes back through the reverse all-to-all.
    ///
    /// When the ranks' splits disagree, host tensors fail on every rank with the communicator's mismatch error;
    /// NCCL does not check, so CUDA tensors show an NCCL error or the communicator's timeout.
    pub fn all_to_all_v(
        &self,
        t: &Tensor,
        send_splits: &[usize],
        recv_splits: &[usize],
    ) -> Result<Tensor> {
        let dims = t.dims();
        let Some((&rows, row)) = dims.split_first() else {
            return Err(
                self.argument_error(OP, "a scalar has no dim 0 to split into rows".to_owned())
            );
        };
        let size = self.size();
        for (name, splits) in [("send_splits", send_splits), ("recv_splits", recv_splits)] {
            if splits.len() != size {
                return Err(self.argument_error(
                    OP,
                    format!(
                        "{name} {splits:?} has {} entries, but the group has {size} ranks (one entry per rank)",
                        splits.len()
                    ),
                ));
            }
        }
        let sent: usize = send_splits.iter().sum();
        if sent != rows {
            return Err(self.argument_error(
                OP,
                format!(
                    "send_splits {send_splits:?} sum to {sent} rows, but the tensor has {rows} (shape {:?})",
                    t.shape()
                ),
            ));
        }
        // A CUDA tensor's dtype is checked by the device path, whose error comes back typed all the same.
        if !on_device(t) {
            crate::host::check_tensor(t, OP, self.name())?;
        }
        let mut out_dims = dims.to_vec();
        out_dims[0] = recv_splits.iter().sum();
        let failure = OpFailure::default();
        let op = AllToAllV {
            group: self.clone(),
            send_rows: send_splits.to_vec(),
            recv_rows: recv_splits.to_vec(),
            row_len: row.iter().product(),
            out_shape: out_dims.into(),
            failure: failure.clone(),
        };
        // The forward's own error, typed, rather than candle's text of it.
        t.contiguous()?
            .apply_op1(op)
            .map_err(|e| failure.take_or(e))
    }
}

/// The all-to-all as a candle custom op, so that candle's autograd runs the reverse one backward.
struct AllToAllV {
    group: TensorGroup,
    send_rows: Vec<usize>,
    recv_rows: Vec<usize>,
    /// Elements per row: the product of the dims after the first.
    row_len: usize,
    out_shape: Shape,
    /// Where a failed forward leaves its error.
    failure: OpFailure,
}

impl AllToAllV {
    /// Element counts per rank for `rows` rows per rank.
    fn counts(&self, rows: &[usize]) -> Vec<usize> {
        rows.iter().map(|r| r * self.row_len).collect()
    }

    /// `result` for candle, keeping its error for [`TensorGroup::all_to_all_v`].
    fn keep<S>(&self, result: Result<S>) -> candle_core::Result<(S, Shape)> {
        self.failure
            .keep(result)
            .map(|storage| (storage, self.out_shape.clone()))
    }

    fn host(&self, storage: &CpuStorage, layout: &Layout) -> Result<CpuStorage> {
        let buf = HostBuf::from_storage(storage, layout)?;
        let out = buf
            .all_to_all_v(
                self.group.comm()?,
                self.counts(&self.send_rows),
                self.counts(&self.recv_rows),
            )
            .and_then(Pending::wait)
            .map_err(|e| self.group.comm_error(e))?;
        Ok(out.into_storage())
    }
}

impl CustomOp1 for AllToAllV {
    fn name(&self) -> &'static str {
        "hypercomm-all-to-all-v"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        self.keep(self.host(storage, layout))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        self.keep(cuda::all_to_all_v(
            &self.group,
            storage,
            layout,
            self.counts(&self.send_rows),
            self.counts(&self.recv_rows),
        ))
    }

    fn bwd(
        &self,
        _arg: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        self.group
            .all_to_all_v(grad_res, &self.recv_rows, &self.send_rows)
            .map(Some)
            .map_err(Error::into_candle)
    }
}

/// CUDA tensors (feature `cuda`): the all-to-all on device buffers, stream-ordered on candle's stream.
#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::Layout;
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::{CudaDevice, CudaStorage};

    use super::OP;
    use crate::device::{CudaElement, Typed, check_same_device, for_dtype};
    use crate::{Result, TensorGroup};

    /// The all-to-all of `storage` read through the contiguous `layout`, with element counts per rank.
    pub(super) fn all_to_all_v(
        group: &TensorGroup,
        storage: &CudaStorage,
        layout: &Layout,
        send_counts: Vec<usize>,
        recv_counts: Vec<usize>,
    ) -> Result<CudaStorage> {
        let Some((start, end)) = layout.contiguous_offsets() else {
            return Err(group.argument_error(
                OP,
                format!("the device all-to-all got a non-contiguous input ({layout:?})"),
            ));
        };
        let run = Run {
            group,
            storage,
            start,
            end,
            send_counts,
            recv_counts,
        };
        for_dtype(storage.dtype(), OP, group.name(), run)
    }

    /// One all-to-all: elements `start..end` of `storage`, counts per rank.
    struct Run<'a> {
        group: &'a TensorGroup,
        storage: &'a CudaStorage,
        start: usize,
        end: usize,
        send_counts: Vec<usize>,
        recv_counts: Vec<usize>,
    }

    impl Typed for Run<'_> {
        type Out = CudaStorage;

        /// Copy in, all-to-all, copy out, all enqueued on the streams (as `crate::device` does).
        fn run<T: CudaElement>(self) -> Result<CudaStorage> {
            let comm_error = |e| self.group.comm_error(e);
            let comm = self.group.comm()?;
            let dev: &CudaDevice = self.storage.device();
            let gpu = check_same_device(self.group, comm, OP, dev)?;
            let stream = dev.cuda_stream();
            let src = self
                .storage
                .as_cuda_slice::<T>()?
                .slice(self.start..self.end);
            let mut input = gpu
                .alloc_zeros::<T>(self.end - self.start)
                .map_err(comm_error)?;
            input.copy_from_device(&src, &stream).map_err(comm_error)?;
            let total: usize = self.recv_counts.iter().sum();
            let output = gpu.alloc_zeros::<T>(total).map_err(comm_error)?;
            let (_, output) = comm
                .all_to_all_v(input, self.send_counts, output, self.recv_counts)
                .and_then(|work| work.wait_on(&stream))
                .map_err(comm_error)?;
            // At least one element: CUDA refuses an empty allocation, and the op's shape says how many of the
            // storage's elements the result has.
            let mut out = dev.alloc_zeros::<T>(total.max(1))?;
            output
                .copy_to_device(&mut out.slice_mut(..total), &stream)
                .map_err(comm_error)?;
            Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
        }
    }
}

#[cfg(test)]
mod tests;
