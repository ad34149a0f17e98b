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

/// The `hypercomm` binary under fake-gpu, the stand-in CUDA driver and NCCL that cargo builds beside the test
/// binary (a dev-dependency), with `devices` fake devices: `libcuda.so` linked into `dir`, which goes first on
/// the loader path, and the fake's exchange files in `dir/exchange`. The caller adds the arguments.
pub fn hypercomm_on_fake_gpu(dir: &Path, devices: usize) -> Command {
    let lib = std::env::current_exe()
        .expect("the test binary's path")
        .parent()
        .expect("test binaries live in target/<profile>/deps")
        .join("libfake_gpu.so");
    assert!(lib.exists(), "{} is missing", lib.display());
    std::fs::create_dir_all(dir.join("exchange")).expect("the scratch directory is writable");
    // A second command in the same directory finds the link made by the first.
    let link = dir.join("libcuda.so");
    if !link.exists() {
        std::os::unix::fs::symlink(&lib, &link).expect("the scratch directory is writable");
    }
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hypercomm"));
    cmd.env("LD_LIBRARY_PATH", dir)
        .env("NCCL_LIBRARY", &lib)
        .env("FAKE_GPU_DEVICES", devices.to_string())
        .env("FAKE_NCCL_DIR", dir.join("exchange"));
    cmd
}
