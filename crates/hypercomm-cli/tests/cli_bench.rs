//! `hypercomm bench` end to end: the host table and JSON, usage errors, and the nccl backend (which runs where a
//! GPU is and otherwise says what is missing).

mod cli_support;

use cli_support::scratch::Scratch;
use cli_support::{hypercomm, hypercomm_on_fake_gpu, json_file, text};

/// A fresh scratch directory for one test, removed when the test ends.
fn scratch(test: &str) -> Scratch {
    Scratch::new("bench", test)
}

#[test]
fn host_bench_prints_a_row_per_size_and_writes_json_and_a_plot() {
    let dir = scratch("host");
    let json = dir.join("host.json");
    let svg = dir.join("host.svg");
    let out = hypercomm(&[
        "bench",
        "-n",
        "2",
        "--op",
        "all_gather",
        "--sizes",
        "64B:256B",
        "--iters",
        "5",
        "--json",
        json.to_str().unwrap(),
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let rows: Vec<&str> = stdout.lines().filter(|l| !l.starts_with('#')).collect();
    assert!(rows[0].contains("busbw(GB/s)"), "{stdout}");
    let sizes: Vec<&str> = rows[1..]
        .iter()
        .filter_map(|r| r.split_whitespace().next())
        .collect();
    assert_eq!(sizes, ["64", "128", "256"], "{stdout}");
    let doc = json_file(&json);
    assert_eq!(doc["backend"], "host");
    // Where the figures came from: the command line, when, and the machine's load.
    let measured = &doc["measured"];
    let command: Vec<&str> = measured["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(&command[1..5], ["bench", "-n", "2", "--op"], "{measured}");
    assert!(
        measured["started_utc"].as_str().unwrap().ends_with('Z'),
        "{measured}"
    );
    assert!(measured["load_average_after"].is_number(), "{measured}");
    let results = doc["results"].as_array().unwrap();
    assert_eq!(results.len(), 3);
    assert_eq!(results[2]["bytes"], 256);
    assert_eq!(results[2]["op"], "all_gather");
    assert!(
        results
            .iter()
            .all(|r| r["busbw_GBps"].as_f64().unwrap() > 0.0)
    );
    assert!(
        doc.get("overhead").is_none(),
        "the host bench has no raw-call baseline"
    );
    assert!(std::fs::read_to_string(&svg).unwrap().starts_with("<svg"));
    // Two ranks are bound to two CPUs where the machine has them, and the JSON says which.
    let placement = &doc["placement"];
    assert_eq!(placement["requested"], "one-cpu-each", "{placement}");
    let bound = placement["bound"].as_bool().unwrap();
    assert!(
        stdout.contains(if bound {
            "# placement: rank i bound to CPU ["
        } else {
            "# placement: threads float"
        }),
        "{stdout}"
    );
    if bound {
        let cpus = placement["cpus"].as_array().unwrap();
        assert_eq!(cpus.len(), 2, "{placement}");
        assert_ne!(cpus[0], cpus[1], "{placement}");
    }
    // The core-to-core round trip is measured before and after the run, on the ranks' CPUs when bound.
    let probe = &doc["core_to_core"];
    let trips = probe["median_ns_before_and_after_each_run"]
        .as_array()
        .unwrap();
    assert_eq!(trips.len(), 1, "{probe}");
    if probe["cpus"].is_null() {
        assert!(
            trips[0].as_array().unwrap().iter().all(|t| t.is_null()),
            "{probe}"
        );
        assert!(
            stdout.contains("# core-to-core round trip: not measured"),
            "{stdout}"
        );
    } else {
        if bound {
            assert_eq!(probe["cpus"], placement["cpus"], "{probe}");
        }
        for t in trips[0].as_array().unwrap() {
            let ns = t.as_f64().unwrap();
            assert!(ns > 0.0 && ns.is_finite(), "{probe}");
        }
        let line = stdout
            .lines()
            .find(|l| l.starts_with("# core-to-core round trip, CPUs "))
            .unwrap_or_else(|| panic!("{stdout}"));
        let before = trips[0][0].as_f64().unwrap();
        assert!(
            line.contains(&format!("{before:.0} ns before the run")),
            "{line} / {probe}"
        );
    }
}

#[test]
fn unpinned_host_bench_lets_the_threads_float_and_says_so() {
    let dir = scratch("unpinned");
    let json = dir.join("unpinned.json");
    let out = hypercomm(&[
        "bench",
        "--sizes",
        "8B",
        "--iters",
        "5",
        "--unpinned",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("# placement: threads float (--unpinned)"),
        "{}",
        text(&out.stdout)
    );
    let doc = json_file(&json);
    assert_eq!(doc["placement"]["bound"], false);
    assert_eq!(doc["placement"]["requested"], "free");
    assert_eq!(doc["buffers"], "plain");
}

#[test]
fn huge_page_buffers_are_asked_for_and_recorded() {
    let dir = scratch("huge");
    let json = dir.join("huge.json");
    let out = hypercomm(&[
        "bench",
        "--sizes",
        "4MiB",
        "--iters",
        "5",
        "--huge-pages",
        "--json",
        json.to_str().unwrap(),
    ]);
    let stdout = text(&out.stdout);
    if !out.status.success() {
        // A kernel without transparent huge pages refuses the advice, and the run says so instead of measuring
        // ordinary pages under the huge-page name.
        let stderr = text(&out.stderr);
        assert!(stderr.contains("refused the advice"), "{stderr}");
        println!("skipped the measurement: this kernel refuses MADV_HUGEPAGE ({stderr})");
        return;
    }
    assert!(
        stdout.contains("# buffers: advised to use 2 MiB pages"),
        "{stdout}"
    );
    let doc = json_file(&json);
    assert_eq!(doc["buffers"], "huge-page advice");
    assert!(doc["results"][0]["busbw_GBps"].as_f64().unwrap() > 0.0);
}

#[test]
fn symmetric_buffers_are_benchmarked_and_recorded() {
    let dir = scratch("symmetric");
    let json = dir.join("symmetric.json");
    let svg = dir.join("symmetric.svg");
    let out = hypercomm(&[
        "bench",
        "--sizes",
        "1KiB:1MiB",
        "--iters",
        "5",
        "--symmetric",
        "--json",
        json.to_str().unwrap(),
        "--plot",
        svg.to_str().unwrap(),
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(
        stdout.contains("# buffers: symmetric, in each rank's window"),
        "{stdout}"
    );
    let doc = json_file(&json);
    assert_eq!(doc["buffers"], "symmetric");
    let rows = doc["results"].as_array().unwrap();
    assert_eq!(rows.len(), 11, "1 KiB to 1 MiB doubling: {doc}");
    assert!(rows.iter().all(|r| r["busbw_GBps"].as_f64().unwrap() > 0.0));
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert!(
        picture.contains("all_reduce busbw, 2 ranks (shm, symmetric buffers)"),
        "the plot names its buffers"
    );
}

#[test]
fn in_place_runs_and_the_algorithm_are_benchmarked_and_recorded() {
    let dir = scratch("in-place");
    for op in ["all_gather", "reduce_scatter"] {
        let json = dir.join(format!("{op}.json"));
        let out = hypercomm(&[
            "bench",
            "--op",
            op,
            "--sizes",
            "1KiB:64KiB",
            "--iters",
            "5",
            "--in-place",
            "--algorithm",
            "direct",
            "--json",
            json.to_str().unwrap(),
        ]);
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
        assert!(stdout.contains("# algorithm: direct; in place"), "{stdout}");
        let doc = json_file(&json);
        assert_eq!(doc["in_place"], true, "{doc}");
        assert_eq!(doc["algorithm"], "direct", "{doc}");
        let rows = doc["results"].as_array().unwrap();
        assert_eq!(rows.len(), 7, "1 KiB to 64 KiB doubling: {doc}");
        assert!(rows.iter().all(|r| r["busbw_GBps"].as_f64().unwrap() > 0.0));
    }
}

#[test]
fn ranks_as_processes_are_launched_measured_and_recorded() {
    let dir = scratch("processes");
    let json = dir.join("processes.json");
    let out = hypercomm(&[
        "bench",
        "--processes",
        "-n",
        "3",
        "--op",
        "reduce_scatter",
        "--sizes",
        "3KiB:48KiB",
        "--iters",
        "5",
        "--json",
        json.to_str().unwrap(),
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(
        stdout.contains("reduce_scatter on 3 ranks (processes started by the launcher)"),
        "{stdout}"
    );
    let doc = json_file(&json);
    assert_eq!(doc["ranks_as"], "processes", "{doc}");
    let rows = doc["results"].as_array().unwrap();
    let bytes: Vec<u64> = rows.iter().map(|r| r["bytes"].as_u64().unwrap()).collect();
    assert_eq!(bytes, [3072, 6144, 12288, 24576, 49152], "{doc}");
    assert!(
        rows.iter()
            .all(|r| r["ranks"] == 3 && r["busbw_GBps"].as_f64().unwrap() > 0.0)
    );
}

#[test]
fn bad_arguments_exit_with_status_2_and_say_which() {
    for (args, needle) in [
        (
            vec!["bench", "--op", "all_sum"],
            "op \"all_sum\" is not one of",
        ),
        (vec!["bench", "--sizes", "64:8"], "MIN:MAX"),
        (vec!["bench", "--sizes", "8XB"], "unknown unit"),
        (vec!["bench", "-n", "0"], "-n must be at least 1"),
        (
            vec!["bench", "--backend", "mpi"],
            "invalid value 'mpi' for '--backend",
        ),
        (
            vec!["bench", "--backend", "nccl", "--tcp"],
            "--tcp is a host transport",
        ),
        (
            vec!["bench", "--op", "broadcast", "--symmetric"],
            "not with --op broadcast",
        ),
        (
            vec!["bench", "--symmetric", "--huge-pages"],
            "not with --huge-pages",
        ),
        (
            vec!["bench", "--op", "all_reduce", "--in-place"],
            "not with --op all_reduce",
        ),
        (
            vec!["bench", "--op", "all_gather", "--in-place", "--symmetric"],
            "not with --symmetric",
        ),
        (
            vec!["bench", "--algorithm", "fastest"],
            "invalid value 'fastest' for '--algorithm",
        ),
        (
            vec!["bench", "--backend", "nccl", "--algorithm", "direct"],
            "are for the host backend",
        ),
    ] {
        let out = hypercomm(&args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}

#[test]
fn nccl_bench_runs_on_a_gpu_or_says_what_is_missing() {
    let dir = scratch("nccl");
    let json = dir.join("nccl.json");
    let out = hypercomm(&[
        "bench",
        "--backend",
        "nccl",
        "-n",
        "1",
        "--sizes",
        "8B:1KiB",
        "--iters",
        "20",
        "--overhead-calls",
        "20",
        "--overhead-batches",
        "3",
        "--json",
        json.to_str().unwrap(),
    ]);
    let stderr = text(&out.stderr);
    if out.status.code() == Some(1) && stderr.contains("unavailable") {
        assert!(stderr.contains("--backend nccl: "), "{stderr}");
        eprintln!("skipping the device run: {}", stderr.trim());
        return;
    }
    assert!(out.status.success(), "{stderr}");
    let doc = json_file(&json);
    assert_eq!(doc["backend"], "nccl");
    assert_eq!(doc["results"].as_array().unwrap().len(), 8);
    let overhead = &doc["overhead"];
    assert!(overhead["raw_ns"].as_f64().unwrap() > 0.0, "{doc}");
    assert!(overhead["hypercomm_ns"].as_f64().unwrap() > 0.0, "{doc}");
    eprintln!("{}", text(&out.stdout));
}

#[test]
fn nccl_bench_runs_end_to_end_on_the_fake_driver() {
    // fake-gpu (a dev-dependency) is a single-rank, synchronous CUDA driver and NCCL on host memory: the numbers
    // mean nothing, but every step of the device bench and its output runs.
    let dir = scratch("fake-driver");
    let json = dir.join("fake.json");
    let out = hypercomm_on_fake_gpu(&dir, 1)
        .args([
            "bench",
            "--backend",
            "nccl",
            "--op",
            "reduce_scatter",
            "--sizes",
            "1KiB:4KiB",
            "--iters",
            "10",
            "--overhead-calls",
            "10",
            "--overhead-batches",
            "3",
            "--json",
            json.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(stdout.contains("backend nccl 2.28.9"), "{stdout}");
    assert!(stdout.contains("ncclAllReduce directly"), "{stdout}");
    let doc = json_file(&json);
    assert_eq!(doc["backend"], "nccl");
    let bytes: Vec<u64> = doc["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["bytes"].as_u64().unwrap())
        .collect();
    assert_eq!(bytes, [1024, 2048, 4096]);
    assert!(doc["overhead"]["extra_ns"].is_number(), "{doc}");
}

#[test]
fn collection_bench_builds_nccl_communicators_on_the_fake_driver() {
    // Eight ranks, one fake device each: every group of the full layout gets an NCCL communicator too.
    let dir = scratch("fake-collection");
    let json = dir.join("fake-collection.json");
    let out = hypercomm_on_fake_gpu(&dir, 8)
        .args([
            "bench",
            "--collection",
            "--backend",
            "nccl",
            "--repeats",
            "1",
        ])
        .args(["--json", json.to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(stdout.contains("backend nccl"), "{stdout}");
    let doc = json_file(&json);
    let rows = doc["collection"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{doc}");
    assert_eq!(doc["measured"]["command"][2], "--collection", "{doc}");
    for row in rows {
        assert_eq!(row["backend"], "nccl", "{doc}");
        assert!(
            row["communicators_per_rank"].as_u64().unwrap() >= 21,
            "{doc}"
        );
    }
    // Every NCCL communicator was destroyed by every rank when the collections were dropped.
    let left = std::fs::read_dir(dir.join("exchange")).unwrap().count();
    assert_eq!(left, 0, "fake nccl communicators left behind");
}

#[test]
fn collection_bench_runs_ranks_as_processes() {
    let dir = scratch("collection-processes");
    let json = dir.join("collection-processes.json");
    let out = hypercomm(&[
        "bench",
        "--collection",
        "--processes",
        "--repeats",
        "2",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("8 ranks as processes"), "{stdout}");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let rows = v["collection"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{v}");
    for row in rows {
        assert_eq!(row["ranks_as"], "processes");
        // Every kind of the full layout: 22 communicators on the ranks that hold embd and pos_embd.
        assert_eq!(row["communicators_per_rank"], 22, "{row}");
        let (min, med, max) = (
            row["min_ms"].as_f64().unwrap(),
            row["median_ms"].as_f64().unwrap(),
            row["max_ms"].as_f64().unwrap(),
        );
        assert!(0.0 < min && min <= med && med <= max, "{row}");
    }
}
