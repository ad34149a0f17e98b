//! Scratch directories for the CLI tests: one per test, named after the process and the test so that tests
//! running side by side never share one, and removed when the test ends, pass or fail.

use std::path::{Path, PathBuf};

/// A fresh, empty directory under the system temp directory; removed (with everything in it) on drop.
pub struct Scratch(PathBuf);

impl Scratch {
    /// Makes `<temp>/hypercomm-cli-<suite>-<pid>-<test>`, emptying what an earlier run with the same process id
    /// left there.
    pub fn new(suite: &str, test: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "hypercomm-cli-{suite}-{}-{test}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("the temp directory is writable");
        Scratch(dir)
    }
}

/// The directory's path, so that `dir.join(name)` and `&*dir` read as they would for a `Path`.
impl std::ops::Deref for Scratch {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
