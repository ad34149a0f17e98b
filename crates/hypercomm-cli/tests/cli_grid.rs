//! The `hypercomm grid` contract: exact JSON shape, key order, and exit status 2 on bad input.

mod cli_support;

use cli_support::hypercomm;

#[test]
fn grid_json_matches_the_contract() {
    let out = hypercomm(&[
        "grid",
        "--dims",
        "tp=2,cp=2,dp=4,pp=2",
        "--offset",
        "32",
        "--groups",
        "dp-cp",
        "--groups",
        "tp",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        value["dims"],
        serde_json::json!([
            {"name": "tp", "size": 2}, {"name": "cp", "size": 2}, {"name": "dp", "size": 4}, {"name": "pp", "size": 2}
        ])
    );
    assert_eq!(value["offset"], 32);
    // Keys keep the order and spelling given on the command line.
    let dp_cp_at = text.find("\"dp-cp\"").unwrap();
    let tp_at = text.find("\"tp\":[[").unwrap();
    assert!(dp_cp_at < tp_at);
    let dp_cp: Vec<Vec<usize>> = serde_json::from_value(value["groups"]["dp-cp"].clone()).unwrap();
    assert_eq!(dp_cp.len(), 4);
    assert_eq!(dp_cp[0], vec![32, 34, 36, 38, 40, 42, 44, 46]);
    assert_eq!(dp_cp[3], vec![49, 51, 53, 55, 57, 59, 61, 63]);
    let tp: Vec<Vec<usize>> = serde_json::from_value(value["groups"]["tp"].clone()).unwrap();
    assert_eq!(tp.len(), 16);
    assert_eq!(tp[15], vec![62, 63]);
}

#[test]
fn group_keys_are_the_given_strings_in_any_order() {
    let out = hypercomm(&[
        "grid",
        "--dims",
        "tp=2,cp=2,dp=2",
        "--groups",
        "cp-tp",
        "--json",
    ]);
    assert!(out.status.success());
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        value["groups"]["cp-tp"],
        serde_json::json!([[0, 1, 2, 3], [4, 5, 6, 7]])
    );
}

#[test]
fn table_output_lists_groups() {
    let out = hypercomm(&["grid", "--dims", "tp=2,pp=2", "--groups", "pp"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("pp: 2 group(s) of 2"), "{text}");
    assert!(text.contains("[1, 3]"), "{text}");
}

#[test]
fn bad_input_exits_2_with_one_line_naming_the_problem() {
    for (args, needle) in [
        (vec!["grid", "--dims", "tp=0", "--groups", "tp"], "tp=0"),
        (
            vec!["grid", "--dims", "tp=2,tp=2", "--groups", "tp"],
            "tp appears more than once",
        ),
        (
            vec!["grid", "--dims", "tp=2", "--groups", "ep"],
            "no dimension ep",
        ),
        (
            vec!["grid", "--dims", "tp=two", "--groups", "tp"],
            "size of \"tp\"",
        ),
        (
            vec!["grid", "--dims", "tp=2", "--groups", "tp", "--groups", "tp"],
            "given twice",
        ),
        (
            vec!["grid", "--dims", "tp=2,dp=2", "--groups", "dp-dp"],
            "dp is selected more than once",
        ),
    ] {
        let out = hypercomm(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}
