//! Groups of operations ([`OpGroup`]) on device buffers, written once for `fake_ranks` and `gpu`: a bucket's
//! reduce-scatters and a round of broadcasts on two communicators in one group ([`buckets_and_broadcasts`]),
//! twin communicators first used in opposite orders in one group ([`twins_first_used_in_opposite_orders`]), and
//! what a group refuses ([`refusals`]).

use std::sync::Arc;
use std::time::Duration;

use hypercomm_comm::device::Gpu;
use hypercomm_comm::{CommError, CommOptions, Communicator, NcclOptions, OpGroup, ReduceOp};
use hypercomm_store::Store;

use super::{all_reduced, done, refused, same};

/// What the check prints to stderr right before [`OpGroup::end`] in [`twins_first_used_in_opposite_orders`], and
/// right after: the calls between the two lines are the group's (`fake_ranks` counts them under the fake).
pub const ENDING: &str = "device-checks: ending the group";
/// See [`ENDING`].
pub const ENDED: &str = "device-checks: the group ended";

/// `buckets` reduce-scatters on `dp` (each rank receives `n` elements of each) and `buckets` broadcasts of `n`
/// elements on `tp` (from every root in turn), issued in one group, and a host all-reduce on `tp` issued and waited
/// for inside it. No device handle completes before the end; after it every result is right, taken back with a
/// CPU wait (the reduce-scatters) or with a stream ordered after them (the broadcasts).
pub fn buckets_and_broadcasts(
    gpu: &Arc<Gpu>,
    dp: &Communicator,
    tp: &Communicator,
    buckets: usize,
    n: usize,
) {
    let (size, rank) = (dp.size(), dp.rank());
    assert_eq!(
        (tp.size(), tp.rank()),
        (size, rank),
        "dp and tp span the same ranks"
    );
    // Rank p's element j of bucket b: (p + 1) * (b + 1) + j.
    let grads = |b: usize| -> Vec<f32> {
        (0..size * n)
            .map(|j| ((rank + 1) * (b + 1) + j) as f32)
            .collect()
    };
    let weights = |k: usize, root: usize| -> Vec<f32> {
        (0..n).map(|i| (1000 * root + 10 * k + i) as f32).collect()
    };
    let group = OpGroup::start(&[dp, tp]).unwrap();
    let scattered: Vec<_> = (0..buckets)
        .map(|b| {
            dp.reduce_scatter_into(
                gpu.upload(&grads(b)).unwrap(),
                gpu.alloc_zeros::<f32>(n).unwrap(),
                ReduceOp::Sum,
            )
            .unwrap()
        })
        .collect();
    let broadcast: Vec<_> = (0..buckets)
        .map(|k| {
            let root = k % size;
            let mine = if rank == root {
                weights(k, root)
            } else {
                vec![0.0; n]
            };
            tp.broadcast(gpu.upload(&mine).unwrap(), root).unwrap()
        })
        .collect();
    // Host vectors are not held: the all-reduce runs, and completes, inside the group.
    let host = done(tp.all_reduce(vec![rank as u32 + 1; 3], ReduceOp::Sum));
    assert_eq!(host, [(size * (size + 1) / 2) as u32; 3]);
    let unfinished = |device: bool, completed: bool| device && !completed;
    assert!(
        scattered
            .iter()
            .all(|w| unfinished(w.is_device(), w.is_completed()))
            && broadcast
                .iter()
                .all(|w| unfinished(w.is_device(), w.is_completed())),
        "a device operation completed before its group ended"
    );
    group.end().unwrap();
    for (b, work) in scattered.into_iter().enumerate() {
        let (_, out) = work.wait().unwrap();
        let want: Vec<f32> = (0..n)
            .map(|i| ((b + 1) * size * (size + 1) / 2 + size * (rank * n + i)) as f32)
            .collect();
        same(
            &out.download().unwrap(),
            &want,
            format!("reduce-scatter of bucket {b} on rank {rank}"),
        );
    }
    let stream = tp.nccl().expect("made with_gpu").stream();
    for (k, work) in broadcast.into_iter().enumerate() {
        let got = work.wait_on(stream).unwrap();
        same(
            &got.download().unwrap(),
            &weights(k, k % size),
            format!("broadcast {k} on rank {rank}"),
        );
    }
}

/// Twin communicators never used before (so NCCL connects their peers on their first operations, which wait
/// for every rank): one group issues an all-gather on `ag` and a reduce-scatter on `dp`, in opposite orders on
/// even and odd ranks. Outside a group that waits until the timeout (see `docs/gpu-validation.md`, "First use
/// connects the peers"); in one group the two connect together, and both results are right. Prints [`ENDING`]
/// and [`ENDED`] around the group's end.
pub fn twins_first_used_in_opposite_orders(gpu: &Arc<Gpu>, ag: &Communicator, dp: &Communicator) {
    let (size, rank) = (dp.size(), dp.rank());
    let gather = || {
        ag.all_gather_into(
            gpu.upload(&[rank as f32 + 1.0; 2]).unwrap(),
            gpu.alloc_zeros::<f32>(2 * size).unwrap(),
        )
        .unwrap()
    };
    let scatter = || {
        dp.reduce_scatter_into(
            gpu.upload(&vec![rank as f32 + 1.0; size]).unwrap(),
            gpu.alloc_zeros::<f32>(1).unwrap(),
            ReduceOp::Sum,
        )
        .unwrap()
    };
    let group = OpGroup::start(&[ag, dp]).unwrap();
    let (g, s) = if rank % 2 == 0 {
        let g = gather();
        (g, scatter())
    } else {
        let s = scatter();
        (gather(), s)
    };
    eprintln!("{ENDING}");
    group.end().unwrap();
    eprintln!("{ENDED}");
    let (_, gathered) = g.wait().unwrap();
    let want: Vec<f32> = (0..size).flat_map(|r| [r as f32 + 1.0; 2]).collect();
    same(
        &gathered.download().unwrap(),
        &want,
        format!("all_gather on rank {rank}"),
    );
    let (_, reduced) = s.wait().unwrap();
    let want = (size * (size + 1) / 2) as f32;
    assert_eq!(
        reduced.download().unwrap(),
        [want],
        "reduce_scatter on rank {rank}"
    );
}

/// What a group refuses, on the two-rank communicators `a` and `b` (made with `gpu` over `store`), each refusal
/// leaving them usable and every rank's operations matched:
/// - a communicator already in an open group, naming it (and the group that failed to start holds nothing);
/// - a blocking and a non-blocking communicator in one group, naming both (a blocking twin of `a` is made over
///   `store`, named `<a>-blocking`);
/// - a barrier inside a group (it would not follow the device operations the group issues at its end);
/// - waiting on a device handle before its group ends: an error at once, not a hang (the operation still runs
///   at the end);
/// - a group dropped without ending: its handles fail saying so, and nothing was issued on any rank; the same
///   when [`OpGroup::run`]'s closure fails.
pub fn refusals(gpu: &Arc<Gpu>, store: &Arc<dyn Store>, a: &Communicator, b: &Communicator) {
    let rank = a.rank();
    let invalid = |e: &CommError| assert!(matches!(e, CommError::InvalidArgument { .. }), "{e}");
    let sum = |comm: &Communicator| all_reduced(comm, gpu, &[rank as f32 + 1.0], ReduceOp::Sum);
    let (an, bn) = (a.name(), b.name());

    // In two open groups.
    let first = OpGroup::start(&[a]).unwrap();
    let e = refused(
        OpGroup::start(&[b, a]),
        &format!(
            "communicator {an}: is already in an open OpGroup over [{an}]; end that group before starting one over [{bn}, {an}]"
        ),
    );
    invalid(&e);
    drop(OpGroup::start(&[b]).expect("the refused group left b in no group"));
    drop(first);

    // Blocking and non-blocking together.
    let blocking = Communicator::with_gpu(
        Arc::clone(gpu),
        Arc::clone(store),
        a.ranks().to_vec(),
        a.ranks()[rank],
        CommOptions {
            timeout: a.options().timeout,
            nccl: NcclOptions {
                blocking: Some(true),
                ..NcclOptions::default()
            },
            ..CommOptions::named(format!("{an}-blocking"))
        },
    )
    .unwrap();
    let e = refused(
        OpGroup::start(&[a, &blocking, b]),
        &format!(
            "communicator {an}-blocking: cannot join an OpGroup over [{an}, {an}-blocking, {bn}]: it is blocking \
             (NcclOptions::blocking) but {an} is non-blocking, and NCCL refuses blocking and non-blocking \
             communicators in one group"
        ),
    );
    invalid(&e);
    assert_eq!(
        sum(&blocking),
        [3.0],
        "the blocking communicator alone works"
    );

    // A barrier inside a group.
    let group = OpGroup::start(&[a]).unwrap();
    refused(
        a.barrier(),
        "a barrier (which waits for the device work issued before it) inside an open OpGroup",
    );
    refused(a.barrier_now(), "inside an open OpGroup (over [");
    drop(group);

    // Waiting before the end: refused at once; the operation still runs at the end.
    let group = OpGroup::start(&[a]).unwrap();
    let work = a
        .all_reduce(gpu.upload(&[1.0f32]).unwrap(), ReduceOp::Sum)
        .unwrap();
    assert!(!work.is_completed());
    assert!(
        !work.wait_timeout(Duration::from_millis(20)),
        "completed before its group ended"
    );
    let e = work.wait().expect_err("waiting before the group ended");
    invalid(&e);
    assert!(
        e.to_string()
            .contains("inside an OpGroup that has not ended"),
        "{e}"
    );
    let late = a
        .all_reduce(gpu.upload(&[2.0f32]).unwrap(), ReduceOp::Sum)
        .unwrap();
    group.end().unwrap();
    assert_eq!(late.wait().unwrap().download().unwrap(), [4.0]);
    assert_eq!(sum(a), [3.0], "the ranks' operations on {an} still match");

    // Dropped without ending: nothing issued, on any rank.
    let group = OpGroup::start(&[a, b]).unwrap();
    let work = b
        .all_reduce(gpu.upload(&[1.0f32]).unwrap(), ReduceOp::Sum)
        .unwrap();
    drop(group);
    let e = work.wait().expect_err("a dropped group's operation");
    invalid(&e);
    assert!(
        e.to_string()
            .contains(&format!("the OpGroup over [{an}, {bn}] was dropped without end(), so this operation was never issued")),
        "{e}"
    );
    let e = OpGroup::run(&[a], || {
        let _work = a.all_reduce(gpu.upload(&[1.0f32]).unwrap(), ReduceOp::Sum)?;
        a.broadcast(gpu.upload(&[1.0f32]).unwrap(), 7)
    })
    .expect_err("root 7 of two ranks");
    assert!(e.to_string().contains("root 7"), "{e}");
    assert_eq!(sum(a), [3.0], "nothing of the dropped groups ran on {an}");
    assert_eq!(sum(b), [3.0], "nothing of the dropped groups ran on {bn}");
}
