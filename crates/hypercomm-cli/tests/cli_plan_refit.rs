//! The `hypercomm plan --refit` contract: an RL trainer's layout refitting inference replicas, bytes per link and
//! per rank that add up, forwarding on and off, a sharding file in and a plan file out, exit status 2 on bad input.

mod cli_support;

use cli_support::scratch::Scratch;
use cli_support::{hypercomm, json_file, json_output as json};
use serde_json::Value;

/// Fails with exit status 2 and one line of error that contains `needle`.
fn usage_error(args: &[&str], needle: &str) {
    let out = hypercomm(args);
    assert_eq!(out.status.code(), Some(2), "{args:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(needle), "{err}");
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("{v} is not a count"))
}

const GPT: &str = "gpt:layers=4,hidden=1024,vocab=32000";

#[test]
fn trainer_tp2_pp2_dp2_refits_two_replicas_of_tp2() {
    let refit = [
        "plan",
        "--refit",
        "--from",
        "tp=2,pp=2,dp=2",
        "--to",
        "tp=2,dp=2",
        "--model",
        GPT,
    ];
    let mut args = refit.to_vec();
    args.push("--json");
    let v = json(&args);
    let s = &v["summary"];
    assert_eq!(v["model"], "gpt layers=4,hidden=1024,vocab=32000");
    assert_eq!(
        (s["source"].as_str(), s["destination"].as_str()),
        (Some("tp=2,pp=2,dp=2"), Some("tp=2,dp=2"))
    );
    assert_eq!(
        s["needed"], s["moved"],
        "each destination byte arrives once"
    );
    let links: u64 = s["links"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| u(&l["bytes"]))
        .sum();
    assert_eq!(links, u(&s["moved"]));
    // The trainer sends each engine shard once; the replicas forward the rest.
    assert_eq!(u(&s["from_sources"]) + u(&s["forwarded"]), u(&s["moved"]));
    let sources = s["sources"].as_array().unwrap();
    assert_eq!(sources.len(), 8);
    let sent: Vec<u64> = sources.iter().map(|r| u(&r["sent"])).collect();
    assert_eq!(sent.iter().sum::<u64>(), u(&s["from_sources"]));
    for r in sources {
        assert!(
            (u(&r["sent"]) as f64 - r["share"].as_f64().unwrap()).abs() < 16.0,
            "{r}"
        );
    }
    // The baseline: every full tensor from rank 0 to the 4 engine ranks, the model's bytes each.
    assert_eq!(s["baseline"]["sender"], 0);
    assert_eq!(u(&s["baseline"]["bytes"]), 4 * u(&s["from_sources"]));
    assert_eq!(s["destinations"].as_array().unwrap().len(), 4);
    assert_eq!(v["explanation"].as_array().unwrap().len(), 4);

    let out = hypercomm(&refit);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "model: gpt layers=4,hidden=1024,vocab=32000 (52 parameters, 232 MB)",
        "52 parameters from tp=2,pp=2,dp=2 (8 ranks) to tp=2,dp=2 (4 ranks)",
        "each destination byte arrives once",
        "baseline: source rank 0 broadcasting every full tensor to the 4 destination ranks sends 927 MB",
        "source ranks: bytes sent (balanced share)",
        "destination ranks: bytes from sources + from replicas, forwarded",
        "links: bytes (transfers)",
        "source 0 -> destination 0",
    ] {
        assert!(text.contains(needle), "{needle:?} not in\n{text}");
    }
}

#[test]
fn without_forwarding_the_sources_serve_every_replica() {
    let v = json(&[
        "plan",
        "--refit",
        "--from",
        "tp=4,dp=2",
        "--to",
        "tp=2,dp=4",
        "--model",
        GPT,
        "--no-forward",
        "--bucket",
        "1MiB",
        "--json",
    ]);
    let s = &v["summary"];
    assert_eq!(s["forwarded"], 0);
    assert_eq!(s["from_sources"], s["needed"]);
    assert_eq!(s["moved"], s["needed"]);
    assert_eq!(s["forward"], false);
    assert_eq!(s["bucket_bytes"], 1 << 20);
    assert!(u(&s["buckets"]) > 1);
    let links = s["links"].as_array().unwrap();
    assert!(
        links.iter().all(|l| l["from"].get("source").is_some()),
        "no destination sends"
    );
}

#[test]
fn a_sharding_file_in_and_the_whole_plan_out() {
    let dir = Scratch::new("plan-refit", "files");
    let model = dir.join("model.json");
    std::fs::write(
        &model,
        r#"{"layers": 2, "params": [
            {"name": "embedding", "shape": [64, 16], "dtype": "bf16", "split": {"tp": {"dim": 0}}, "place": "first"},
            {"name": "layer1.fc2", "shape": [16, 64], "dtype": "f32", "split": {"tp": {"dim": 1}}, "place": {"layer": 1}},
            {"name": "norm", "shape": [16], "dtype": "f32", "place": "last"}
        ]}"#,
    )
    .unwrap();
    let plan_path = dir.join("plan.json");
    let v = json(&[
        "plan",
        "--refit",
        "--from",
        "tp=2,pp=2",
        "--to",
        "tp=4",
        "--model",
        model.to_str().unwrap(),
        "--write-plan",
        plan_path.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(v["summary"]["params"], 3);
    let needed = 64 * 16 * 2 + 16 * 64 * 4 + 4 * 16 * 4;
    assert_eq!(
        v["summary"]["needed"], needed,
        "norm whole on each of 4 ranks"
    );
    let plan = json_file(&plan_path);
    let transfers = plan["transfers"].as_array().unwrap();
    let moved: u64 = transfers
        .iter()
        .map(|t| {
            let runs = &t["runs"];
            let count: u64 = runs["repeat"]
                .as_array()
                .map_or(1, |r| r.iter().map(|s| u(&s["count"])).product());
            u(&runs["len"]) * count
        })
        .sum();
    assert_eq!(moved, needed);
    // fc2 [16, 64] from tp 2 into tp 4: each engine shard is 16 strided rows of its trainer shard.
    let fc2 = transfers.iter().find(|t| t["param"] == 1).unwrap();
    assert_eq!(fc2["runs"]["repeat"][0]["count"], 16);
    assert_eq!(plan["destination"]["tp"], 4);
}

#[test]
fn bad_refit_input_is_one_line_naming_it() {
    usage_error(
        &[
            "plan", "--refit", "--from", "tp=3", "--to", "tp=2", "--model", GPT,
        ],
        "parameter \"embedding.word_embeddings.weight\": dim 0 of size 32000 does not split into 3 tensor-parallel shard(s)",
    );
    usage_error(
        &[
            "plan",
            "--refit",
            "--from",
            "tp=2,xp=2",
            "--to",
            "tp=2",
            "--model",
            GPT,
        ],
        "unknown size \"xp\"",
    );
    usage_error(
        &[
            "plan",
            "--refit",
            "--from",
            "tp=2",
            "--to",
            "tp=2",
            "--model",
            "gpt:layers=4,hidden=1024",
        ],
        "model vocab=0: must be at least 1",
    );
    usage_error(
        &[
            "plan",
            "--refit",
            "--from",
            "tp=2",
            "--to",
            "tp=2",
            "--model",
            "gpt:layers=4,depth=3",
        ],
        "unknown key \"depth\"",
    );
    usage_error(
        &[
            "plan",
            "--refit",
            "--from",
            "tp=2",
            "--to",
            "tp=2",
            "--model",
            "/nonexistent/model.json",
        ],
        "--model /nonexistent/model.json: not gpt:... and cannot read it as a file",
    );
    usage_error(
        &[
            "plan", "--refit", "--from", "tp=2", "--to", "tp=2", "--model", GPT, "--bucket", "100B",
        ],
        "bucket of 100 bytes is below the minimum of 1024 bytes",
    );
    usage_error(
        &[
            "plan", "--refit", "--from", "pp=2", "--to", "pp=3", "--model", GPT,
        ],
        "4 layers do not split evenly over pp 3",
    );
    // clap's own errors: --refit with the cluster search's arguments, or without its own.
    for args in [
        &[
            "plan", "--refit", "--from", "tp=2", "--to", "tp=2", "--model", GPT, "--world", "8",
        ][..],
        &["plan", "--refit", "--from", "tp=2", "--to", "tp=2"][..],
        &["plan", "--from", "tp=2"][..],
    ] {
        let out = hypercomm(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(String::from_utf8_lossy(&out.stderr).starts_with("error:"));
    }
}
