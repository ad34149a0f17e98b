//! Records the commit the benchmarks are built from, for the provenance their JSON carries: the environment
//! variable `HYPERCOMM_BENCH_COMMIT` at compile time, left unset when the source is not a git checkout or git is
//! missing. Uncommitted changes are not recorded.

use std::path::Path;
use std::process::Command;

/// `git <args>`'s output, trimmed; `None` when git is missing, fails or says nothing.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

fn watch(path: &str) {
    println!("cargo:rerun-if-changed={path}");
}

fn main() {
    watch("build.rs");
    let Some(commit) = git(&["rev-parse", "HEAD"]) else {
        return;
    };
    println!("cargo:rustc-env=HYPERCOMM_BENCH_COMMIT={commit}");
    // Run again when HEAD moves: HEAD itself (a checkout) and the branch it names (a commit on it), whose ref is a
    // file of its own or, once packed, a line of packed-refs (a new commit writes the file again, in its folder).
    if let Some(head) = git(&["rev-parse", "--git-path", "HEAD"]) {
        watch(&head);
    }
    let Some(branch) = git(&["rev-parse", "--symbolic-full-name", "HEAD"]).filter(|b| b != "HEAD")
    else {
        return;
    };
    if let Some(file) = git(&["rev-parse", "--git-path", &branch]) {
        if Path::new(&file).exists() {
            watch(&file);
        } else if let Some(folder) = Path::new(&file).parent().and_then(Path::to_str) {
            watch(folder);
        }
    }
    if let Some(packed) =
        git(&["rev-parse", "--git-path", "packed-refs"]).filter(|p| Path::new(p).exists())
    {
        watch(&packed);
    }
}
