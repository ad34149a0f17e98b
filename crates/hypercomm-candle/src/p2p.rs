//! Point-to-point on tensors: [`TensorGroup::send`], [`TensorGroup::recv`], and [`TensorGroup::exchange`], which
//! runs several sends and receives ([`TensorP2p`]) to and from several peers as one operation, as PyTorch's
//! `batch_isend_irecv` does.
//!
//! Pipeline parallelism is what the exchange is for: a stage sends its activations to the next stage while it
//! receives a gradient from it, or sends a gradient to the previous stage while it receives the next micro-batch's
//! activations (Megatron's `_batched_p2p_ops`). As separate blocking operations, two stages that both send first
//! would wait on each other; the parts of one exchange progress together, whatever their order and sizes, so they
//! cannot.
//!
//! - Messages between two ranks match in the order they were issued (NCCL matches by order alone, so there are no
//!   tags). A receive names the shape, dtype and device of the tensor it makes; the matching send's tensor must
//!   have as many elements and the same dtype. On the host a disagreement fails the receive with the
//!   communicator's mismatch error, which names both calls, and leaves the message for a receive that matches it;
//!   on NCCL, which does not check, it shows as an NCCL error or the communicator's timeout.
//! - All parts of one exchange have one dtype and one device (a batch moves one element type).
//! - None of these is differentiable: a received tensor is a new leaf of candle's graph. Pipeline schedules move
//!   gradients explicitly, as Megatron's do: the next stage sends back the gradient of the tensor it received.
//!
//! CPU tensors go through the group's communicator as host vectors. CUDA tensors (feature `cuda`) are copied into
//! device buffers on candle's stream, exchanged as one NCCL group, and copied out into new candle storage on
//! candle's stream again, with no CPU wait (as the collectives are).

use candle_core::{DType, Device, Shape, Tensor};
use hypercomm_comm::P2p;

use crate::host::{HostBuf, Pending, check_device};
use crate::{Result, TensorGroup};

/// One part of a [`TensorGroup::exchange`]: a send of a tensor to a group rank, or a receive of a tensor of a
/// given shape, dtype and device from one.
#[derive(Debug, Clone)]
pub enum TensorP2p {
    /// Send `tensor` (any layout: its elements go in row-major order) to group rank `peer`.
    Send {
        /// The tensor sent.
        tensor: Tensor,
        /// The receiving group rank.
        peer: usize,
    },
    /// Receive a tensor of `shape`, `dtype` and `device` from group rank `peer`.
    Recv {
        /// The received tensor's shape: the sender's tensor has as many elements.
        shape: Shape,
        /// The received tensor's dtype: the sender's tensor's.
        dtype: DType,
        /// Where the received tensor lives.
        device: Device,
        /// The sending group rank.
        peer: usize,
    },
}

impl TensorP2p {
    /// A send of `tensor` (a cheap handle clone) to group rank `peer`.
    pub fn send(tensor: &Tensor, peer: usize) -> TensorP2p {
        TensorP2p::Send {
            tensor: tensor.clone(),
            peer,
        }
    }

    /// A receive of a tensor of `shape` and `dtype` on `device` from group rank `peer`.
    pub fn recv(shape: impl Into<Shape>, dtype: DType, device: &Device, peer: usize) -> TensorP2p {
        TensorP2p::Recv {
            shape: shape.into(),
            dtype,
            device: device.clone(),
            peer,
        }
    }

    /// The other rank of the part, a rank of the group.
    pub fn peer(&self) -> usize {
        match self {
            TensorP2p::Send { peer, .. } | TensorP2p::Recv { peer, .. } => *peer,
        }
    }

    /// The dtype the part moves.
    pub fn dtype(&self) -> DType {
        match self {
            TensorP2p::Send { tensor, .. } => tensor.dtype(),
            TensorP2p::Recv { dtype, .. } => *dtype,
        }
    }

    /// The device of the part's tensor.
    pub fn device(&self) -> &Device {
        match self {
            TensorP2p::Send { tensor, .. } => tensor.device(),
            TensorP2p::Recv { device, .. } => device,
        }
    }
}

impl TensorGroup {
    /// Sends `t` to group rank `peer`, which takes it with [`recv`](Self::recv) (or a receive part of an
    /// [`exchange`](Self::exchange)) of as many elements and the same dtype. Blocks until the message is handed
    /// over, which may mean until the peer receives it: two ranks that send to each other use one exchange each.
    pub fn send(&self, t: &Tensor, peer: usize) -> Result<()> {
        self.exchange_as("send", vec![TensorP2p::send(t, peer)])
            .map(drop)
    }

    /// Receives a tensor of `shape` and `dtype` on `device` from group rank `peer`, sent there with
    /// [`send`](Self::send) or a send part of an [`exchange`](Self::exchange). Blocks until it has arrived (within
    /// the communicator's timeout).
    pub fn recv(
        &self,
        shape: impl Into<Shape>,
        dtype: DType,
        device: &Device,
        peer: usize,
    ) -> Result<Tensor> {
        let mut got =
            self.exchange_as("recv", vec![TensorP2p::recv(shape, dtype, device, peer)])?;
        // One part in, one tensor out.
        Ok(got.remove(0))
    }

    /// Runs `parts` as one operation: every send and receive progresses at once, whatever their order here or on
    /// the peers and whatever the sizes, and this returns when all have completed (within the communicator's
    /// timeout). The result has one tensor per part, in the parts' order: a receive's new tensor, and for a send
    /// the tensor it sent (the same handle, so that results line up with parts).
    ///
    /// Collective only between the ranks that exchange messages: each send needs the matching receive on its peer,
    /// in an exchange or a [`recv`](Self::recv). Every part names another rank of the group and has the first
    /// part's dtype and device; otherwise nothing is sent and the error names the part.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use candle_core::{DType, Device, Tensor};
    /// use hypercomm_candle::{TensorGroup, TensorP2p};
    /// use hypercomm_comm::{CommOptions, Communicator};
    /// use hypercomm_store::MemoryStore;
    ///
    /// // A ring of three ranks: each sends to the next and receives from the previous, in one exchange.
    /// let store = Arc::new(MemoryStore::new());
    /// let ranks: Vec<_> = (0..3)
    ///     .map(|me| {
    ///         let store = Arc::clone(&store);
    ///         std::thread::spawn(move || -> Result<Vec<f32>, Box<dyn std::error::Error + Send + Sync>> {
    ///             let comm = Communicator::world(store, 3, me, CommOptions::named("ring"))?;
    ///             let ring = TensorGroup::from_communicator(Arc::new(comm));
    ///             let (next, prev) = ((me + 1) % 3, (me + 2) % 3);
    ///             let mine = Tensor::new(&[me as f32; 2], &Device::Cpu)?;
    ///             let got = ring.exchange(vec![
    ///                 TensorP2p::send(&mine, next),
    ///                 TensorP2p::recv(2, DType::F32, &Device::Cpu, prev),
    ///             ])?;
    ///             Ok(got[1].to_vec1()?)
    ///         })
    ///     })
    ///     .collect();
    /// for (me, r) in ranks.into_iter().enumerate() {
    ///     assert_eq!(r.join().unwrap().unwrap(), [((me + 2) % 3) as f32; 2]);
    /// }
    /// ```
    pub fn exchange(&self, parts: Vec<TensorP2p>) -> Result<Vec<Tensor>> {
        self.exchange_as("exchange", parts)
    }

    /// [`exchange`](Self::exchange), with errors naming `op`.
    fn exchange_as(&self, op: &'static str, parts: Vec<TensorP2p>) -> Result<Vec<Tensor>> {
        let Some(first) = parts.first() else {
            return Ok(Vec::new());
        };
        let label = |i: usize| {
            if op == "exchange" {
                format!("part {i}: ")
            } else {
                String::new()
            }
        };
        for (i, part) in parts.iter().enumerate() {
            let peer = part.peer();
            if peer >= self.size() || peer == self.rank() {
                return Err(self.argument_error(
                    op,
                    format!(
                        "{}peer {peer} is not another rank of this {}-rank group (this is rank {})",
                        label(i),
                        self.size(),
                        self.rank()
                    ),
                ));
            }
            if part.dtype() != first.dtype() {
                return Err(self.argument_error(
                    op,
                    format!(
                        "part {i} is {:?} but part 0 is {:?}: all parts of one exchange have one dtype",
                        part.dtype(),
                        first.dtype()
                    ),
                ));
            }
            if !part.device().same_device(first.device()) {
                return Err(self.argument_error(
                    op,
                    format!(
                        "part {i} is on {:?} but part 0 is on {:?}: all parts of one exchange are on one device",
                        part.device().location(),
                        first.device().location()
                    ),
                ));
            }
        }
        #[cfg(feature = "cuda")]
        if crate::collectives::on_gpu(first.device()) {
            return cuda::exchange(self, op, parts);
        }
        check_device(first.device(), op, self.name())?;
        let batch = parts
            .iter()
            .map(|part| {
                Ok(match part {
                    TensorP2p::Send { tensor, peer } => {
                        P2p::send(HostBuf::from_tensor(tensor, op, self.name())?, *peer)
                    }
                    TensorP2p::Recv {
                        shape, dtype, peer, ..
                    } => P2p::recv(
                        HostBuf::zeros(*dtype, shape.elem_count(), op, self.name())?,
                        *peer,
                    ),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let bufs = HostBuf::batch(self.comm()?, batch)
            .and_then(Pending::wait)
            .map_err(|e| self.comm_error(e))?;
        parts
            .into_iter()
            .zip(bufs)
            .map(|(part, buf)| match part {
                TensorP2p::Send { tensor, .. } => Ok(tensor),
                TensorP2p::Recv { shape, device, .. } => buf.into_tensor(shape, &device),
            })
            .collect()
    }
}

/// CUDA tensors (feature `cuda`): the exchange as one NCCL group, stream-ordered on candle's stream.
#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::cuda_backend::CudaStorage;
    use candle_core::op::BackpropOp;
    use candle_core::{Device, Storage, Tensor};
    use hypercomm_comm::P2p;

    use super::TensorP2p;
    use crate::device::{CudaElement, Typed, check_same_device, for_dtype};
    use crate::{Error, Result, TensorGroup};

    /// The exchange of `parts` (checked: at least one, one dtype, one CUDA device, peers in the group).
    pub(super) fn exchange(
        group: &TensorGroup,
        op: &'static str,
        parts: Vec<TensorP2p>,
    ) -> Result<Vec<Tensor>> {
        let dtype = parts[0].dtype();
        for_dtype(dtype, op, group.name(), Exchange { group, op, parts })
    }

    /// One exchange on one group, for [`exchange`].
    struct Exchange<'a> {
        group: &'a TensorGroup,
        op: &'static str,
        parts: Vec<TensorP2p>,
    }

    impl Typed for Exchange<'_> {
        type Out = Vec<Tensor>;

        /// Copy each send in, exchange, copy each receive out: all enqueued on candle's stream, which waits for
        /// the NCCL group before the copies out.
        fn run<T: CudaElement>(self) -> Result<Vec<Tensor>> {
            let Exchange { group, op, parts } = self;
            let Device::Cuda(dev) = parts[0].device().clone() else {
                return Err(Error::UnsupportedDevice {
                    op,
                    group: group.name().to_owned(),
                    device: format!("{:?}", parts[0].device().location()),
                    why: "the device exchange serves cuda tensors".into(),
                });
            };
            let comm = group.comm()?;
            let gpu = check_same_device(group, comm, op, &dev)?;
            let stream = dev.cuda_stream();
            let comm_error = |e| group.comm_error(e);
            let mut batch = Vec::with_capacity(parts.len());
            for part in &parts {
                batch.push(match part {
                    TensorP2p::Send { tensor, peer } => {
                        let t = tensor.contiguous()?;
                        let (storage, layout) = t.storage_and_layout();
                        let (Storage::Cuda(cuda), Some((start, end))) =
                            (&*storage, layout.contiguous_offsets())
                        else {
                            return Err(group.argument_error(
                                op,
                                format!(
                                    "a send's tensor is not contiguous cuda storage ({layout:?})"
                                ),
                            ));
                        };
                        let src = cuda.as_cuda_slice::<T>()?.slice(start..end);
                        let mut buf = gpu.alloc_zeros::<T>(end - start).map_err(comm_error)?;
                        buf.copy_from_device(&src, &stream).map_err(comm_error)?;
                        P2p::send(buf, *peer)
                    }
                    TensorP2p::Recv { shape, peer, .. } => P2p::recv(
                        gpu.alloc_zeros::<T>(shape.elem_count())
                            .map_err(comm_error)?,
                        *peer,
                    ),
                });
            }
            let bufs = comm
                .batch(batch)
                .and_then(|work| work.wait_on(&stream))
                .map_err(comm_error)?;
            parts
                .into_iter()
                .zip(bufs)
                .map(|(part, buf)| match part {
                    TensorP2p::Send { tensor, .. } => Ok(tensor),
                    TensorP2p::Recv { shape, .. } => {
                        let n = buf.len();
                        // At least one element: CUDA refuses an empty allocation, and the tensor's shape says how
                        // many of the storage's elements it has.
                        let mut out = dev.alloc_zeros::<T>(n.max(1))?;
                        buf.copy_to_device(&mut out.slice_mut(..n), &stream)
                            .map_err(comm_error)?;
                        let storage = CudaStorage::wrap_cuda_slice(out, dev.clone());
                        Ok(Tensor::from_storage(
                            Storage::Cuda(storage),
                            shape,
                            BackpropOp::none(),
                            false,
                        ))
                    }
                })
                .collect()
        }
    }
}

#[cfg(test)]
mod tests;
