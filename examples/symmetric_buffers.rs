//! A distributed-optimizer step on symmetric buffers: gradients reduce-scattered so that each rank owns the sum of
//! one shard, the shard updated, and the parameters all-gathered back, with the ranks reading each other's buffers
//! in place instead of staging them through the shared-memory slots.
//!
//! Two ranks (threads of this process, each with its own communicator) run the step on 4 Mi parameters both ways,
//! on symmetric buffers and on ordinary vectors, check that both give the same parameters, and print how long each
//! took (the median of nine steps; figures on a shared machine vary from run to run).
//!
//! Run with `cargo run --release --example symmetric_buffers`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hypercomm::comm::{CommOptions, Communicator, ReduceOp};
use hypercomm::store::MemoryStore;

const PARAMS: usize = 4 << 20;
const STEPS: usize = 9;
const LEARNING_RATE: f32 = 0.5;

/// Rank `rank`'s gradient for parameter `i`.
fn gradient(rank: usize, i: usize) -> f32 {
    ((rank * 31 + i) % 17) as f32 - 8.0
}

/// Plain gradient descent on one shard.
fn update(weights: &mut [f32], grads: &[f32]) {
    for (w, g) in weights.iter_mut().zip(grads) {
        *w -= LEARNING_RATE * g;
    }
}

/// One step on symmetric buffers: reduce-scatter the gradients, update this rank's shard of `params`, all-gather.
fn step_symmetric(
    comm: &Communicator,
    params: &mut [f32],
) -> Result<Duration, Box<dyn std::error::Error>> {
    let (n, me) = (comm.size(), comm.rank());
    let shard = PARAMS / n;
    let mut grads = comm.symmetric_buffer(PARAMS, 0.0f32)?;
    grads
        .iter_mut()
        .enumerate()
        .for_each(|(i, g)| *g = gradient(me, i));
    let mut weights = comm.symmetric_buffer(PARAMS, 0.0f32)?;
    weights.copy_from_slice(params);
    let start = Instant::now();
    let grads = comm
        .reduce_scatter_symmetric(grads, ReduceOp::Sum)?
        .wait()?;
    let mine = me * shard..(me + 1) * shard;
    update(&mut weights[mine.clone()], &grads[mine]);
    let weights = comm.all_gather_symmetric(weights)?.wait()?;
    let took = start.elapsed();
    params.copy_from_slice(&weights);
    Ok(took)
}

/// The same step on ordinary vectors.
fn step_ordinary(
    comm: &Communicator,
    params: &mut Vec<f32>,
) -> Result<Duration, Box<dyn std::error::Error>> {
    let (n, me) = (comm.size(), comm.rank());
    let shard = PARAMS / n;
    let grads: Vec<f32> = (0..PARAMS).map(|i| gradient(me, i)).collect();
    let mut weights = std::mem::take(params);
    let start = Instant::now();
    let grads = comm.reduce_scatter(grads, ReduceOp::Sum)?.wait()?;
    let mine = me * shard..(me + 1) * shard;
    update(&mut weights[mine.clone()], &grads[mine]);
    *params = comm.all_gather(weights)?.wait()?;
    Ok(start.elapsed())
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

/// One rank: both kinds of step, `STEPS` times each; the final parameters and the median step times.
fn rank(store: Arc<MemoryStore>, me: usize) -> Result<(Vec<f32>, Duration, Duration), String> {
    let run = || -> Result<_, Box<dyn std::error::Error>> {
        let options = CommOptions {
            // Room for the two buffers of a step.
            symmetric_bytes: 2 * PARAMS * size_of::<f32>(),
            ..CommOptions::named("optimizer")
        };
        let comm = Communicator::world(store, 2, me, options)?;
        let (mut sym, mut ord) = (vec![1.0f32; PARAMS], vec![1.0f32; PARAMS]);
        let (mut sym_times, mut ord_times) = (Vec::new(), Vec::new());
        for _ in 0..STEPS {
            sym_times.push(step_symmetric(&comm, &mut sym)?);
            ord_times.push(step_ordinary(&comm, &mut ord)?);
        }
        if sym != ord {
            return Err("symmetric and ordinary steps disagree".into());
        }
        Ok((sym, median(sym_times), median(ord_times)))
    };
    run().map_err(|e| format!("rank {me}: {e}"))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = Arc::new(MemoryStore::new());
    let ranks: Vec<_> = (0..2)
        .map(|me| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || rank(store, me))
        })
        .collect();
    let mut results = Vec::new();
    for r in ranks {
        results.push(r.join().map_err(|_| "a rank panicked")??);
    }
    // Every rank holds the same parameters, and they are what the update rule gives.
    let expected: Vec<f32> = (0..PARAMS)
        .map(|i| 1.0 - STEPS as f32 * LEARNING_RATE * (gradient(0, i) + gradient(1, i)))
        .collect();
    for (me, (params, sym, ord)) in results.iter().enumerate() {
        if *params != expected {
            return Err(format!(
                "rank {me} ended with other parameters than the update rule gives"
            )
            .into());
        }
        println!(
            "rank {me}: reduce-scatter + update + all-gather of {PARAMS} f32, median of {STEPS}: \
             symmetric {:.2} ms, ordinary {:.2} ms",
            sym.as_secs_f64() * 1e3,
            ord.as_secs_f64() * 1e3
        );
    }
    println!("both ranks agree with the update rule after {STEPS} steps");
    Ok(())
}
