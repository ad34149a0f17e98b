//! One communicator, host vectors and device buffers alike: the same `all_reduce` call runs on the host flavor
//! for a `Vec<f32>` and on NCCL for a `DeviceBuffer<f32>` (PyTorch's `cpu:gloo,cuda:nccl`, without a wrapper type).
//! Two ranks run as threads of this process.
//!
//! On a machine without a GPU (or without NCCL) the communicator has no NCCL flavor and the example says why; the
//! host half runs everywhere.
//!
//! ```sh
//! cargo run --example device_routing
//! ```

use std::sync::Arc;
use std::time::Duration;

use hypercomm::comm::device::{DeviceRuntime, Gpu, placement};
use hypercomm::comm::{CommError, CommOptions, Communicator, NcclOptions, ReduceOp};
use hypercomm::store::MemoryStore;

const RANKS: usize = 2;

/// The GPU of each rank, or why there is none for this run.
fn gpus() -> Result<Vec<Arc<Gpu>>, String> {
    let runtime =
        DeviceRuntime::probe_with_env(|n| std::env::var_os(n)).map_err(|e| e.to_string())?;
    let multi_rank = std::env::var("NCCL_MULTI_RANK_GPU_ENABLE").is_ok_and(|v| v == "1");
    let devices = placement(
        RANKS,
        runtime.device_count(),
        runtime.nccl().version(),
        multi_rank,
    )
    .map_err(|e| e.to_string())?;
    devices
        .into_iter()
        .map(|d| Gpu::open(Arc::clone(&runtime), d).map_err(|e| e.to_string()))
        .collect()
}

fn rank_main(
    me: usize,
    store: Arc<MemoryStore>,
    gpu: Option<Arc<Gpu>>,
) -> Result<String, CommError> {
    let options = CommOptions {
        timeout: Duration::from_secs(30),
        // An NCCL knob: the NCCL flavor applies it (or refuses it by name); without a GPU it is refused, so it is set
        // only with one.
        nccl: NcclOptions {
            max_ctas: gpu.as_ref().map(|_| 4),
            ..NcclOptions::default()
        },
        ..CommOptions::named("tp")
    };
    let group = Communicator::connect(gpu.clone(), store, (0..RANKS).collect(), me, options)?;
    let mut report = Vec::new();

    let host = vec![me as f32 + 1.0; 4];
    let sum = group.all_reduce(host, ReduceOp::Sum)?.wait()?;
    assert_eq!(sum, vec![3.0; 4], "1 + 2 on every element");
    report.push(format!("host all_reduce {sum:?}"));

    if let Some(gpu) = gpu {
        let device = gpu.upload(&[me as f32 + 1.0; 4])?;
        let device = group.all_reduce(device, ReduceOp::Sum)?.wait()?;
        let sum = device.download()?;
        assert_eq!(sum, vec![3.0; 4]);
        report.push(format!("device {} all_reduce {sum:?}", gpu.ordinal()));
    }
    group.barrier()?.wait()?;
    Ok(report.join(", "))
}

fn main() {
    let gpus = match gpus() {
        Ok(g) => Some(g),
        Err(why) => {
            println!("no device half: {why}");
            None
        }
    };
    let store = Arc::new(MemoryStore::new());
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..RANKS)
            .map(|me| {
                let store = Arc::clone(&store);
                let gpu = gpus.as_ref().map(|g| Arc::clone(&g[me]));
                scope.spawn(move || rank_main(me, store, gpu))
            })
            .collect();
        for (me, t) in threads.into_iter().enumerate() {
            match t.join() {
                Ok(Ok(report)) => println!("rank {me}: {report}"),
                Ok(Err(e)) => {
                    eprintln!("rank {me}: {e}");
                    std::process::exit(1);
                }
                Err(_) => {
                    eprintln!("rank {me} panicked");
                    std::process::exit(1);
                }
            }
        }
    });
}
