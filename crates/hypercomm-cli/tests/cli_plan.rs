//! The `hypercomm plan` and `hypercomm layout --render` contracts: rankings on the shipped example clusters,
//! traffic overrides that change the winner, pictures that are real SVG and PNG files, exit status 2 on bad input.

mod cli_support;

use std::path::PathBuf;

use cli_support::scratch::Scratch;
use cli_support::{hypercomm, json_output as json};

fn example(name: &str) -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/clusters");
    root.join(name).to_string_lossy().into_owned()
}

/// Fails with exit status 2 and one line of error that contains `needle`.
fn usage_error(args: &[&str], needle: &str) {
    let out = hypercomm(args);
    assert_eq!(out.status.code(), Some(2), "{args:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(needle), "{err}");
}

/// A fresh scratch directory for one test, removed when the test ends.
fn scratch(test: &str) -> Scratch {
    Scratch::new("plan", test)
}

#[test]
fn plan_on_hgx_keeps_tp_on_nvlink_and_dp_in_the_rack() {
    let hgx = example("hgx-h100-8x8-infiniband.json");
    let v = json(&[
        "plan",
        "--cluster",
        &hgx,
        "--world",
        "64",
        "--tp",
        "8",
        "--pp",
        "2",
        "--top",
        "3",
        "--json",
    ]);
    assert_eq!(v["devices"], 64);
    assert_eq!(v["default_rank"], 1);
    let best = &v["candidates"][0];
    assert_eq!(best["order"], "tp-dp-pp");
    assert_eq!(best["placement"], "launcher");
    let kinds = best["kinds"].as_array().unwrap();
    let worst: Vec<&str> = kinds.iter().map(|k| k["worst"].as_str().unwrap()).collect();
    assert_eq!(worst, ["nvlink", "nic", "spine"]);
    let explanation = best["explanation"][0].as_str().unwrap();
    assert!(
        explanation
            .starts_with("tp (8 ranks, all-reduce) stays inside each host over NVLink at 450 GB/s"),
        "{explanation}"
    );
    assert_eq!(v["candidates"].as_array().unwrap().len(), 3);
    // Candidates come best first.
    let secs: Vec<f64> = v["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["seconds"].as_f64().unwrap())
        .collect();
    assert!(secs.windows(2).all(|w| w[0] <= w[1]), "{secs:?}");
}

#[test]
fn traffic_overrides_change_the_winner_and_the_default_is_still_shown() {
    let hgx = example("hgx-h100-8x8-infiniband.json");
    let args = [
        "plan",
        "--cluster",
        &hgx,
        "--world",
        "16",
        "--tp",
        "2",
        "--traffic",
        "tp=1M,dp=100GB",
        "--top",
        "1",
    ];
    let mut with_json = args.to_vec();
    with_json.push("--json");
    let v = json(&with_json);
    assert_eq!(v["traffic"]["dp"], 1e11);
    // dp groups of 8 fit one host's NVLink only if dp varies fastest.
    assert_eq!(v["candidates"][0]["order"], "dp-tp");
    let default_rank = v["default_rank"].as_u64().unwrap();
    assert!(default_rank > 1);
    assert_eq!(
        v["candidates"][1]["rank"], default_rank,
        "the default is appended"
    );
    let out = hypercomm(&args);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("best: order dp-tp with the launcher placement"),
        "{text}"
    );
    assert!(text.contains("[Megatron default]"), "{text}");
    assert!(
        text.contains("tp (2 ranks, all-reduce) crosses hosts over InfiniBand"),
        "{text}"
    );
}

#[test]
fn plan_rejects_bad_input_with_one_line() {
    let hgx = example("hgx-h100-8x8-infiniband.json");
    usage_error(
        &[
            "plan",
            "--cluster",
            "/nonexistent/cluster.json",
            "--world",
            "8",
        ],
        "cannot read cluster /nonexistent/cluster.json",
    );
    usage_error(
        &["plan", "--cluster", &hgx, "--world", "64", "--tp", "3"],
        "tp*pp*cp=3 does not divide world 64",
    );
    usage_error(
        &["plan", "--cluster", &hgx, "--world", "128", "--tp", "8"],
        "world 128 needs 128 devices",
    );
    usage_error(
        &[
            "plan",
            "--cluster",
            &hgx,
            "--world",
            "64",
            "--traffic",
            "xp=1",
        ],
        "unknown kind \"xp\"",
    );
    usage_error(
        &["plan", "--cluster", &hgx, "--world", "64", "--hidden", "0"],
        "model hidden=0 must be a positive number",
    );
    let dir = scratch("bad-cluster");
    let bad = dir.join("bad.json");
    std::fs::write(
        &bad,
        r#"{"bandwidth": {"nic": 50}, "hosts": [{"name": "a", "gpus": 8}, {"name": "b", "gpus": 0}]}"#,
    )
    .unwrap();
    usage_error(
        &["plan", "--cluster", bad.to_str().unwrap(), "--world", "8"],
        "host \"b\" has gpus=0",
    );
}

#[test]
fn render_writes_svg_with_labels_and_a_legend() {
    let dir = scratch("svg");
    let path = dir.join("layout.svg");
    let nvl = example("gb200-nvl72.json");
    let out = hypercomm(&[
        "layout",
        "--world",
        "64",
        "--tp",
        "8",
        "--pp",
        "2",
        "--cluster",
        &nvl,
        "--render",
        path.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let svg = std::fs::read_to_string(&path).unwrap();
    assert!(svg.starts_with("<svg"), "{}", &svg[..80]);
    // Hosts of the NVL72 rack hold 4 GPUs: 16 trays for 64 ranks.
    assert!(svg.contains(">\ntray15\n<") && !svg.contains(">\ntray16\n<"));
    assert!(svg.contains(">\ntp: 8 groups of 8"));
    assert!(svg.contains(">\ndp: 16 groups of 4"));
    assert!(svg.contains(">\n63\n<"), "every rank is labelled");
    assert!(svg.contains(">\ng7\n<"), "legend and group labels");
}

#[test]
fn render_writes_png_of_the_scene_size() {
    let dir = scratch("png");
    let path = dir.join("layout.png");
    let out = hypercomm(&[
        "layout",
        "--world",
        "16",
        "--tp",
        "2",
        "--pp",
        "4",
        "--kinds",
        "tp,pp",
        "--gpus-per-host",
        "4",
        "--render",
        path.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let png = std::fs::read(&path).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let width = u32::from_be_bytes(png[16..20].try_into().unwrap());
    let height = u32::from_be_bytes(png[20..24].try_into().unwrap());
    assert!(width >= 400 && height >= 400, "{width}x{height}");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("wrote "));
}

#[test]
fn render_rejects_bad_input() {
    let dir = scratch("bad-render");
    let jpg = dir.join("layout.jpg");
    usage_error(
        &["layout", "--world", "8", "--render", jpg.to_str().unwrap()],
        "must end in .svg or .png",
    );
    let svg = dir.join("layout.svg");
    usage_error(
        &[
            "layout",
            "--world",
            "8",
            "--kinds",
            "tpp",
            "--render",
            svg.to_str().unwrap(),
        ],
        "unknown group kind \"tpp\"",
    );
    usage_error(
        &[
            "layout",
            "--world",
            "8",
            "--kinds",
            "expt_dp_ag",
            "--render",
            svg.to_str().unwrap(),
        ],
        "this layout has no expt_dp_ag groups",
    );
    // An output that cannot be created is bad input named in one line, before anything is drawn.
    for name in ["out.png", "out.svg"] {
        let missing = dir.join("no-such-dir").join(name);
        usage_error(
            &[
                "layout",
                "--world",
                "64",
                "--tp",
                "2",
                "--render",
                missing.to_str().unwrap(),
            ],
            &format!(
                "hypercomm: --render {}: the directory {} does not exist",
                missing.display(),
                dir.join("no-such-dir").display()
            ),
        );
    }
    let taken = dir.join("taken.svg");
    std::fs::create_dir(&taken).unwrap();
    usage_error(
        &[
            "layout",
            "--world",
            "8",
            "--render",
            taken.to_str().unwrap(),
        ],
        &format!("--render {}: cannot create the file: ", taken.display()),
    );
}
