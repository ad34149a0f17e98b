//! candle gradient sync on the host backend: `GradSync::sync` over two ranks (threads bound to a CPU each, over
//! shared memory), with the dp communicator's buckets in vectors and in a symmetric window, alternated call by
//! call so that both see the same machine.
//!
//! `cargo bench --features candle --bench grad_sync`; under `cargo test --features candle --benches` it runs a
//! quick smoke pass. Prints, per configuration, the median time per sync on rank 0 and the gradient bytes per
//! second it amounts to.

use std::sync::{Arc, Barrier};
use std::time::Instant;

use hypercomm::candle::candle_core::{DType, Device, Tensor, Var};
use hypercomm::candle::{GradSync, TensorGroup};
use hypercomm::comm::{CommOptions, Communicator};
use hypercomm::store::{MemoryStore, Store};
use hypercomm_bench::cpus::{Placement, bind_current_thread, rank_cpus};
use hypercomm_bench::harness::smoke_run;
use hypercomm_bench::median;

const RANKS: usize = 2;

/// One rank: two dp communicators (without and with a window), the variables and their gradients; returns rank
/// 0's sync times, vectors and window alternating.
fn rank(
    me: usize,
    store: Arc<dyn Store>,
    barrier: Arc<Barrier>,
    vars_len: &[usize],
    iters: usize,
) -> (Vec<f64>, Vec<f64>) {
    // One CPU per rank, as `hypercomm bench` places its ranks.
    if let Some(cpus) = rank_cpus(Placement::OneCpuEach, RANKS) {
        // Best effort: an unbound run still measures, only more noisily.
        let _ = bind_current_thread(cpus[me]);
    }
    let bytes: usize = vars_len.iter().sum::<usize>() * 4;
    let comm = |name: &str, window: usize| {
        let options = CommOptions {
            symmetric_bytes: window,
            ..CommOptions::named(name)
        };
        let c = Communicator::world(Arc::clone(&store), RANKS, me, options).expect("communicator");
        GradSync::new(TensorGroup::from_communicator(Arc::new(c)))
    };
    let staged = comm("grad-sync-vectors", 0);
    let windowed = comm("grad-sync-window", bytes);
    let vars: Vec<Var> = vars_len
        .iter()
        .map(|&n| Var::zeros(n, DType::F32, &Device::Cpu).expect("var"))
        .collect();
    // Gradients from a real backward pass: d/dv sum(v * c) = c.
    let mut loss = Tensor::zeros((), DType::F32, &Device::Cpu).expect("zero");
    for (i, var) in vars.iter().enumerate() {
        let c = Tensor::full((me * 7 + i) as f32 * 0.01, vars_len[i], &Device::Cpu).expect("c");
        loss = (loss
            + (var.as_tensor() * c)
                .and_then(|t| t.sum_all())
                .expect("term"))
        .expect("sum");
    }
    let mut grads = loss.backward().expect("backward");
    let (mut vector_times, mut window_times) = (Vec::new(), Vec::new());
    for i in 0..iters + 1 {
        // Alternate which goes first, so neither always follows the other.
        let order = if i % 2 == 0 {
            [(&staged, false), (&windowed, true)]
        } else {
            [(&windowed, true), (&staged, false)]
        };
        for (sync, window) in order {
            barrier.wait();
            let start = Instant::now();
            let stats = sync.sync(&vars, &mut grads).expect("sync");
            let took = start.elapsed().as_secs_f64();
            assert_eq!(stats.symmetric_buckets > 0, window, "{stats:?}");
            // The first pair warms up (first touch of the window's pages, allocations).
            if i > 0 {
                if window {
                    window_times.push(took);
                } else {
                    vector_times.push(took);
                }
            }
        }
    }
    (vector_times, window_times)
}

fn main() {
    let smoke = smoke_run();
    // 24 variables of 1 Mi f32 (96 MiB of gradients, four buckets of 25 MiB), as a 25M-parameter model's layers.
    let (vars, iters) = if smoke {
        (vec![1 << 12; 3], 2)
    } else {
        (vec![1 << 20; 24], 15)
    };
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let barrier = Arc::new(Barrier::new(RANKS));
    let ranks: Vec<_> = (0..RANKS)
        .map(|me| {
            let (store, barrier, vars) = (Arc::clone(&store), Arc::clone(&barrier), vars.clone());
            std::thread::spawn(move || rank(me, store, barrier, &vars, iters))
        })
        .collect();
    let mut results: Vec<_> = ranks
        .into_iter()
        .map(|r| r.join().expect("rank thread panicked"))
        .collect();
    let (vectors, window) = results.swap_remove(0);
    let bytes = vars.iter().sum::<usize>() * 4;
    for (name, mut times) in [("vectors", vectors), ("symmetric window", window)] {
        times.sort_by(f64::total_cmp);
        let med = median(&times).unwrap_or(f64::NAN);
        println!(
            "grad sync, {RANKS} ranks, {} KiB of f32 in 25 MiB buckets, {name:<16}: median {:>8.2} ms \
             ({:.2}-{:.2}) over {} calls, {:.2} GB/s of gradients",
            bytes >> 10,
            med * 1e3,
            times[0] * 1e3,
            times[times.len() - 1] * 1e3,
            times.len(),
            bytes as f64 / med / 1e9
        );
    }
}
