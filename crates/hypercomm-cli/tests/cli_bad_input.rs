//! A property sweep of the command line with mostly invalid values: every run of `grid`, `layout`, `plan` and
//! `plan --refit` ends with status 0, or with status 2 and one line naming the problem; none panics or hangs.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use proptest::prelude::*;

/// A size as a user might mistype it: valid numbers, zero, negatives, huge values, words, empty.
fn arb_size() -> impl Strategy<Value = String> {
    prop_oneof![
        (0usize..20).prop_map(|n| n.to_string()),
        Just("0".to_owned()),
        (-5i64..0).prop_map(|n| n.to_string()),
        Just("18446744073709551615".to_owned()),
        Just("99999999999999999999999".to_owned()),
        "[a-z]{1,4}",
        Just(String::new()),
    ]
}

fn arb_order() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("tp-cp-ep-dp-pp".to_owned()),
        proptest::collection::vec(
            prop_oneof!["tp", "cp", "ep", "dp", "pp", "TP", "xp", ""],
            0..7
        )
        .prop_map(|t| t.join("-")),
        "[^\\x00]{0,12}",
    ]
}

fn arb_args() -> impl Strategy<Value = Vec<String>> {
    let layout = (
        arb_size(),
        arb_size(),
        arb_size(),
        arb_size(),
        arb_size(),
        arb_order(),
        arb_size(),
        arb_size(),
    )
        .prop_map(|(world, tp, pp, cp, ep, order, rank, hcp)| {
            let mut args: Vec<String> = [
                "layout", "--world", &world, "--tp", &tp, "--pp", &pp, "--cp", &cp, "--ep", &ep,
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            args.extend([
                "--order".to_owned(),
                order,
                "--rank".to_owned(),
                rank,
                "--hcp".to_owned(),
                hcp,
            ]);
            args
        });
    let grid = ("[^\\x00]{0,24}", arb_size(), "[^\\x00]{0,8}", any::<bool>()).prop_map(
        |(dims, offset, groups, json)| {
            let mut args = vec![
                "grid".to_owned(),
                "--dims".to_owned(),
                dims,
                "--offset".to_owned(),
                offset,
            ];
            args.extend(["--groups".to_owned(), groups]);
            if json {
                args.push("--json".to_owned());
            }
            args
        },
    );
    let plan = (arb_size(), arb_size(), "[^\\x00]{0,20}").prop_map(|(world, tp, traffic)| {
        [
            "plan",
            "--cluster",
            "/nonexistent/cluster.json",
            "--world",
            &world,
            "--tp",
            &tp,
            "--traffic",
            &traffic,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    });
    let refit = (
        "[a-z]{2}=",
        arb_size(),
        "[^\\x00]{0,12}",
        arb_size(),
        arb_size(),
        "[^\\x00]{0,12}",
    )
        .prop_map(|(key, size, to, layers, hidden, extra)| {
            [
                "plan".to_owned(),
                "--refit".to_owned(),
                "--from".to_owned(),
                format!("{key}{size}"),
                "--to".to_owned(),
                to,
                "--model".to_owned(),
                format!("gpt:layers={layers},hidden={hidden},vocab=64{extra}"),
            ]
            .to_vec()
        });
    prop_oneof![layout, grid, plan, refit]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn invalid_arguments_give_a_one_line_error_never_a_panic(args in arb_args()) {
        let start = Instant::now();
        let mut child = Command::new(env!("CARGO_BIN_EXE_hypercomm"))
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Bounded: every command here answers at once; a hang would be killed and reported.
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if start.elapsed() > Duration::from_secs(20) {
                child.kill().unwrap();
                panic!("hypercomm {args:?} did not finish within 20 s");
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let mut stderr = String::new();
        std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
        prop_assert!(!stderr.contains("panicked"), "{:?}: {}", args, stderr);
        match status.code() {
            Some(0) => {}
            Some(2) => {
                // clap's own usage errors print a usage block; ours are exactly one line.
                if stderr.starts_with("hypercomm: ") {
                    prop_assert_eq!(stderr.lines().count(), 1, "{:?}: {}", args, stderr);
                } else {
                    prop_assert!(stderr.starts_with("error:"), "{:?}: {}", args, stderr);
                }
            }
            other => prop_assert!(false, "{:?} exited with {:?}: {}", args, other, stderr),
        }
    }
}
