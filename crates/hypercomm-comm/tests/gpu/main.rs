//! Tests of communicators with a GPU (device buffers through the one `Communicator` face, run on its NCCL
//! flavor) that need a GPU, a CUDA 13 driver and NCCL. Without them each test prints why it skips
//! and passes, so this target runs everywhere; on the GPU machine it is the validation run described in
//! `docs/gpu-validation.md` (run with `--nocapture` to see the skips and `NCCL_DEBUG=INFO` for the knobs).
//!
//! With `HYPERCOMM_REQUIRE_GPU=1` (which `scripts/gpu-validation.sh` sets) a GPU run cannot pass by skipping:
//! every skip is a failure that says what was missing. A GPU that the probe finds but that cannot be opened is a
//! failure in any case.
//!
//! The tests, by module:
//! - [`kernels`]: compiling the kernels with NVRTC through cudarc (needs only libnvrtc, no GPU), and running
//!   the fill/verify and strided-view kernels;
//! - [`one_rank`]: every collective and type, knobs, splits and shrinks, streams and events, abort and timeouts
//!   on a one-rank communicator;
//! - [`two_ranks`]: two ranks as threads (two GPUs, or one with NCCL 2.30): every collective, the operations the
//!   device gained (the checks in `device_checks`, shared with `tests/fake_ranks`), twins, groups of operations,
//!   split and timeout;
//! - [`collections`]: process-group collections with a GPU.
//!
//! This file holds what they share (finding the GPU or saying why not) and the test that runs them all under
//! fake-gpu.

#[path = "../device_checks/mod.rs"]
mod device_checks;
#[path = "../fake_support/mod.rs"]
mod fake_support;

mod collections;
mod kernels;
mod one_rank;
mod two_ranks;

use std::sync::Arc;
use std::time::Duration;

use hypercomm_comm::device::{DeviceRuntime, Gpu};
use hypercomm_comm::{CommError, CommOptions, Communicator};
use hypercomm_store::{MemoryStore, Store};
use nccl_sys::SearchConfig;

/// Whether this run must not skip (`HYPERCOMM_REQUIRE_GPU=1`).
fn gpu_required() -> bool {
    std::env::var("HYPERCOMM_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// Says why `test` skips, or fails it when the run requires a GPU.
fn skip(test: &str, why: impl std::fmt::Display) {
    assert!(
        !gpu_required(),
        "{test}: HYPERCOMM_REQUIRE_GPU=1, but the test would skip: {why}"
    );
    eprintln!("{test}: skipping: {why}");
}

fn gpu_or_skip(test: &str) -> Option<Arc<Gpu>> {
    // Reads (never writes) the process environment: this is about the machine's real setup.
    match DeviceRuntime::probe(&SearchConfig::from_env(|n| std::env::var_os(n))) {
        Ok(rt) => {
            eprintln!(
                "{test}: nccl {} from {}, driver {:?}",
                rt.nccl().version(),
                rt.nccl().origin(),
                rt.driver()
            );
            // The probe found a device: failing to open it is a failure, not a reason to skip.
            Some(Gpu::open(rt, 0).unwrap_or_else(|e| panic!("{test}: opening gpu 0: {e}")))
        }
        Err(e) => {
            assert!(matches!(e, CommError::Unavailable { .. }), "{e:?}");
            skip(test, e);
            None
        }
    }
}

/// The one-rank communicator `name` with `gpu` (a 60 s timeout, the rest of `options`).
fn single(gpu: &Arc<Gpu>, name: &str, options: CommOptions) -> Communicator {
    let options = CommOptions {
        name: name.into(),
        timeout: Duration::from_secs(60),
        ..options
    };
    Communicator::with_gpu(
        Arc::clone(gpu),
        Arc::new(MemoryStore::new()),
        vec![0],
        0,
        options,
    )
    .unwrap()
}

#[test]
fn probe_is_unavailable_not_a_panic_without_a_gpu() {
    let _ = gpu_or_skip("probe");
}

/// Two device handles for a two-rank communicator: two GPUs, or one GPU twice where NCCL allows several ranks on
/// one device (2.30 or newer with `NCCL_MULTI_RANK_GPU_ENABLE=1`). `None`, after saying why, otherwise.
fn two_ranks_or_skip(test: &str) -> Option<[Arc<Gpu>; 2]> {
    let gpu = gpu_or_skip(test)?;
    let runtime = Arc::clone(gpu.runtime());
    if runtime.device_count() >= 2 {
        return Some([gpu, Gpu::open(runtime, 1).unwrap()]);
    }
    let version = runtime.nccl().version();
    let enabled = std::env::var("NCCL_MULTI_RANK_GPU_ENABLE").is_ok_and(|v| v == "1");
    if version >= nccl_sys::Version::new(2, 30, 0) && enabled {
        return Some([Arc::clone(&gpu), gpu]);
    }
    skip(
        test,
        format!(
            "two ranks need two GPUs, or one GPU with NCCL >= 2.30 and NCCL_MULTI_RANK_GPU_ENABLE=1 (found {} \
             device(s), nccl {version}, NCCL_MULTI_RANK_GPU_ENABLE {})",
            runtime.device_count(),
            if enabled { "set" } else { "unset" }
        ),
    );
    None
}

/// Runs `f(rank, gpu, store)` for two ranks on threads (see [`two_ranks_or_skip`]).
fn on_two_ranks(test: &str, f: impl Fn(usize, Arc<Gpu>, Arc<dyn Store>) + Sync) {
    let Some(gpus) = two_ranks_or_skip(test) else {
        return;
    };
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..2)
            .map(|r| {
                let (gpu, store, f) = (Arc::clone(&gpus[r]), Arc::clone(&store), &f);
                scope.spawn(move || f(r, gpu, store))
            })
            .collect();
        for t in threads {
            t.join().expect("a rank failed; its message is above");
        }
    });
}

/// Rank `rank` of the two-rank communicator `name` with `gpu`.
fn pair(gpu: &Arc<Gpu>, store: &Arc<dyn Store>, rank: usize, name: &str) -> Communicator {
    Communicator::with_gpu(
        Arc::clone(gpu),
        Arc::clone(store),
        vec![0, 1],
        rank,
        CommOptions {
            timeout: Duration::from_secs(60),
            ..CommOptions::named(name)
        },
    )
    .unwrap()
}

/// The tests of this binary that need kernels, which the fake GPU cannot run (it has no NVRTC or PTX loader).
const NEEDS_KERNELS: [&str; 2] = [
    "kernels::kernels_compile_with_nvrtc_when_present",
    "kernels::strided_views_and_fill_verify_kernels",
];

#[test]
fn the_gpu_tests_pass_under_the_fake_gpu() {
    // Every test of the modules, run again in a child process under fake-gpu with two fake devices and
    // HYPERCOMM_REQUIRE_GPU=1, so no test can pass by skipping: the tests' own logic is checked in CI before a
    // GPU run spends its time on them. (On the GPU machine the fake is not bundled, and this says so.)
    if std::env::var_os(fake_support::UNDER_FAKE).is_some() {
        return;
    }
    let lib = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("libfake_gpu.so")));
    if !lib.is_some_and(|l| l.exists()) {
        eprintln!(
            "under the fake gpu: libfake_gpu.so is not beside this binary (a bundle): nothing to run"
        );
        return;
    }
    let dir = fake_support::FakeDir::new("gpu-tests");
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    fake_support::with_fake_env(
        &mut cmd,
        &dir,
        &[
            ("FAKE_GPU_DEVICES", "2"),
            ("FAKE_NCCL_TIMEOUT_SECS", "20"),
            // A mismatch hangs, as NCCL's kernels do, for the watchdog's disagreement case to meet.
            ("FAKE_NCCL_MISMATCH_HANGS", "1"),
            ("HYPERCOMM_REQUIRE_GPU", "1"),
        ],
    );
    // The whole binary, less what needs kernels and this test itself.
    cmd.args([
        "--test-threads=1",
        "--skip",
        "the_gpu_tests_pass_under_the_fake_gpu",
    ]);
    for t in NEEDS_KERNELS {
        cmd.args(["--skip", t]);
    }
    let out = cmd.output().expect("run this binary again");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("0 failed"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for test in [
        "two_ranks::two_ranks_run_every_collective",
        "two_ranks::two_ranks_run_every_operation_the_device_gained",
        "two_ranks::two_ranks_issue_operations_in_groups",
    ] {
        assert!(stdout.contains(&format!("test {test} ... ok")), "{stdout}");
    }
}
