//! Data- and tensor-parallel training of a small candle MLP over hypercomm's process groups.
//!
//! The model is `head(mlp(tanh(input(x))))`: `input` (8 → 16) and `head` (16 → 1) are ordinary linear layers,
//! replicated on every rank; `mlp` (16 → 64 → 16, SiLU) is Megatron's tensor-parallel block, its first layer split
//! by columns and its second by rows over the tp group. It learns a fixed function of 8 inputs from synthetic data
//! with plain SGD for 20 steps. Every rank makes the same weights and the same data from a fixed seed with a small
//! linear congruential generator, so no rank needs another's to start.
//!
//! - `--tp 2 --dp 2` (the default) launches itself as 4 processes on the host backend, with a collection over a
//!   `tp 2, dp 2` layout: each data-parallel replica takes half of every global batch of 64 rows, and
//!   `GradSync` averages the gradients over the dp group after each backward pass.
//! - `--tp 1 --dp 1` is the single-rank reference on the whole batch. Both print, from rank 0, one line per step,
//!   `step <n> loss <value>` (the loss over the global batch, 9 significant digits), then
//!   `final weight checksum <value>` (the sum of the squares of every weight of the full model); the two runs
//!   agree to about 1e-6 relative (`tests/examples.rs` checks 1e-5).
//!
//! - `--device cuda` (a build with feature `cuda`, which needs nvcc) runs the same on GPUs: rank `r` uses GPU
//!   `local_rank % GPUs`, the collection gets an NCCL communicator for every group, and every tensor collective
//!   goes through NCCL on candle's stream. Several ranks on one GPU need NCCL 2.30 or newer with
//!   `NCCL_MULTI_RANK_GPU_ENABLE=1`. The numbers match the CPU run's to about 1e-5 relative.
//!
//! Run with `cargo run --features candle --example candle_dp_tp -- --tp 2 --dp 2`. Started by hand it launches
//! its ranks itself (through `hypercomm::launch::Launcher`); under any launcher `Rendezvous::from_env` reads
//! (`hypercomm launch -n 4`, torchrun, `srun -n 4`, `mpirun -n 4`, with `HYPERCOMM_STORE_ADDR` exported under
//! srun and mpirun) it runs as one rank of the job.

use std::error::Error;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use hypercomm::candle::candle_core::{DType, Device, Module, Tensor, Var};
use hypercomm::candle::candle_nn::{Activation, Linear, Optimizer, SGD};
use hypercomm::candle::tp::{MlpWeights, ParallelMlp};
use hypercomm::candle::{GradSync, ReduceOp, TensorGroup};
use hypercomm::comm::device::{DeviceRuntime, Gpu};
use hypercomm::grid::layout::LayoutConfig;
use hypercomm::pgc::{GroupOptions, ProcessGroupCollection};
use hypercomm::store::{EnvSource, Rendezvous, Store};

mod support;

use support::{Lcg, launch_self, significant, target};

const SEED: u64 = 0x5eed_2026;
const INPUTS: usize = 8;
const WIDTH: usize = 16;
const HIDDEN: usize = 64;
const GLOBAL_BATCH: usize = 64;
const STEPS: usize = 20;
const LEARNING_RATE: f64 = 0.15;
const TIMEOUT: Duration = Duration::from_secs(60);

struct Args {
    tp: usize,
    dp: usize,
    device: String,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        tp: 2,
        dp: 2,
        device: "cpu".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--tp" | "--dp" => {
                let v = value()?;
                let n: usize = v
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| format!("{flag} {v}: expected a positive integer"))?;
                if flag == "--tp" {
                    args.tp = n
                } else {
                    args.dp = n
                }
            }
            "--device" => args.device = value()?,
            other => {
                return Err(format!(
                    "unknown argument {other} (expected --tp N, --dp N, --device cpu|cuda)"
                ));
            }
        }
    }
    if HIDDEN % args.tp != 0 || WIDTH % args.tp != 0 {
        return Err(format!(
            "--tp {} must divide the MLP's widths {WIDTH} and {HIDDEN}",
            args.tp
        ));
    }
    if GLOBAL_BATCH % args.dp != 0 {
        return Err(format!(
            "--dp {} must divide the global batch of {GLOBAL_BATCH} rows",
            args.dp
        ));
    }
    match args.device.as_str() {
        "cpu" => Ok(args),
        "cuda" if cfg!(feature = "cuda") => Ok(args),
        "cuda" => Err("--device cuda needs candle's CUDA backend, which this build does not have: build the \
                       example with `--features cuda` (hypercomm's `cuda` feature builds candle's CUDA backend \
                       and routes CUDA tensors through NCCL; it needs nvcc and the CUDA libraries at build \
                       time). Or run with --device cpu."
            .into()),
        other => Err(format!("--device {other}: expected cpu or cuda")),
    }
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("candle_dp_tp: {e}");
            return ExitCode::from(2);
        }
    };
    let result = if EnvSource::detect().is_none() {
        launch_self(
            &[
                "--tp".into(),
                args.tp.to_string(),
                "--dp".into(),
                args.dp.to_string(),
                "--device".into(),
                args.device.clone(),
            ],
            args.tp * args.dp,
        )
    } else {
        rank_main(&args)
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("candle_dp_tp: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Rows `first..first + rows` of step `step`'s global batch: inputs `[rows, 8]` and targets `[rows, 1]`.
fn batch(
    step: usize,
    first: usize,
    rows: usize,
) -> hypercomm::candle::candle_core::Result<(Tensor, Tensor)> {
    let mut lcg = Lcg::new(SEED, 1_000 + step as u64);
    let all: Vec<Vec<f64>> = (0..GLOBAL_BATCH)
        .map(|_| (0..INPUTS).map(|_| lcg.uniform()).collect())
        .collect();
    let mine = &all[first..first + rows];
    let x: Vec<f32> = mine.iter().flatten().map(|&v| v as f32).collect();
    let y: Vec<f32> = mine.iter().map(|row| target(row) as f32).collect();
    Ok((
        Tensor::from_vec(x, (rows, INPUTS), &Device::Cpu)?,
        Tensor::from_vec(y, (rows, 1), &Device::Cpu)?,
    ))
}

/// The model: replicated `input` and `head`, a tensor-parallel `mlp`.
struct Model {
    input: Linear,
    mlp: ParallelMlp,
    head: Linear,
    /// The variables of `input` and `head` (weight, bias, weight, bias).
    replicated: [Var; 4],
}

impl Model {
    /// Every rank draws the same full weights (on the CPU, then moved to `device`); the MLP keeps this rank's
    /// shards.
    fn new(tp: TensorGroup, device: &Device) -> Result<Model, Box<dyn Error>> {
        let mut lcg = Lcg::new(SEED, 0);
        let mut layer = |out: usize,
                         fan_in: usize|
         -> hypercomm::candle::candle_core::Result<(Tensor, Tensor)> {
            let scale = 1.0 / (fan_in as f64).sqrt();
            Ok((
                lcg.tensor(out, fan_in, scale)?.to_device(device)?,
                lcg.tensor(1, out, scale)?
                    .flatten_all()?
                    .to_device(device)?,
            ))
        };
        let (w0, b0) = layer(WIDTH, INPUTS)?;
        let (w1, b1) = layer(HIDDEN, WIDTH)?;
        let (w2, b2) = layer(WIDTH, HIDDEN)?;
        let (wh, bh) = layer(1, WIDTH)?;
        let weights = MlpWeights {
            fc1_weight: &w1,
            fc1_bias: Some(&b1),
            fc2_weight: &w2,
            fc2_bias: Some(&b2),
        };
        let replicated = [
            Var::from_tensor(&w0)?,
            Var::from_tensor(&b0)?,
            Var::from_tensor(&wh)?,
            Var::from_tensor(&bh)?,
        ];
        let [w0, b0, wh, bh] = replicated.clone().map(|v| v.as_tensor().clone());
        Ok(Model {
            input: Linear::new(w0, Some(b0)),
            mlp: ParallelMlp::from_full(weights, Activation::Silu, tp)?,
            head: Linear::new(wh, Some(bh)),
            replicated,
        })
    }

    fn forward(&self, x: &Tensor) -> hypercomm::candle::candle_core::Result<Tensor> {
        let h = self.input.forward(x)?.tanh()?;
        self.head.forward(&self.mlp.forward(&h)?)
    }

    /// Every trainable variable, in a fixed order, and whether it is a tensor-parallel shard.
    fn vars(&self) -> Vec<(Var, bool)> {
        let [w0, b0, wh, bh] = self.replicated.clone();
        let mut vars = vec![(w0, false), (b0, false)];
        vars.extend(self.mlp.fc1().vars().into_iter().map(|v| (v, true)));
        vars.push((self.mlp.fc2().weight().clone(), true));
        vars.extend(self.mlp.fc2().bias().map(|b| (b.clone(), false)));
        vars.extend([(wh, false), (bh, false)]);
        vars
    }
}

fn rank_main(args: &Args) -> Result<(), Box<dyn Error>> {
    let rendezvous = Rendezvous::from_env()?;
    let rank = rendezvous.rank;
    let world = args.tp * args.dp;
    if rendezvous.world_size != world {
        return Err(format!(
            "--tp {} --dp {} needs {world} ranks, got {}",
            args.tp, args.dp, rendezvous.world_size
        )
        .into());
    }
    let joined = rendezvous.join(rendezvous.client_options())?;
    let store: Arc<dyn Store> = Arc::new(joined.store);
    let layout = LayoutConfig::new(world).tp(args.tp).build()?;
    // The dp groups' host communicators get a symmetric window (1 MiB per rank, plenty for this model's
    // gradients): `GradSync` flattens its buckets there, and the peers on this host reduce them in place.
    let options = GroupOptions::from_json(r#"{"dp": {"symmetric_bytes": 1048576}}"#)?;
    let mut builder = ProcessGroupCollection::for_layout("candle", layout)
        .with_timeout(TIMEOUT)
        .with_options(options);
    let device = if args.device == "cuda" {
        // One GPU per local rank, wrapping around when there are fewer GPUs than ranks on this machine.
        let runtime = DeviceRuntime::probe_with_env(|n| std::env::var_os(n))?;
        let ordinal = rendezvous.local_rank % runtime.device_count().max(1);
        builder = builder.with_gpu(Gpu::open(runtime, ordinal)?);
        Device::new_cuda(ordinal)?
    } else {
        Device::Cpu
    };
    let pgc = Arc::new(builder.build(rank, store)?);
    let tp = TensorGroup::kind(&pgc, "tp")?;
    let dp = TensorGroup::kind(&pgc, "dp")?;

    let model = Model::new(tp.clone(), &device)?;
    let vars = model.vars();
    let all: Vec<Var> = vars.iter().map(|(v, _)| v.clone()).collect();
    let mut sgd = SGD::new(all.clone(), LEARNING_RATE)?;
    let sync = GradSync::new(dp.clone());
    let rows = GLOBAL_BATCH / args.dp;
    for step in 1..=STEPS {
        let (x, y) = batch(step, dp.rank() * rows, rows)?;
        let (x, y) = (x.to_device(&device)?, y.to_device(&device)?);
        let loss = model.forward(&x)?.sub(&y)?.sqr()?.mean_all()?;
        let mut grads = loss.backward()?;
        // Issued as the buckets fill; the loss average below queues behind them on the same communicator.
        sync.sync(&all, &mut grads)?;
        let global = dp.all_reduce(&loss.detach(), ReduceOp::Avg)?;
        sgd.step(&grads)?;
        if rank == 0 {
            println!(
                "step {step} loss {}",
                significant(
                    f64::from(global.to_device(&Device::Cpu)?.to_scalar::<f32>()?),
                    9
                )
            );
        }
    }

    // The full model's sum of squares: shards summed over the tp group, replicated weights counted once.
    let square_sum = |v: &Var| -> hypercomm::candle::candle_core::Result<f64> {
        v.as_tensor()
            .to_device(&Device::Cpu)?
            .to_dtype(DType::F64)?
            .sqr()?
            .sum_all()?
            .to_scalar::<f64>()
    };
    let (mut sharded, mut replicated) = (0.0, 0.0);
    for (v, is_shard) in &vars {
        *if *is_shard {
            &mut sharded
        } else {
            &mut replicated
        } += square_sum(v)?;
    }
    let sharded = tp.all_reduce(&Tensor::new(sharded, &Device::Cpu)?, ReduceOp::Sum)?;
    let checksum = sharded.to_scalar::<f64>()? + replicated;
    if rank == 0 {
        println!("final weight checksum {}", significant(checksum, 9));
    }
    // Nobody leaves while a peer may still be reading.
    pgc.tp_dp_cp()?.barrier()?.wait()?;
    Ok(())
}
