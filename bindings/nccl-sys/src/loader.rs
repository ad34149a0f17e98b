//! Finding and opening `libnccl.so` at run time, and the [`Nccl`] handle that owns the opened library.
//!
//! Search order ([`SearchConfig`]):
//!
//! 1. `$NCCL_LIBRARY`, a full path. When set it is the only candidate: a user who names a library must get that
//!    one or an error, never a different NCCL found further down.
//! 2. `libnccl.so.2`, then `libnccl.so`, through the dynamic linker (`LD_LIBRARY_PATH`, `ld.so.cache`, the
//!    default folders).
//! 3. `nvidia/nccl/lib/libnccl.so.2` under each Python `site-packages`/`dist-packages` folder, which is where
//!    `pip install nvidia-nccl-cu13` (or PyTorch's dependency on it) puts the library. The folders are found
//!    without running Python: `$PYTHONPATH`, `$VIRTUAL_ENV`, `$CONDA_PREFIX`, the user site under `$HOME/.local`,
//!    pyenv versions, then `/usr/local`, `/usr` and `/opt/conda`.
//! 4. As a last resort, the folders that `python3` itself reports (`site.getsitepackages()` and friends), asked
//!    with a timeout.
//!
//! The first candidate that opens and answers `ncclGetVersion` wins. When none does, [`LoadError`] lists every
//! candidate with the reason it was passed over.
//!
//! Environment variables are read only by [`SearchConfig::from_env`], through a lookup function the caller
//! passes, so tests build a [`SearchConfig`] by hand and never touch the process environment.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::config::ConfigField;
use crate::function::Function;
use crate::result::{NcclError, availability};
use crate::sys;
use crate::version::Version;

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

/// A candidate and why it was not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// Where the loader looked.
    pub candidate: Candidate,
    /// Why that did not give a usable library.
    pub reason: String,
}

/// No usable NCCL library was found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// Every candidate failed; each is listed with its reason.
    #[error(
        "no usable nccl library found; tried {}: {}; set NCCL_LIBRARY to the full path of libnccl.so.2 \
         or pip install nvidia-nccl-cu13",
        attempts.len(),
        list(attempts)
    )]
    NotFound {
        /// Every candidate, in search order.
        attempts: Vec<Attempt>,
    },
}

fn list(attempts: &[Attempt]) -> String {
    let parts: Vec<String> = attempts
        .iter()
        .map(|a| format!("{} ({})", a.candidate, a.reason))
        .collect();
    parts.join(", ")
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

/// An error and its sources, `"outer: inner"`: libloading's own message is only "dlopen failed", the reason
/// (`dlerror`) is its source.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    // Bounded: error chains are short; stop after 8 links in any case.
    for _ in 0..8 {
        let Some(inner) = source else { break };
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

/// Runs the probe's interpreter and returns the package folders it reports, killing it after the timeout.
fn ask_python(probe: &PythonProbe) -> Result<Vec<PathBuf>, String> {
    const SCRIPT: &str = "import site, sys\n\
        dirs = list(getattr(site, 'getsitepackages', lambda: [])())\n\
        dirs.append(site.getusersitepackages())\n\
        dirs.extend(p for p in sys.path if p)\n\
        print('\\n'.join(dirs))\n";
    let mut child = Command::new(&probe.interpreter)
        .args(["-c", SCRIPT])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("could not start it: {e}"))?;
    let deadline = Instant::now() + probe.timeout;
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

/// An opened NCCL library, its release, and where it came from.
///
/// Invariant: `version` is what this library's `ncclGetVersion` reported when it was opened. The library stays
/// loaded for the handle's lifetime; every function pointer in [`Nccl::api`]'s table is valid until it is dropped.
pub struct Nccl {
    lib: sys::NcclLib,
    version: Version,
    origin: Candidate,
}

impl fmt::Debug for Nccl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Nccl")
            .field("version", &self.version)
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

impl Nccl {
    /// Searches as `config` says and opens the first usable library.
    ///
    /// ```no_run
    /// use nccl_sys::{Nccl, SearchConfig};
    ///
    /// let nccl = Nccl::load(&SearchConfig::from_env(|name| std::env::var_os(name)))?;
    /// println!("nccl {} from {}", nccl.version(), nccl.origin());
    /// # Ok::<(), nccl_sys::LoadError>(())
    /// ```
    pub fn load(config: &SearchConfig) -> Result<Nccl, LoadError> {
        let mut attempts = Vec::new();
        for candidate in config.candidates() {
            match Self::try_candidate(candidate.clone()) {
                Ok(nccl) => return Ok(nccl),
                Err(reason) => attempts.push(Attempt { candidate, reason }),
            }
        }
        if config.library_override.is_none()
            && let Some(probe) = &config.python_probe
        {
            match ask_python(probe) {
                Err(reason) => attempts.push(Attempt {
                    candidate: Candidate::PythonProbe(probe.interpreter.clone()),
                    reason,
                }),
                Ok(dirs) => {
                    for dir in dirs
                        .into_iter()
                        .filter(|d| !config.python_site_dirs.contains(d))
                    {
                        let candidate = Candidate::PythonPackage(dir.join(PYTHON_PACKAGE_LIBRARY));
                        if !dir.join(PYTHON_PACKAGE_LIBRARY).exists() {
                            continue; // Python's own path list is long; only folders with NCCL are worth listing.
                        }
                        match Self::try_candidate(candidate.clone()) {
                            Ok(nccl) => return Ok(nccl),
                            Err(reason) => attempts.push(Attempt { candidate, reason }),
                        }
                    }
                }
            }
        }
        Err(LoadError::NotFound { attempts })
    }

    /// Opens the library at `path` (a full path, or a name for the dynamic linker) and nothing else.
    pub fn open(path: impl AsRef<OsStr>) -> Result<Nccl, LoadError> {
        let candidate = Candidate::Override(PathBuf::from(path.as_ref()));
        Self::try_candidate(candidate.clone()).map_err(|reason| LoadError::NotFound {
            attempts: vec![Attempt { candidate, reason }],
        })
    }

    fn try_candidate(candidate: Candidate) -> Result<Nccl, String> {
        let target: &OsStr = match &candidate {
            Candidate::Override(p) | Candidate::PythonPackage(p) => {
                if !p.exists() {
                    return Err("no such file".into());
                }
                p.as_os_str()
            }
            Candidate::Soname(name) => name,
            Candidate::PythonProbe(_) => return Err("not a library".into()),
        };
        // SAFETY: opening runs the library's initialisers; the search only opens files named like NCCL from the
        // places NCCL is installed, which the user controls as for any dynamically linked program. Each symbol is
        // given the type nccl.h declares for it, and NCCL keeps its C ABI stable across 2.x releases; symbols a
        // release lacks stay `Err` and are never called (see `Nccl::api`).
        let lib = unsafe { sys::NcclLib::new(target) }
            .map_err(|e| format!("cannot open: {}", chain(&e)))?;
        let get_version = *lib
            .ncclGetVersion
            .as_ref()
            .map_err(|e| format!("has no ncclGetVersion, so not usable: {}", chain(e)))?;
        let mut code: std::os::raw::c_int = 0;
        // SAFETY: ncclGetVersion writes one int through the pointer, which points to a live local.
        let raw = unsafe { get_version(&mut code) };
        if raw != sys::ncclSuccess {
            return Err(format!("ncclGetVersion returned {raw}"));
        }
        let version = Version::from_code(code).map_err(|e| e.to_string())?;
        Ok(Nccl {
            lib,
            version,
            origin: candidate,
        })
    }

    /// The loaded release, from `ncclGetVersion`.
    pub fn version(&self) -> Version {
        self.version
    }

    /// Where the library was found.
    pub fn origin(&self) -> &Candidate {
        &self.origin
    }

    /// Whether `function` can be called: the library exports it and its release is at least
    /// [`Function::introduced`].
    pub fn has(&self, function: Function) -> bool {
        self.require(function).is_ok()
    }

    /// `Ok` when `function` can be called, otherwise [`NcclError::Unavailable`] (library too old) or
    /// [`NcclError::NotExported`] (symbol missing).
    pub fn require(&self, function: Function) -> Result<(), NcclError> {
        let exported = if function.is_exported(&self.lib) {
            Ok(())
        } else {
            Err(format!("symbol {} not found", function.symbol()))
        };
        availability(function, self.version, exported)
    }

    /// Whether the loaded release honours `field` of `ncclConfig_t` (an older one silently ignores it).
    pub fn supports_config_field(&self, field: ConfigField) -> bool {
        self.version >= field.introduced()
    }

    /// The raw function table, after checking that `function` can be called.
    ///
    /// On `Ok`, calling the `NcclLib` method (or field) named after `function` will not panic: its symbol is
    /// present. Methods for other functions may panic if their symbol is missing, so require each one used.
    ///
    /// ```no_run
    /// # fn demo(nccl: &nccl_sys::Nccl, comm: nccl_sys::sys::ncclComm_t) -> Result<(), nccl_sys::NcclError> {
    /// use nccl_sys::Function;
    ///
    /// let mut count = 0;
    /// let api = nccl.api(Function::CommCount)?;
    /// // SAFETY (in real code): `comm` is a live communicator of this library.
    /// let raw = unsafe { api.ncclCommCount(comm, &mut count) };
    /// unsafe { nccl.check(Function::CommCount, raw, comm) }?;
    /// # Ok(()) }
    /// ```
    pub fn api(&self, function: Function) -> Result<&sys::NcclLib, NcclError> {
        self.require(function)?;
        Ok(&self.lib)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A scratch folder unique to this test process and name, removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Scratch {
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

    fn env_of(pairs: &[(&str, &Path)]) -> impl Fn(&str) -> Option<OsString> + use<> {
        let map: HashMap<String, OsString> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_os_str().to_owned()))
            .collect();
        move |name| map.get(name).cloned()
    }

    /// Names no system has, so the dynamic linker step fails the same way everywhere.
    fn missing_sonames() -> Vec<OsString> {
        vec![
            "libnccl-hypercomm-test-missing.so.2".into(),
            "libnccl-hypercomm-test-missing.so".into(),
        ]
    }

    #[test]
    fn bogus_override_is_the_only_candidate_and_is_named_in_the_error() {
        let config = SearchConfig {
            library_override: Some(PathBuf::from("/nonexistent/hypercomm/libnccl.so.2")),
            sonames: DEFAULT_SONAMES.iter().map(OsString::from).collect(),
            python_site_dirs: vec![PathBuf::from("/nonexistent/site-packages")],
            python_probe: Some(PythonProbe::default()),
        };
        let err = Nccl::load(&config).unwrap_err();
        let LoadError::NotFound { attempts } = &err;
        assert_eq!(attempts.len(), 1, "{err}");
        assert_eq!(
            attempts[0].candidate,
            Candidate::Override("/nonexistent/hypercomm/libnccl.so.2".into())
        );
        assert_eq!(attempts[0].reason, "no such file");
        let text = err.to_string();
        assert!(
            text.contains("$NCCL_LIBRARY=/nonexistent/hypercomm/libnccl.so.2 (no such file)"),
            "{text}"
        );
        assert!(text.contains("set NCCL_LIBRARY"), "{text}");
    }

    #[test]
    fn not_found_lists_every_candidate_in_order_with_reasons() {
        let scratch = Scratch::new("not-found");
        // One package folder holds a file that is not a shared library, one holds nothing.
        let fake = scratch.0.join("fake-site");
        std::fs::create_dir_all(fake.join("nvidia/nccl/lib")).unwrap();
        std::fs::write(fake.join(PYTHON_PACKAGE_LIBRARY), b"not an ELF file").unwrap();
        let empty = scratch.0.join("empty-site");
        std::fs::create_dir_all(&empty).unwrap();
        let config = SearchConfig {
            library_override: None,
            sonames: missing_sonames(),
            python_site_dirs: vec![fake.clone(), empty.clone()],
            python_probe: Some(PythonProbe {
                interpreter: "/nonexistent/hypercomm/python3".into(),
                timeout: Duration::from_secs(5),
            }),
        };
        let err = Nccl::load(&config).unwrap_err();
        let LoadError::NotFound { attempts } = &err;
        let candidates: Vec<&Candidate> = attempts.iter().map(|a| &a.candidate).collect();
        assert_eq!(
            candidates,
            [
                &Candidate::Soname("libnccl-hypercomm-test-missing.so.2".into()),
                &Candidate::Soname("libnccl-hypercomm-test-missing.so".into()),
                &Candidate::PythonPackage(fake.join(PYTHON_PACKAGE_LIBRARY)),
                &Candidate::PythonPackage(empty.join(PYTHON_PACKAGE_LIBRARY)),
                &Candidate::PythonProbe("/nonexistent/hypercomm/python3".into()),
            ]
        );
        assert!(
            attempts[0].reason.starts_with("cannot open"),
            "{}",
            attempts[0].reason
        );
        assert!(
            attempts[2].reason.starts_with("cannot open"),
            "{}",
            attempts[2].reason
        );
        assert_eq!(attempts[3].reason, "no such file");
        assert!(
            attempts[4].reason.starts_with("could not start it"),
            "{}",
            attempts[4].reason
        );
        let text = err.to_string();
        assert!(
            text.starts_with("no usable nccl library found; tried 5:"),
            "{text}"
        );
        assert!(
            text.contains(&fake.join(PYTHON_PACKAGE_LIBRARY).display().to_string()),
            "{text}"
        );
    }

    #[test]
    fn open_names_the_path_it_could_not_use() {
        let err = Nccl::open("/nonexistent/hypercomm/libnccl.so.2").unwrap_err();
        assert!(
            err.to_string()
                .contains("/nonexistent/hypercomm/libnccl.so.2 (no such file)"),
            "{err}"
        );
    }

    #[test]
    fn python_probe_that_hangs_is_killed_after_its_timeout() {
        let scratch = Scratch::new("slow-python");
        let script = scratch.0.join("slow-python");
        std::fs::write(&script, "#!/bin/sh\nexec sleep 30\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
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
        std::fs::write(
            &script,
            "#!/bin/sh\nprintf '/a/site-packages\\n\\n/b/dist-packages\\n'\n",
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
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
