//! `hypercomm bench --op sendrecv` and `--op all_to_all_v` end to end: ranks as threads and as processes on the
//! host, two ranks on two devices of the fake driver, and the ring's rank count refused.

mod cli_support;

use cli_support::scratch::Scratch;
use cli_support::{hypercomm, hypercomm_on_fake_gpu, json_file as json, text};

/// Every result row is `op` on 2 ranks at `bytes`, with busbw `factor` times algbw.
fn check_rows(doc: &serde_json::Value, op: &str, bytes: &[u64], factor: f64) {
    let rows = doc["results"].as_array().unwrap();
    let got: Vec<u64> = rows.iter().map(|r| r["bytes"].as_u64().unwrap()).collect();
    assert_eq!(got, bytes, "{doc}");
    for r in rows {
        assert_eq!(r["op"], op, "{r}");
        assert_eq!(r["ranks"], 2, "{r}");
        let (algbw, busbw) = (
            r["algbw_GBps"].as_f64().unwrap(),
            r["busbw_GBps"].as_f64().unwrap(),
        );
        assert!((busbw - factor * algbw).abs() < 1e-9, "{r}");
    }
}

#[test]
fn sendrecv_and_all_to_all_v_run_as_threads_and_as_processes() {
    let dir = Scratch::new("bench-p2p", "host");
    for (op, factor, note) in [
        ("sendrecv", 1.0, "# ring: rank i sends to rank i+1"),
        ("all_to_all_v", 0.5, "# split sizes drawn from seed 5"),
    ] {
        for processes in [false, true] {
            let path = dir.join(format!("{op}-{processes}.json"));
            let mut args = vec![
                "bench", "-n", "2", "--op", op, "--sizes", "4B:64KiB", "--iters", "5", "--seed",
                "5",
            ];
            if processes {
                args.push("--processes");
            }
            args.extend(["--json", path.to_str().unwrap()]);
            let out = hypercomm(&args);
            let stdout = text(&out.stdout);
            assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
            assert!(stdout.contains(note), "{stdout}");
            let doc = json(&path);
            let sizes: Vec<u64> = (2..=16).map(|p| 1 << p).collect();
            check_rows(&doc, op, &sizes, factor);
            assert_eq!(
                doc["ranks_as"],
                if processes { "processes" } else { "threads" }
            );
            if op == "all_to_all_v" {
                assert_eq!(doc["seed"], 5, "{doc}");
            } else {
                assert!(doc.get("seed").is_none(), "{doc}");
            }
        }
    }
}

#[test]
fn a_ring_of_one_rank_is_refused() {
    for backend in ["host", "nccl"] {
        let out = hypercomm(&["bench", "--backend", backend, "--op", "sendrecv", "-n", "1"]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains("--op sendrecv needs at least 2 ranks, not -n 1"),
            "{stderr}"
        );
    }
}

#[test]
fn sendrecv_and_all_to_all_v_run_on_two_fake_devices() {
    // fake-gpu (a dev-dependency) stands in for the CUDA driver and NCCL on host memory: the figures mean nothing,
    // but the ring's batch and the all-to-all-v run through NCCL's send and receive, and what arrived is checked.
    let dir = Scratch::new("bench-p2p", "fake-driver");
    for (op, factor) in [("sendrecv", 1.0), ("all_to_all_v", 0.5)] {
        let path = dir.join(format!("{op}.json"));
        let out = hypercomm_on_fake_gpu(&dir, 2)
            .args([
                "bench",
                "--backend",
                "nccl",
                "--op",
                op,
                "--sizes",
                "4B:4KiB",
            ])
            .args(["--iters", "5", "--overhead-calls", "0"])
            .args(["--json", path.to_str().unwrap()])
            .output()
            .unwrap();
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
        assert!(stdout.contains(&format!("{op} on 2 ranks")), "{stdout}");
        let doc = json(&path);
        assert_eq!(doc["backend"], "nccl");
        let sizes: Vec<u64> = (2..=12).map(|p| 1 << p).collect();
        check_rows(&doc, op, &sizes, factor);
    }
}
