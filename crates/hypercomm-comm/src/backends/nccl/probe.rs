//! Finding out, without panicking, whether this machine can run device communicators.
//!
//! cudarc loads `libcuda` on first use and panics when it is missing (or when a symbol of its CUDA 13.0 bindings
//! is missing from an older driver). Every device entry point therefore goes through [`DeviceRuntime::probe`]
//! first, which asks in an order where each step only runs if the one before succeeded:
//!
//! 1. Is a `libcuda` library present? (cudarc's `is_culib_present`, which only tries to open it.)
//! 2. Which CUDA version does the driver support? (`cuDriverGetVersion`; below [`MIN_DRIVER_VERSION`] the
//!    bindings' symbols may be missing, so the probe stops there.)
//! 3. Does `cuInit` succeed, and how many devices are there? (Zero devices is unavailable too.)
//! 4. Does an NCCL library load? (`nccl_sys::Nccl::load`, which never panics.)
//!
//! Any "no" is [`CommError::Unavailable`] naming the step and why. The steps sit behind [`DriverProbe`] so tests
//! check the order, and that nothing past a failed step is called, with a fake driver.

use std::sync::Arc;

use nccl_sys::{Nccl, SearchConfig};

use crate::CommError;

/// The lowest driver API version (`cuDriverGetVersion`, 1000 * major + 10 * minor) the bindings are built for:
/// cudarc's `cuda-13000` feature.
pub const MIN_DRIVER_VERSION: i32 = 13000;

/// The questions the probe asks the CUDA driver, in order. The real implementation is cudarc's; tests fake it.
pub(crate) trait DriverProbe {
    /// Whether a driver library can be opened. Must not panic.
    fn library_present(&self) -> bool;
    /// `cuDriverGetVersion`. Called only when the library is present.
    fn driver_version(&self) -> Result<i32, String>;
    /// `cuInit(0)`. Called only when the version is new enough.
    fn init(&self) -> Result<(), String>;
    /// Number of devices. Called only after a successful init.
    fn device_count(&self) -> Result<usize, String>;
}

/// The CUDA driver through cudarc.
pub(crate) struct CudarcDriver;

/// Runs `f`, turning a panic inside cudarc (a symbol missing from an unexpected driver) into an error.
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|_| Err(format!("{what} panicked inside cudarc")))
}

impl DriverProbe for CudarcDriver {
    fn library_present(&self) -> bool {
        // Linked at build time (feature `cuda-linked`): the loader loaded libcuda before this process started.
        #[cfg(feature = "cuda-linked")]
        return true;
        #[cfg(not(feature = "cuda-linked"))]
        guarded("opening libcuda", || {
            // SAFETY: only tries to dlopen the driver library under its usual names and closes it again; it runs
            // the library's initialisers like any CUDA program does, and calls nothing in it.
            Ok(unsafe { cudarc::driver::sys::is_culib_present() })
        })
        .unwrap_or(false)
    }

    fn driver_version(&self) -> Result<i32, String> {
        guarded("cuDriverGetVersion", || {
            let mut version = 0;
            // SAFETY: the library is present (checked first by `probe_driver`); cuDriverGetVersion exists in every
            // driver and writes one int through a pointer to a live local.
            let code = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut version) };
            if code == cudarc::driver::sys::CUresult::CUDA_SUCCESS {
                Ok(version)
            } else {
                Err(format!("cuDriverGetVersion returned {code:?}"))
            }
        })
    }

    fn init(&self) -> Result<(), String> {
        guarded("cuInit", || {
            cudarc::driver::result::init().map_err(|e| format!("cuInit failed: {e}"))
        })
    }

    fn device_count(&self) -> Result<usize, String> {
        guarded("cuDeviceGetCount", || {
            let n = cudarc::driver::CudaContext::device_count()
                .map_err(|e| format!("cuDeviceGetCount failed: {e}"))?;
            usize::try_from(n).map_err(|_| format!("cuDeviceGetCount reported {n} devices"))
        })
    }
}

/// What the driver probe found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverInfo {
    /// `cuDriverGetVersion`: 1000 * major + 10 * minor (13000 is CUDA 13.0).
    pub version: i32,
    /// Devices visible to this process.
    pub devices: usize,
}

fn unavailable(what: &str, why: String) -> CommError {
    CommError::Unavailable {
        what: what.to_owned(),
        why,
    }
}

/// Asks `driver` the probe's questions in order, stopping at the first "no".
pub(crate) fn probe_driver(driver: &dyn DriverProbe) -> Result<DriverInfo, CommError> {
    if !driver.library_present() {
        return Err(unavailable(
            "cuda driver",
            "no libcuda library could be opened (no NVIDIA driver on this machine, or it is not on the loader \
             path)"
                .into(),
        ));
    }
    let version = driver
        .driver_version()
        .map_err(|why| unavailable("cuda driver", why))?;
    if version < MIN_DRIVER_VERSION {
        return Err(unavailable(
            "cuda driver",
            format!(
                "the driver supports cuda {}.{}, but hypercomm's bindings need {}.{} or newer",
                version / 1000,
                (version % 1000) / 10,
                MIN_DRIVER_VERSION / 1000,
                (MIN_DRIVER_VERSION % 1000) / 10
            ),
        ));
    }
    driver
        .init()
        .map_err(|why| unavailable("cuda driver", why))?;
    let devices = driver
        .device_count()
        .map_err(|why| unavailable("cuda device", why))?;
    if devices == 0 {
        return Err(unavailable(
            "cuda device",
            "the driver loaded but reports 0 devices (check CUDA_VISIBLE_DEVICES)".into(),
        ));
    }
    Ok(DriverInfo { version, devices })
}

/// Whether NVRTC (needed only for the strided-view and fill/verify kernels) can be opened. Never panics.
pub(crate) fn nvrtc_present() -> bool {
    // Linked at build time (feature `cuda-linked`): present, or this process would not have started.
    #[cfg(feature = "cuda-linked")]
    return true;
    #[cfg(not(feature = "cuda-linked"))]
    guarded("opening libnvrtc", || {
        // SAFETY: only tries to dlopen libnvrtc under its usual names; nothing in it is called.
        Ok(unsafe { cudarc::nvrtc::sys::is_culib_present() })
    })
    .unwrap_or(false)
}

/// A machine that can run device communicators: a CUDA driver with at least one device, and a loaded NCCL.
///
/// Made once by [`DeviceRuntime::probe`] and passed to everything that touches a GPU, so the checks run once and
/// nothing reaches cudarc on a machine where it would panic.
#[derive(Debug)]
pub struct DeviceRuntime {
    nccl: Nccl,
    driver: DriverInfo,
    /// Where flight records go when a communicator's options name no folder (`HYPERCOMM_FLIGHT_RECORDER_DIR`,
    /// read by [`probe_with_env`](Self::probe_with_env)).
    flight_recorder_dir: Option<std::path::PathBuf>,
}

impl DeviceRuntime {
    /// Probes the driver (see the module docs for the steps) and loads NCCL as `search` says.
    ///
    /// ```
    /// use hypercomm_comm::device::DeviceRuntime;
    /// use nccl_sys::SearchConfig;
    ///
    /// match DeviceRuntime::probe(&SearchConfig::from_env(|name| std::env::var_os(name))) {
    ///     Ok(rt) => println!("{} device(s), nccl {}", rt.device_count(), rt.nccl().version()),
    ///     Err(e) => println!("host only: {e}"), // e.g. "cuda driver is unavailable: no libcuda ..."
    /// }
    /// ```
    pub fn probe(search: &SearchConfig) -> Result<Arc<DeviceRuntime>, CommError> {
        Self::probe_for(search, None)
    }

    fn probe_for(
        search: &SearchConfig,
        flight_recorder_dir: Option<std::path::PathBuf>,
    ) -> Result<Arc<DeviceRuntime>, CommError> {
        let driver = probe_driver(&CudarcDriver)?;
        let nccl = Nccl::load(search).map_err(|e| unavailable("nccl", e.to_string()))?;
        Ok(Arc::new(DeviceRuntime {
            nccl,
            driver,
            flight_recorder_dir,
        }))
    }

    /// [`probe`](Self::probe) with NCCL's search described by environment variables read through `lookup`
    /// (`NCCL_LIBRARY`, the Python folders; see `nccl_sys::loader`), and the folder for flight records from
    /// [`FLIGHT_RECORDER_DIR_ENV`](crate::device::FLIGHT_RECORDER_DIR_ENV) (`HYPERCOMM_FLIGHT_RECORDER_DIR`).
    pub fn probe_with_env(
        lookup: impl Fn(&str) -> Option<std::ffi::OsString>,
    ) -> Result<Arc<DeviceRuntime>, CommError> {
        let dir = lookup(super::flight::FLIGHT_RECORDER_DIR_ENV)
            .filter(|d| !d.is_empty())
            .map(std::path::PathBuf::from);
        Self::probe_for(&SearchConfig::from_env(lookup), dir)
    }

    /// The folder flight records go to when a communicator's options name none.
    pub fn flight_recorder_dir(&self) -> Option<&std::path::Path> {
        self.flight_recorder_dir.as_deref()
    }

    /// The loaded NCCL.
    pub fn nccl(&self) -> &Nccl {
        &self.nccl
    }

    /// The driver's version and device count.
    pub fn driver(&self) -> DriverInfo {
        self.driver
    }

    /// Devices visible to this process.
    pub fn device_count(&self) -> usize {
        self.driver.devices
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// A driver whose answers are set by the test; it records which questions were asked.
    struct FakeDriver {
        present: bool,
        version: Result<i32, String>,
        init: Result<(), String>,
        devices: Result<usize, String>,
        asked: RefCell<Vec<&'static str>>,
    }

    impl FakeDriver {
        fn working() -> Self {
            FakeDriver {
                present: true,
                version: Ok(13000),
                init: Ok(()),
                devices: Ok(2),
                asked: RefCell::new(Vec::new()),
            }
        }
    }

    impl DriverProbe for FakeDriver {
        fn library_present(&self) -> bool {
            self.asked.borrow_mut().push("present");
            self.present
        }
        fn driver_version(&self) -> Result<i32, String> {
            self.asked.borrow_mut().push("version");
            self.version.clone()
        }
        fn init(&self) -> Result<(), String> {
            self.asked.borrow_mut().push("init");
            self.init.clone()
        }
        fn device_count(&self) -> Result<usize, String> {
            self.asked.borrow_mut().push("count");
            self.devices.clone()
        }
    }

    fn unavailable_parts(e: CommError) -> (String, String) {
        match e {
            CommError::Unavailable { what, why } => (what, why),
            other => panic!("expected Unavailable, got {other:?}"),
        }
    }

    #[test]
    fn a_working_driver_is_asked_everything_in_order() {
        let d = FakeDriver::working();
        assert_eq!(
            probe_driver(&d).unwrap(),
            DriverInfo {
                version: 13000,
                devices: 2
            }
        );
        assert_eq!(*d.asked.borrow(), ["present", "version", "init", "count"]);
    }

    #[test]
    fn no_library_stops_before_any_driver_call() {
        let d = FakeDriver {
            present: false,
            ..FakeDriver::working()
        };
        let (what, why) = unavailable_parts(probe_driver(&d).unwrap_err());
        assert_eq!(what, "cuda driver");
        assert!(why.contains("no libcuda"), "{why}");
        assert_eq!(*d.asked.borrow(), ["present"]);
    }

    #[test]
    fn an_old_driver_stops_before_init_and_names_both_versions() {
        let d = FakeDriver {
            version: Ok(12040),
            ..FakeDriver::working()
        };
        let (_, why) = unavailable_parts(probe_driver(&d).unwrap_err());
        assert!(why.contains("supports cuda 12.4"), "{why}");
        assert!(why.contains("need 13.0"), "{why}");
        assert_eq!(*d.asked.borrow(), ["present", "version"]);
    }

    #[test]
    fn init_failure_and_zero_devices_are_unavailable() {
        let d = FakeDriver {
            init: Err("cuInit failed: CUDA_ERROR_NO_DEVICE".into()),
            ..FakeDriver::working()
        };
        let (_, why) = unavailable_parts(probe_driver(&d).unwrap_err());
        assert!(why.contains("CUDA_ERROR_NO_DEVICE"), "{why}");
        assert_eq!(*d.asked.borrow(), ["present", "version", "init"]);

        let d = FakeDriver {
            devices: Ok(0),
            ..FakeDriver::working()
        };
        let (what, why) = unavailable_parts(probe_driver(&d).unwrap_err());
        assert_eq!(what, "cuda device");
        assert!(why.contains("0 devices"), "{why}");
    }

    #[test]
    fn the_real_probe_never_panics() {
        // On a machine without a GPU this is Unavailable; with one, it succeeds. Either way, no panic.
        match probe_driver(&CudarcDriver) {
            Ok(info) => assert!(info.devices > 0 && info.version >= MIN_DRIVER_VERSION),
            Err(e) => {
                let (what, _) = unavailable_parts(e);
                assert!(what.starts_with("cuda"), "{what}");
            }
        }
        let _ = nvrtc_present();
    }
}
