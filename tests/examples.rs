//! Every example is a program users copy: run each one (as built by `cargo test`) and require success.
//!
//! `candle_dp_tp` and `candle_pp_ep` need the feature `candle` (README's test command enables it); without it,
//! their tests are left out along with the examples.

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
    run_example_with(name, &[])
}

fn example_command(name: &str, args: &[&str]) -> Command {
    let path = examples_dir().join(name);
    assert!(
        path.exists(),
        "{} is missing: `cargo test` builds examples, run it through cargo",
        path.display()
    );
    let mut command = Command::new(&path);
    command.args(args);
    command
}

fn run_example_with(name: &str, args: &[&str]) -> String {
    let out = example_command(name, args).output().expect("run example");
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
fn symmetric_buffers_runs_an_optimizer_step_both_ways_and_they_agree() {
    let out = run_example("symmetric_buffers");
    assert!(
        out.contains("both ranks agree with the update rule after 9 steps"),
        "{out}"
    );
    assert_eq!(out.matches("symmetric ").count(), 2, "{out}");
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

#[test]
fn gpu_collection_runs_everywhere_and_on_the_fake_gpu() {
    // As it runs here: on the host when there is no GPU (it says why), on the GPU where there is one.
    let out = run_example("gpu_collection");
    let on = if out.contains("no gpu: ") {
        "on host"
    } else {
        "on gpu"
    };
    for rank in 0..4 {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("rank {rank}: ")))
            .unwrap_or_else(|| panic!("no line for rank {rank}:\n{out}"));
        for kind in ["tp [", "dp [", "dp_cp [", "dp_cp_ag ["] {
            assert!(line.contains(kind), "{line}");
        }
        assert!(line.contains(on), "{line}");
    }
    // And with the device half for certain: under fake-gpu, the stand-in driver and NCCL, one device per rank.
    let fake = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|deps| deps.join("libfake_gpu.so")))
        .filter(|lib| lib.exists())
        .expect("libfake_gpu.so is built beside the test binaries (a dev-dependency)");
    let dir = std::env::temp_dir().join(format!("hypercomm-example-fake-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("exchange")).unwrap();
    std::os::unix::fs::symlink(&fake, dir.join("libcuda.so")).unwrap();
    let out = example_command("gpu_collection", &[])
        .env("LD_LIBRARY_PATH", &dir)
        .env("NCCL_LIBRARY", &fake)
        .env("FAKE_NCCL_DIR", dir.join("exchange"))
        .env("FAKE_GPU_DEVICES", "4")
        .output()
        .expect("run example");
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for rank in 0..4 {
        assert!(
            stdout.contains(&format!("rank {rank}: tp "))
                && stdout.contains(&format!("on gpu{rank}")),
            "{stdout}"
        );
    }
    assert!(!stdout.contains("no gpu"), "{stdout}");
}

/// A candle example's per-step losses and final checksum, parsed from its output.
#[cfg(feature = "candle")]
fn losses_and_checksum(out: &str) -> (Vec<f64>, f64) {
    let mut losses = Vec::new();
    let mut checksum = None;
    for line in out.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["step", n, "loss", v] => {
                assert_eq!(n.parse::<usize>().ok(), Some(losses.len() + 1), "{out}");
                losses.push(v.parse().expect("loss value"));
            }
            ["final", "weight", "checksum", v] => {
                checksum = Some(v.parse().expect("checksum value"))
            }
            _ => {}
        }
    }
    (
        losses,
        checksum.unwrap_or_else(|| panic!("no checksum line in:\n{out}")),
    )
}

/// Runs candle example `name` with each of `runs` (the first is the reference) and requires every run's 20 losses
/// and final checksum to agree with the reference's to 1e-5 relative; returns the reference's output.
#[cfg(feature = "candle")]
fn assert_runs_train_alike(name: &str, runs: &[&[&str]]) -> String {
    let reference = run_example_with(name, runs[0]);
    let (ref_losses, ref_sum) = losses_and_checksum(&reference);
    assert_eq!(ref_losses.len(), 20, "{reference}");
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-5 * a.abs().max(b.abs());
    for args in &runs[1..] {
        let parallel = run_example_with(name, args);
        let (par_losses, par_sum) = losses_and_checksum(&parallel);
        assert_eq!(par_losses.len(), 20, "{parallel}");
        for (step, (a, b)) in ref_losses.iter().zip(&par_losses).enumerate() {
            assert!(
                close(*a, *b),
                "{name} step {}: loss {a} ({}) vs {b} ({})",
                step + 1,
                runs[0].join(" "),
                args.join(" ")
            );
        }
        assert!(
            close(ref_sum, par_sum),
            "{name}: checksum {ref_sum} ({}) vs {par_sum} ({})",
            runs[0].join(" "),
            args.join(" ")
        );
    }
    // Training does something: the last loss is well below the first.
    assert!(ref_losses[19] < 0.5 * ref_losses[0], "{reference}");
    reference
}

#[cfg(feature = "candle")]
#[test]
fn candle_dp_tp_four_ranks_train_like_one() {
    assert_runs_train_alike(
        "candle_dp_tp",
        &[&["--tp", "1", "--dp", "1"], &["--tp", "2", "--dp", "2"]],
    );
}

#[cfg(feature = "candle")]
#[test]
fn candle_pp_ep_pipeline_and_experts_train_like_one_rank() {
    // pp 2, ep 2 on 4 ranks (expert dp of 1: expert gradients only scaled), and on 8 ranks with dp 4 (expert dp
    // of 2: expert gradients averaged over their replicas too).
    assert_runs_train_alike(
        "candle_pp_ep",
        &[
            &["--pp", "1", "--ep", "1"],
            &["--pp", "2", "--ep", "2"],
            &["--pp", "2", "--ep", "2", "--dp", "4"],
        ],
    );
}

#[cfg(all(feature = "candle", not(feature = "cuda")))]
#[test]
fn candle_dp_tp_without_cuda_says_how_and_exits_2() {
    let out = example_command("candle_dp_tp", &["--device", "cuda"])
        .output()
        .expect("run example");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--device cuda needs candle's CUDA backend"),
        "{stderr}"
    );
    assert!(stderr.contains("`cuda` feature"), "{stderr}");
    assert!(stderr.contains("--features cuda"), "{stderr}");
}

#[cfg(feature = "candle")]
#[test]
fn rl_refit_moves_a_trainer_s_weights_into_two_engines_five_times_byte_exact() {
    // 12 processes: the trainer (tp 2, pp 2, dp 2) and two engines (tp 2); each engine rank checks every byte after
    // each refit and the example fails if one differs.
    let out = run_example("rl_refit");
    assert!(
        out.contains("16 parameters from tp=2,pp=2,dp=2 to tp=2,dp=2@8, 16.8 MB moved"),
        "{out}"
    );
    for step in 1..=5 {
        assert!(
            out.contains(&format!("refit {step}: 16.8 MB moved in ")),
            "{out}"
        );
    }
    assert!(
        out.contains("every byte of every shard equals the full model after each of 5 refits"),
        "{out}"
    );
}
