//! Streams: a result taken back without a CPU wait is still ordered before its download, and twin communicators
//! (each with its own stream, as Megatron's dp_cp and dp_cp_ag) overlap an all-gather and a reduce-scatter once
//! their peers are connected; opposite first operations time out unless NCCL connects at creation.

use std::sync::Arc;
use std::time::Duration;

use hypercomm_comm::device::Gpu;
use hypercomm_comm::{CommError, Communicator, ReduceOp};

use crate::device_checks;
use crate::fake_support::{nccl, ranks};
use crate::{join, options};

#[test]
#[ignore = "run under fake-gpu by suite_ranks_as_threads"]
fn fake_results_are_ordered_without_a_cpu_wait() {
    // Rank 1 comes late, so rank 0's all-reduce is still waiting on its stream when rank 0 takes the buffer back
    // with wait() on the communicator's own stream (no CPU block) and downloads it. The download must wait for
    // the all-reduce: the buffer's write event has to come after the NCCL call.
    ranks(2, |rank, gpu, store| {
        let comm = join(&gpu, &store, 2, rank, "ordered");
        if rank == 1 {
            std::thread::sleep(Duration::from_millis(300));
        }
        let buf = comm
            .all_reduce(gpu.upload(&[rank as f32 + 1.0; 64]).unwrap(), ReduceOp::Sum)
            .unwrap()
            .wait_on(nccl(&comm).stream())
            .unwrap();
        assert_eq!(buf.download().unwrap(), [3.0; 64]);
    });
}

#[test]
#[ignore = "run under fake-gpu by suite_ranks_as_threads"]
fn fake_all_gather_and_reduce_scatter_overlap_on_twin_communicators() {
    ranks(2, |rank, gpu, store| {
        let dp = join(&gpu, &store, 2, rank, "dp_cp");
        let ag = join(&gpu, &store, 2, rank, "dp_cp_ag");
        device_checks::twins_overlap_in_opposite_orders(&gpu, &ag, &dp, 4, 5);
    });
}

/// An all-gather on `ag` and a reduce-scatter on `dp`, issued in opposite orders by the two ranks (the all-gather
/// first on rank 0), then both waited for.
fn opposite_orders(
    rank: usize,
    gpu: &Arc<Gpu>,
    ag: &Communicator,
    dp: &Communicator,
) -> Result<(), CommError> {
    let gather = || {
        ag.all_gather_into(
            gpu.upload(&[1f32]).unwrap(),
            gpu.alloc_zeros::<f32>(2).unwrap(),
        )
    };
    let scatter = || {
        dp.reduce_scatter_into(
            gpu.upload(&[1f32; 2]).unwrap(),
            gpu.alloc_zeros::<f32>(1).unwrap(),
            ReduceOp::Sum,
        )
    };
    let (g, s) = if rank == 0 {
        let g = gather()?;
        (g, scatter()?)
    } else {
        let s = scatter()?;
        (gather()?, s)
    };
    g.wait()?;
    s.wait()?;
    Ok(())
}

#[test]
#[ignore = "run under fake-gpu by suite_failures_are_reported_not_hung"]
fn fake_opposite_first_operations_on_twins_time_out() {
    // The H100 run of 2026-11-23 (NCCL 2.30.7): the first collective on a communicator connects its peers and
    // settles only when every rank has reached it; ranks whose first operations are on twin communicators in
    // opposite orders each wait in their first enqueue for the other.
    ranks(2, |rank, gpu, store| {
        let short = |name| {
            Communicator::with_gpu(
                Arc::clone(&gpu),
                Arc::clone(&store),
                vec![0, 1],
                rank,
                options(name, Duration::from_secs(1)),
            )
            .unwrap()
        };
        let (dp, ag) = (short("dp_cp"), short("dp_cp_ag"));
        let e = opposite_orders(rank, &gpu, &ag, &dp).expect_err("the ranks wait on each other");
        assert!(matches!(e, CommError::Timeout { .. }), "{e}");
        assert!(e.to_string().contains("enqueueing"), "{e}");
    });
}

#[test]
#[ignore = "run under fake-gpu by suite_ranks_as_threads"]
fn fake_opposite_first_operations_on_twins_pass_when_connected_at_creation() {
    // NCCL_RUNTIME_CONNECT=0 (set by the suite) connects the peers when the communicator is created.
    ranks(2, |rank, gpu, store| {
        let dp = join(&gpu, &store, 2, rank, "dp_cp");
        let ag = join(&gpu, &store, 2, rank, "dp_cp_ag");
        opposite_orders(rank, &gpu, &ag, &dp).unwrap();
    });
}
