//! Data parallelism: [`GradSync`] averages gradients over a data-parallel group in buckets, as PyTorch's
//! `DistributedDataParallel` does.
//!
//! After `loss.backward()`, each rank's gradients are flattened, variable after variable, into one bucket per
//! element type. When a bucket holds at least the bucket size (default 25 MiB, PyTorch's default) its all-reduce
//! (average) is issued at once, and the next bucket is flattened while the communicator moves that one; the last
//! partial buckets are issued at the end, then every result is waited for and written back into the
//! [`GradStore`]. With each rank computing the mean loss over its equal slice of the global batch, the averaged
//! gradients are those of one rank training on the whole batch.
//!
//! Every rank must pass the same variables (shapes and dtypes) in the same order, so that the buckets line up;
//! [`GradSync::sync_varmap`] sorts a `VarMap`'s variables by name for that (a `VarMap` iterates a hash map, whose
//! order differs between processes). A variable without a gradient on a rank counts as zeros there, so the
//! buckets stay aligned, and gets the averaged gradient like the others.

use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};
use candle_nn::VarMap;
use hypercomm_comm::ReduceOp;

use crate::bucket::{Bucket, Buckets, Fill, Tally};
use crate::host::{HostBuf, Pending};
use crate::{Error, Result, TensorGroup};

/// PyTorch DDP's default bucket size: 25 MiB.
pub const DEFAULT_BUCKET_BYTES: usize = 25 * 1024 * 1024;

/// What one [`GradSync::sync`] moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SyncStats {
    /// All-reduces issued (one per bucket).
    pub buckets: usize,
    /// Gradient elements averaged.
    pub elements: usize,
    /// Gradient bytes averaged.
    pub bytes: usize,
}

/// Averages gradients over a data-parallel group, in buckets (see the module docs).
#[derive(Debug, Clone)]
pub struct GradSync {
    group: TensorGroup,
    bucket_bytes: usize,
}

impl GradSync {
    /// A synchroniser over `group` with the default bucket size.
    pub fn new(group: TensorGroup) -> GradSync {
        GradSync {
            group,
            bucket_bytes: DEFAULT_BUCKET_BYTES,
        }
    }

    /// Issues a bucket's all-reduce once it holds at least `bytes` (a variable is never split, so a bucket may
    /// be larger; 0 gives every variable its own all-reduce).
    #[must_use]
    pub fn with_bucket_bytes(mut self, bytes: usize) -> GradSync {
        self.bucket_bytes = bytes;
        self
    }

    /// The bucket size.
    pub fn bucket_bytes(&self) -> usize {
        self.bucket_bytes
    }

    /// The data-parallel group.
    pub fn group(&self) -> &TensorGroup {
        &self.group
    }

    /// Replaces the gradient of every variable of `varmap` in `grads` by its average over the group; variables
    /// are taken in name order.
    pub fn sync_varmap(&self, varmap: &VarMap, grads: &mut GradStore) -> Result<SyncStats> {
        let mut named: Vec<(String, Var)> = varmap
            .data()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(name, var)| (name.clone(), var.clone()))
            .collect();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        let vars: Vec<Var> = named.into_iter().map(|(_, v)| v).collect();
        self.sync(&vars, grads)
    }

    /// Replaces the gradient of each of `vars` in `grads` by its average over the group. Collective: every rank
    /// passes variables of the same shapes and dtypes in the same order.
    pub fn sync(&self, vars: &[Var], grads: &mut GradStore) -> Result<SyncStats> {
        if vars
            .first()
            .is_some_and(|v| crate::collectives::on_device(v.as_tensor()))
        {
            return self.sync_on_device(vars, grads);
        }
        let comm = self.group.comm()?;
        let mut stats = SyncStats::default();
        let mut buckets: Buckets<HostBuf> = Buckets::new(self.bucket_bytes);
        let mut in_flight: Vec<(Pending, Vec<(usize, usize)>)> = Vec::new();
        let issue = |bucket: Bucket<HostBuf>, stats: &mut SyncStats| -> Result<_> {
            stats.count(&bucket.fill);
            let pending = bucket
                .fill
                .all_reduce(comm, ReduceOp::Avg)
                .map_err(|source| self.group.comm_error(source))?;
            Ok((pending, bucket.members))
        };
        let empty = |dtype| HostBuf::empty(dtype, "gradient sync", self.group.name());
        for (index, var) in vars.iter().enumerate() {
            let t = var.as_tensor();
            crate::host::check_tensor(t, "gradient sync", self.group.name())?;
            let grad = self.gradient(index, t, grads)?;
            if let Some(full) = buckets.add(index, &grad, empty)? {
                in_flight.push(issue(full, &mut stats)?);
            }
        }
        for bucket in buckets.rest() {
            in_flight.push(issue(bucket, &mut stats)?);
        }
        for (pending, members) in in_flight {
            let buf = pending
                .wait()
                .map_err(|source| self.group.comm_error(source))?;
            for (index, offset) in members {
                let t = vars[index].as_tensor();
                let avg: Tensor = buf.tensor_at(offset, t.shape(), t.device())?;
                grads.insert(t, avg);
            }
        }
        Ok(stats)
    }

    /// Variable `index`'s gradient (zeros when it has none), checked against the variable.
    fn gradient(&self, index: usize, t: &Tensor, grads: &GradStore) -> Result<Tensor> {
        let grad = match grads.get(t) {
            Some(g) => g.clone(),
            None => t.zeros_like()?,
        };
        if grad.shape() != t.shape() || grad.dtype() != t.dtype() {
            return Err(Error::Shape {
                op: "gradient sync",
                group: self.group.name().to_owned(),
                what: format!(
                    "variable {index} is {:?} {:?} but its gradient is {:?} {:?}",
                    t.dtype(),
                    t.shape(),
                    grad.dtype(),
                    grad.shape()
                ),
            });
        }
        Ok(grad)
    }

    /// [`sync`](Self::sync) for variables on a CUDA device: the same buckets, flattened on the device with
    /// `Tensor::cat` and averaged through the group's NCCL communicator. Each bucket's all-reduce is ordered on
    /// candle's stream as soon as the bucket fills, so it runs while the next one is flattened; nothing blocks
    /// the CPU.
    fn sync_on_device(&self, vars: &[Var], grads: &mut GradStore) -> Result<SyncStats> {
        let mut stats = SyncStats::default();
        let mut buckets: Buckets<DeviceFlat> = Buckets::new(self.bucket_bytes);
        let mut done: Vec<(Tensor, Vec<(usize, usize)>)> = Vec::new();
        let issue = |bucket: Bucket<DeviceFlat>, stats: &mut SyncStats| -> Result<_> {
            stats.count(&bucket.fill);
            let flat = Tensor::cat(&bucket.fill.parts, 0)?;
            let avg = self.group.all_reduce_async(&flat, ReduceOp::Avg)?.wait()?;
            Ok((avg, bucket.members))
        };
        for (index, var) in vars.iter().enumerate() {
            let t = var.as_tensor();
            if !crate::collectives::on_device(t)
                || t.device().location() != vars[0].device().location()
            {
                return Err(Error::UnsupportedDevice {
                    op: "gradient sync",
                    group: self.group.name().to_owned(),
                    device: format!("{:?}", t.device().location()),
                    why: format!(
                        "variable 0 is on {:?}; one sync serves variables of one device",
                        vars[0].device().location()
                    ),
                });
            }
            let grad = self.gradient(index, t, grads)?;
            if let Some(full) = buckets.add(index, &grad, |_| Ok(DeviceFlat::default()))? {
                done.push(issue(full, &mut stats)?);
            }
        }
        for bucket in buckets.rest() {
            done.push(issue(bucket, &mut stats)?);
        }
        for (avg, members) in done {
            for (index, offset) in members {
                let t = vars[index].as_tensor();
                let mine = avg.narrow(0, offset, t.elem_count())?.reshape(t.shape())?;
                grads.insert(t, mine);
            }
        }
        Ok(stats)
    }
}

impl SyncStats {
    /// Counts one issued bucket.
    fn count(&mut self, fill: &impl Fill) {
        self.buckets += 1;
        self.elements += fill.elements();
        self.bytes += fill.bytes();
    }
}

impl Fill for HostBuf {
    fn elements(&self) -> usize {
        self.len()
    }
    fn bytes(&self) -> usize {
        HostBuf::bytes(self)
    }
    fn push(&mut self, grad: &Tensor) -> Result<()> {
        self.append(grad)
    }
}

/// A bucket of CUDA gradients: flattened on the device, joined by one `Tensor::cat` when issued.
#[derive(Default)]
struct DeviceFlat {
    parts: Vec<Tensor>,
    tally: Tally,
}

impl Fill for DeviceFlat {
    fn elements(&self) -> usize {
        self.tally.elements
    }
    fn bytes(&self) -> usize {
        self.tally.bytes
    }
    fn push(&mut self, grad: &Tensor) -> Result<()> {
        self.tally.add(grad);
        self.parts.push(grad.flatten_all()?);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Tensor, Var};
    use candle_nn::VarMap;

    use super::{DEFAULT_BUCKET_BYTES, GradSync, SyncStats};
    use crate::TensorGroup;
    use crate::testing::run_ranks;

    /// A deterministic tensor that differs by rank and by `salt`.
    fn pattern(rank: usize, salt: usize, dims: &[usize], dtype: DType) -> Tensor {
        let n: usize = dims.iter().product();
        let v: Vec<f64> = (0..n)
            .map(|i| ((i * 7 + salt * 13 + rank * 29) % 17) as f64 * 0.25 - 2.0)
            .collect();
        Tensor::from_vec(v, dims, &Device::Cpu)
            .and_then(|t| t.to_dtype(dtype))
            .expect("pattern")
    }

    fn values(t: &Tensor) -> Vec<f64> {
        t.to_dtype(DType::F64)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1())
            .expect("values")
    }

    const SHAPES: [(&[usize], DType); 5] = [
        (&[3, 4], DType::F32),
        (&[5], DType::F32),
        (&[2, 2], DType::F64),
        (&[7], DType::F32),
        (&[6], DType::F64),
    ];

    /// Each variable's gradient on `rank` is `pattern(rank, var)`, made by a real backward pass of
    /// `Σ var ⊙ pattern`; variable 3 gets no gradient on rank 1.
    fn grads_on(rank: usize, vars: &[Var]) -> candle_core::backprop::GradStore {
        let mut loss = Tensor::zeros((), DType::F64, &Device::Cpu).expect("zero");
        for (i, (var, (dims, dtype))) in vars.iter().zip(SHAPES).enumerate() {
            if i == 3 && rank == 1 {
                continue;
            }
            let term = (var.as_tensor() * pattern(rank, i, dims, dtype))
                .and_then(|t| t.sum_all())
                .and_then(|t| t.to_dtype(DType::F64))
                .expect("term");
            loss = (loss + term).expect("sum");
        }
        loss.backward().expect("backward")
    }

    #[test]
    fn bucketed_average_equals_the_mean_gradient() {
        // 40 bytes: f32 [0] (48 B), f32 [1, 3] (48 B), f64 [2, 4] (80 B).
        for (bucket_bytes, want_buckets) in [(DEFAULT_BUCKET_BYTES, 2), (40, 3), (0, 5)] {
            let stats = run_ranks(2, 1, move |rank, pgc| {
                let dp = TensorGroup::kind(&pgc, "dp").expect("dp");
                let vars: Vec<Var> = SHAPES
                    .iter()
                    .map(|(dims, dtype)| Var::zeros(*dims, *dtype, &Device::Cpu).expect("var"))
                    .collect();
                let mut grads = grads_on(rank, &vars);
                let sync = GradSync::new(dp).with_bucket_bytes(bucket_bytes);
                let stats = sync.sync(&vars, &mut grads).expect("sync");
                for (i, (var, (dims, dtype))) in vars.iter().zip(SHAPES).enumerate() {
                    let got = grads.get(var.as_tensor()).expect("averaged gradient");
                    assert_eq!(got.dtype(), dtype);
                    assert_eq!(got.dims(), dims);
                    let g0 = values(&pattern(0, i, dims, dtype));
                    let g1 = if i == 3 {
                        vec![0.0; g0.len()]
                    } else {
                        values(&pattern(1, i, dims, dtype))
                    };
                    let want: Vec<f64> = g0.iter().zip(&g1).map(|(a, b)| (a + b) / 2.0).collect();
                    assert_eq!(
                        values(got),
                        want,
                        "variable {i}, bucket size {bucket_bytes}"
                    );
                }
                stats
            });
            let elements = 12 + 5 + 4 + 7 + 6;
            let bytes = (12 + 5 + 7) * 4 + (4 + 6) * 8;
            let want = SyncStats {
                buckets: want_buckets,
                elements,
                bytes,
            };
            assert_eq!(stats, [want, want], "bucket size {bucket_bytes}");
        }
    }

    /// `mean((x·wᵀ + b − y)²)` over the rows of `x`.
    fn mse(w: &Var, b: &Var, x: &Tensor, y: &Tensor) -> Tensor {
        x.matmul(&w.as_tensor().t().expect("t"))
            .and_then(|p| p.broadcast_add(b.as_tensor()))
            .and_then(|p| p - y)
            .and_then(|d| d.sqr())
            .and_then(|d| d.mean_all())
            .expect("mse")
    }

    #[test]
    fn data_parallel_gradients_equal_one_rank_on_the_whole_batch() {
        let x = pattern(0, 1, &[8, 4], DType::F32);
        let y = pattern(0, 2, &[8, 2], DType::F32);
        let w0 = pattern(0, 3, &[2, 4], DType::F32);
        let b0 = pattern(0, 4, &[2], DType::F32);
        let whole = {
            let (w, b) = (
                Var::from_tensor(&w0).expect("w"),
                Var::from_tensor(&b0).expect("b"),
            );
            let grads = mse(&w, &b, &x, &y).backward().expect("backward");
            [&w, &b].map(|v| values(grads.get(v.as_tensor()).expect("grad")))
        };
        let per_rank = run_ranks(2, 1, move |rank, pgc| {
            let dp = TensorGroup::kind(&pgc, "dp").expect("dp");
            let varmap = VarMap::new();
            let w = varmap
                .get(
                    (2, 4),
                    "w",
                    candle_nn::Init::Const(0.0),
                    DType::F32,
                    &Device::Cpu,
                )
                .expect("w");
            let b = varmap
                .get(
                    2,
                    "b",
                    candle_nn::Init::Const(0.0),
                    DType::F32,
                    &Device::Cpu,
                )
                .expect("b");
            let vars = varmap.all_vars();
            let var_of = |t: &Tensor| {
                vars.iter()
                    .find(|v| v.as_tensor().id() == t.id())
                    .expect("var")
                    .clone()
            };
            let (w, b) = (var_of(&w), var_of(&b));
            w.set(&w0).expect("set w");
            b.set(&b0).expect("set b");
            let (xs, ys) = (
                x.narrow(0, 4 * rank, 4).expect("x"),
                y.narrow(0, 4 * rank, 4).expect("y"),
            );
            let mut grads = mse(&w, &b, &xs, &ys).backward().expect("backward");
            GradSync::new(dp)
                .sync_varmap(&varmap, &mut grads)
                .expect("sync");
            [&w, &b].map(|v| values(grads.get(v.as_tensor()).expect("grad")))
        });
        for grads in per_rank {
            for (got, want) in grads.iter().zip(&whole) {
                for (g, w) in got.iter().zip(want) {
                    assert!(
                        (g - w).abs() <= 1e-6 * w.abs().max(1.0),
                        "{got:?} vs {want:?}"
                    );
                }
            }
        }
    }
}
