//! Ranks placed otherwise than one thread per device: two ranks sharing a device (NCCL 2.30 with
//! `NCCL_MULTI_RANK_GPU_ENABLE=1`), and ranks as processes meeting through a TCP store.

use std::sync::Arc;

use hypercomm_comm::ReduceOp;
use hypercomm_comm::device::Gpu;
use hypercomm_store::{ClientOptions, MemoryStore, Store, TcpStore};

use crate::device_checks::all_reduced;
use crate::fake_support::runtime;
use crate::join;

#[test]
#[ignore = "run under fake-gpu by suite_two_ranks_on_one_device_with_nccl_2_30"]
fn fake_two_ranks_share_a_device_when_allowed() {
    let rt = runtime();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let sums: Vec<Vec<i32>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|rank| {
                let (gpu, store) = (Gpu::open(Arc::clone(&rt), 0).unwrap(), Arc::clone(&store));
                s.spawn(move || {
                    let comm = join(&gpu, &store, 2, rank, "shared-device");
                    all_reduced(&comm, &gpu, &[rank as i32 + 1], ReduceOp::Sum)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(sums, [[3], [3]]);
}

#[test]
#[ignore = "run under fake-gpu by suite_ranks_as_processes"]
fn fake_one_rank_of_two_processes() {
    let rank: usize = std::env::var("HC_RANK").unwrap().parse().unwrap();
    let addr = std::env::var("HC_ADDR").unwrap();
    let store: Arc<dyn Store> =
        Arc::new(TcpStore::connect(addr, ClientOptions::default()).unwrap());
    let gpu = Gpu::open(runtime(), rank).unwrap();
    let comm = join(&gpu, &store, 2, rank, "processes");
    let b = comm
        .all_reduce(
            gpu.upload(&[rank as f64 + 0.5, 2.0]).unwrap(),
            ReduceOp::Prod,
        )
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(b.download().unwrap(), [0.75, 4.0]);
    let (_, all) = comm
        .all_gather_into(
            gpu.upload(&[rank as u16 as i32; 2]).unwrap(),
            gpu.alloc_zeros::<i32>(4).unwrap(),
        )
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(all.download().unwrap(), [0, 0, 1, 1]);
    if rank == 0 {
        comm.send(gpu.upload(&[42u64, 43]).unwrap(), 1, 0)
            .unwrap()
            .wait()
            .unwrap();
    } else {
        let got = comm
            .recv(gpu.alloc_zeros::<u64>(2).unwrap(), 0, 0)
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(got.download().unwrap(), [42, 43]);
    }
    crate::device_checks::pre_mul_sum::through_every_reduction(&comm, &gpu, 3);
}

#[test]
#[ignore = "run under fake-gpu by suite_ranks_as_processes"]
fn fake_one_rank_of_a_ring_of_four_processes() {
    let rank: usize = std::env::var("HC_RANK").unwrap().parse().unwrap();
    let addr = std::env::var("HC_ADDR").unwrap();
    let store: Arc<dyn Store> =
        Arc::new(TcpStore::connect(addr, ClientOptions::default()).unwrap());
    let gpu = Gpu::open(runtime(), rank).unwrap();
    let comm = join(&gpu, &store, 4, rank, "ring");
    // 64 MiB each way.
    crate::device_checks::ring_in_one_batch(&comm, &gpu, 16 << 20);
}
