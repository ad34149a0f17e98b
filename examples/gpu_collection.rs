//! A process-group collection with a GPU: every group of a `tp 2, dp 2` layout gets a communicator with an NCCL
//! flavor beside its host one, with the all-gather twin of `dp_cp` as a separate NCCL communicator. Four ranks run as threads
//! of this process; each checks an all-reduce on every group it belongs to, on the GPU, and one on the host.
//!
//! Without a GPU (or where four ranks cannot be placed: four GPUs, or NCCL 2.30+ with
//! `NCCL_MULTI_RANK_GPU_ENABLE=1`), it says why and builds the host half only.
//!
//! ```sh
//! cargo run --example gpu_collection
//! ```

use std::sync::Arc;
use std::time::Duration;

use hypercomm::comm::ReduceOp;
use hypercomm::comm::device::{DeviceRuntime, Gpu, placement};
use hypercomm::grid::layout::LayoutConfig;
use hypercomm::pgc::{GroupOptions, ProcessGroupCollection};
use hypercomm::store::{MemoryStore, Store};

const RANKS: usize = 4;

/// The GPU of each rank, or why there is none for this run.
fn gpus() -> Result<Vec<Arc<Gpu>>, String> {
    let runtime =
        DeviceRuntime::probe_with_env(|n| std::env::var_os(n)).map_err(|e| e.to_string())?;
    let multi_rank = std::env::var("NCCL_MULTI_RANK_GPU_ENABLE").is_ok_and(|v| v == "1");
    placement(
        RANKS,
        runtime.device_count(),
        runtime.nccl().version(),
        multi_rank,
    )
    .map_err(|e| e.to_string())?
    .into_iter()
    .map(|d| Gpu::open(Arc::clone(&runtime), d).map_err(|e| e.to_string()))
    .collect()
}

fn rank_main(rank: usize, store: Arc<dyn Store>, gpu: Option<Arc<Gpu>>) -> Result<String, String> {
    let layout = LayoutConfig::new(RANKS)
        .tp(2)
        .build()
        .map_err(|e| e.to_string())?;
    // Per-kind options as in Megatron-Core's NCCL communicator config: with a GPU, tp's NCCL knob reaches its
    // ncclConfig_t and dp_cp runs on a high-priority stream; without one, they would be refused, not dropped.
    let options = if gpu.is_some() {
        r#"{"tp": {"max_ctas": 8}, "dp_cp": {"high_priority_stream": true}}"#
    } else {
        "{}"
    };
    let mut builder = ProcessGroupCollection::for_layout("model", layout)
        .with_all_gather_groups(true)
        .with_options(GroupOptions::from_json(options).map_err(|e| e.to_string())?)
        .with_timeout(Duration::from_secs(60));
    if let Some(gpu) = &gpu {
        builder = builder.with_gpu(Arc::clone(gpu));
    }
    let pgc = builder.build(rank, store).map_err(|e| e.to_string())?;
    let mut report = Vec::new();
    for id in pgc.groups().cloned().collect::<Vec<_>>() {
        let Ok(m) = pgc.membership(&id) else { continue };
        let members = m.members.clone();
        let group = pgc.get(&id).map_err(|e| e.to_string())?;
        let want: f32 = members.iter().map(|&r| r as f32).sum();
        // The same call on a device buffer (NCCL) when there is a GPU, on a host vector otherwise.
        let (sum, place) = match &gpu {
            Some(gpu) => {
                let buf = gpu.upload(&[rank as f32; 4]).map_err(|e| e.to_string())?;
                let out = group
                    .all_reduce(buf, ReduceOp::Sum)
                    .and_then(|w| w.wait())
                    .map_err(|e| e.to_string())?;
                let place = format!("gpu{}", out.device());
                (out.download().map_err(|e| e.to_string())?, place)
            }
            None => {
                let out = group
                    .all_reduce(vec![rank as f32; 4], ReduceOp::Sum)
                    .and_then(|w| w.wait())
                    .map_err(|e| e.to_string())?;
                (out, "host".to_owned())
            }
        };
        if sum != [want; 4] {
            return Err(format!(
                "{id}: all_reduce gave {sum:?}, expected {want} (members {members:?})"
            ));
        }
        if members.len() > 1 {
            report.push(format!("{id} {members:?} on {place}"));
        }
    }
    Ok(format!(
        "{} (and the single-rank groups)",
        report.join(", ")
    ))
}

fn main() {
    let gpus = match gpus() {
        Ok(g) => Some(g),
        Err(why) => {
            println!("no gpu: {why}; building the host half only");
            None
        }
    };
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..RANKS)
            .map(|rank| {
                let store = Arc::clone(&store);
                let gpu = gpus.as_ref().map(|g| Arc::clone(&g[rank]));
                scope.spawn(move || rank_main(rank, store, gpu))
            })
            .collect();
        for (rank, t) in threads.into_iter().enumerate() {
            match t.join() {
                Ok(Ok(report)) => println!("rank {rank}: {report}"),
                Ok(Err(e)) => {
                    eprintln!("rank {rank}: {e}");
                    std::process::exit(1);
                }
                Err(_) => {
                    eprintln!("rank {rank} panicked");
                    std::process::exit(1);
                }
            }
        }
    });
}
