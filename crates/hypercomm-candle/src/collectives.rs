//! Collectives on `candle_core::Tensor` through a [`TensorGroup`]: all-reduce, all-gather and reduce-scatter
//! along a dimension, broadcast.
//!
//! candle tensors are immutable, so every collective returns its result as a new tensor (on the input's device,
//! with the input's dtype) instead of writing into the input. A non-contiguous input (a transposed or narrowed
//! view) is read through its layout, so the result is always contiguous and never drops a stride. CPU tensors
//! go through the group's communicator as host vectors, CUDA tensors (feature `cuda`) as device buffers,
//! stream-ordered on candle's stream; a tensor of another device, or of a dtype the communicator lacks (i16,
//! f8e8m0, the f6/f4 formats), is an [`Error`] naming it. f8e4m3 tensors are broadcast and gathered
//! on both; the host does not reduce them, so an all-reduce or reduce-scatter of CPU f8e4m3 tensors is the
//! communicator's error saying so, while CUDA ones reduce on NCCL.

use candle_core::{Device, Shape, Tensor};
use hypercomm_comm::ReduceOp;

use crate::host::{HostBuf, Pending};
use crate::kind::Kind;
use crate::{Error, Result, TensorGroup};

/// The pending result of an asynchronous collective on a tensor; [`TensorWork::wait`] gives the result tensor.
#[derive(Debug)]
#[must_use = "the result comes back only through wait()"]
pub struct TensorWork {
    pending: Outcome,
    shape: Shape,
    device: Device,
    group: String,
}

/// A host collective in flight, or a device one already ordered on candle's stream.
#[derive(Debug)]
enum Outcome {
    Host(Pending),
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    Device(Tensor),
}

impl TensorWork {
    /// Blocks until the collective completes (within the communicator's timeout) and returns its result. A
    /// CUDA tensor's collective is stream-ordered: its result is returned at once, and candle's later work on
    /// its stream sees the values.
    pub fn wait(self) -> Result<Tensor> {
        let pending = match self.pending {
            Outcome::Device(t) => return Ok(t),
            Outcome::Host(p) => p,
        };
        let buf = pending.wait().map_err(|source| Error::Comm {
            group: self.group,
            source: Box::new(source),
        })?;
        buf.into_tensor(self.shape, &self.device)
    }
}

/// Whether `t` goes through the group's NCCL communicator: a CUDA tensor in a build with feature `cuda`.
pub(crate) fn on_device(t: &Tensor) -> bool {
    on_gpu(t.device())
}

/// Whether tensors on `device` go through the group's NCCL communicator: a CUDA device in a build with feature
/// `cuda`.
pub(crate) fn on_gpu(device: &Device) -> bool {
    cfg!(feature = "cuda") && device.is_cuda()
}

impl TensorGroup {
    /// `kind` on the CUDA tensor `t` through the group's NCCL communicator, with the result in `shape`.
    fn device_collective(&self, t: &Tensor, kind: Kind, shape: Shape) -> Result<Tensor> {
        #[cfg(feature = "cuda")]
        {
            crate::device::collective(self, t, kind, shape)
        }
        #[cfg(not(feature = "cuda"))]
        {
            // `on_device` is false without the feature, so no caller gets here; answer as the host would.
            let _ = (kind, shape);
            crate::host::check_tensor(t, "device collective", self.name()).map(|_| t.clone())
        }
    }

    /// A work handle whose result is already ordered on candle's stream.
    fn ready(&self, t: Tensor) -> TensorWork {
        TensorWork {
            shape: t.shape().clone(),
            device: t.device().clone(),
            group: self.name().to_owned(),
            pending: Outcome::Device(t),
        }
    }

    /// `source` as this group's [`Error::Comm`].
    pub(crate) fn comm_error(&self, source: hypercomm_comm::CommError) -> Error {
        Error::Comm {
            group: self.name().to_owned(),
            source: Box::new(source),
        }
    }

    fn shape_error(&self, op: &'static str, what: String) -> Error {
        Error::Shape {
            op,
            group: self.name().to_owned(),
            what,
        }
    }

    /// Issues an all-reduce of `t` and returns at once; the result has `t`'s shape and dtype. Issue order is
    /// completion order; overlap further work with the communication, then [`TensorWork::wait`].
    pub fn all_reduce_async(&self, t: &Tensor, op: ReduceOp) -> Result<TensorWork> {
        if on_device(t) {
            let out = self.device_collective(t, Kind::AllReduce(op), t.shape().clone())?;
            return Ok(self.ready(out));
        }
        let buf = HostBuf::from_tensor(t, "all_reduce", self.name())?;
        let pending = buf
            .all_reduce(self.comm()?, op)
            .map_err(|e| self.comm_error(e))?;
        Ok(TensorWork {
            pending: Outcome::Host(pending),
            shape: t.shape().clone(),
            device: t.device().clone(),
            group: self.name().to_owned(),
        })
    }

    /// All-reduce: every rank gets the reduction of all ranks' `t` (same shape and dtype on every rank).
    pub fn all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        self.all_reduce_async(t, op)?.wait()
    }

    /// Broadcast: every rank gets `root`'s `t` (`root` is a rank within the group). Every rank passes a tensor of
    /// the same shape and dtype; only the root's values are read.
    pub fn broadcast(&self, t: &Tensor, root: usize) -> Result<Tensor> {
        if on_device(t) {
            return self.device_collective(t, Kind::Broadcast(root), t.shape().clone());
        }
        let buf = HostBuf::from_tensor(t, "broadcast", self.name())?;
        let work = TensorWork {
            pending: Outcome::Host(
                buf.broadcast(self.comm()?, root)
                    .map_err(|e| self.comm_error(e))?,
            ),
            shape: t.shape().clone(),
            device: t.device().clone(),
            group: self.name().to_owned(),
        };
        work.wait()
    }

    /// All-gather along `dim`: the result is every rank's `t` concatenated along `dim` in group rank order (as
    /// `Tensor::cat`), so that dimension grows `size()` times. Every rank passes the same shape.
    pub fn all_gather(&self, t: &Tensor, dim: usize) -> Result<Tensor> {
        let dims = t.dims().to_vec();
        if dim >= dims.len() {
            return Err(self.shape_error(
                "all_gather",
                format!("dim {dim} is out of range for shape {:?}", t.shape()),
            ));
        }
        let n = self.size();
        let stacked: Shape = std::iter::once(n)
            .chain(dims.iter().copied())
            .collect::<Vec<_>>()
            .into();
        let gathered = if on_device(t) {
            self.device_collective(t, Kind::AllGather, stacked)?
        } else {
            let buf = HostBuf::from_tensor(t, "all_gather", self.name())?;
            TensorWork {
                pending: Outcome::Host(
                    buf.all_gather(self.comm()?)
                        .map_err(|e| self.comm_error(e))?,
                ),
                shape: stacked,
                device: t.device().clone(),
                group: self.name().to_owned(),
            }
            .wait()?
        };
        // [n, d0, .., dk] -> [d0, .., n, d_dim, .., dk] -> merge n into d_dim: the concatenation along `dim`.
        let mut order: Vec<usize> = (1..=dim).collect();
        order.push(0);
        order.extend(dim + 1..=dims.len());
        let mut out_dims = dims;
        out_dims[dim] *= n;
        Ok(gathered.permute(order)?.contiguous()?.reshape(out_dims)?)
    }

    /// Reduce-scatter along `dim`: `t` is cut into `size()` equal chunks along `dim`; rank `r` gets the reduction
    /// of every rank's chunk `r`. `dim`'s size must be a multiple of `size()`.
    pub fn reduce_scatter(&self, t: &Tensor, dim: usize, op: ReduceOp) -> Result<Tensor> {
        let dims = t.dims().to_vec();
        let n = self.size();
        if dim >= dims.len() {
            return Err(self.shape_error(
                "reduce_scatter",
                format!("dim {dim} is out of range for shape {:?}", t.shape()),
            ));
        }
        if dims[dim] % n != 0 {
            return Err(self.shape_error(
                "reduce_scatter",
                format!(
                    "dim {dim} of shape {:?} has size {}, not a multiple of {n} ranks",
                    t.shape(),
                    dims[dim]
                ),
            ));
        }
        if !on_device(t) {
            crate::host::check_tensor(t, "reduce_scatter", self.name())?;
        }
        // [d0, .., d_dim, .., dk] -> [d0, .., n, d_dim / n, .., dk] -> chunk index first: block r is chunk r.
        let mut split = dims[..dim].to_vec();
        split.extend([n, dims[dim] / n]);
        split.extend(&dims[dim + 1..]);
        let mut order = vec![dim];
        order.extend(0..dim);
        order.extend(dim + 1..split.len());
        let blocks = t.reshape(split)?.permute(order)?;
        let mut out_dims = dims;
        out_dims[dim] /= n;
        if on_device(t) {
            return self.device_collective(&blocks, Kind::ReduceScatter(op), out_dims.into());
        }
        let buf = HostBuf::from_tensor(&blocks, "reduce_scatter", self.name())?;
        TensorWork {
            pending: Outcome::Host(
                buf.reduce_scatter(self.comm()?, op)
                    .map_err(|e| self.comm_error(e))?,
            ),
            shape: out_dims.into(),
            device: t.device().clone(),
            group: self.name().to_owned(),
        }
        .wait()
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Tensor};
    use hypercomm_comm::ReduceOp;

    use crate::testing::{f8_bits, f8_sample, run_ranks, sample, values};
    use crate::{Error, TensorGroup};

    /// 4 ranks, tp groups {0, 1} and {2, 3}: `f(rank, tp group, members)` on each.
    fn on_tp_groups(f: impl Fn(usize, TensorGroup, Vec<usize>) + Send + Sync + 'static) {
        run_ranks(4, 2, move |rank, pgc| {
            let tp = TensorGroup::kind(&pgc, "tp").expect("tp group");
            let members = tp.comm().expect("comm").ranks().to_vec();
            f(rank, tp, members);
        });
    }

    #[test]
    fn all_reduce_sums_every_supported_dtype() {
        on_tp_groups(|rank, tp, members| {
            for dtype in [
                DType::F32,
                DType::F64,
                DType::BF16,
                DType::F16,
                DType::I64,
                DType::I32,
                DType::U32,
            ] {
                let got = tp
                    .all_reduce(&sample(rank, &[2, 3], dtype), ReduceOp::Sum)
                    .expect("all_reduce");
                assert_eq!(got.dtype(), dtype);
                assert_eq!(got.dims(), [2, 3]);
                // The sum of the inputs as `dtype` holds them, rounded once to `dtype` (bf16 and f16 reduce in f32).
                let want = members
                    .iter()
                    .map(|&r| sample(r, &[2, 3], dtype).to_dtype(DType::F64).expect("f64"))
                    .reduce(|a, b| (a + b).expect("add"))
                    .and_then(|t| t.to_dtype(dtype).ok())
                    .expect("members");
                assert_eq!(values(&got), values(&want), "{dtype:?}");
            }
            let max = tp
                .all_reduce(&sample(rank % 2, &[4], DType::U8), ReduceOp::Max)
                .expect("u8 max");
            assert_eq!(values(&max), [100.0, 101.0, 102.0, 103.0]);
        });
    }

    #[test]
    fn all_gather_concatenates_along_a_dim_in_rank_order() {
        on_tp_groups(|rank, tp, members| {
            for dim in 0..3 {
                let got = tp
                    .all_gather(&sample(rank, &[2, 3, 2], DType::F32), dim)
                    .expect("all_gather");
                let parts: Vec<Tensor> = members
                    .iter()
                    .map(|&r| sample(r, &[2, 3, 2], DType::F32))
                    .collect();
                let want = Tensor::cat(&parts, dim).expect("cat");
                assert_eq!(got.dims(), want.dims(), "dim {dim}");
                assert_eq!(values(&got), values(&want), "dim {dim}");
            }
            // A transposed (non-contiguous) input is gathered by its logical layout.
            let t = sample(rank, &[2, 3], DType::F32).t().expect("t");
            assert!(!t.is_contiguous());
            let got = tp.all_gather(&t, 1).expect("all_gather of a view");
            let parts: Vec<Tensor> = members
                .iter()
                .map(|&r| sample(r, &[2, 3], DType::F32).t().expect("t"))
                .collect();
            assert_eq!(values(&got), values(&Tensor::cat(&parts, 1).expect("cat")));
        });
    }

    #[test]
    fn reduce_scatter_gives_each_rank_its_chunk_of_the_sum() {
        on_tp_groups(|rank, tp, members| {
            let me = members.iter().position(|&r| r == rank).expect("member");
            for dim in 0..2 {
                let got = tp
                    .reduce_scatter(&sample(rank, &[4, 6], DType::F32), dim, ReduceOp::Sum)
                    .expect("reduce_scatter");
                let sum = (sample(members[0], &[4, 6], DType::F64)
                    + sample(members[1], &[4, 6], DType::F64))
                .expect("sum");
                let len = [4, 6][dim] / 2;
                let want = sum.narrow(dim, me * len, len).expect("narrow");
                assert_eq!(got.dims(), want.dims(), "dim {dim}");
                assert_eq!(values(&got), values(&want), "dim {dim}");
            }
            let err = tp
                .reduce_scatter(&sample(rank, &[3, 5], DType::F32), 1, ReduceOp::Sum)
                .expect_err("5 is not a multiple of 2");
            assert!(
                err.to_string()
                    .contains("has size 5, not a multiple of 2 ranks"),
                "{err}"
            );
        });
    }

    #[test]
    fn premulsum_divides_while_it_sums() {
        // Sharded data parallelism's reduce-scatter of gradients, averaged by a factor of 1/2 on two ranks.
        on_tp_groups(|rank, tp, members| {
            let me = members.iter().position(|&r| r == rank).expect("member");
            let half = ReduceOp::pre_mul_sum(0.5);
            for dtype in [DType::F32, DType::BF16] {
                let got = tp
                    .reduce_scatter(&sample(rank, &[4, 6], dtype), 0, half)
                    .expect("reduce_scatter");
                // The inputs as `dtype` holds them, halved and summed exactly, rounded once to `dtype`.
                let held = |r: usize| sample(r, &[4, 6], dtype).to_dtype(DType::F64).expect("f64");
                let mean = ((held(members[0]) + held(members[1])).expect("sum") * 0.5)
                    .and_then(|t| t.to_dtype(dtype))
                    .expect("mean");
                let want = mean.narrow(0, me * 2, 2).expect("narrow");
                assert_eq!(got.dtype(), dtype);
                assert_eq!(values(&got), values(&want), "{dtype:?}");
            }
            let got = tp
                .all_reduce(&sample(rank, &[3], DType::I64), ReduceOp::pre_mul_sum(-2.0))
                .expect("i64 all_reduce");
            let base = (100 * (members[0] + members[1])) as f64;
            assert_eq!(
                values(&got),
                (0..3)
                    .map(|i| -2.0 * (base + 2.0 * i as f64))
                    .collect::<Vec<_>>()
            );
            // An integer tensor multiplies by whole numbers only; the refusal names the factor.
            let err = tp
                .all_reduce(&sample(rank, &[3], DType::I64), half)
                .expect_err("half of an integer");
            assert!(
                matches!(err, Error::Comm { .. })
                    && err
                        .to_string()
                        .contains("premulsum factor 0.5 is not a whole number"),
                "{err}"
            );
        });
    }

    #[test]
    fn broadcast_and_async_all_reduce() {
        on_tp_groups(|rank, tp, members| {
            let got = tp
                .broadcast(&sample(rank, &[3], DType::F64), 1)
                .expect("broadcast");
            assert_eq!(values(&got), values(&sample(members[1], &[3], DType::F64)));
            // Two all-reduces in flight at once complete in issue order.
            let a = tp
                .all_reduce_async(&sample(rank, &[5], DType::F32), ReduceOp::Sum)
                .expect("a");
            let b = tp
                .all_reduce_async(&sample(rank, &[2], DType::F32), ReduceOp::Max)
                .expect("b");
            let (b, a) = (b.wait().expect("b"), a.wait().expect("a"));
            let base = (100 * (members[0] + members[1])) as f64;
            assert_eq!(
                values(&a),
                (0..5).map(|i| base + 2.0 * i as f64).collect::<Vec<_>>()
            );
            assert_eq!(
                values(&b),
                [100.0 * members[1] as f64, 100.0 * members[1] as f64 + 1.0]
            );
        });
    }

    #[test]
    fn unsupported_dtypes_and_bad_dims_are_named() {
        on_tp_groups(|rank, tp, _| {
            let t = sample(rank, &[4], DType::I16);
            let err = tp.all_reduce(&t, ReduceOp::Sum).expect_err("i16");
            assert!(
                matches!(
                    err,
                    Error::UnsupportedDType {
                        dtype: DType::I16,
                        ..
                    }
                ),
                "{err}"
            );
            assert!(
                err.to_string().contains("dtype I16 cannot be communicated"),
                "{err}"
            );
            let err = tp
                .all_gather(&sample(rank, &[4], DType::F32), 1)
                .expect_err("dim 1 of a vector");
            assert!(
                err.to_string()
                    .contains("dim 1 is out of range for shape [4]"),
                "{err}"
            );
            // Nothing was issued above, so the group still works.
            let ok = tp
                .all_reduce(&sample(rank, &[1], DType::F32), ReduceOp::Sum)
                .expect("still works");
            assert_eq!(ok.dims(), [1]);
        });
    }

    #[test]
    fn f8e4m3_is_broadcast_and_gathered_bit_for_bit() {
        on_tp_groups(|rank, tp, members| {
            // 256 elements: every bit pattern, NaNs and both zeros included, each rank in its own order.
            let got = tp
                .broadcast(&f8_sample(rank, &[16, 16]), 1)
                .expect("broadcast");
            assert_eq!((got.dtype(), got.dims()), (DType::F8E4M3, &[16, 16][..]));
            assert_eq!(f8_bits(&got), f8_bits(&f8_sample(members[1], &[16, 16])));
            // A transposed view goes by its logical layout.
            let view = f8_sample(rank, &[16, 16]).t().expect("t");
            assert!(!view.is_contiguous());
            let got = tp.broadcast(&view, 0).expect("broadcast of a view");
            let want = f8_sample(members[0], &[16, 16]).t().expect("t");
            assert_eq!(f8_bits(&got), f8_bits(&want));
            for dim in 0..2 {
                let got = tp
                    .all_gather(&f8_sample(rank, &[8, 32]), dim)
                    .expect("all_gather");
                let parts: Vec<Tensor> = members.iter().map(|&r| f8_sample(r, &[8, 32])).collect();
                let want = Tensor::cat(&parts, dim).expect("cat");
                assert_eq!(got.dims(), want.dims(), "dim {dim}");
                assert_eq!(f8_bits(&got), f8_bits(&want), "dim {dim}");
            }
        });
    }

    #[test]
    fn reducing_f8e4m3_on_the_cpu_is_refused_naming_the_way_out() {
        on_tp_groups(|rank, tp, members| {
            let t = f8_sample(rank, &[4, 2]);
            let refusals = [
                ("all_reduce", tp.all_reduce(&t, ReduceOp::Sum)),
                ("reduce_scatter", tp.reduce_scatter(&t, 0, ReduceOp::Max)),
            ];
            for (op, result) in refusals {
                let err = result.expect_err("a host reduction of f8e4m3");
                assert!(matches!(err, Error::Comm { .. }), "{op}: {err:?}");
                let text = err.to_string();
                assert!(
                    text.contains(&format!("{op} of f8e4m3 on host buffers is not supported"))
                        && text.contains("reduce on a device buffer")
                        && text.contains("or in f32 or bf16"),
                    "{text}"
                );
            }
            // Refused before anything was sent: the group goes on, and the way out works.
            let f32 = |r: usize| f8_sample(r, &[4, 2]).to_dtype(DType::F32).expect("f32");
            let got = tp.all_reduce(&f32(rank), ReduceOp::Sum).expect("f32 sum");
            let want = (f32(members[0]) + f32(members[1])).expect("add");
            assert_eq!(values(&got), values(&want));
        });
    }
}
