//! Communicators with a GPU and several ranks, under `fake-gpu` (see `fake_support`): ranks as threads of one
//! child process (one fake device each) and as processes meeting through a TCP store. Every operation goes
//! through the one [`Communicator`] face with device buffers, so it runs on the NCCL flavor. The fake exchanges
//! and reduces real data, runs streams asynchronously, creates communicators asynchronously and writes split
//! children late, as NCCL does; these tests are the CI half of what `tests/gpu` checks on a GPU.
//!
//! The suites below start the `#[ignore]`d `fake_*` tests of the modules, each by its full name:
//! - [`collectives`]: every type and reduction (premulsum's operators counted too), every collective's data, the
//!   operations the device gained;
//! - [`splits`]: a non-blocking split and shrink giving working children;
//! - [`streams`]: results ordered without a CPU wait, twin communicators on their own streams;
//! - [`failures`]: timeouts, aborts and asynchronous errors, reported rather than hung, and what the GPU's watchdog
//!   stops that would otherwise hang;
//! - [`aborts`]: a failure domain's abort stopping every communicator at once, in one NCCL group where NCCL allows;
//! - [`groups`]: operations on several communicators issued as one NCCL group, and what a group refuses;
//! - [`placement`]: two ranks on one device (NCCL 2.30), ranks as processes;
//! - [`raw`]: NCCL called directly on a communicator's handle, between hypercomm's operations.
//!
//! [`watchdog_cost`] is a measurement run by hand (the watchdog's CPU at 1,000 operations in flight), not a suite.

#[path = "../device_checks/mod.rs"]
mod device_checks;
#[path = "../fake_support/mod.rs"]
mod fake_support;

mod aborts;
mod collectives;
mod failures;
mod groups;
mod placement;
mod raw;
mod splits;
mod streams;
mod watchdog_cost;

use std::sync::Arc;
use std::time::Duration;

use hypercomm_comm::device::Gpu;
use hypercomm_comm::{CommOptions, Communicator};
use hypercomm_store::{ServerOptions, Store, TcpStore};

use fake_support::{FakeDir, pass_under_fake, require_pass, spawn_under_fake};

const DEVICES: &str = "FAKE_GPU_DEVICES";

fn options(name: &str, timeout: Duration) -> CommOptions {
    CommOptions {
        timeout,
        ..CommOptions::named(name)
    }
}

/// Rank `rank` of the communicator `name` over ranks `0..n`, with `gpu`.
fn join(gpu: &Arc<Gpu>, store: &Arc<dyn Store>, n: usize, rank: usize, name: &str) -> Communicator {
    Communicator::with_gpu(
        Arc::clone(gpu),
        Arc::clone(store),
        (0..n).collect(),
        rank,
        options(name, Duration::from_secs(30)),
    )
    .unwrap()
}

#[test]
fn suite_ranks_as_threads() {
    for name in [
        "collectives::fake_every_type_and_reduction_over_three_ranks",
        "collectives::fake_every_collective_moves_real_data",
        "collectives::fake_out_of_place_all_reduce_broadcast_and_reduce_on_device",
        "collectives::fake_in_place_all_gather_and_reduce_scatter_on_device",
        "collectives::fake_all_to_all_v_on_device_with_zero_counts",
        "collectives::fake_gather_and_scatter_on_device_from_every_root",
        "collectives::fake_what_nccl_cannot_run_is_refused_with_the_reason",
        "collectives::fake_a_barrier_waits_for_the_device_work_before_it",
        "collectives::fake_float8_moves_and_reduces_on_device",
        "collectives::fake_uneven_all_gather_and_reduce_scatter_on_device",
        "collectives::fake_premulsum_through_every_reducing_operation",
        "raw::fake_a_raw_nccl_call_runs_between_hypercomm_operations",
        "splits::fake_nonblocking_split_and_shrink_give_working_children",
        "streams::fake_results_are_ordered_without_a_cpu_wait",
        "streams::fake_all_gather_and_reduce_scatter_overlap_on_twin_communicators",
        "groups::fake_buckets_and_broadcasts_in_one_group",
        "groups::fake_what_a_group_refuses",
        "groups::fake_an_operation_issued_while_its_group_ends_is_refused",
    ] {
        pass_under_fake(name, &[(DEVICES, "3")]);
    }
    pass_under_fake(
        "streams::fake_opposite_first_operations_on_twins_pass_when_connected_at_creation",
        &[(DEVICES, "2"), ("NCCL_RUNTIME_CONNECT", "0")],
    );
}

#[test]
fn suite_premulsum_operators_live_as_long_as_their_communicator() {
    let log = pass_under_fake(
        "collectives::fake_premulsum_operators_are_created_once_and_released_with_the_communicator",
        &[(DEVICES, "3"), ("FAKE_GPU_TRACE_CALLS", "1")],
    );
    // `fake-cuda: call <name> on thread <tid>`, from whichever thread.
    let count = |call: &str| {
        log.lines()
            .filter(|l| {
                l.trim()
                    .starts_with(&format!("fake-cuda: call {call} on thread "))
            })
            .count()
    };
    // Three ranks: three operators each on the communicator dropped, one each on the one aborted.
    assert_eq!(count("ncclRedOpCreatePreMulSum"), 3 * (3 + 1), "{log}");
    assert_eq!(count("ncclRedOpDestroy"), 3 * 3, "{log}");
    assert!(!log.contains("never destroyed"), "{log}");
}

#[test]
fn suite_failures_are_reported_not_hung() {
    for name in [
        "failures::fake_a_rank_that_never_joins_is_a_timeout",
        "failures::fake_a_rank_that_never_calls_is_a_timeout_that_aborts",
        "streams::fake_opposite_first_operations_on_twins_time_out",
        "failures::fake_two_ranks_on_one_device_need_nccl_2_30",
        "failures::fake_mismatched_counts_between_peers_are_reported_not_hung",
    ] {
        pass_under_fake(name, &[(DEVICES, "2"), ("FAKE_NCCL_TIMEOUT_SECS", "30")]);
    }
    pass_under_fake(
        "failures::fake_an_asynchronous_error_breaks_the_communicator",
        &[("FAKE_NCCL_FAIL_AFTER", "2")],
    );
}

#[test]
fn suite_the_watchdog_stops_what_would_hang() {
    // The fake's own peer timeout (30 s) stands in for a collective that never ends: the watchdog must act first.
    // Each case prints `watchdog-case:` lines (times and errors) to the child's stderr; run with --nocapture to see
    // them (docs/perf/reliability.md).
    let cases = |log: String| {
        for line in log.lines().filter(|l| l.starts_with("watchdog-case:")) {
            println!("{line}");
        }
    };
    cases(pass_under_fake(
        "failures::fake_a_rank_that_never_calls_is_named_while_the_others_only_order_their_streams",
        &[(DEVICES, "3"), ("FAKE_NCCL_TIMEOUT_SECS", "30")],
    ));
    cases(pass_under_fake(
        "failures::fake_a_ring_of_stages_that_send_before_they_receive_is_named_as_a_cycle",
        &[(DEVICES, "4"), ("FAKE_NCCL_TIMEOUT_SECS", "30")],
    ));
    let flight = std::env::temp_dir().join(format!("hypercomm-flight-{}", std::process::id()));
    let dir = flight.to_string_lossy().into_owned();
    cases(pass_under_fake(
        "failures::fake_an_asynchronous_error_stops_every_communicator_of_the_collection",
        &[
            (DEVICES, "2"),
            ("FAKE_NCCL_TIMEOUT_SECS", "30"),
            ("FAKE_NCCL_FAIL_AFTER", "2"),
            ("FAKE_NCCL_FAIL_RANK", "0"),
            ("FAKE_GPU_STREAM_DELAY_MS", "100"),
            (hypercomm_comm::device::FLIGHT_RECORDER_DIR_ENV, &dir),
        ],
    ));
    let _ = std::fs::remove_dir_all(&flight);
    cases(pass_under_fake(
        "failures::fake_an_abort_beside_a_call_inside_nccl_revokes_instead_of_freeing",
        &[(DEVICES, "2"), ("FAKE_NCCL_TIMEOUT_SECS", "30")],
    ));
    cases(pass_under_fake(
        "failures::fake_a_rank_that_calls_another_collective_is_named_as_the_disagreement",
        &[
            (DEVICES, "3"),
            ("FAKE_NCCL_TIMEOUT_SECS", "30"),
            ("FAKE_NCCL_MISMATCH_HANGS", "1"),
        ],
    ));
}

#[test]
fn suite_a_domain_abort_stops_every_communicator_together() {
    // Each rank's NCCL communicators wait for the fake's peer timeout when nothing stops them: 30 s, against the
    // abort's bound of 1.55 s. What the fake traced: where each aborted communicator was freed.
    let freed = |log: &str, how: &str| -> Vec<String> {
        log.lines()
            .filter_map(|l| l.trim().strip_prefix("fake-nccl: freed "))
            .filter(|l| l.contains(how) && l.contains("(rank 0 of 2)"))
            .map(str::to_owned)
            .collect()
    };
    let log = pass_under_fake(
        "aborts::fake_a_domain_with_stuck_work_everywhere_is_aborted_in_one_group",
        &[
            (DEVICES, "2"),
            ("FAKE_GPU_TRACE_CALLS", "1"),
            ("FAKE_NCCL_TIMEOUT_SECS", "30"),
        ],
    );
    print_cases(&log);
    // p, q and p's split child together, in one group; b, whose call was inside NCCL, revoked and freed by that
    // call on its way out, alone.
    let grouped = freed(&log, "at ncclGroupEnd with 2 other(s)");
    assert_eq!(grouped.len(), 3, "{log}");
    for name in ["p/device ", "q/device ", "p/split0/color0/device "] {
        assert!(
            grouped.iter().any(|l| l.starts_with(name)),
            "{name}: {grouped:?}"
        );
    }
    assert_eq!(
        freed(&log, "in ncclCommAbort"),
        ["b/device (rank 0 of 2) in ncclCommAbort"],
        "{log}"
    );
    let calls = nccl_calls_between(&log, aborts::ABORTING, aborts::ABORTED);
    assert!(
        calls.contains(&"ncclCommRevoke on b/device (rank 0 of 2)"),
        "{calls:?}"
    );
    assert_eq!(
        calls.iter().filter(|c| **c == "ncclGroupStart").count(),
        1,
        "{calls:?}"
    );
    // Before NCCL 2.22 an abort frees at once, group or not: one at a time, no group.
    let log = pass_under_fake(
        "aborts::fake_a_domain_is_aborted_one_at_a_time_before_nccl_2_22",
        &[
            (DEVICES, "2"),
            ("FAKE_GPU_TRACE_CALLS", "1"),
            ("FAKE_NCCL_TIMEOUT_SECS", "3"),
            ("FAKE_NCCL_VERSION", "22105"),
        ],
    );
    print_cases(&log);
    assert_eq!(freed(&log, "in ncclCommAbort").len(), 3, "{log}");
    assert!(freed(&log, "at ncclGroupEnd").is_empty(), "{log}");
    let calls = nccl_calls_between(&log, aborts::ABORTING, aborts::ABORTED);
    assert!(!calls.contains(&"ncclGroupStart"), "{calls:?}");
}

/// Prints a child's `abort-case:` lines (run with --nocapture to see them; docs/perf/reliability.md).
fn print_cases(log: &str) {
    for line in log.lines().filter(|l| l.starts_with("abort-case:")) {
        println!("{line}");
    }
}

#[test]
fn suite_two_ranks_on_one_device_with_nccl_2_30() {
    let env = [
        ("FAKE_NCCL_VERSION", "23007"),
        ("NCCL_MULTI_RANK_GPU_ENABLE", "1"),
    ];
    pass_under_fake(
        "placement::fake_two_ranks_share_a_device_when_allowed",
        &env,
    );
}

#[test]
fn suite_a_group_is_one_nccl_group() {
    // Twin communicators first used in opposite orders by two rank processes, in one OpGroup: outside a group
    // that waits until the timeout (streams::fake_opposite_first_operations_on_twins_time_out). Each rank's
    // NCCL calls in the group's end, as the fake traces them: one ncclGroupStart, the two operations in the
    // rank's order, one ncclGroupEnd.
    let logs = run_as_processes_with(
        "groups::fake_one_rank_of_twins_first_used_in_opposite_orders_in_one_group",
        2,
        &[
            ("FAKE_GPU_TRACE_CALLS", "1"),
            ("FAKE_NCCL_TIMEOUT_SECS", "30"),
        ],
    );
    for (rank, log) in logs.iter().enumerate() {
        let calls = nccl_calls_between(
            log,
            device_checks::groups::ENDING,
            device_checks::groups::ENDED,
        );
        let gather = "ncclAllGather on dp_cp_ag/device";
        let scatter = "ncclReduceScatter on dp_cp/device";
        let order = if rank == 0 {
            [gather, scatter]
        } else {
            [scatter, gather]
        };
        assert_eq!(calls.len(), 4, "rank {rank}: {calls:?}");
        assert_eq!(calls[0], "ncclGroupStart", "rank {rank}: {calls:?}");
        assert!(
            calls[1].starts_with(order[0]) && calls[2].starts_with(order[1]),
            "rank {rank}: {calls:?}"
        );
        assert_eq!(calls[3], "ncclGroupEnd", "rank {rank}: {calls:?}");
    }
}

/// The NCCL calls the fake traced (`fake-nccl: call <call>`) between the lines `from` and `to` of `log`.
fn nccl_calls_between<'a>(log: &'a str, from: &str, to: &str) -> Vec<&'a str> {
    log.lines()
        .skip_while(|l| l.trim() != from)
        .take_while(|l| l.trim() != to)
        .filter_map(|l| l.trim().strip_prefix("fake-nccl: call "))
        .collect()
}

#[test]
fn suite_ranks_as_processes() {
    run_as_processes("placement::fake_one_rank_of_two_processes", 2);
    // Four processes exchange 64 MiB around a ring in one batch each, in both orders of the parts.
    run_as_processes("placement::fake_one_rank_of_a_ring_of_four_processes", 4);
}

/// Runs the ignored test `name` as `n` rank processes under the fake (one fake device each), meeting through a TCP
/// store; every one must pass.
fn run_as_processes(name: &str, n: usize) {
    run_as_processes_with(name, n, &[]);
}

/// [`run_as_processes`] with `env` set in every rank too; each rank's stderr, in rank order.
fn run_as_processes_with(name: &str, n: usize, env: &[(&str, &str)]) -> Vec<String> {
    let server = TcpStore::server("127.0.0.1:0", ServerOptions::default()).unwrap();
    let addr = server.local_addr().to_string();
    let dir = FakeDir::new(name);
    let devices = n.to_string();
    let children: Vec<_> = (0..n)
        .map(|rank| {
            let r = rank.to_string();
            let mut all = vec![
                (DEVICES, devices.as_str()),
                ("HC_RANK", &r),
                ("HC_ADDR", &addr),
            ];
            all.extend_from_slice(env);
            spawn_under_fake(&dir, name, &all)
        })
        .collect();
    children
        .into_iter()
        .map(|child| require_pass(name, &child.wait_with_output().unwrap()))
        .collect()
}
