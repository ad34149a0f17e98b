//! What the CLI tests share: running the `hypercomm` binary built for them, reading what it printed or wrote, and
//! a scratch directory per test (`scratch`).

#![allow(dead_code)]

pub mod scratch;

use std::path::Path;
use std::process::{Command, Output};

/// Runs the `hypercomm` binary with `args` and returns what it did.
pub fn hypercomm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hypercomm"))
        .args(args)
        .output()
        .expect("the hypercomm binary runs")
}

/// Printed bytes as text.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// What `hypercomm args` printed as JSON, after requiring that it succeeded.
pub fn json_output(args: &[&str]) -> serde_json::Value {
    let out = hypercomm(args);
    assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("the output is JSON")
}

/// The JSON file at `path`.
pub fn json_file(path: &Path) -> serde_json::Value {
    let body =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}
