//! Groups of operations ([`OpGroup`]): a bucket's reduce-scatters and a round of broadcasts on two communicators
//! as one NCCL group, blocking and non-blocking; twin communicators first used in opposite orders in one group,
//! as processes whose NCCL calls the fake traces; what a group refuses; and an operation issued while its group
//! ends.

use std::sync::{Arc, mpsc};
use std::time::Duration;

use hypercomm_comm::device::Gpu;
use hypercomm_comm::{CommOptions, Communicator, NcclOptions, OpGroup, ReduceOp};
use hypercomm_store::{ClientOptions, Store, TcpStore};

use crate::device_checks::{all_reduced, groups, refused};
use crate::fake_support::{ranks, runtime};
use crate::{join, options};

#[test]
#[ignore = "run under fake-gpu by suite_ranks_as_threads"]
fn fake_buckets_and_broadcasts_in_one_group() {
    ranks(2, |rank, gpu, store| {
        let dp = join(&gpu, &store, 2, rank, "dp");
        let tp = join(&gpu, &store, 2, rank, "tp");
        groups::buckets_and_broadcasts(&gpu, &dp, &tp, 3, 5);
        // Blocking communicators: the group's end launches in the call, with no ncclInProgress to wait out.
        let blocking = |name: &str| {
            let options = CommOptions {
                nccl: NcclOptions {
                    blocking: Some(true),
                    ..NcclOptions::default()
                },
                ..options(name, Duration::from_secs(30))
            };
            Communicator::with_gpu(
                Arc::clone(&gpu),
                Arc::clone(&store),
                vec![0, 1],
                rank,
                options,
            )
            .unwrap()
        };
        groups::buckets_and_broadcasts(
            &gpu,
            &blocking("dp-blocking"),
            &blocking("tp-blocking"),
            2,
            3,
        );
    });
}

#[test]
#[ignore = "run under fake-gpu by suite_ranks_as_threads"]
fn fake_what_a_group_refuses() {
    ranks(2, |rank, gpu, store| {
        let a = join(&gpu, &store, 2, rank, "a");
        let b = join(&gpu, &store, 2, rank, "b");
        groups::refusals(&gpu, &store, &a, &b);
    });
}

#[test]
#[ignore = "run under fake-gpu by suite_a_group_is_one_nccl_group"]
fn fake_one_rank_of_twins_first_used_in_opposite_orders_in_one_group() {
    let rank: usize = std::env::var("HC_RANK").unwrap().parse().unwrap();
    let addr = std::env::var("HC_ADDR").unwrap();
    let store: Arc<dyn Store> =
        Arc::new(TcpStore::connect(addr, ClientOptions::default()).unwrap());
    let gpu = Gpu::open(runtime(), rank).unwrap();
    let ag = join(&gpu, &store, 2, rank, "dp_cp_ag");
    let dp = join(&gpu, &store, 2, rank, "dp_cp");
    groups::twins_first_used_in_opposite_orders(&gpu, &ag, &dp);
}

#[test]
#[ignore = "run under fake-gpu by suite_ranks_as_threads"]
fn fake_an_operation_issued_while_its_group_ends_is_refused() {
    // The communicator's first operation connects its peers (NCCL's runtime connection), so rank 0's end waits for
    // rank 1, which ends its group a second later. Meanwhile another thread of rank 0 issues an operation on the
    // communicator, still in the group: the group's calls are issued already, so it is refused, not lost.
    ranks(2, |rank, gpu, store| {
        let a = join(&gpu, &store, 2, rank, "racing");
        let group = OpGroup::start(&[&a]).unwrap();
        let work = a
            .all_reduce(gpu.upload(&[rank as f32 + 1.0]).unwrap(), ReduceOp::Sum)
            .unwrap();
        if rank == 1 {
            std::thread::sleep(Duration::from_secs(1));
            group.end().unwrap();
        } else {
            let (ending, ended) = mpsc::channel();
            std::thread::scope(|s| {
                let (a, gpu) = (&a, &gpu);
                let racer = s.spawn(move || {
                    ended.recv().unwrap();
                    std::thread::sleep(Duration::from_millis(300));
                    a.all_reduce(gpu.upload(&[5.0f32]).unwrap(), ReduceOp::Sum)
                });
                ending.send(()).unwrap();
                group.end().unwrap();
                refused(
                    racer.join().unwrap(),
                    "communicator racing/device: an operation was issued on it while its OpGroup over [racing] \
                     was ending",
                );
            });
        }
        assert_eq!(work.wait().unwrap().download().unwrap(), [3.0]);
        assert_eq!(
            all_reduced(&a, &gpu, &[1.0f32], ReduceOp::Sum),
            [2.0],
            "the refused operation reached nccl"
        );
    });
}
