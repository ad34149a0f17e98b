//! Every example is a program users copy: run each one (as built by `cargo test`) and require success.

use std::path::PathBuf;
use std::process::Command;

/// `target/<profile>/examples`, found from this test binary's path (`target/<profile>/deps/examples-<hash>`).
fn examples_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    exe.parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join("examples"))
        .expect("test binary lives in target/<profile>/deps")
}

fn run_example(name: &str) -> String {
    let path = examples_dir().join(name);
    assert!(
        path.exists(),
        "{} is missing: `cargo test` builds examples, run it through cargo",
        path.display()
    );
    let out = Command::new(&path).output().expect("run example");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "example {name} failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn layout_tour_runs_and_finds_rank_groups() {
    let out = run_example("layout_tour");
    assert!(out.contains("rank 37 belongs to:"), "{out}");
    assert!(out.contains("dp_cp_ag"), "{out}");
}

#[test]
fn rl_layouts_runs() {
    let out = run_example("rl_layouts");
    assert!(out.contains("weight sync: [0, 4, 5, 6, 7]"), "{out}");
}

#[test]
fn rl_pipeline_runs_eight_processes_and_checks_every_result() {
    let out = run_example("rl_pipeline");
    for rank in 0..8 {
        assert!(
            out.contains(&format!("[rank {rank}] rank {rank}: ")),
            "{out}"
        );
    }
    assert!(
        out.contains(
            "[rank 0] rank 0: policy tp [0, 1] sum ok, dp [0, 2] average ok, weights synced"
        ),
        "{out}"
    );
    assert!(out.contains("all 8 rank(s) exited with status 0"), "{out}");
}

#[test]
fn device_routing_runs_the_host_half_everywhere() {
    let out = run_example("device_routing");
    for rank in 0..2 {
        assert!(
            out.contains(&format!(
                "rank {rank}: host all_reduce [3.0, 3.0, 3.0, 3.0]"
            )),
            "{out}"
        );
    }
    // Either both ranks ran the device half too, or the example said why there is none.
    let device_runs = out
        .matches("all_reduce [3.0, 3.0, 3.0, 3.0], device ")
        .count();
    assert!(
        device_runs == 2 || out.contains("no device half: "),
        "{out}"
    );
}
