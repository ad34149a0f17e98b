//! Process-group collections with a GPU, under `fake-gpu` (the stand-in CUDA driver and NCCL; see
//! `crates/hypercomm-comm/tests/fake_support`): every group of a full Megatron layout gets a communicator with an
//! NCCL flavor beside its host one, store-keyed and by split, with per-kind options reaching `ncclConfig_t`, twins that
//! overlap, and nothing left behind on drop. Ranks are threads of a child process, one fake device each.

#[path = "../crates/hypercomm-comm/tests/device_checks/mod.rs"]
mod device_checks;
#[path = "../crates/hypercomm-comm/tests/fake_support/mod.rs"]
mod fake_support;

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use hypercomm_comm::device::{DeviceCommunicator, Gpu};
use hypercomm_comm::{CommError, CommOptions, Communicator, ReduceOp};
use hypercomm_grid::layout::{LayoutConfig, ParallelLayout};

use process_group_collection::{
    CollectionBuilder, CollectionError, GroupId, GroupOptions, ProcessGroupCollection,
};

use fake_support::{pass_under_fake, ranks};

const WORLD: usize = 8;
const DEVICES: (&str, &str) = ("FAKE_GPU_DEVICES", "8");

fn layout() -> ParallelLayout {
    LayoutConfig::new(WORLD)
        .tp(2)
        .pp(2)
        .cp(2)
        .ep(2)
        .build()
        .unwrap()
}

/// Per-kind options as a user writes them: NCCL knobs for tp, a high-priority stream for dp_cp.
fn options() -> GroupOptions {
    GroupOptions::from_json(
        r#"{"tp": {"max_ctas": 16, "min_ctas": 2}, "dp_cp": {"high_priority_stream": true}}"#,
    )
    .unwrap()
}

fn builder(gpu: Arc<Gpu>) -> CollectionBuilder {
    ProcessGroupCollection::for_layout("m", layout())
        .with_all_gather_groups(true)
        .with_tagged("dp_cp", "overlap")
        .with_options(options())
        .with_timeout(Duration::from_secs(30))
        .with_gpu(gpu)
}

/// The NCCL flavor of `group`'s communicator.
fn nccl<'a>(pgc: &'a ProcessGroupCollection, group: &GroupId) -> &'a DeviceCommunicator {
    pgc.get(group)
        .unwrap()
        .nccl()
        .expect("a collection built with a gpu")
}

/// For every group this rank is in: the NCCL flavor has the layout's members and its own stream, and an
/// all-reduce of a device buffer sums the global ranks over exactly those members. Returns how many groups were checked.
fn check_every_group(pgc: &ProcessGroupCollection, rank: usize) -> usize {
    let gpu = pgc.gpu().expect("built with a gpu");
    let mut streams = Vec::new();
    let mut checked = 0;
    for id in pgc.groups().cloned().collect::<Vec<_>>() {
        let Ok(m) = pgc.membership(&id) else { continue };
        let device = nccl(pgc, &id);
        assert_eq!(device.ranks(), m.members, "{id}");
        assert_eq!(device.rank(), m.index, "{id}");
        assert_eq!(
            pgc.get(&id).unwrap().ranks(),
            m.members,
            "{id}: host flavor"
        );
        streams.push(device.stream().cu_stream() as usize);
        let buf = pgc
            .get(&id)
            .unwrap()
            .all_reduce(gpu.upload(&[rank as u64, 1]).unwrap(), ReduceOp::Sum)
            .unwrap()
            .wait()
            .unwrap();
        let sum: usize = m.members.iter().sum();
        assert_eq!(
            buf.download().unwrap(),
            [sum as u64, m.members.len() as u64],
            "{id}"
        );
        checked += 1;
    }
    streams.sort_unstable();
    streams.dedup();
    assert_eq!(
        streams.len(),
        checked,
        "every nccl communicator has a stream of its own"
    );
    checked
}

/// An all-gather on `dp_cp_ag` and a reduce-scatter on `dp_cp` at once, in opposite orders on alternating ranks
/// (on one communicator this would deadlock): the check the device tests run on twins, on the collection's.
fn overlap_twins(pgc: &ProcessGroupCollection) {
    device_checks::twins_overlap_in_opposite_orders(
        pgc.gpu().unwrap(),
        pgc.get(&GroupId::kind("dp_cp_ag")).unwrap(),
        pgc.get(&GroupId::kind("dp_cp")).unwrap(),
        3,
        2,
    );
}

/// The fake's exchange directories left: one per NCCL communicator some rank has not destroyed yet.
fn live_nccl_communicators() -> usize {
    let dir = std::env::var_os("FAKE_NCCL_DIR").expect("set by the suite");
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| e.as_ref().is_ok_and(|e| e.path().is_dir()))
        .count()
}

#[test]
fn suite_device_collections() {
    let log = pass_under_fake("fake_store_keyed_collection_with_a_gpu", &[DEVICES]);
    // Per-kind options reach that kind's ncclConfig_t, and only that kind's.
    let tp_configs: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("commName=m/tp/"))
        .collect();
    assert!(!tp_configs.is_empty(), "{log}");
    assert!(
        tp_configs
            .iter()
            .all(|l| l.contains("minCTAs=2 maxCTAs=16")),
        "{tp_configs:?}"
    );
    let dp_configs: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("commName=m/dp/"))
        .collect();
    assert!(
        !dp_configs.is_empty() && dp_configs.iter().all(|l| l.contains("maxCTAs=-2147483648")),
        "{log}"
    );
    pass_under_fake(
        "fake_collection_split_from_a_world_communicator",
        &[DEVICES],
    );
    pass_under_fake("fake_a_missing_rank_is_named_with_its_group", &[DEVICES]);
    pass_under_fake(
        "fake_a_knob_the_loaded_nccl_lacks_is_refused_before_anything_is_made",
        &[DEVICES, ("FAKE_NCCL_VERSION", "22400")],
    );
}

#[test]
fn suite_the_failure_domain_covers_the_nccl_halves() {
    pass_under_fake(
        "fake_a_host_failure_aborts_the_ranks_nccl_communicators",
        &[DEVICES],
    );
    // The NCCL communicators where world rank 0 is rank 0 fail asynchronously at their third operation.
    pass_under_fake(
        "fake_an_nccl_failure_aborts_the_ranks_host_communicators",
        &[
            DEVICES,
            ("FAKE_NCCL_FAIL_AFTER", "2"),
            ("FAKE_NCCL_FAIL_RANK", "0"),
        ],
    );
    pass_under_fake(
        "fake_an_nccl_timeout_aborts_the_ranks_host_communicators",
        &[DEVICES],
    );
    pass_under_fake(
        "fake_aborting_a_collection_stops_its_split_children_too",
        &[DEVICES],
    );
}

/// A two-rank collection with a gpu: tp over both ranks, every other kind over one.
fn pair(
    name: &str,
    gpu: Arc<Gpu>,
    rank: usize,
    store: Arc<dyn hypercomm_store::Store>,
    timeout: Duration,
) -> ProcessGroupCollection {
    ProcessGroupCollection::for_layout(name, LayoutConfig::new(2).tp(2).build().unwrap())
        .with_timeout(timeout)
        .with_gpu(gpu)
        .build(rank, store)
        .unwrap()
}

/// The groups `rank` is in.
fn my_groups(pgc: &ProcessGroupCollection) -> Vec<GroupId> {
    let ids: Vec<GroupId> = pgc.groups().cloned().collect();
    ids.into_iter()
        .filter(|id| pgc.membership(id).is_ok())
        .collect()
}

/// One device all-reduce on tp, which both ranks join: the NCCL communicators are alive.
fn device_sum_on_tp(pgc: &ProcessGroupCollection) {
    let gpu = pgc.gpu().unwrap();
    let tp = pgc.get(&GroupId::kind("tp")).unwrap();
    let sum = tp
        .all_reduce(gpu.upload(&[1u32]).unwrap(), ReduceOp::Sum)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(sum.download().unwrap(), [2]);
}

#[test]
#[ignore = "run under fake-gpu by suite_the_failure_domain_covers_the_nccl_halves"]
fn fake_a_host_failure_aborts_the_ranks_nccl_communicators() {
    let tp = GroupId::kind("tp");
    ranks(2, |rank, gpu, store| {
        let pgc = pair("hostfail", gpu, rank, store, Duration::from_secs(10));
        device_sum_on_tp(&pgc);
        if rank == 1 {
            // Rank 1 gives up on its tp communicator: both flavors, so nothing waits on either.
            pgc.get(&tp).unwrap().abort();
            return;
        }
        let e = pgc
            .get(&tp)
            .unwrap()
            .all_reduce(vec![1u32], ReduceOp::Sum)
            .and_then(hypercomm_comm::Work::wait)
            .expect_err("rank 1 aborted tp");
        assert!(matches!(e, CommError::AbortedByPeer { by: 1, .. }), "{e}");
        // Every NCCL communicator of rank 0, in every group, was aborted with the host failure.
        let gpu = pgc.gpu().unwrap();
        let groups = my_groups(&pgc);
        assert!(groups.len() > 1, "{groups:?}");
        for id in groups {
            assert!(
                nccl(&pgc, &id).broken().is_some(),
                "{id}: nccl communicator still alive"
            );
            let e = pgc
                .get(&id)
                .unwrap()
                .all_reduce(gpu.upload(&[1u32]).unwrap(), ReduceOp::Sum)
                .and_then(|w| w.wait())
                .expect_err("an aborted nccl communicator");
            assert!(matches!(e, CommError::Broken { .. }), "{id}: {e}");
        }
    });
}

#[test]
#[ignore = "run under fake-gpu by suite_the_failure_domain_covers_the_nccl_halves"]
fn fake_an_nccl_failure_aborts_the_ranks_host_communicators() {
    let tp = GroupId::kind("tp");
    let errors = ranks(2, |rank, gpu, store| {
        let pgc = pair("ncclfail", gpu, rank, store, Duration::from_secs(10));
        // FAKE_NCCL_FAIL_AFTER=2: two operations pass.
        device_sum_on_tp(&pgc);
        device_sum_on_tp(&pgc);
        if rank == 1 {
            // Rank 1 waits on the host half, and learns of rank 0's NCCL failure there.
            return pgc
                .get(&tp)
                .unwrap()
                .all_reduce(vec![1u32], ReduceOp::Sum)
                .and_then(hypercomm_comm::Work::wait)
                .expect_err("rank 0's domain aborted its host tp communicator");
        }
        let gpu = pgc.gpu().unwrap();
        let e = pgc
            .get(&tp)
            .unwrap()
            .all_reduce(gpu.upload(&[1u32]).unwrap(), ReduceOp::Sum)
            .and_then(|w| w.wait())
            .expect_err("the third nccl operation fails");
        assert!(e.to_string().contains("ncclRemoteError"), "{e}");
        // The NCCL failure is rank 0's root cause, and every host communicator of the rank was aborted.
        let cause = pgc.get(&tp).unwrap().failure_domain().root_cause();
        let cause = cause.expect("the nccl failure was recorded");
        assert!(cause.ranks.is_empty(), "{cause}");
        assert!(cause.comm.ends_with("/device"), "{cause}");
        for id in my_groups(&pgc) {
            let host = pgc.get(&id).unwrap();
            assert!(
                host.broken().is_some(),
                "{id}: host communicator still alive"
            );
            let e = host
                .barrier()
                .and_then(hypercomm_comm::Work::wait)
                .expect_err("an aborted host communicator");
            assert!(matches!(e, CommError::Broken { .. }), "{id}: {e}");
        }
        e
    });
    // Rank 1 was stopped by rank 0's abort, and reports the NCCL failure as the root cause.
    let e = &errors[1];
    assert!(matches!(e, CommError::AbortedByPeer { by: 0, .. }), "{e}");
    assert!(e.to_string().contains("ncclRemoteError"), "{e}");
}

#[test]
#[ignore = "run under fake-gpu by suite_device_collections"]
fn fake_store_keyed_collection_with_a_gpu() {
    let checked = ranks(WORLD, |rank, gpu, store| {
        let pgc = builder(gpu).build(rank, store).unwrap();
        let checked = check_every_group(&pgc, rank);
        overlap_twins(&pgc);
        // The same communicator runs host vectors on its host flavor: the same call, a host result.
        let tp: &Communicator = pgc.tp().unwrap();
        let work = tp.all_reduce(vec![1u32], ReduceOp::Sum).unwrap();
        assert!(!work.is_device());
        assert_eq!(work.wait().unwrap(), [2]);
        checked
    });
    assert!(checked.iter().all(|&c| c >= 20), "{checked:?}");
    // Every rank dropped its collection: every NCCL communicator was destroyed by every member.
    assert_eq!(live_nccl_communicators(), 0);
}

#[test]
#[ignore = "run under fake-gpu by suite_device_collections"]
fn fake_collection_split_from_a_world_communicator() {
    ranks(WORLD, |rank, gpu, store| {
        let host_world = Communicator::new(
            Arc::clone(&store),
            (0..WORLD).collect(),
            rank,
            CommOptions {
                timeout: Duration::from_secs(30),
                ..CommOptions::named("host-world")
            },
        )
        .unwrap();
        // A collection with a gpu cannot split a parent without one: refused with the way out.
        let e = builder(Arc::clone(&gpu))
            .build_by_split(&host_world)
            .unwrap_err();
        assert!(e.to_string().contains("with_gpu"), "{e}");
        let world = Communicator::with_gpu(
            Arc::clone(&gpu),
            Arc::clone(&store),
            (0..WORLD).collect(),
            rank,
            CommOptions {
                timeout: Duration::from_secs(30),
                ..CommOptions::named("world")
            },
        )
        .unwrap();
        let pgc = builder(gpu).build_by_split(&world).unwrap();
        check_every_group(&pgc, rank);
        overlap_twins(&pgc);
    });
    assert_eq!(live_nccl_communicators(), 0);
}

#[test]
#[ignore = "run under fake-gpu by suite_device_collections"]
fn fake_a_missing_rank_is_named_with_its_group() {
    let tp_only = || LayoutConfig::new(2).tp(2).build().unwrap();
    let errors = ranks(1, |rank, gpu, store| {
        ProcessGroupCollection::for_layout("lonely", tp_only())
            .with_timeout(Duration::from_secs(2))
            .with_gpu(gpu)
            .build(rank, store)
            .unwrap_err()
    });
    let shown = errors[0].to_string();
    assert!(matches!(errors[0], CollectionError::Comm { .. }), "{shown}");
    assert!(shown.contains("tp") && shown.contains('1'), "{shown}");
}

#[test]
#[ignore = "run under fake-gpu by suite_device_collections"]
fn fake_a_knob_the_loaded_nccl_lacks_is_refused_before_anything_is_made() {
    // FAKE_NCCL_VERSION=22400: traffic_class needs 2.25.
    let opts = GroupOptions::from_json(r#"{"dp": {"traffic_class": 3}}"#).unwrap();
    let errors = ranks(1, |rank, gpu, store| {
        ProcessGroupCollection::for_layout("qos", layout())
            .with_options(opts.clone())
            .with_gpu(gpu)
            .build(rank, store)
            .unwrap_err()
    });
    let shown = errors[0].to_string();
    let CollectionError::Comm { group, source, .. } = &errors[0] else {
        panic!("{shown}");
    };
    assert_eq!(group.kind, "dp", "{shown}");
    assert!(
        matches!(
            **source,
            CommError::OptionNeedsNewerLibrary {
                option: "traffic_class",
                ..
            }
        ),
        "{shown}"
    );
    // Refused while preparing: no communicator of any kind was made.
    assert_eq!(live_nccl_communicators(), 0);
}

#[test]
#[ignore = "run under fake-gpu by suite_the_failure_domain_covers_the_nccl_halves"]
fn fake_an_nccl_timeout_aborts_the_ranks_host_communicators() {
    let tp = GroupId::kind("tp");
    let done = (Mutex::new(false), Condvar::new());
    ranks(2, |rank, gpu, store| {
        let pgc = pair("nccltimeout", gpu, rank, store, Duration::from_secs(2));
        device_sum_on_tp(&pgc);
        if rank == 1 {
            // Rank 1 stays (bounded) until rank 0 has checked, then drops its half without having joined.
            let (lock, cv) = &done;
            let guard = lock.lock().unwrap();
            let (finished, wait) = cv
                .wait_timeout_while(guard, Duration::from_secs(60), |d| !*d)
                .unwrap();
            assert!(*finished && !wait.timed_out(), "rank 0 never finished");
            return;
        }
        // Rank 1 may go once rank 0 is done, even when an assertion below fails.
        let _release = Release(&done);
        {
            // Rank 1 never joins: rank 0's NCCL all-reduce times out, which aborts it.
            let gpu = pgc.gpu().unwrap();
            let e = pgc
                .get(&tp)
                .unwrap()
                .all_reduce(gpu.upload(&[1u32]).unwrap(), ReduceOp::Sum)
                .and_then(|w| w.wait())
                .expect_err("rank 1 never joins");
            assert!(matches!(e, CommError::Timeout { .. }), "{e}");
            let cause = pgc.get(&tp).unwrap().failure_domain().root_cause();
            let cause = cause.expect("the nccl timeout was recorded");
            // NCCL does not say which rank it waits for; the ranks' progress does: rank 1 left none.
            assert_eq!(cause.ranks, [1], "{cause}");
            assert!(
                cause.detail.contains("op #2 all_reduce")
                    && cause.detail.contains("rank(s) [1] left no progress record"),
                "{cause}"
            );
            for id in my_groups(&pgc) {
                let host = pgc.get(&id).unwrap();
                assert!(
                    host.broken().is_some(),
                    "{id}: host communicator still alive"
                );
            }
        }
    });
}

/// Sets the flag and wakes its waiters when dropped (also while a failed assertion unwinds).
struct Release<'a>(&'a (Mutex<bool>, Condvar));

impl Drop for Release<'_> {
    fn drop(&mut self) {
        let (lock, cv) = self.0;
        *lock.lock().unwrap_or_else(|p| p.into_inner()) = true;
        cv.notify_all();
    }
}

#[test]
#[ignore = "run under fake-gpu by suite_the_failure_domain_covers_the_nccl_halves"]
fn fake_aborting_a_collection_stops_its_split_children_too() {
    // Rank 0 splits a child off tp (both flavors), then gives up on the whole collection: every communicator it
    // made, the child included, host and NCCL, fails at once on rank 0, and rank 1, waiting on the child, hears of
    // it through the child's host flavor rather than waiting out the timeout.
    let tp = GroupId::kind("tp");
    let timeout = Duration::from_secs(20);
    ranks(2, |rank, gpu, store| {
        let pgc = pair("abortall", Arc::clone(&gpu), rank, store, timeout);
        device_sum_on_tp(&pgc);
        let child = pgc.get(&tp).unwrap().split(Some(0), 0).unwrap().unwrap();
        let sum = child
            .all_reduce(gpu.upload(&[1u32]).unwrap(), ReduceOp::Sum)
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(sum.download().unwrap(), [2], "the child works");
        let started = std::time::Instant::now();
        if rank == 0 {
            pgc.abort();
            assert!(
                started.elapsed() < Duration::from_secs(2),
                "{:?}",
                started.elapsed()
            );
            for comm in [pgc.get(&tp).unwrap(), &child] {
                assert!(comm.broken().is_some(), "{}", comm.name());
                assert!(comm.nccl().unwrap().broken().is_some(), "{}", comm.name());
                let host = comm.all_reduce(vec![1u32], ReduceOp::Sum).err().unwrap();
                assert!(matches!(host, CommError::Broken { .. }), "{host}");
                let device = comm
                    .all_reduce(gpu.upload(&[1u32]).unwrap(), ReduceOp::Sum)
                    .and_then(|w| w.wait())
                    .expect_err("an aborted nccl communicator");
                assert!(matches!(device, CommError::Broken { .. }), "{device}");
            }
            return;
        }
        let e = child
            .all_reduce(vec![1u32], ReduceOp::Sum)
            .and_then(hypercomm_comm::Work::wait)
            .expect_err("rank 0 aborted the child");
        assert!(matches!(e, CommError::AbortedByPeer { by: 0, .. }), "{e}");
        assert!(started.elapsed() < timeout / 2, "{:?}", started.elapsed());
    });
}
