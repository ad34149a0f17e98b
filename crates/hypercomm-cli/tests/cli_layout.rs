//! The `hypercomm layout` contract: fields named as Megatron's ProcessGroupCollection, absent kinds omitted,
//! `--rank` consistent with the full listing, exit status 2 on bad input.

mod cli_support;

use cli_support::{hypercomm, json_output as json};
use serde_json::Value;

const ALL_FIELDS: [&str; 22] = [
    "tp",
    "pp",
    "mp",
    "embd",
    "pos_embd",
    "cp",
    "tp_cp",
    "hcp",
    "ep",
    "expt_tp",
    "tp_ep",
    "tp_ep_pp",
    "tp_dp_cp",
    "dp",
    "dp_cp",
    "dp_cp_ag",
    "expt_dp",
    "expt_dp_ag",
    "intra_dp_cp",
    "intra_expt_dp",
    "inter_dist_opt",
    "intra_dist_opt",
];

#[test]
fn megatron_docstring_example_through_the_cli() {
    let v = json(&[
        "layout", "--world", "16", "--tp", "2", "--pp", "4", "--json",
    ]);
    assert_eq!(v["dp"], 2);
    assert_eq!(v["expert_dp"], 2);
    assert_eq!(v["groups"]["tp"][0], serde_json::json!([0, 1]));
    assert_eq!(v["groups"]["pp"][0], serde_json::json!([0, 4, 8, 12]));
    assert_eq!(v["groups"]["dp"][1], serde_json::json!([1, 3]));
    let fields: Vec<&str> = v["groups"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    // ep = 1, no hierarchical cp, one optimizer instance: those three kinds are omitted.
    let expected: Vec<&str> = ALL_FIELDS
        .into_iter()
        .filter(|f| !["hcp", "expt_dp_ag", "inter_dist_opt"].contains(f))
        .collect();
    let mut sorted_fields = fields.clone();
    sorted_fields.sort();
    let mut sorted_expected = expected.clone();
    sorted_expected.sort();
    assert_eq!(sorted_fields, sorted_expected);
}

#[test]
fn every_field_appears_when_the_layout_has_it() {
    let v = json(&[
        "layout",
        "--world",
        "64",
        "--tp",
        "2",
        "--pp",
        "2",
        "--cp",
        "2",
        "--ep",
        "2",
        "--etp",
        "1",
        "--dist-opt-instances",
        "2",
        "--hcp",
        "2",
        "--json",
    ]);
    for field in ALL_FIELDS {
        assert!(v["groups"].get(field).is_some(), "missing {field}");
    }
    assert_eq!(v["expert_dp"], 16);
}

#[test]
fn rank_query_matches_the_full_listing() {
    let base = [
        "layout",
        "--world",
        "64",
        "--tp",
        "2",
        "--pp",
        "4",
        "--cp",
        "2",
        "--ep",
        "2",
        "--order",
        "TP-CP-EP-DP-PP",
        "--offset",
        "64",
        "--dist-opt-instances",
        "2",
        "--json",
    ];
    let all = json(&base);
    for rank in [64usize, 71, 100, 127] {
        let mut args = base.to_vec();
        let rank_text = rank.to_string();
        args.extend(["--rank", &rank_text]);
        let mine = json(&args);
        assert_eq!(mine["rank"], rank);
        for (field, groups) in all["groups"].as_object().unwrap() {
            let holding: Vec<&Value> = groups
                .as_array()
                .unwrap()
                .iter()
                .filter(|g| g.as_array().unwrap().contains(&Value::from(rank)))
                .collect();
            match holding.as_slice() {
                [] => assert!(
                    mine["groups"].get(field).is_none(),
                    "{field} for rank {rank}"
                ),
                [one] => assert_eq!(&&mine["groups"][field], one, "{field} for rank {rank}"),
                many => panic!("{field}: rank {rank} in {} groups", many.len()),
            }
        }
    }
}

/// The members a `--compact` group object describes: `base + Σ digit_k(start + i) · stride_k`, first axis fastest.
fn expand(compact: &Value) -> Value {
    let n = |v: &Value| v.as_u64().expect("a number") as usize;
    let axes: Vec<(usize, usize)> = compact["axes"]
        .as_array()
        .expect("axes")
        .iter()
        .map(|a| (n(&a[0]), n(&a[1])))
        .collect();
    let (base, start, len) = (
        n(&compact["base"]),
        n(&compact["start"]),
        n(&compact["len"]),
    );
    (start..start + len)
        .map(|mut position| {
            let mut rank = base;
            for &(stride, size) in &axes {
                rank += (position % size) * stride;
                position /= size;
            }
            Value::from(rank)
        })
        .collect()
}

#[test]
fn compact_rank_query_describes_the_same_members_at_any_size() {
    let base = [
        "layout", "--world", "64", "--tp", "2", "--pp", "4", "--cp", "2", "--ep", "2", "--hcp",
        "1,2", "--offset", "64", "--json",
    ];
    for rank in [64usize, 71, 100, 127] {
        let rank_text = rank.to_string();
        let mut args = base.to_vec();
        args.extend(["--rank", &rank_text]);
        let listed = json(&args);
        args.push("--compact");
        let compact = json(&args);
        assert_eq!(compact["rank"], rank);
        let (listed, compact) = (
            listed["groups"].as_object().unwrap(),
            compact["groups"].as_object().unwrap(),
        );
        assert_eq!(
            listed.keys().collect::<Vec<_>>(),
            compact.keys().collect::<Vec<_>>()
        );
        for (field, members) in listed {
            let got = match &compact[field] {
                Value::Array(levels) => Value::Array(levels.iter().map(expand).collect()),
                one => expand(one),
            };
            assert_eq!(&got, members, "{field} for rank {rank}");
        }
    }
    // The same query at 16,777,216 ranks lists groups of up to every rank; the compact form stays small.
    let out = hypercomm(&[
        "layout",
        "--world",
        "16777216",
        "--tp",
        "8",
        "--cp",
        "2",
        "--ep",
        "8",
        "--pp",
        "16",
        "--rank",
        "777",
        "--json",
        "--compact",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout.len() < 4096, "{} bytes", out.stdout.len());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["groups"]["intra_dist_opt"]["len"], 16_777_216);
    // --compact needs --rank and --json.
    let out = hypercomm(&["layout", "--world", "8", "--json", "--compact"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn bad_input_exits_2_with_one_line() {
    for (args, needle) in [
        (
            vec!["layout", "--world", "64", "--tp", "3"],
            "tp*pp*cp=3 does not divide world 64",
        ),
        (
            vec!["layout", "--world", "64", "--order", "tp-tp"],
            "names tp more than once",
        ),
        (
            vec!["layout", "--world", "64", "--pp", "2", "--order", "tp-dp"],
            "leaves out pp",
        ),
        (
            vec!["layout", "--world", "16", "--cp", "4", "--hcp", "3"],
            "multiply to 3, not cp=4",
        ),
        (
            vec!["layout", "--world", "16", "--rank", "16"],
            "--rank 16 is outside",
        ),
        (
            vec!["layout", "--world", "16", "--tp", "x"],
            "invalid value 'x'",
        ),
        // A leading '-' is read as a value, not as the flags -6 -4, and refused by the rule it breaks.
        (
            vec!["layout", "--world", "-64"],
            "invalid value '-64' for '--world <WORLD>': cannot be negative",
        ),
        (
            vec!["layout", "--world", "64", "--tp", "-2"],
            "invalid value '-2' for '--tp <TP>': cannot be negative",
        ),
        (
            vec!["layout", "--world", "64", "--rank", "-1"],
            "invalid value '-1' for '--rank <RANK>': cannot be negative",
        ),
        (
            vec!["layout", "--world", "64", "--cp", "8", "--hcp", "2,-4"],
            "invalid value '-4' for '--hcp <HCP>': cannot be negative",
        ),
    ] {
        let out = hypercomm(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert!(err.contains(needle), "{args:?}: {err}");
        if !needle.starts_with("invalid value") {
            assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        }
    }
}

#[test]
fn table_output_is_readable() {
    let out = hypercomm(&[
        "layout", "--world", "16", "--tp", "2", "--pp", "4", "--rank", "13",
    ]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("rank 13:"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with("embd") && l.contains("[1, 13]")),
        "{text}"
    );
}

/// One rank's table costs the same at any world size: at 2^40 ranks (a world-sized `intra_dist_opt` group and
/// a 2^36-rank `tp_dp_cp` group) it prints each group's size and its first and last members without listing them.
#[test]
fn rank_table_at_a_trillion_ranks() {
    let world = (1u64 << 40).to_string();
    let out = hypercomm(&[
        "layout", "--world", &world, "--tp", "8", "--cp", "2", "--ep", "8", "--pp", "16", "--rank",
        "777",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let line = |kind: &str| {
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(kind))
            .unwrap_or_else(|| panic!("no {kind} line in {text}"))
            .to_owned()
    };
    assert!(
        line("tp").ends_with("[776, 777, 778, 779, 780, 781, 782, 783]"),
        "{text}"
    );
    let intra = line("intra_dist_opt");
    assert!(intra.contains(&format!("777/{world}")), "{intra}");
    assert!(
        intra.ends_with("[0, 1, 2, 3, 4, 5, ..., 1099511627774, 1099511627775]"),
        "{intra}"
    );
    assert!(
        line("dp").ends_with("..., 68719476713, 68719476729]"),
        "{text}"
    );
}
