//! `hypercomm bench --refit` end to end: both methods' rows, their ratio, the JSON, and a bad layout refused.

mod cli_support;

use cli_support::scratch::Scratch;
use cli_support::{hypercomm, json_file};

#[test]
fn refit_bench_measures_the_plan_against_gather_and_broadcast() {
    let scratch = Scratch::new("bench-refit", "rows");
    let json = scratch.join("refit.json");
    let out = hypercomm(&[
        "bench",
        "--refit",
        "--from",
        "tp=2,dp=2",
        "--to",
        "tp=1,dp=2",
        "--model",
        "gpt:layers=1,hidden=64,vocab=256",
        "--bucket",
        "8KiB",
        "--refits",
        "2",
        "--json",
        json.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("tp=2,dp=2 (4 ranks) -> dp=2 (2 ranks)"),
        "{stdout}"
    );
    let bytes = |method: &str| -> u64 {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(method))
            .unwrap_or_else(|| panic!("no {method} row:\n{stdout}"));
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    // The refit moves what the engines hold; the baseline that, again, for each engine, plus the gather.
    assert!(bytes("refit ") < bytes("baseline"), "{stdout}");
    assert!(stdout.contains("refit: 0."), "{stdout}");
    let doc = json_file(&json);
    assert_eq!(doc["refit"]["plan"]["bytes"], bytes("refit "));
    assert_eq!(
        doc["refit"]["baseline"]["seconds"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert!(doc["measured"]["command"].is_array(), "{doc}");

    let bad = hypercomm(&["bench", "--refit", "--to", "tp=3"]);
    assert_eq!(bad.status.code(), Some(2));
}
