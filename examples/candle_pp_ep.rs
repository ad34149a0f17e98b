//! Pipeline- and expert-parallel training of a small candle model with a mixture-of-experts layer, over
//! hypercomm's process groups.
//!
//! **The model** has two pipeline stages. Stage 0 is `h = tanh(input(x))` (8 → 16) followed by a mixture-of-
//! experts block: a learned router (16 → 2) picks for every token (a row) the expert with the highest probability
//! (top-1), and the block returns `h + p · expert(h)`, where `p` is that probability (the Switch Transformer's gate,
//! through which the router learns) and each of the 2 experts is an MLP (16 → 32 → 16, SiLU). Stage 1 is
//! `head(tanh(mid(h)))` (16 → 16 → 1). It learns a fixed function of 8 inputs (mean squared error) with plain SGD
//! for 20 steps. Every rank draws the same initial weights and data from a fixed seed with a small linear
//! congruential generator, so no rank needs another's to start.
//!
//! **The groups** come from a Megatron-Core layout with `pp` and `ep` over `pp · dp` ranks (`dp` defaults to `ep`),
//! through a `ProcessGroupCollection`:
//! - `pp`: one rank per stage. Stage 0 sends its activations to stage 1 and gets their gradients back.
//! - `dp` (dense data parallel, `world / pp` ranks): the replicas of a stage, each on its own shard of every global
//!   batch of 64 rows. The dense parameters (input, router, mid, head) are averaged over it.
//! - `ep` (expert parallel): the experts are spread over it, one per rank with `--ep 2`. It is carved out of `dp`
//!   as Megatron-Core does, so its ranks hold different shards: each routes its tokens, sends every expert's rank
//!   the tokens for that expert with a split-size all-to-all (`TensorGroup::all_to_all_v`, after an all-to-all of
//!   the token counts), runs its expert on what it gets, and sends the results back the same way (the combine).
//!   The backward pass runs the reverse all-to-alls.
//! - `expt_dp` (expert data parallel, `dp / ep` ranks): the replicas of an expert. An expert's gradient holds the
//!   contributions of the tokens of all `ep` shards it served, so, as Megatron-Core's DDP does, expert gradients
//!   are scaled by `expt_dp / dp` and averaged over `expt_dp`: summed over the replicas and divided by `dp`, the
//!   mean over all shards, as the dense gradients' average over `dp` is.
//!
//! With `--pp 2 --ep 2` (4 ranks) the layout gives `pp` {0, 2} and {1, 3}, `dp` and `ep` both {0, 1} and {2, 3},
//! and `expt_dp` one rank each: the dense gradients are averaged over 2 ranks, the expert gradients only scaled
//! by 1/2. `--pp 2 --ep 2 --dp 4` (8 ranks) makes `expt_dp` 2 ranks wide too.
//!
//! **The schedule** is Megatron's 1F1B (one forward, one backward) over 4 micro-batches per shard: stage `s` of `P`
//! runs `P - s - 1` warm-up forwards, then alternates one forward and one backward, then drains the remaining
//! backwards. Activations and gradients move with `TensorGroup::exchange`, which runs a send and a receive as
//! one operation: a stage sends its output to the next stage while it receives a gradient from it, and sends a
//! gradient back while it receives the next micro-batch's input, so neither side waits on the other. Gradients
//! are accumulated over the micro-batches, each micro-batch's loss divided by their number.
//!
//! `--pp 1 --ep 1` is the single-rank reference: the same math with both stages and both experts on one rank
//! (its all-to-alls are over a group of one). Both print, from rank 0, one line per step, `step <n> loss <value>`
//! (the loss over the global batch, 9 significant digits), then `final weight checksum <value>` (the sum of the
//! squares of every weight of the full model, each counted once); the runs agree to about 1e-6 relative
//! (`tests/examples.rs` checks 1e-5).
//!
//! Run with `cargo run --features candle --example candle_pp_ep -- --pp 2 --ep 2`. Started by hand it launches its
//! ranks itself (through `hypercomm::launch::Launcher`, host backend); under a launcher that `Rendezvous::from_env`
//! reads (`hypercomm launch -n 4`, torchrun, srun, mpirun) it runs as one rank of the job.

use std::collections::VecDeque;
use std::error::Error;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use hypercomm::candle::candle_core::backprop::GradStore;
use hypercomm::candle::candle_core::{
    D, DType, Device, Module, Result as CandleResult, Tensor, Var,
};
use hypercomm::candle::candle_nn::{Linear, Optimizer, SGD, ops};
use hypercomm::candle::{GradSync, ReduceOp, TensorGroup, TensorP2p};
use hypercomm::grid::layout::LayoutConfig;
use hypercomm::pgc::ProcessGroupCollection;
use hypercomm::store::{EnvSource, Rendezvous, Store};

mod support;

use support::{Lcg, launch_self, significant, target};

const SEED: u64 = 0x5eed_2027;
const INPUTS: usize = 8;
const WIDTH: usize = 16;
const EXPERT_HIDDEN: usize = 32;
const EXPERTS: usize = 2;
const GLOBAL_BATCH: usize = 64;
const MICRO_BATCHES: usize = 4;
const STAGES: usize = 2;
const STEPS: usize = 20;
const LEARNING_RATE: f64 = 0.1;
const TIMEOUT: Duration = Duration::from_secs(60);

type Res<T> = Result<T, Box<dyn Error>>;

struct Args {
    pp: usize,
    ep: usize,
    dp: usize,
}

fn parse_args() -> Result<Args, String> {
    let (mut pp, mut ep, mut dp) = (2, 2, None);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let n: usize = v
            .parse()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("{flag} {v}: expected a positive integer"))?;
        match flag.as_str() {
            "--pp" => pp = n,
            "--ep" => ep = n,
            "--dp" => dp = Some(n),
            other => {
                return Err(format!(
                    "unknown argument {other} (expected --pp N, --ep N, --dp N)"
                ));
            }
        }
    }
    let dp = dp.unwrap_or(ep);
    if pp != 1 && pp != STAGES {
        return Err(format!(
            "--pp {pp}: the model has {STAGES} stages, so pp is 1 or {STAGES}"
        ));
    }
    if EXPERTS % ep != 0 {
        return Err(format!("--ep {ep} must divide the {EXPERTS} experts"));
    }
    if dp % ep != 0 {
        return Err(format!(
            "--ep {ep} must divide --dp {dp} (expert parallelism is carved out of dp)"
        ));
    }
    if GLOBAL_BATCH % (dp * MICRO_BATCHES) != 0 {
        return Err(format!(
            "--dp {dp} times {MICRO_BATCHES} micro-batches must divide the global batch of {GLOBAL_BATCH} rows"
        ));
    }
    Ok(Args { pp, ep, dp })
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("candle_pp_ep: {e}");
            return ExitCode::from(2);
        }
    };
    let result = if EnvSource::detect().is_none() {
        launch_self(
            &[
                "--pp".into(),
                args.pp.to_string(),
                "--ep".into(),
                args.ep.to_string(),
                "--dp".into(),
                args.dp.to_string(),
            ],
            args.pp * args.dp,
        )
    } else {
        rank_main(&args)
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("candle_pp_ep: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Rows `first..first + rows` of step `step`'s global batch: inputs `[rows, 8]` and targets `[rows, 1]`.
fn batch(step: usize, first: usize, rows: usize) -> CandleResult<(Tensor, Tensor)> {
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

fn linear([weight, bias]: &[Var; 2]) -> Linear {
    Linear::new(weight.as_tensor().clone(), Some(bias.as_tensor().clone()))
}

/// One expert: `fc2(silu(fc1(h)))`.
struct Expert {
    vars: [[Var; 2]; 2],
}

impl Expert {
    fn forward(&self, h: &Tensor) -> CandleResult<Tensor> {
        linear(&self.vars[1]).forward(&linear(&self.vars[0]).forward(h)?.silu()?)
    }
}

/// The stable order that sorts `keys`, and its inverse, as index tensors: `sorted = t.index_select(order)`, and
/// `sorted.index_select(inverse)` is `t` again.
fn sorting(keys: &[usize]) -> CandleResult<(Tensor, Tensor)> {
    let mut order: Vec<u32> = (0..keys.len() as u32).collect();
    order.sort_by_key(|&i| keys[i as usize]);
    let mut inverse = vec![0u32; keys.len()];
    for (position, &i) in order.iter().enumerate() {
        inverse[i as usize] = position as u32;
    }
    let n = keys.len();
    Ok((
        Tensor::from_vec(order, n, &Device::Cpu)?,
        Tensor::from_vec(inverse, n, &Device::Cpu)?,
    ))
}

/// The mixture-of-experts block: a replicated router, this rank's share of the experts, and the ep group they
/// are spread over (expert `e` lives on ep rank `e / local`, where `local = EXPERTS / ep`).
struct Moe {
    router: [Var; 2],
    experts: Vec<Expert>,
    ep: TensorGroup,
}

impl Moe {
    /// `h + p · expert(h)` with top-1 routing (see the module docs). Every rank of the ep group calls it for
    /// each micro-batch, in the same order: its all-to-alls are collective, forward and backward.
    fn forward(&self, h: &Tensor) -> Res<Tensor> {
        let (ep, local) = (self.ep.size(), self.experts.len());
        let probs = ops::softmax(&linear(&self.router).forward(h)?, D::Minus1)?;
        // Top-1: the decision has no gradient; the gate `p` does, and trains the router.
        let choice: Vec<u32> = probs.argmax(D::Minus1)?.to_vec1()?;
        let tokens = choice.len();
        let gate = probs.gather(
            &Tensor::from_vec(choice.clone(), (tokens, 1), &Device::Cpu)?,
            1,
        )?;

        // Dispatch: sort the tokens by expert, so that each expert's rank gets one block of rows, and tell every
        // rank how many tokens it gets for each of its experts.
        let expert_of: Vec<usize> = choice.iter().map(|&e| e as usize).collect();
        let (by_expert, unsort) = sorting(&expert_of)?;
        let mut per_expert = vec![0u32; EXPERTS];
        for &e in &expert_of {
            per_expert[e] += 1;
        }
        let counts = self.ep.all_to_all_v(
            &Tensor::new(per_expert.as_slice(), &Device::Cpu)?,
            &vec![local; ep],
            &vec![local; ep],
        )?;
        // `incoming[s * local + j]`: tokens ep rank `s` sends for this rank's expert `j`.
        let incoming: Vec<u32> = counts.to_vec1()?;
        let rows_per_rank = |c: &[u32]| -> Vec<usize> {
            c.chunks(local)
                .map(|r| r.iter().sum::<u32>() as usize)
                .collect()
        };
        let (send_splits, recv_splits) = (rows_per_rank(&per_expert), rows_per_rank(&incoming));
        let received =
            self.ep
                .all_to_all_v(&h.index_select(&by_expert, 0)?, &send_splits, &recv_splits)?;

        // The received rows come by sender, then by expert; group them by expert to run each expert once.
        let local_expert: Vec<usize> = incoming
            .iter()
            .enumerate()
            .flat_map(|(i, &n)| std::iter::repeat_n(i % local, n as usize))
            .collect();
        let (by_local, ungroup) = sorting(&local_expert)?;
        let grouped = received.index_select(&by_local, 0)?;
        let mut outputs = Vec::with_capacity(local);
        let mut offset = 0;
        for (j, expert) in self.experts.iter().enumerate() {
            let rows = local_expert.iter().filter(|&&k| k == j).count();
            outputs.push(expert.forward(&grouped.narrow(0, offset, rows)?)?);
            offset += rows;
        }
        let done = Tensor::cat(&outputs, 0)?.index_select(&ungroup, 0)?;

        // Combine: the results go back to the tokens' ranks (the dispatch reversed), then into token order.
        let combined = self.ep.all_to_all_v(&done, &recv_splits, &send_splits)?;
        let y = combined.index_select(&unsort, 0)?;
        Ok((h + y.broadcast_mul(&gate)?)?)
    }
}

/// Stage 0: the input layer and the mixture-of-experts block.
struct First {
    input: [Var; 2],
    moe: Moe,
}

/// Stage 1: `head(tanh(mid(h)))`.
struct Last {
    mid: [Var; 2],
    head: [Var; 2],
}

/// This rank's part of the model: one stage, or both when pp = 1.
struct Model {
    first: Option<First>,
    last: Option<Last>,
}

impl Model {
    /// Every rank draws every weight in the same order and keeps its stages' layers and its ep rank's experts.
    fn new(stage: Option<usize>, ep: TensorGroup) -> CandleResult<Model> {
        let mut lcg = Lcg::new(SEED, 0);
        let input = lcg.layer(WIDTH, INPUTS)?;
        let router = lcg.layer(EXPERTS, WIDTH)?;
        let mut experts = Vec::new();
        for _ in 0..EXPERTS {
            experts.push(Expert {
                vars: [
                    lcg.layer(EXPERT_HIDDEN, WIDTH)?,
                    lcg.layer(WIDTH, EXPERT_HIDDEN)?,
                ],
            });
        }
        let mid = lcg.layer(WIDTH, WIDTH)?;
        let head = lcg.layer(1, WIDTH)?;
        let local = EXPERTS / ep.size();
        let mine: Vec<Expert> = experts
            .into_iter()
            .skip(ep.rank() * local)
            .take(local)
            .collect();
        Ok(Model {
            first: (stage != Some(1)).then_some(First {
                input,
                moe: Moe {
                    router,
                    experts: mine,
                    ep,
                },
            }),
            last: (stage != Some(0)).then_some(Last { mid, head }),
        })
    }

    /// The dense variables (averaged over dp) and the expert variables (over expt_dp), in a fixed order.
    fn vars(&self) -> (Vec<Var>, Vec<Var>) {
        let (mut dense, mut expert) = (Vec::new(), Vec::new());
        if let Some(first) = &self.first {
            dense.extend(first.input.iter().chain(&first.moe.router).cloned());
            for e in &first.moe.experts {
                expert.extend(e.vars.iter().flatten().cloned());
            }
        }
        if let Some(last) = &self.last {
            dense.extend(last.mid.iter().chain(&last.head).cloned());
        }
        (dense, expert)
    }

    /// This rank's stages on micro-batch `x` (or on `input` received from the previous stage): the activation for
    /// the next stage, or, on the last stage, the micro-batch's share of the loss.
    fn forward(&self, x: &Tensor, input: Option<&Tensor>, y: &Tensor) -> Res<Tensor> {
        let mut h = input.unwrap_or(x).clone();
        if let Some(first) = &self.first {
            h = first
                .moe
                .forward(&linear(&first.input).forward(&h)?.tanh()?)?;
        }
        let Some(last) = &self.last else {
            return Ok(h);
        };
        let out = linear(&last.head).forward(&linear(&last.mid).forward(&h)?.tanh()?)?;
        Ok((out.sub(y)?.sqr()?.mean_all()? / MICRO_BATCHES as f64)?)
    }
}

/// Activations and gradients between the neighbouring stages of this rank's pipeline, as Megatron's
/// `p2p_communication`: each call is one `exchange` (an empty one where this stage has no such neighbour).
struct Pipe {
    pp: TensorGroup,
    /// The activations' shape: `[rows of a micro-batch, WIDTH]`.
    shape: (usize, usize),
}

impl Pipe {
    fn prev(&self) -> Option<usize> {
        self.pp.rank().checked_sub(1)
    }

    fn next(&self) -> Option<usize> {
        Some(self.pp.rank() + 1).filter(|&n| n < self.pp.size())
    }

    /// Sends `send` (if any, and if there is a `to`) and receives an activation-shaped tensor from `from` (if
    /// any), as one operation.
    fn exchange(
        &self,
        send: Option<&Tensor>,
        to: Option<usize>,
        from: Option<usize>,
    ) -> Res<Option<Tensor>> {
        let mut parts = Vec::new();
        if let (Some(t), Some(to)) = (send, to) {
            parts.push(TensorP2p::send(t, to));
        }
        if let Some(from) = from {
            parts.push(TensorP2p::recv(self.shape, DType::F32, &Device::Cpu, from));
        }
        let mut got = self.pp.exchange(parts)?;
        Ok(from.and(got.pop()))
    }

    fn recv_forward(&self) -> Res<Option<Tensor>> {
        self.exchange(None, None, self.prev())
    }

    fn send_forward(&self, output: &Tensor) -> Res<()> {
        self.exchange(Some(output), self.next(), None).map(drop)
    }

    fn send_forward_recv_backward(&self, output: &Tensor) -> Res<Option<Tensor>> {
        self.exchange(Some(output), self.next(), self.next())
    }

    fn send_backward_recv_forward(&self, grad: Option<&Tensor>) -> Res<Option<Tensor>> {
        self.exchange(grad, self.prev(), self.prev())
    }

    fn recv_backward(&self) -> Res<Option<Tensor>> {
        self.exchange(None, None, self.next())
    }

    fn send_backward(&self, grad: Option<&Tensor>) -> Res<()> {
        self.exchange(grad, self.prev(), None).map(drop)
    }
}

/// A micro-batch between its forward and its backward step.
struct InFlight {
    /// The received activation, as a variable so that its gradient can go back (none on the first stage).
    input: Option<Var>,
    /// The activation sent on, or the loss share on the last stage.
    output: Tensor,
}

/// One training step's forward and backward passes on this rank's stage, over its data shard.
struct Step<'a> {
    model: &'a Model,
    pipe: &'a Pipe,
    step: usize,
    /// The first row of this rank's shard of the global batch, and rows per micro-batch.
    shard_start: usize,
    rows: usize,
    /// The gradients summed over the micro-batches so far.
    grads: Option<GradStore>,
    /// The loss summed over the micro-batches (last stage only).
    loss: f64,
    forwarded: usize,
}

impl Step<'_> {
    fn forward(&mut self, input: Option<Tensor>) -> Res<InFlight> {
        let (x, y) = batch(
            self.step,
            self.shard_start + self.forwarded * self.rows,
            self.rows,
        )?;
        self.forwarded += 1;
        let input = input.map(|t| Var::from_tensor(&t)).transpose()?;
        let output = self
            .model
            .forward(&x, input.as_ref().map(Var::as_tensor), &y)?;
        if self.model.last.is_some() {
            self.loss += f64::from(output.to_scalar::<f32>()?);
        }
        Ok(InFlight { input, output })
    }

    /// Backward from the loss share, or from the output's gradient received from the next stage; returns the
    /// input's gradient for the previous stage.
    fn backward(&mut self, done: InFlight, output_grad: Option<Tensor>) -> Res<Option<Tensor>> {
        let grads = match output_grad {
            Some(g) => done.output.mul(&g)?.sum_all()?.backward()?,
            None => done.output.backward()?,
        };
        let input_grad = done.input.and_then(|v| grads.get(v.as_tensor()).cloned());
        let (dense, expert) = self.model.vars();
        match &mut self.grads {
            None => self.grads = Some(grads),
            Some(total) => {
                for var in dense.iter().chain(&expert) {
                    if let Some(g) = grads.get(var.as_tensor()) {
                        let sum = match total.get(var.as_tensor()) {
                            Some(t) => (t + g)?,
                            None => g.clone(),
                        };
                        total.insert(var.as_tensor(), sum);
                    }
                }
            }
        }
        Ok(input_grad)
    }

    /// Megatron's 1F1B schedule without interleaving (`forward_backward_pipelining_without_interleaving`).
    fn run(mut self) -> Res<(GradStore, f64)> {
        let (stage, stages) = (self.pipe.pp.rank(), self.pipe.pp.size());
        let warmup = (stages - stage - 1).min(MICRO_BATCHES);
        let remaining = MICRO_BATCHES - warmup;
        let mut in_flight = VecDeque::new();
        for _ in 0..warmup {
            let input = self.pipe.recv_forward()?;
            let done = self.forward(input)?;
            self.pipe.send_forward(&done.output)?;
            in_flight.push_back(done);
        }
        let mut input = if remaining > 0 {
            self.pipe.recv_forward()?
        } else {
            None
        };
        for i in 0..remaining {
            let done = self.forward(input.take())?;
            let output_grad = self.pipe.send_forward_recv_backward(&done.output)?;
            in_flight.push_back(done);
            let oldest = in_flight
                .pop_front()
                .ok_or("1F1B: no forward awaits its backward")?;
            let input_grad = self.backward(oldest, output_grad)?;
            if i + 1 == remaining {
                self.pipe.send_backward(input_grad.as_ref())?;
            } else {
                input = self.pipe.send_backward_recv_forward(input_grad.as_ref())?;
            }
        }
        for _ in 0..warmup {
            let output_grad = self.pipe.recv_backward()?;
            let oldest = in_flight
                .pop_front()
                .ok_or("1F1B: no forward awaits its backward")?;
            let input_grad = self.backward(oldest, output_grad)?;
            self.pipe.send_backward(input_grad.as_ref())?;
        }
        let grads = self.grads.ok_or("no micro-batches")?;
        Ok((grads, self.loss))
    }
}

/// The groups gradients are reduced over (see the module docs).
struct Reduce {
    dense: GradSync,
    expert: GradSync,
    /// `expt_dp / dp`: Megatron-Core's `expert_gradient_scaling_factor` with averaging in the collective.
    expert_scale: f64,
}

impl Reduce {
    fn run(&self, dense: &[Var], expert: &[Var], grads: &mut GradStore) -> Res<()> {
        self.dense.sync(dense, grads)?;
        for var in expert {
            if let Some(g) = grads.get(var.as_tensor()) {
                let scaled = g.affine(self.expert_scale, 0.0)?;
                grads.insert(var.as_tensor(), scaled);
            }
        }
        self.expert.sync(expert, grads)?;
        Ok(())
    }
}

fn rank_main(args: &Args) -> Res<()> {
    let rendezvous = Rendezvous::from_env()?;
    let rank = rendezvous.rank;
    let world = args.pp * args.dp;
    if rendezvous.world_size != world {
        return Err(format!(
            "--pp {} --dp {} needs {world} ranks, got {}",
            args.pp, args.dp, rendezvous.world_size
        )
        .into());
    }
    let joined = rendezvous.join(rendezvous.client_options())?;
    let store: Arc<dyn Store> = Arc::new(joined.store);
    let layout = LayoutConfig::new(world).pp(args.pp).ep(args.ep).build()?;
    let pgc = Arc::new(
        ProcessGroupCollection::for_layout("candle_pp_ep", layout)
            .with_timeout(TIMEOUT)
            .with_world_group(true)
            .build(rank, store)?,
    );
    let [pp, dp, ep, expt_dp] =
        ["pp", "dp", "ep", "expt_dp"].map(|kind| TensorGroup::kind(&pgc, kind));
    let (pp, dp, ep, expt_dp) = (pp?, dp?, ep?, expt_dp?);

    let stage = (args.pp > 1).then_some(pp.rank());
    let model = Model::new(stage, ep.clone())?;
    let (dense, expert) = model.vars();
    let mut sgd = SGD::new(
        dense.iter().chain(&expert).cloned().collect(),
        LEARNING_RATE,
    )?;
    let reduce = Reduce {
        dense: GradSync::new(dp.clone()),
        expert: GradSync::new(expt_dp.clone()),
        expert_scale: expt_dp.size() as f64 / dp.size() as f64,
    };
    let shard = GLOBAL_BATCH / args.dp;
    let pipe = Pipe {
        pp: pp.clone(),
        shape: (shard / MICRO_BATCHES, WIDTH),
    };
    for step in 1..=STEPS {
        let (mut grads, loss) = Step {
            model: &model,
            pipe: &pipe,
            step,
            shard_start: dp.rank() * shard,
            rows: shard / MICRO_BATCHES,
            grads: None,
            loss: 0.0,
            forwarded: 0,
        }
        .run()?;
        reduce.run(&dense, &expert, &mut grads)?;
        sgd.step(&grads)?;
        // The loss over the global batch: averaged over the last stage's replicas, then sent to the first stage.
        let last = pp.size() - 1;
        let mut loss = Tensor::new(loss, &Device::Cpu)?;
        if pp.rank() == last {
            loss = dp.all_reduce(&loss, ReduceOp::Avg)?;
            if last > 0 {
                pp.send(&loss, 0)?;
            }
        } else if pp.rank() == 0 {
            loss = pp.recv((), DType::F64, &Device::Cpu, last)?;
        }
        if rank == 0 {
            println!(
                "step {step} loss {}",
                significant(loss.to_scalar::<f64>()?, 9)
            );
        }
    }

    // The full model's sum of squares, each weight once: a stage's dense weights from this rank, its experts
    // summed over the ep group (each expert on one of its ranks), the stages summed over the pp group.
    let square_sum = |vars: &[Var]| -> CandleResult<f64> {
        vars.iter().try_fold(0.0, |sum, v| {
            Ok(sum
                + v.as_tensor()
                    .to_dtype(DType::F64)?
                    .sqr()?
                    .sum_all()?
                    .to_scalar::<f64>()?)
        })
    };
    let experts = ep.all_reduce(
        &Tensor::new(square_sum(&expert)?, &Device::Cpu)?,
        ReduceOp::Sum,
    )?;
    let stage_sum = (experts + square_sum(&dense)?)?;
    let checksum = pp
        .all_reduce(&stage_sum, ReduceOp::Sum)?
        .to_scalar::<f64>()?;
    if rank == 0 {
        println!("final weight checksum {}", significant(checksum, 9));
    }
    // Nobody leaves while a peer may still be reading.
    pgc.world()?.barrier()?.wait()?;
    Ok(())
}
