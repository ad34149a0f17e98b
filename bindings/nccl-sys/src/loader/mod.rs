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

use std::ffi::OsStr;
use std::fmt;
use std::path::PathBuf;

use crate::config::ConfigField;
use crate::function::Function;
use crate::result::{NcclError, availability};
use crate::sys;
use crate::version::Version;

mod search;
mod texts;

use search::ask_python;
pub use search::{Candidate, DEFAULT_SONAMES, PYTHON_PACKAGE_LIBRARY, PythonProbe, SearchConfig};

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
        // The interpreter is asked last, and never when $NCCL_LIBRARY named the one library to use.
        let probe = config
            .python_probe
            .as_ref()
            .filter(|_| config.library_override.is_none());
        if let Some(probe) = probe {
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
    use super::search::testing::{Scratch, missing_sonames, write_script};
    use super::*;
    use std::ffi::OsString;
    use std::time::Duration;

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
    fn handle_can_be_shared_across_threads() {
        // The NCCL backend keeps one `Nccl` per process group behind an `Arc`; this must keep compiling.
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Nccl>();
        assert_send_sync::<LoadError>();
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
    fn folders_from_the_python_probe_are_tried_when_they_hold_a_library() {
        let scratch = Scratch::new("probe-load");
        let with_lib = scratch.0.join("probe-site");
        std::fs::create_dir_all(with_lib.join("nvidia/nccl/lib")).unwrap();
        std::fs::write(with_lib.join(PYTHON_PACKAGE_LIBRARY), b"not an ELF file").unwrap();
        let without_lib = scratch.0.join("other-site");
        let script = scratch.0.join("fake-python");
        let answer = format!("{}\n{}\n", without_lib.display(), with_lib.display());
        write_script(&script, &format!("printf '%s' '{answer}'"));
        let config = SearchConfig {
            library_override: None,
            sonames: missing_sonames(),
            python_site_dirs: Vec::new(),
            python_probe: Some(PythonProbe {
                interpreter: script.into_os_string(),
                timeout: Duration::from_secs(30),
            }),
        };
        let LoadError::NotFound { attempts } = Nccl::load(&config).unwrap_err();
        // The two sonames, then only the probe folder that holds a file; the empty one is not listed.
        assert_eq!(attempts.len(), 3, "{attempts:?}");
        assert_eq!(
            attempts[2].candidate,
            Candidate::PythonPackage(with_lib.join(PYTHON_PACKAGE_LIBRARY))
        );
        assert!(
            attempts[2].reason.starts_with("cannot open"),
            "{}",
            attempts[2].reason
        );
    }
}
