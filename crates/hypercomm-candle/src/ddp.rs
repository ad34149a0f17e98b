//! Data parallelism: [`GradSync`] averages gradients over a data-parallel group in buckets, as PyTorch's
//! `DistributedDataParallel` does.
//!
//! After `loss.backward()`, each rank's gradients are flattened, variable after variable, into one bucket per
//! element type; a bucket closes once it holds at least the bucket size (default 25 MiB, PyTorch's default). The
//! buckets are planned from the variables' shapes first, then filled and issued one after another: a bucket's
//! all-reduce (average) starts as soon as it is filled, and the next bucket is flattened while the communicator
//! moves that one. Every result is then waited for and written back into the [`GradStore`]. With each rank
//! computing the mean loss over its equal slice of the global batch, the averaged gradients are those of one rank
//! training on the whole batch.
//!
//! On the host backend, when the group's communicator has a symmetric window
//! ([`CommOptions::symmetric_bytes`](hypercomm_comm::CommOptions), or `{"dp": {"symmetric_bytes": N}}` in a
//! collection's group options), each bucket is flattened into a symmetric buffer there, and the ranks on one host
//! reduce each other's buckets in place instead of staging them through the communicator's slots (see
//! [`hypercomm_comm::symmetric`]); results are the same bits. A bucket that does not fit what is left of the
//! window goes through a vector instead, on every rank alike, and [`SyncStats::symmetric_buckets`] says how many
//! went through the window. All buckets are in flight together, so a window of the model's gradient bytes (plus
//! 64 bytes a bucket) holds them all. A sync through the window takes about two thirds of the time of one through
//! vectors (`cargo bench --features candle --bench grad_sync`; figures in `docs/perf/candle.md`).
//!
//! On CUDA tensors (feature `cuda`), the buckets' all-reduces run on NCCL and are waited for on candle's stream,
//! not the CPU; the GPU's watchdog bounds each of them by the group's timeout all the same, so a rank that never
//! syncs makes the others' next sync (or anything else on the collection) fail naming it, rather than hang (see
//! `device`).
//!
//! Every rank must pass the same variables (shapes and dtypes) in the same order, so that the buckets line up;
//! [`GradSync::sync_varmap`] sorts a `VarMap`'s variables by name for that (a `VarMap` iterates a hash map, whose
//! order differs between processes). A variable without a gradient on a rank counts as zeros there, so the
//! buckets stay aligned, and gets the averaged gradient like the others.

use candle_core::backprop::GradStore;
use candle_core::{Device, Shape, Tensor, Var};
use candle_nn::VarMap;
use hypercomm_comm::{CommError, Communicator, ReduceOp};

use crate::bucket::{Bucket, Buckets, Fill, Tally};
use crate::host::{HostBuf, Pending};
use crate::symmetric::{self, SymBuf};
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
    /// Buckets that went through the group communicator's symmetric window (read in place by the peers on this
    /// host) rather than through vectors; 0 without a window (see [`GradSync`]).
    pub symmetric_buckets: usize,
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
        for var in vars {
            crate::host::check_tensor(var.as_tensor(), "gradient sync", self.group.name())?;
        }
        // The buckets are planned from the variables (a gradient has its variable's shape and dtype, checked as it
        // is read), so each one's size is known before it is filled: a symmetric buffer cannot grow.
        let mut planner: Buckets<Tally> = Buckets::new(self.bucket_bytes);
        let mut plan = Vec::new();
        for (index, var) in vars.iter().enumerate() {
            if let Some(full) = planner.add(index, var.as_tensor(), |_| Ok(Tally::default()))? {
                plan.push(full);
            }
        }
        plan.extend(planner.rest());
        let window = symmetric::has_window(comm);
        let mut stats = SyncStats::default();
        let mut in_flight = Vec::with_capacity(plan.len());
        for bucket in plan {
            // Every bucket has a first member: a bucket opens with the gradient that joins it.
            let dtype = vars[bucket.members[0].0].dtype();
            let mut contents =
                match window.then(|| SymBuf::zeros(comm, dtype, bucket.fill.elements)) {
                    Some(Ok(buf)) => HostBucket::Symmetric(buf),
                    // No window, or one without room left for this bucket: the same answer on every rank that
                    // allocates alike, so every rank takes the vector path for it.
                    None | Some(Err(_)) => {
                        let mut v = HostBuf::empty(dtype, "gradient sync", self.group.name())?;
                        v.reserve(bucket.fill.elements);
                        HostBucket::Staged(v)
                    }
                };
            for &(index, offset) in &bucket.members {
                let grad = self.gradient(index, vars[index].as_tensor(), grads)?;
                contents.put(offset, &grad)?;
            }
            stats.count(&bucket.fill);
            stats.symmetric_buckets += usize::from(matches!(contents, HostBucket::Symmetric(_)));
            let pending = contents
                .all_reduce(comm, ReduceOp::Avg)
                .map_err(|source| self.group.comm_error(source))?;
            in_flight.push((pending, bucket.members));
        }
        for (pending, members) in in_flight {
            let reduced = pending
                .wait()
                .map_err(|source| self.group.comm_error(source))?
                .into_reduced()?;
            for (index, offset) in members {
                let t = vars[index].as_tensor();
                grads.insert(t, reduced.gradient(offset, t.shape())?);
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

/// A host bucket's contents: its gradients flattened into a vector, or into a symmetric buffer when the group's
/// communicator has a window with room for it (the all-reduce then reads the peers' buckets in place).
enum HostBucket {
    Staged(HostBuf),
    Symmetric(SymBuf),
}

impl HostBucket {
    /// Puts `grad` at element `offset`: where the plan placed it, which for a vector is its end.
    fn put(&mut self, offset: usize, grad: &Tensor) -> Result<()> {
        match self {
            HostBucket::Staged(v) => {
                debug_assert_eq!(v.len(), offset, "buckets fill in plan order");
                v.append(grad)
            }
            HostBucket::Symmetric(b) => b.write_at(offset, grad),
        }
    }

    /// Issues the bucket's in-place all-reduce.
    fn all_reduce(
        self,
        comm: &Communicator,
        op: ReduceOp,
    ) -> std::result::Result<Pending<HostBucket>, CommError> {
        Ok(match self {
            HostBucket::Staged(v) => {
                let work = v.all_reduce(comm, op)?;
                Pending::new(move || work.wait().map(HostBucket::Staged))
            }
            HostBucket::Symmetric(b) => {
                let work = b.all_reduce(comm, op)?;
                Pending::new(move || work.wait().map(HostBucket::Symmetric))
            }
        })
    }

    /// The averages, ready to be handed out as gradients.
    fn into_reduced(self) -> Result<Reduced> {
        Ok(match self {
            HostBucket::Staged(v) => {
                let len = v.len();
                Reduced::Tensor(v.into_tensor(len, &Device::Cpu)?)
            }
            HostBucket::Symmetric(b) => Reduced::Window(b),
        })
    }
}

/// A reduced host bucket.
enum Reduced {
    /// The vector, turned into a 1-D tensor without a copy: each gradient is a view of it, as on the device.
    Tensor(Tensor),
    /// The symmetric buffer: each gradient is copied out into a tensor of its own, and the window's space goes
    /// back when the buffer drops. (Copying the whole bucket into one tensor and handing out views of it measured
    /// slower; see `docs/perf/candle.md`.)
    Window(SymBuf),
}

impl Reduced {
    /// The gradient of `shape` at element `offset`.
    fn gradient(&self, offset: usize, shape: &Shape) -> Result<Tensor> {
        match self {
            Reduced::Tensor(t) => Ok(t.narrow(0, offset, shape.elem_count())?.reshape(shape)?),
            Reduced::Window(b) => b.tensor_at(offset, shape, &Device::Cpu),
        }
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

    use process_group_collection::GroupOptions;

    use super::{DEFAULT_BUCKET_BYTES, GradSync, SyncStats};
    use crate::TensorGroup;
    use crate::testing::{run_ranks, run_ranks_with, values};

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

    /// The mean over ranks 0 and 1 of variable `i`'s gradient in [`grads_on`], as f64 values.
    fn mean_gradient(i: usize) -> Vec<f64> {
        let (dims, dtype) = SHAPES[i];
        let g0 = values(&pattern(0, i, dims, dtype));
        let g1 = if i == 3 {
            vec![0.0; g0.len()]
        } else {
            values(&pattern(1, i, dims, dtype))
        };
        g0.iter().zip(&g1).map(|(a, b)| (a + b) / 2.0).collect()
    }

    /// Syncs the [`SHAPES`] variables' gradients ([`grads_on`]) on two ranks whose dp communicators have a
    /// symmetric window of `window` bytes (0: none); each rank's stats and averaged gradients, in variable order.
    fn sync_two_ranks(bucket_bytes: usize, window: usize) -> Vec<(SyncStats, Vec<Vec<f64>>)> {
        let options = if window == 0 {
            GroupOptions::new()
        } else {
            GroupOptions::from_json(&format!(r#"{{"dp": {{"symmetric_bytes": {window}}}}}"#))
                .expect("options")
        };
        run_ranks_with(2, 1, options, move |rank, pgc| {
            let dp = TensorGroup::kind(&pgc, "dp").expect("dp");
            let vars: Vec<Var> = SHAPES
                .iter()
                .map(|(dims, dtype)| Var::zeros(*dims, *dtype, &Device::Cpu).expect("var"))
                .collect();
            let mut grads = grads_on(rank, &vars);
            let sync = GradSync::new(dp).with_bucket_bytes(bucket_bytes);
            let stats = sync.sync(&vars, &mut grads).expect("sync");
            let averaged = vars
                .iter()
                .zip(SHAPES)
                .map(|(var, (dims, dtype))| {
                    let got = grads.get(var.as_tensor()).expect("averaged gradient");
                    assert_eq!((got.dtype(), got.dims()), (dtype, dims));
                    values(got)
                })
                .collect();
            (stats, averaged)
        })
    }

    /// Bucket sizes and the buckets they give for [`SHAPES`]: f32 [0] (48 B), f32 [1, 3] (48 B), f64 [2, 4]
    /// (80 B) at 40 bytes.
    const BUCKETINGS: [(usize, usize); 3] = [(DEFAULT_BUCKET_BYTES, 2), (40, 3), (0, 5)];

    #[test]
    fn bucketed_average_equals_the_mean_gradient() {
        for (bucket_bytes, want_buckets) in BUCKETINGS {
            let ranks = sync_two_ranks(bucket_bytes, 0);
            for (stats, averaged) in &ranks {
                for (i, got) in averaged.iter().enumerate() {
                    assert_eq!(
                        *got,
                        mean_gradient(i),
                        "variable {i}, bucket size {bucket_bytes}"
                    );
                }
                let want = SyncStats {
                    buckets: want_buckets,
                    elements: 12 + 5 + 4 + 7 + 6,
                    bytes: (12 + 5 + 7) * 4 + (4 + 6) * 8,
                    symmetric_buckets: 0,
                };
                assert_eq!(*stats, want, "bucket size {bucket_bytes}");
            }
        }
    }

    #[test]
    fn with_a_symmetric_window_every_bucket_goes_through_it_and_the_bits_are_the_same() {
        for (bucket_bytes, want_buckets) in BUCKETINGS {
            let staged = sync_two_ranks(bucket_bytes, 0);
            let windowed = sync_two_ranks(bucket_bytes, 1 << 20);
            for ((s, staged), (w, windowed)) in staged.iter().zip(&windowed) {
                assert_eq!(windowed, staged, "bucket size {bucket_bytes}");
                assert_eq!(
                    (w.buckets, w.symmetric_buckets),
                    (want_buckets, want_buckets)
                );
                assert_eq!((w.elements, w.bytes), (s.elements, s.bytes));
            }
        }
    }

    #[test]
    fn buckets_that_do_not_fit_the_window_go_through_vectors_on_every_rank() {
        // Three f32 variables of 3000 elements, a bucket each (12000 bytes, 12032 in the window's 64-byte units,
        // past the size the host backend stages, so the first is reduced in place); a window of four pages (16384
        // bytes) holds the first while it is in flight, not the second or third.
        let per_rank = run_ranks_with(
            2,
            1,
            GroupOptions::from_json(r#"{"dp": {"symmetric_bytes": 16384}}"#).expect("options"),
            |rank, pgc| {
                let dp = TensorGroup::kind(&pgc, "dp").expect("dp");
                let vars: Vec<Var> = (0..3)
                    .map(|_| Var::zeros(3000, DType::F32, &Device::Cpu).expect("var"))
                    .collect();
                // Gradient i is pattern(rank, i): a backward pass of the sum of var_i ⊙ pattern(rank, i).
                let mut loss = Tensor::zeros((), DType::F32, &Device::Cpu).expect("zero");
                for (i, var) in vars.iter().enumerate() {
                    let term = (var.as_tensor() * pattern(rank, i, &[3000], DType::F32))
                        .and_then(|t| t.sum_all())
                        .expect("term");
                    loss = (loss + term).expect("sum");
                }
                let mut grads = loss.backward().expect("backward");
                let stats = GradSync::new(dp.clone())
                    .with_bucket_bytes(0)
                    .sync(&vars, &mut grads)
                    .expect("sync");
                let averaged: Vec<Vec<f64>> = vars
                    .iter()
                    .map(|v| values(grads.get(v.as_tensor()).expect("gradient")))
                    .collect();
                // The window's space came back: a buffer of the whole window fits again.
                let comm = dp.comm().expect("comm");
                assert!(comm.symmetric_buffer(4096, 0.0f32).is_ok());
                (stats, averaged)
            },
        );
        for (stats, averaged) in per_rank {
            assert_eq!((stats.buckets, stats.symmetric_buckets), (3, 1));
            for (i, got) in averaged.iter().enumerate() {
                let want: Vec<f64> = values(&pattern(0, i, &[3000], DType::F32))
                    .iter()
                    .zip(values(&pattern(1, i, &[3000], DType::F32)))
                    .map(|(a, b)| (a + b) / 2.0)
                    .collect();
                assert_eq!(*got, want, "variable {i}");
            }
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
