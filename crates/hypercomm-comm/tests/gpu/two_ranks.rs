//! Two ranks as threads, on two GPUs or on one GPU twice (NCCL 2.30 with `NCCL_MULTI_RANK_GPU_ENABLE=1`): every
//! collective with checked values, the operations the device gained, twin communicators overlapping, groups of
//! operations, a non-blocking split, a rank that never calls, and what the watchdog ends and names (a rank that
//! never calls while the other only orders its stream, different collectives, a cycle of sends).

use std::sync::Arc;
use std::time::{Duration, Instant};

use hypercomm_comm::device::Gpu;
use hypercomm_comm::{CommError, CommOptions, Communicator, NcclOptions, ReduceOp};
use hypercomm_store::Store;

use crate::device_checks::{self, Counts, watchdog};
use crate::fake_support::nccl;
use crate::{on_two_ranks, pair};

/// Rank `rank` of the two-rank communicator `name` with `gpu`, its NCCL kernels bounded to 8 CTAs: twin
/// communicators of both ranks may run at once on one GPU, and NCCL's docs for several ranks per GPU warn that
/// too many channels exhaust the SMs and hang.
fn few_ctas(gpu: &Arc<Gpu>, store: &Arc<dyn Store>, rank: usize, name: &str) -> Communicator {
    Communicator::with_gpu(
        Arc::clone(gpu),
        Arc::clone(store),
        vec![0, 1],
        rank,
        CommOptions {
            timeout: Duration::from_secs(60),
            nccl: NcclOptions {
                max_ctas: Some(8),
                ..Default::default()
            },
            ..CommOptions::named(name)
        },
    )
    .unwrap()
}

#[test]
fn two_ranks_run_every_collective() {
    on_two_ranks("two ranks", |r, gpu, store| {
        let comm = pair(&gpu, &store, r, "pair");
        let m = 1000usize;
        let value = |x: usize| x as f32;
        let up = |v: Vec<f32>| gpu.upload(&v).unwrap();
        // all_reduce: (i % 61) + r summed over both ranks.
        let buf = up((0..m).map(|i| value(i % 61 + r)).collect());
        let buf = comm.all_reduce(buf, ReduceOp::Sum).unwrap().wait().unwrap();
        let want: Vec<f32> = (0..m).map(|i| value(2 * (i % 61) + 1)).collect();
        assert_eq!(buf.download().unwrap(), want, "all_reduce on rank {r}");
        // broadcast from rank 1.
        let buf = up((0..m).map(|i| value(i + 7 * r)).collect());
        let buf = comm.broadcast(buf, 1).unwrap().wait().unwrap();
        let want: Vec<f32> = (0..m).map(|i| value(i + 7)).collect();
        assert_eq!(buf.download().unwrap(), want, "broadcast on rank {r}");
        // all_gather: rank p contributes p * 1000 + i.
        let input = up((0..m).map(|i| value(r * 1000 + i)).collect());
        let output = gpu.alloc_zeros::<f32>(2 * m).unwrap();
        let (_, out) = comm.all_gather_into(input, output).unwrap().wait().unwrap();
        let want: Vec<f32> = (0..2 * m).map(|j| value((j / m) * 1000 + j % m)).collect();
        assert_eq!(out.download().unwrap(), want, "all_gather on rank {r}");
        // reduce_scatter: block b of rank p holds p + 10 * b + i; rank r receives block r summed.
        let input = up((0..2 * m)
            .map(|j| value(r + 10 * (j / m) + j % m))
            .collect());
        let output = gpu.alloc_zeros::<f32>(m).unwrap();
        let (_, out) = comm
            .reduce_scatter_into(input, output, ReduceOp::Sum)
            .unwrap()
            .wait()
            .unwrap();
        let want: Vec<f32> = (0..m).map(|i| value(1 + 2 * (10 * r + i))).collect();
        assert_eq!(out.download().unwrap(), want, "reduce_scatter on rank {r}");
        // all_to_all: block p of rank q holds 100 q + 10 p + i; rank r's block p comes from rank p.
        let input = up((0..2 * m)
            .map(|j| value(100 * r + 10 * (j / m) + j % m))
            .collect());
        let output = gpu.alloc_zeros::<f32>(2 * m).unwrap();
        let (_, out) = comm.all_to_all_into(input, output).unwrap().wait().unwrap();
        let want: Vec<f32> = (0..2 * m)
            .map(|j| value(100 * (j / m) + 10 * r + j % m))
            .collect();
        assert_eq!(out.download().unwrap(), want, "all_to_all on rank {r}");
        // send / recv: rank 0 sends its pattern to rank 1.
        if r == 0 {
            let buf = up((0..m).map(|i| value(3 * i)).collect());
            let _ = comm.send(buf, 1, 0).unwrap().wait().unwrap();
        } else {
            let buf = gpu.alloc_zeros::<f32>(m).unwrap();
            let buf = comm.recv(buf, 0, 0).unwrap().wait().unwrap();
            let want: Vec<f32> = (0..m).map(|i| value(3 * i)).collect();
            assert_eq!(buf.download().unwrap(), want, "recv on rank 1");
        }
    });
}

#[test]
fn two_ranks_overlap_all_gather_and_reduce_scatter_on_twin_communicators() {
    // As Megatron's dp_cp and dp_cp_ag: the ranks issue the two operations in opposite orders. On one
    // communicator (one stream) that deadlocks; on twins each stream progresses on its own.
    on_two_ranks("two-rank overlap", |rank, gpu, store| {
        // Four NCCL kernels share the one GPU when both ranks run both twins at once, each with its own channels
        // (one CTA each): NCCL's docs for several ranks per GPU warn that too many channels exhaust the SMs and
        // hang, and advise fewer CTAs. Without a bound this test hung on an H100 with NCCL 2.30.7 (2026-11-23).
        let few = |name: &str| few_ctas(&gpu, &store, rank, name);
        let dp = few("dp_cp");
        let ag = few("dp_cp_ag");
        device_checks::twins_overlap_in_opposite_orders(&gpu, &ag, &dp, 1 << 20, 10);
    });
}

#[test]
fn two_ranks_run_every_operation_the_device_gained() {
    // What ran only on the host before the one face: the out-of-place all-reduce, broadcast and reduce, the
    // in-place all-gather and reduce-scatter, all_to_all_v (zero counts included), gather and scatter (grouped
    // sends and receives); and what NCCL cannot run is refused before NCCL sees it. The checks are shared with
    // `tests/fake_ranks` (`device_checks`); here on one communicator, one after the other, with 1000-element blocks.
    // A batch of sends and receives (one NCCL group) around the ring, and to every peer with empty parts.
    // all_to_all_v: round 0 sends nothing to oneself, different counts each way; in round 1 rank 1 sends nothing
    // (an empty input) and rank 0 sends to itself too; round 2 sends nothing at all.
    let rounds: [Counts; 3] = [
        |s, d| if s == d { 0 } else { 500 * (1 + s) },
        |s, d| if s == 1 { 0 } else { 300 * (1 + d) },
        |_, _| 0,
    ];
    on_two_ranks("two-rank device operations", |rank, gpu, store| {
        let comm = pair(&gpu, &store, rank, "gained");
        let m = 1000;
        device_checks::out_of_place_all_reduce_broadcast_and_reduce(&comm, &gpu, m);
        device_checks::in_place_all_gather_and_reduce_scatter(&comm, &gpu, m);
        device_checks::all_to_all_v_with_zero_counts(&comm, &gpu, &rounds);
        device_checks::gather_and_scatter_from_every_root(&comm, &gpu, m);
        device_checks::refusals(&comm, &gpu, &store, m);
        // Pipeline's exchange: 4 MiB each way around the ring, in one NCCL group, both orders of the parts.
        device_checks::ring_in_one_batch(&comm, &gpu, 1 << 20);
        device_checks::float8_moves_and_reduces(&comm, &gpu);
        device_checks::pre_mul_sum::through_every_reduction(&comm, &gpu, m);
        device_checks::uneven_all_gather_and_reduce_scatter(&comm, &gpu, |r| [1000, 0][r % 2]);
        device_checks::uneven_all_gather_and_reduce_scatter(&comm, &gpu, |r| 300 + 700 * r);
        device_checks::barrier_orders_device_work(&comm, &gpu, 1 << 20, Duration::from_millis(200));
    });
}

#[test]
fn two_ranks_issue_operations_in_groups() {
    // Megatron's coalesced bucket reduce-scatters and a round of broadcasts on two communicators as one NCCL group;
    // twins first used in opposite orders, which outside a group wait on each other until the timeout (NCCL
    // connects a communicator's peers on its first operation), in one group; and what a group refuses. The checks
    // are shared with `tests/fake_ranks` (`device_checks::groups`).
    on_two_ranks("two-rank groups", |rank, gpu, store| {
        let dp = pair(&gpu, &store, rank, "group-dp");
        let tp = pair(&gpu, &store, rank, "group-tp");
        device_checks::groups::buckets_and_broadcasts(&gpu, &dp, &tp, 4, 1 << 16);
        device_checks::groups::refusals(&gpu, &store, &dp, &tp);
        // Bounded CTAs, as in the overlap test above: both ranks' twins may share one GPU.
        let few = |name: &str| few_ctas(&gpu, &store, rank, name);
        let (ag, dp_cp) = (few("group-dp_cp_ag"), few("group-dp_cp"));
        device_checks::groups::twins_first_used_in_opposite_orders(&gpu, &ag, &dp_cp);
    });
}

#[test]
fn two_ranks_split_a_nonblocking_communicator() {
    on_two_ranks("two-rank split", |rank, gpu, store| {
        let parent = pair(&gpu, &store, rank, "parent");
        // Both ranks in one child, the order reversed by key.
        let child = parent
            .split(Some(1), -(rank as i64))
            .unwrap()
            .expect("color 1");
        assert_eq!((child.size(), child.rank()), (2, 1 - rank));
        assert_eq!(
            (child.name(), child.ranks()),
            ("parent/split0/color1", &[1, 0][..])
        );
        let device = nccl(&child);
        assert_eq!(device.name(), "parent/split0/color1/device");
        assert_eq!((device.ranks(), device.rank()), (&[1, 0][..], 1 - rank));
        let (_, all) = child
            .all_gather_into(
                gpu.upload(&[rank as u32]).unwrap(),
                gpu.alloc_zeros(2).unwrap(),
            )
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(all.download().unwrap(), [1, 0]);
    });
}

#[test]
fn two_ranks_one_that_never_calls_is_a_timeout_that_aborts() {
    on_two_ranks("two-rank timeout", |rank, gpu, store| {
        let comm = Communicator::with_gpu(
            Arc::clone(&gpu),
            store,
            vec![0, 1],
            rank,
            CommOptions {
                timeout: Duration::from_secs(5),
                ..CommOptions::named("stuck")
            },
        )
        .unwrap();
        if rank == 0 {
            let started = Instant::now();
            // The timeout may come from the enqueue itself: NCCL connects the peers on a communicator's first
            // collective, and a non-blocking enqueue stays in progress until rank 1 arrives, which it never does.
            let e = comm
                .all_reduce(gpu.upload(&[1.0f32; 1024]).unwrap(), ReduceOp::Sum)
                .and_then(|w| w.wait())
                .map(|_| ())
                .expect_err("rank 1 never calls");
            eprintln!("two-rank timeout: {e} after {:?}", started.elapsed());
            assert!(matches!(e, CommError::Timeout { .. }), "{e}");
            assert!(nccl(&comm).broken().is_some());
            assert!(
                comm.broken().is_some(),
                "the failure domain broke the face too"
            );
        }
        // Rank 1 keeps its communicator until rank 0 has given up, then drops it (rank 0's aborted).
        std::thread::sleep(Duration::from_secs(if rank == 1 { 8 } else { 0 }));
    });
}

/// The watchdog cases' timeout on a GPU: long enough for two ranks on one GPU to create and connect their NCCL
/// communicators, short enough for a quick run.
const WATCHED: Duration = Duration::from_secs(5);

/// A fresh folder for the flight records of `case`, under the temporary folder (or the fake's scratch folder).
fn flight_dir(case: &str) -> std::path::PathBuf {
    let root = std::env::var_os("FAKE_NCCL_DIR").map_or_else(std::env::temp_dir, Into::into);
    let dir = root.join(format!("hypercomm-flight-{}-{case}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn two_ranks_one_that_never_calls_while_the_other_orders_its_stream_is_named() {
    // Rank 1 never makes the second all-reduce; rank 0 only orders its stream after it and copies to the host:
    // the watchdog ends it past the timeout, naming rank 1.
    let dir = flight_dir("never-calls");
    let finished = std::sync::atomic::AtomicUsize::new(0);
    on_two_ranks("watchdog never calls", |rank, gpu, store| {
        let comm = watchdog::connected(2, &gpu, store, rank, "gpu-behind", WATCHED, &dir);
        watchdog::a_rank_that_never_calls(&comm, &gpu, 1, &finished, WATCHED, &dir);
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn two_ranks_that_call_different_collectives_are_named_as_a_disagreement() {
    // NCCL's kernels wait on the mismatch (the fake with FAKE_NCCL_MISMATCH_HANGS=1): rank 1 calls all_gather
    // where rank 0 calls reduce_scatter, and both report it past the timeout.
    let dir = flight_dir("disagree");
    on_two_ranks("watchdog disagreement", |rank, gpu, store| {
        let comm = watchdog::connected(2, &gpu, store, rank, "gpu-disagree", WATCHED, &dir);
        watchdog::a_rank_that_calls_another_collective(&comm, &gpu, 1, WATCHED, &dir);
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn two_ranks_that_each_send_before_they_receive_are_named_as_a_cycle() {
    // 64 MiB each way, far beyond what NCCL buffers: each send waits for the other rank's receive, queued behind
    // that rank's own send.
    let dir = flight_dir("cycle");
    on_two_ranks("watchdog cycle", |rank, gpu, store| {
        let comm = watchdog::connected(2, &gpu, store, rank, "gpu-ring", WATCHED, &dir);
        watchdog::a_ring_that_sends_before_it_receives(&comm, &gpu, 16 << 20, WATCHED, &dir);
    });
    let _ = std::fs::remove_dir_all(&dir);
}
