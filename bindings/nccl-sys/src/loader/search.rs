//! Where to look for NCCL: the ordered candidates of the search, and the Python package folders among them.
//!
//! Everything here only lists places; [`Nccl::load`](super::Nccl::load) opens them. Environment variables are
//! read only by [`SearchConfig::from_env`], through the lookup function it is given.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The file a Python NCCL wheel installs, relative to its `site-packages` folder.
pub const PYTHON_PACKAGE_LIBRARY: &str = "nvidia/nccl/lib/libnccl.so.2";

/// The library names tried through the dynamic linker, in order.
pub const DEFAULT_SONAMES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];

/// Where to look for NCCL. Build one with [`SearchConfig::from_env`] or by hand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchConfig {
    /// `$NCCL_LIBRARY`: when set, the only candidate.
    pub library_override: Option<PathBuf>,
    /// Names handed to the dynamic linker, in order ([`DEFAULT_SONAMES`]).
    pub sonames: Vec<OsString>,
    /// Python package folders, searched in order for [`PYTHON_PACKAGE_LIBRARY`].
    pub python_site_dirs: Vec<PathBuf>,
    /// Whether and how to ask a Python interpreter for more package folders when all else fails.
    pub python_probe: Option<PythonProbe>,
}

/// Asking a Python interpreter where its packages live (the last resort of the search).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PythonProbe {
    /// The interpreter, `python3` by default.
    pub interpreter: OsString,
    /// How long to wait for it before killing it.
    pub timeout: Duration,
}

impl Default for PythonProbe {
    fn default() -> Self {
        PythonProbe {
            interpreter: "python3".into(),
            timeout: Duration::from_secs(5),
        }
    }
}

/// One place the loader tried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Candidate {
    /// The path from `$NCCL_LIBRARY`.
    Override(PathBuf),
    /// A name resolved by the dynamic linker.
    Soname(OsString),
    /// The library inside a Python package folder.
    PythonPackage(PathBuf),
    /// The Python interpreter asked for package folders (only reported when asking failed).
    PythonProbe(OsString),
}

impl fmt::Display for Candidate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Candidate::Override(p) => write!(f, "$NCCL_LIBRARY={}", p.display()),
            Candidate::Soname(name) => {
                write!(f, "{} (dynamic linker search path)", name.to_string_lossy())
            }
            Candidate::PythonPackage(p) => write!(f, "{}", p.display()),
            Candidate::PythonProbe(python) => write!(
                f,
                "asking {} for its package folders",
                python.to_string_lossy()
            ),
        }
    }
}

impl SearchConfig {
    /// The standard search, reading `NCCL_LIBRARY`, `PYTHONPATH`, `VIRTUAL_ENV`, `CONDA_PREFIX`, `HOME` and
    /// `PYENV_ROOT` through `env` (pass `|name| std::env::var_os(name)` for the process environment).
    /// Python folders are listed only when they exist.
    pub fn from_env(env: impl Fn(&str) -> Option<OsString>) -> SearchConfig {
        let system_prefixes = [
            PathBuf::from("/usr/local"),
            PathBuf::from("/usr"),
            PathBuf::from("/opt/conda"),
        ];
        SearchConfig {
            library_override: env("NCCL_LIBRARY")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            sonames: DEFAULT_SONAMES.iter().map(OsString::from).collect(),
            python_site_dirs: python_site_dirs(&env, &system_prefixes),
            python_probe: Some(PythonProbe::default()),
        }
    }

    /// The candidates that do not need a Python interpreter, in search order.
    pub fn candidates(&self) -> Vec<Candidate> {
        if let Some(path) = &self.library_override {
            return vec![Candidate::Override(path.clone())];
        }
        let sonames = self.sonames.iter().cloned().map(Candidate::Soname);
        let packages = self
            .python_site_dirs
            .iter()
            .map(|d| Candidate::PythonPackage(d.join(PYTHON_PACKAGE_LIBRARY)));
        sonames.chain(packages).collect()
    }
}

/// Python package folders named by the environment and present on disk, most specific first, without
/// duplicates. `system_prefixes` are the installation prefixes searched after the environment's.
fn python_site_dirs(
    env: &dyn Fn(&str) -> Option<OsString>,
    system_prefixes: &[PathBuf],
) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(pythonpath) = env("PYTHONPATH") {
        dirs.extend(std::env::split_paths(&pythonpath).filter(|p| !p.as_os_str().is_empty()));
    }
    let mut prefixes: Vec<PathBuf> = Vec::new();
    prefixes.extend(env("VIRTUAL_ENV").map(PathBuf::from));
    prefixes.extend(env("CONDA_PREFIX").map(PathBuf::from));
    let home = env("HOME").map(PathBuf::from);
    prefixes.extend(home.as_ref().map(|h| h.join(".local")));
    let pyenv_root = env("PYENV_ROOT")
        .map(PathBuf::from)
        .or_else(|| home.as_ref().map(|h| h.join(".pyenv")));
    if let Some(root) = pyenv_root {
        prefixes.extend(sorted_children(&root.join("versions")));
    }
    prefixes.extend(system_prefixes.iter().cloned());
    for prefix in &prefixes {
        dirs.extend(prefix_site_dirs(prefix));
    }
    let mut seen = std::collections::HashSet::new();
    dirs.retain(|d| d.is_dir() && seen.insert(d.clone()));
    dirs
}

/// `PREFIX/lib*/python3*/{site,dist}-packages` and `PREFIX/lib/python3/dist-packages` (Debian's layout).
fn prefix_site_dirs(prefix: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for lib in ["lib", "lib64"] {
        for python in sorted_children(&prefix.join(lib)) {
            let is_python3 = python
                .file_name()
                .and_then(OsStr::to_str)
                .is_some_and(|n| n.starts_with("python3"));
            if is_python3 {
                dirs.push(python.join("site-packages"));
                dirs.push(python.join("dist-packages"));
            }
        }
    }
    dirs
}

/// The entries of `dir`, sorted by name (newest Python last is fine: all are searched), at most 256.
fn sorted_children(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut children: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .take(256)
        .collect();
    children.sort();
    children
}

/// Runs the probe's interpreter and returns the package folders it reports, killing it after the timeout.
pub(super) fn ask_python(probe: &PythonProbe) -> Result<Vec<PathBuf>, String> {
    const SCRIPT: &str = "import site, sys\n\
        dirs = list(getattr(site, 'getsitepackages', lambda: [])())\n\
        dirs.append(site.getusersitepackages())\n\
        dirs.extend(p for p in sys.path if p)\n\
        print('\\n'.join(dirs))\n";
    let deadline = Instant::now() + probe.timeout;
    let spawn = || {
        Command::new(&probe.interpreter)
            .args(["-c", SCRIPT])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
    };
    // ETXTBSY: the interpreter file was just written and another thread's fork still holds a copy of that
    // write descriptor until its exec; that clears within moments. Retried until the deadline, then reported.
    const TEXT_FILE_BUSY: i32 = 26;
    let mut child = loop {
        match spawn() {
            Err(e) if e.raw_os_error() == Some(TEXT_FILE_BUSY) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5))
            }
            other => break other.map_err(|e| format!("could not start it: {e}"))?,
        }
    };
    // Bounded: one poll every 10 ms until the deadline, then the child is killed.
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("no answer within {:?}", probe.timeout));
            }
            Err(e) => return Err(format!("could not wait for it: {e}")),
        }
    };
    if !status.success() {
        return Err(format!("it exited with {status}"));
    }
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        stdout
            .read_to_string(&mut out)
            .map_err(|e| format!("could not read its answer: {e}"))?;
    }
    Ok(out
        .lines()
        .filter(|l| !l.is_empty())
        .map(PathBuf::from)
        .collect())
}

/// Helpers shared by the loader's tests.
#[cfg(test)]
pub(super) mod testing {
    use std::ffi::OsString;
    use std::path::PathBuf;

    /// A scratch folder unique to this test process and name, removed on drop.
    pub struct Scratch(pub PathBuf);

    impl Scratch {
        pub fn new(name: &str) -> Scratch {
            let dir = std::env::temp_dir().join(format!("nccl-sys-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Scratch(dir)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Writes an executable shell script `body` at `path` (a stand-in Python interpreter).
    pub fn write_script(path: &std::path::Path, body: &str) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// Names no system has, so the dynamic linker step fails the same way everywhere.
    pub fn missing_sonames() -> Vec<OsString> {
        vec![
            "libnccl-hypercomm-test-missing.so.2".into(),
            "libnccl-hypercomm-test-missing.so".into(),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{Scratch, write_script};
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &Path)]) -> impl Fn(&str) -> Option<OsString> + use<> {
        let map: HashMap<String, OsString> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_os_str().to_owned()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn python_probe_that_hangs_is_killed_after_its_timeout() {
        let scratch = Scratch::new("slow-python");
        let script = scratch.0.join("slow-python");
        write_script(&script, "exec sleep 30");
        let probe = PythonProbe {
            interpreter: script.into_os_string(),
            timeout: Duration::from_millis(200),
        };
        let started = Instant::now();
        let err = ask_python(&probe).unwrap_err();
        assert!(err.starts_with("no answer within"), "{err}");
        // Generous bound: the point is that it does not wait the full 30 s of the script.
        assert!(started.elapsed() < Duration::from_secs(20));
    }

    #[test]
    fn python_probe_reads_the_folders_printed() {
        let scratch = Scratch::new("echo-python");
        let script = scratch.0.join("echo-python");
        // Ignores its arguments and prints two folders, as python3 -c would.
        write_script(
            &script,
            "printf '/a/site-packages\\n\\n/b/dist-packages\\n'",
        );
        let probe = PythonProbe {
            interpreter: script.into_os_string(),
            timeout: Duration::from_secs(30),
        };
        assert_eq!(
            ask_python(&probe).unwrap(),
            vec![
                PathBuf::from("/a/site-packages"),
                PathBuf::from("/b/dist-packages")
            ]
        );
    }

    #[test]
    fn site_dirs_come_from_the_environment_in_order_and_only_when_present() {
        let scratch = Scratch::new("site-dirs");
        let root = &scratch.0;
        let extra = root.join("pythonpath-dir");
        let venv = root.join("venv");
        let home = root.join("home");
        let system = root.join("usr");
        for dir in [
            extra.clone(),
            venv.join("lib/python3.12/site-packages"),
            home.join(".local/lib/python3.11/site-packages"),
            home.join(".pyenv/versions/3.11.7/lib/python3.11/site-packages"),
            system.join("lib/python3/dist-packages"),
            system.join("lib/python2.7/site-packages"),
        ] {
            std::fs::create_dir_all(dir).unwrap();
        }
        let missing = root.join("missing");
        let pythonpath = std::env::join_paths([&extra, &missing]).unwrap();
        let env = env_of(&[
            ("PYTHONPATH", Path::new(&pythonpath)),
            ("VIRTUAL_ENV", &venv),
            ("HOME", &home),
            ("CONDA_PREFIX", &missing),
        ]);
        let dirs = python_site_dirs(&env, std::slice::from_ref(&system));
        assert_eq!(
            dirs,
            vec![
                extra,
                venv.join("lib/python3.12/site-packages"),
                home.join(".local/lib/python3.11/site-packages"),
                home.join(".pyenv/versions/3.11.7/lib/python3.11/site-packages"),
                system.join("lib/python3/dist-packages"),
            ]
        );
    }

    #[test]
    fn from_env_reads_the_override_and_ignores_an_empty_one() {
        let with = SearchConfig::from_env(env_of(&[(
            "NCCL_LIBRARY",
            Path::new("/opt/nccl/libnccl.so.2"),
        )]));
        assert_eq!(
            with.library_override,
            Some(PathBuf::from("/opt/nccl/libnccl.so.2"))
        );
        assert_eq!(
            with.candidates(),
            vec![Candidate::Override("/opt/nccl/libnccl.so.2".into())]
        );
        let empty = SearchConfig::from_env(env_of(&[("NCCL_LIBRARY", Path::new(""))]));
        assert_eq!(empty.library_override, None);
        let names: Vec<Candidate> = empty.candidates().into_iter().take(2).collect();
        assert_eq!(
            names,
            vec![
                Candidate::Soname("libnccl.so.2".into()),
                Candidate::Soname("libnccl.so".into())
            ]
        );
    }
}
