//! A refit plan run on device shards, through the communicator's NCCL flavor: under `fake-gpu` with six ranks as
//! threads of one child process (one fake device each; `fake_support`, shared with hypercomm-comm's tests, starts
//! it), and on a real GPU machine over the devices it has (skipping, with the reason, where it has too few).
//! Every destination byte is downloaded and compared with the shard cut from the full tensors.

#[path = "../../hypercomm-comm/tests/fake_support/mod.rs"]
mod fake_support;

use std::sync::Arc;
use std::time::Duration;

use hypercomm_comm::device::{DeviceBuffer, DeviceRuntime, Gpu};
use hypercomm_comm::{CommOptions, Communicator};
use hypercomm_refit::{
    DeviceShards, GptConfig, Peer, PlanOptions, Refit, RefitPlan, Sharding, Side, parse_layout,
    plan_peer,
};
use hypercomm_store::{MemoryStore, Store};

/// The full tensor of plan parameter `p` at step `step`: bytes that differ between parameters, positions and steps.
fn full(plan: &RefitPlan, p: usize, step: u64) -> Vec<u8> {
    (0..plan.params()[p].bytes)
        .map(|i| (i.wrapping_mul(31) ^ (i >> 8) ^ (p as u64 * 7) ^ step.wrapping_mul(101)) as u8)
        .collect()
}

/// `peer`'s shards of every plan parameter at `step` (empty where it holds none): the oracle.
fn shards_of(plan: &RefitPlan, sharding: &Sharding, peer: Peer, step: u64) -> Vec<Vec<u8>> {
    let (layout, rank) = match peer {
        Peer::Source(r) => (plan.source(), r),
        Peer::Destination(d) => (plan.destination(), d),
    };
    plan.params()
        .iter()
        .enumerate()
        .map(|(p, pp)| {
            let param = sharding.params.iter().find(|s| s.name == pp.name).unwrap();
            sharding
                .local_shard(param, layout, rank, &full(plan, p, step))
                .unwrap()
                .unwrap_or_default()
        })
        .collect()
}

/// Group rank `rank` of the refit of `plan`, on `gpu`: runs the plan `steps` times on device shards (new weights
/// each time, garbage where they land) and checks every destination byte.
fn refit_rank(
    plan: &RefitPlan,
    sharding: &Sharding,
    rank: usize,
    gpu: Arc<Gpu>,
    store: Arc<dyn Store>,
    steps: u64,
) {
    let n = plan.source().world() + plan.destination().world();
    let options = CommOptions {
        timeout: Duration::from_secs(60),
        ..CommOptions::named("refit")
    };
    let comm =
        Communicator::with_gpu(Arc::clone(&gpu), store, (0..n).collect(), rank, options).unwrap();
    let stream = Arc::clone(comm.nccl().expect("made with a gpu").stream());
    let peer = plan_peer(plan, rank).unwrap();
    let mut refit: Refit<'_, DeviceBuffer<u8>> = Refit::new(plan, peer).unwrap();
    for step in 0..steps {
        let host = match peer {
            Peer::Source(_) => shards_of(plan, sharding, peer, step),
            Peer::Destination(_) => shards_of(plan, sharding, peer, 0)
                .into_iter()
                .map(|s| vec![0xEE; s.len()])
                .collect(),
        };
        let mut shards: Vec<DeviceBuffer<u8>> =
            host.iter().map(|s| gpu.upload(s).unwrap()).collect();
        let stats = refit
            .run(
                &comm,
                &mut DeviceShards::new(&mut shards, Arc::clone(&gpu), Arc::clone(&stream)),
            )
            .unwrap();
        if let Peer::Destination(d) = peer {
            assert!(stats.received > 0, "destination {d} received nothing");
            let want = shards_of(plan, sharding, peer, step);
            for (p, (got, want)) in shards.iter().zip(&want).enumerate() {
                assert!(
                    &got.download().unwrap() == want,
                    "destination {d}, step {step}: shard of {} differs",
                    plan.params()[p].name
                );
            }
        }
        assert!(refit.staging_bytes() <= 2 * plan.options().bucket_bytes as usize);
    }
}

/// The plan from `from` to `to` of a small GPT, in buckets of `bucket` bytes.
fn plan_of(from: &str, to: &str, sharding: &Sharding, bucket: u64) -> RefitPlan {
    let (from, to) = (parse_layout(from).unwrap(), parse_layout(to).unwrap());
    RefitPlan::build(
        Side::new(&from, sharding),
        Side::new(&to, sharding),
        PlanOptions::default().bucket_bytes(bucket),
    )
    .unwrap()
}

#[test]
fn suite_refit_on_nccl_under_the_fake_gpu() {
    fake_support::pass_under_fake(
        "fake_six_ranks_refit_device_shards",
        &[("FAKE_GPU_DEVICES", "6")],
    );
}

#[test]
#[ignore = "run under fake-gpu by suite_refit_on_nccl_under_the_fake_gpu"]
fn fake_six_ranks_refit_device_shards() {
    // Four trainer ranks re-split into two engine ranks: strided runs (column-parallel halves), several buckets,
    // and a second run that reuses the staging buffers.
    let model = GptConfig::new(2, 64, 256).sharding().unwrap();
    let plan = plan_of("tp=4", "tp=2", &model, 8192);
    assert!(plan.bucket_count() > 1);
    fake_support::ranks(6, |rank, gpu, store| {
        refit_rank(&plan, &model, rank, gpu, store, 2)
    });
}

#[test]
fn gpu_refit_on_device_shards() {
    let Ok(rt) = DeviceRuntime::probe_with_env(|n| std::env::var_os(n))
        .inspect_err(|e| eprintln!("gpu_refit_on_device_shards: skipping: no device runtime: {e}"))
    else {
        return;
    };
    let devices = rt.device_count();
    // One rank per device: six devices re-split tp=4 into tp=2, two copy one rank's shards to another.
    let (from, to) = match devices {
        6.. => ("tp=4", "tp=2"),
        2.. => ("tp=1", "tp=1"),
        _ => {
            eprintln!("gpu_refit_on_device_shards: skipping: {devices} device(s), two needed");
            return;
        }
    };
    let model = GptConfig::new(2, 64, 256).sharding().unwrap();
    let plan = plan_of(from, to, &model, 8192);
    let n = plan.source().world() + plan.destination().world();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    std::thread::scope(|s| {
        let ranks: Vec<_> = (0..n)
            .map(|r| {
                let (gpu, store) = (Gpu::open(Arc::clone(&rt), r).unwrap(), Arc::clone(&store));
                let (plan, model) = (&plan, &model);
                s.spawn(move || refit_rank(plan, model, r, gpu, store, 2))
            })
            .collect();
        for r in ranks {
            r.join().expect("a rank panicked");
        }
    });
}
