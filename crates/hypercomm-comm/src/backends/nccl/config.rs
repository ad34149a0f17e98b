//! [`CommOptions`] to `ncclConfig_t` and stream properties, for a given NCCL release: a pure function.
//!
//! Every NCCL knob of [`CommOptions`] maps to one `ncclConfig_t` field or to a property of the communicator's
//! stream:
//!
//! | option | goes to | first release |
//! |---|---|---|
//! | `blocking` | `blocking` (unset: 0, non-blocking, polled by the backend) | 2.14 |
//! | `cga_cluster_size` | `cgaClusterSize` (0..=8) | 2.17 |
//! | `min_ctas`, `max_ctas` | `minCTAs`, `maxCTAs` (1..=64, min <= max; see below) | 2.17 |
//! | `net_name` | `netName` | 2.17 |
//! | `split_share` | `splitShare` | 2.18 |
//! | `traffic_class` | `trafficClass` | 2.25 |
//! | `name` | `commName` | 2.27 (see below) |
//! | `high_priority_stream` | the stream's priority (the context's greatest), not the config | any |
//!
//! A knob the loaded release does not honour is [`CommError::OptionNeedsNewerLibrary`], because NCCL resets
//! config fields newer than itself without a word. Host-only options (`force_tcp`, `algorithm`, `scratch_bytes`,
//! `symmetric_bytes`) are [`CommError::UnsupportedOption`]. Two defaults are not knobs and degrade instead of failing: before 2.14
//! (no configs) the communicator is blocking, and before 2.27 the name is only hypercomm's (in its errors and
//! store keys), not NCCL's; `name` is mandatory in `CommOptions`, so refusing it would refuse every old NCCL.
//!
//! **One CTA bound.** NCCL's config check (`parseCommConfig`, 2.17 through 2.30) compares `minCTAs > maxCTAs`
//! even when one of them is unset (`NCCL_CONFIG_UNDEF_INT`, `INT_MIN`), so a config with only `minCTAs` is always
//! refused as an invalid argument. When only one bound is given, hypercomm fills the other with NCCL's own
//! default (`minCTAs` 1, `maxCTAs` [`MAX_CTAS`]), which is what NCCL would have used. Bounds above [`MAX_CTAS`]
//! are refused: NCCL would cap them without a word.

use std::ffi::CString;
use std::os::raw::c_int;

use nccl_sys::Version;
use nccl_sys::config::{ConfigField, config_initializer};
use nccl_sys::sys::ncclConfig_t;

use crate::CommError;
use crate::options::{Algorithm, CommOptions};

/// `NCCL_MAX_CGA_CLUSTER_SIZE`: NCCL clamps larger cluster sizes; hypercomm refuses them instead.
pub(crate) const MAX_CGA_CLUSTER_SIZE: u32 = 8;

/// `MAXCHANNELS`: NCCL's default `maxCTAs`, and the most channels (CTAs) a collective can use. NCCL caps larger
/// bounds; hypercomm refuses them instead.
pub(crate) const MAX_CTAS: u32 = 64;

/// NCCL's default `minCTAs`.
const DEFAULT_MIN_CTAS: c_int = 1;

/// Which priority the communicator's stream gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamPriority {
    /// The context's default priority.
    Default,
    /// The context's greatest priority (`cuCtxGetStreamPriorityRange`'s greatest, a negative number).
    Highest,
}

/// The translated options: what to put in `ncclConfig_t` and how to make the stream. Owns the C strings that
/// [`NcclSettings::raw`] points into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NcclSettings {
    /// `blocking`, when the library has configs; `None` before 2.14.
    pub blocking: Option<bool>,
    pub cga_cluster_size: Option<c_int>,
    pub min_ctas: Option<c_int>,
    pub max_ctas: Option<c_int>,
    pub net_name: Option<CString>,
    pub split_share: Option<c_int>,
    pub traffic_class: Option<c_int>,
    pub comm_name: Option<CString>,
    pub stream_priority: StreamPriority,
}

impl NcclSettings {
    /// Whether any config field is set; when none is (NCCL before 2.14), plain `ncclCommInitRank` is enough.
    pub(crate) fn uses_config(&self) -> bool {
        self.blocking.is_some()
    }

    /// The `ncclConfig_t` to pass. Its `netName` and `commName` point into `self`: keep `self` alive and
    /// unmoved-from until NCCL has returned from the call that takes the config (NCCL copies the strings).
    pub(crate) fn raw(&self) -> ncclConfig_t {
        let mut c = config_initializer();
        let int = |v: Option<c_int>, default: c_int| v.unwrap_or(default);
        if let Some(b) = self.blocking {
            c.blocking = c_int::from(b);
        }
        c.cgaClusterSize = int(self.cga_cluster_size, c.cgaClusterSize);
        c.minCTAs = int(self.min_ctas, c.minCTAs);
        c.maxCTAs = int(self.max_ctas, c.maxCTAs);
        c.splitShare = int(self.split_share, c.splitShare);
        c.trafficClass = int(self.traffic_class, c.trafficClass);
        if let Some(n) = &self.net_name {
            c.netName = n.as_ptr();
        }
        if let Some(n) = &self.comm_name {
            c.commName = n.as_ptr();
        }
        c
    }

    /// Whether the communicator is non-blocking (its calls may return `ncclInProgress` and must be polled).
    pub(crate) fn non_blocking(&self) -> bool {
        self.blocking == Some(false)
    }
}

fn needs(option: &'static str, field: ConfigField, loaded: Version) -> Result<(), CommError> {
    if loaded >= field.introduced() {
        Ok(())
    } else {
        Err(CommError::OptionNeedsNewerLibrary {
            option,
            library: "nccl",
            needs: field.introduced().to_string(),
            loaded: loaded.to_string(),
        })
    }
}

/// Translates `options` for NCCL release `loaded`. Pure: no library is touched.
pub(crate) fn translate(options: &CommOptions, loaded: Version) -> Result<NcclSettings, CommError> {
    let unsupported = |option| CommError::UnsupportedOption {
        backend: "nccl",
        option,
    };
    if options.force_tcp {
        return Err(unsupported("force_tcp"));
    }
    if options.algorithm != Algorithm::Auto {
        return Err(unsupported("algorithm"));
    }
    if options.scratch_bytes.is_some() {
        return Err(unsupported("scratch_bytes"));
    }
    if options.symmetric_bytes != 0 {
        return Err(unsupported("symmetric_bytes"));
    }
    let invalid = |what: String| CommError::InvalidArgument {
        comm: options.name.clone(),
        what,
    };
    let to_int = |option: &str, v: u32| {
        c_int::try_from(v).map_err(|_| invalid(format!("{option}={v} does not fit a C int")))
    };

    let configs = loaded >= ConfigField::Blocking.introduced();
    let blocking = match options.nccl.blocking {
        Some(b) => {
            needs("blocking", ConfigField::Blocking, loaded)?;
            Some(b)
        }
        None => configs.then_some(false),
    };
    let cga_cluster_size = match options.nccl.cga_cluster_size {
        Some(v) => {
            needs("cga_cluster_size", ConfigField::CgaClusterSize, loaded)?;
            if v > MAX_CGA_CLUSTER_SIZE {
                return Err(invalid(format!(
                    "cga_cluster_size={v} exceeds nccl's maximum of {MAX_CGA_CLUSTER_SIZE}"
                )));
            }
            Some(to_int("cga_cluster_size", v)?)
        }
        None => None,
    };
    let ctas = |option, field, value: Option<u32>| -> Result<Option<c_int>, CommError> {
        let Some(v) = value else { return Ok(None) };
        needs(option, field, loaded)?;
        if v == 0 {
            return Err(invalid(format!("{option}=0 must be at least 1")));
        }
        if v > MAX_CTAS {
            return Err(invalid(format!(
                "{option}={v} exceeds nccl's maximum of {MAX_CTAS} channels"
            )));
        }
        to_int(option, v).map(Some)
    };
    let min_ctas = ctas("min_ctas", ConfigField::MinCtas, options.nccl.min_ctas)?;
    let max_ctas = ctas("max_ctas", ConfigField::MaxCtas, options.nccl.max_ctas)?;
    // NCCL refuses a config with one bound set and the other unset (see the module doc): fill in its default.
    let (min_ctas, max_ctas) = match (min_ctas, max_ctas) {
        (Some(lo), None) => (Some(lo), Some(MAX_CTAS as c_int)),
        (None, Some(hi)) => (Some(DEFAULT_MIN_CTAS.min(hi)), Some(hi)),
        both => both,
    };
    if let (Some(lo), Some(hi)) = (min_ctas, max_ctas)
        && lo > hi
    {
        return Err(invalid(format!(
            "min_ctas={lo} exceeds max_ctas={hi}; min_ctas must not exceed max_ctas"
        )));
    }
    let net_name = match &options.nccl.net_name {
        Some(n) => {
            needs("net_name", ConfigField::NetName, loaded)?;
            Some(CString::new(n.as_str()).map_err(|_| {
                invalid(format!(
                    "net_name={n:?} contains a NUL byte, which C strings cannot hold"
                ))
            })?)
        }
        None => None,
    };
    let split_share = match options.nccl.split_share {
        Some(b) => {
            needs("split_share", ConfigField::SplitShare, loaded)?;
            Some(c_int::from(b))
        }
        None => None,
    };
    let traffic_class = match options.nccl.traffic_class {
        Some(v) => {
            needs("traffic_class", ConfigField::TrafficClass, loaded)?;
            Some(to_int("traffic_class", v)?)
        }
        None => None,
    };
    let comm_name = if loaded >= ConfigField::CommName.introduced() {
        Some(CString::new(options.name.as_str()).map_err(|_| {
            invalid(format!(
                "name={:?} contains a NUL byte, which C strings cannot hold",
                options.name
            ))
        })?)
    } else {
        None
    };
    let stream_priority = match options.nccl.high_priority_stream {
        Some(true) => StreamPriority::Highest,
        Some(false) | None => StreamPriority::Default,
    };
    Ok(NcclSettings {
        blocking,
        cga_cluster_size,
        min_ctas,
        max_ctas,
        net_name,
        split_share,
        traffic_class,
        comm_name,
        stream_priority,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NcclOptions;
    use nccl_sys::config::CONFIG_UNDEF_INT;
    use std::ffi::CStr;

    const NEW: Version = Version::new(2, 28, 9);

    fn all_knobs() -> CommOptions {
        CommOptions {
            nccl: NcclOptions {
                high_priority_stream: Some(true),
                cga_cluster_size: Some(2),
                min_ctas: Some(4),
                max_ctas: Some(16),
                net_name: Some("IB".into()),
                blocking: Some(true),
                split_share: Some(true),
                traffic_class: Some(106),
            },
            ..CommOptions::named("tp")
        }
    }

    #[test]
    fn every_knob_lands_in_its_field_on_a_new_library() {
        let s = translate(&all_knobs(), NEW).unwrap();
        let c = s.raw();
        assert_eq!(c.blocking, 1);
        assert_eq!(c.cgaClusterSize, 2);
        assert_eq!(c.minCTAs, 4);
        assert_eq!(c.maxCTAs, 16);
        assert_eq!(c.splitShare, 1);
        assert_eq!(c.trafficClass, 106);
        // SAFETY: the pointers point into `s`, which is alive; both are NUL-terminated CStrings.
        let (net, name) = unsafe { (CStr::from_ptr(c.netName), CStr::from_ptr(c.commName)) };
        assert_eq!(net.to_str().unwrap(), "IB");
        assert_eq!(name.to_str().unwrap(), "tp");
        assert_eq!(s.stream_priority, StreamPriority::Highest);
        // Fields hypercomm has no option for stay NCCL's "undefined".
        assert_eq!(c.collnetEnable, CONFIG_UNDEF_INT);
        assert_eq!(c.CTAPolicy, CONFIG_UNDEF_INT);
        assert_eq!(c.magic, nccl_sys::config::CONFIG_MAGIC);
    }

    #[test]
    fn defaults_are_non_blocking_and_otherwise_undefined() {
        let s = translate(&CommOptions::named("dp"), NEW).unwrap();
        assert!(s.non_blocking());
        assert!(s.uses_config());
        let c = s.raw();
        assert_eq!(c.blocking, 0);
        for v in [
            c.cgaClusterSize,
            c.minCTAs,
            c.maxCTAs,
            c.splitShare,
            c.trafficClass,
        ] {
            assert_eq!(v, CONFIG_UNDEF_INT);
        }
        assert!(c.netName.is_null());
        assert!(!c.commName.is_null());
        assert_eq!(s.stream_priority, StreamPriority::Default);
    }

    #[test]
    fn each_knob_is_refused_by_a_library_older_than_its_field() {
        // (option name, options with only that knob, last release without the field)
        let cases: Vec<(&str, CommOptions, Version)> = vec![
            (
                "blocking",
                CommOptions {
                    nccl: NcclOptions {
                        blocking: Some(false),
                        ..NcclOptions::default()
                    },
                    ..CommOptions::named("c")
                },
                Version::new(2, 13, 4),
            ),
            (
                "cga_cluster_size",
                CommOptions {
                    nccl: NcclOptions {
                        cga_cluster_size: Some(4),
                        ..NcclOptions::default()
                    },
                    ..CommOptions::named("c")
                },
                Version::new(2, 16, 5),
            ),
            (
                "min_ctas",
                CommOptions {
                    nccl: NcclOptions {
                        min_ctas: Some(1),
                        ..NcclOptions::default()
                    },
                    ..CommOptions::named("c")
                },
                Version::new(2, 16, 5),
            ),
            (
                "max_ctas",
                CommOptions {
                    nccl: NcclOptions {
                        max_ctas: Some(8),
                        ..NcclOptions::default()
                    },
                    ..CommOptions::named("c")
                },
                Version::new(2, 16, 5),
            ),
            (
                "net_name",
                CommOptions {
                    nccl: NcclOptions {
                        net_name: Some("Socket".into()),
                        ..NcclOptions::default()
                    },
                    ..CommOptions::named("c")
                },
                Version::new(2, 16, 5),
            ),
            (
                "split_share",
                CommOptions {
                    nccl: NcclOptions {
                        split_share: Some(true),
                        ..NcclOptions::default()
                    },
                    ..CommOptions::named("c")
                },
                Version::new(2, 17, 1),
            ),
            (
                "traffic_class",
                CommOptions {
                    nccl: NcclOptions {
                        traffic_class: Some(3),
                        ..NcclOptions::default()
                    },
                    ..CommOptions::named("c")
                },
                Version::new(2, 24, 3),
            ),
        ];
        for (name, opts, old) in cases {
            let introduced = match name {
                "blocking" => Version::new(2, 14, 0),
                "split_share" => Version::new(2, 18, 0),
                "traffic_class" => Version::new(2, 25, 0),
                _ => Version::new(2, 17, 0),
            };
            match translate(&opts, old) {
                Err(CommError::OptionNeedsNewerLibrary {
                    option,
                    library: "nccl",
                    needs,
                    loaded,
                }) => {
                    assert_eq!(option, name);
                    assert_eq!(loaded, old.to_string());
                    assert_eq!(needs, introduced.to_string(), "{name}");
                    let shown = translate(&opts, old).unwrap_err().to_string();
                    assert!(shown.contains(name) && shown.contains(&needs), "{shown}");
                }
                other => panic!("{name} on {old}: expected a refusal, got {other:?}"),
            }
            // From the field's first release on, the same options translate.
            assert!(
                translate(&opts, introduced).is_ok(),
                "{name} on {introduced}"
            );
        }
    }

    #[test]
    fn old_libraries_degrade_the_two_defaults_only() {
        let s = translate(&CommOptions::named("old"), Version::new(2, 12, 12)).unwrap();
        assert_eq!(s.blocking, None, "no configs before 2.14: blocking init");
        assert!(!s.uses_config());
        assert_eq!(s.comm_name, None);
        let s = translate(&CommOptions::named("mid"), Version::new(2, 26, 6)).unwrap();
        assert!(s.non_blocking());
        assert_eq!(s.comm_name, None, "commName arrives in 2.27");
        // The priority is a stream property: honoured on any release.
        let hp = CommOptions {
            nccl: NcclOptions {
                high_priority_stream: Some(true),
                ..NcclOptions::default()
            },
            ..CommOptions::named("hp")
        };
        assert_eq!(
            translate(&hp, Version::new(2, 12, 12))
                .unwrap()
                .stream_priority,
            StreamPriority::Highest
        );
    }

    #[test]
    fn host_only_options_are_refused_by_name() {
        let cases = [
            (
                "force_tcp",
                CommOptions {
                    force_tcp: true,
                    ..CommOptions::named("c")
                },
            ),
            (
                "algorithm",
                CommOptions {
                    algorithm: Algorithm::Latency,
                    ..CommOptions::named("c")
                },
            ),
            (
                "scratch_bytes",
                CommOptions {
                    scratch_bytes: Some(4096),
                    ..CommOptions::named("c")
                },
            ),
            (
                "symmetric_bytes",
                CommOptions {
                    symmetric_bytes: 1 << 20,
                    ..CommOptions::named("c")
                },
            ),
        ];
        for (name, opts) in cases {
            match translate(&opts, NEW) {
                Err(CommError::UnsupportedOption {
                    backend: "nccl",
                    option,
                }) => assert_eq!(option, name),
                other => panic!("{name}: {other:?}"),
            }
        }
    }

    #[test]
    fn one_cta_bound_gets_nccls_default_for_the_other() {
        // NCCL 2.28 and 2.30 refuse minCTAs=1 with maxCTAs unset ("Invalid config min/max channels attribute
        // value 1/-2147483648"): the unset bound must never reach it.
        let only_min = CommOptions {
            nccl: NcclOptions {
                min_ctas: Some(1),
                ..NcclOptions::default()
            },
            ..CommOptions::named("c")
        };
        let c = translate(&only_min, NEW).unwrap().raw();
        assert_eq!((c.minCTAs, c.maxCTAs), (1, 64));
        let only_max = CommOptions {
            nccl: NcclOptions {
                max_ctas: Some(4),
                ..NcclOptions::default()
            },
            ..CommOptions::named("c")
        };
        let c = translate(&only_max, NEW).unwrap().raw();
        assert_eq!((c.minCTAs, c.maxCTAs), (1, 4));
        for (lo, hi) in [(Some(64), None), (None, Some(1)), (Some(3), Some(3))] {
            let c = translate(
                &CommOptions {
                    nccl: NcclOptions {
                        min_ctas: lo,
                        max_ctas: hi,
                        ..NcclOptions::default()
                    },
                    ..CommOptions::named("c")
                },
                NEW,
            )
            .unwrap()
            .raw();
            assert!(
                c.minCTAs >= 1 && c.maxCTAs >= c.minCTAs && c.maxCTAs <= 64,
                "{lo:?}/{hi:?} gave {}/{}",
                c.minCTAs,
                c.maxCTAs
            );
        }
        let e = translate(
            &CommOptions {
                nccl: NcclOptions {
                    min_ctas: Some(65),
                    ..NcclOptions::default()
                },
                ..CommOptions::named("c")
            },
            NEW,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("min_ctas=65 exceeds nccl's maximum of 64"),
            "{e}"
        );
    }

    #[test]
    fn out_of_range_values_name_the_value_and_rule() {
        let e = translate(
            &CommOptions {
                nccl: NcclOptions {
                    cga_cluster_size: Some(9),
                    ..NcclOptions::default()
                },
                ..CommOptions::named("c")
            },
            NEW,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("cga_cluster_size=9 exceeds nccl's maximum of 8"),
            "{e}"
        );
        let e = translate(
            &CommOptions {
                nccl: NcclOptions {
                    min_ctas: Some(8),
                    max_ctas: Some(2),
                    ..NcclOptions::default()
                },
                ..CommOptions::named("c")
            },
            NEW,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("min_ctas=8 exceeds max_ctas=2"), "{e}");
        let e = translate(
            &CommOptions {
                nccl: NcclOptions {
                    max_ctas: Some(0),
                    ..NcclOptions::default()
                },
                ..CommOptions::named("c")
            },
            NEW,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("max_ctas=0 must be at least 1"), "{e}");
        let e = translate(
            &CommOptions {
                nccl: NcclOptions {
                    traffic_class: Some(u32::MAX),
                    ..NcclOptions::default()
                },
                ..CommOptions::named("c")
            },
            NEW,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("traffic_class=4294967295 does not fit"), "{e}");
        let e = translate(
            &CommOptions {
                nccl: NcclOptions {
                    net_name: Some("a\0b".into()),
                    ..NcclOptions::default()
                },
                ..CommOptions::named("c")
            },
            NEW,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("NUL"), "{e}");
    }
}
