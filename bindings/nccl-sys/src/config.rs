//! Hand-written equivalents of the initializer macros in `nccl.h`, which bindgen cannot translate.
//!
//! `nccl.h` 2.28.9 says a `ncclConfig_t` must start from `NCCL_CONFIG_INITIALIZER`; NCCL rejects one that does not
//! carry the magic number. [`config_initializer`] builds the same value: the three header fields NCCL uses to
//! recognise the struct, then every knob set to "undefined", which tells NCCL to use its own default (or the
//! matching `NCCL_*` environment variable).
//!
//! Passing this 2.28.9 struct to an older library is safe: NCCL reads the `size` field first and copies at most
//! its own `sizeof(ncclConfig_t)` bytes, and it resets fields newer than the struct's `version`. The other side of
//! that is the trap: a field newer than the *loaded library* is silently ignored. [`ConfigField::introduced`] says
//! which release first honours each field; check it against the loaded version
//! ([`Nccl::supports_config_field`](crate::Nccl::supports_config_field)) before setting a knob, and report an error
//! rather than let the knob be dropped.
//!
//! ```
//! use nccl_sys::config::{config_initializer, CONFIG_MAGIC, CONFIG_UNDEF_INT};
//!
//! let mut config = config_initializer();
//! assert_eq!(config.magic, CONFIG_MAGIC);
//! assert_eq!(config.blocking, CONFIG_UNDEF_INT);
//! config.blocking = 0; // a non-blocking communicator
//! ```

use std::os::raw::{c_int, c_uint};

use crate::sys;
use crate::version::Version;

/// `NCCL_API_MAGIC` in NCCL's sources: the value of the `magic` field of an initialised config (`0xcafebeef`).
pub const CONFIG_MAGIC: c_uint = 0xcafe_beef;

/// `NCCL_CONFIG_UNDEF_INT` (`INT_MIN`): "not set, use NCCL's default" for an integer knob.
pub const CONFIG_UNDEF_INT: c_int = c_int::MIN;

/// The magic number of an initialised `ncclSimInfo_t` (`NCCL_SIM_INFO_INITIALIZER`).
pub const SIM_INFO_MAGIC: c_uint = 0x7468_5283;

/// `NCCL_UNDEF_FLOAT`: "not computed yet" for the estimated time of a `ncclSimInfo_t`.
pub const UNDEF_FLOAT: f32 = -1.0;

/// The header's version code as the unsigned `version` field of the initialised structs (`22809`).
const HEADER_VERSION_FIELD: c_uint = sys::NCCL_VERSION_CODE;

/// The value `NCCL_CONFIG_INITIALIZER` of `nccl.h` 2.28.9 gives, field for field:
///
/// | field | value | meaning |
/// |---|---|---|
/// | `size` | `size_of::<ncclConfig_t>()` (80 on 64-bit) | lets NCCL copy only the bytes it knows |
/// | `magic` | [`CONFIG_MAGIC`] | proves the struct was initialised |
/// | `version` | 22809 | the header release; NCCL resets fields newer than it |
/// | `blocking` | undefined | NCCL default 1: calls block until done |
/// | `cgaClusterSize` | undefined | default 4 on sm90+: thread-block cluster size of NCCL kernels |
/// | `minCTAs`, `maxCTAs` | undefined | defaults 1 and the channel maximum: bounds on NCCL's thread blocks |
/// | `netName` | null | network plugin or device to use, by name |
/// | `splitShare` | undefined | default 0: a split child shares its parent's resources when 1 |
/// | `trafficClass` | undefined | network traffic class (QoS) of the communicator |
/// | `commName` | null | name used in NCCL's logs and profiler |
/// | `collnetEnable` | undefined | default 0: use CollNet (in-network reduction) when 1 |
/// | `CTAPolicy` | undefined | default `NCCL_CTA_POLICY_DEFAULT`: efficiency or zero-CTA policies |
/// | `shrinkShare` | undefined | default 0: a shrunk child shares its parent's resources when 1 |
/// | `nvlsCTAs` | undefined | number of thread blocks for NVLink SHARP |
/// | `nChannelsPerNetPeer` | undefined | channels per network peer |
/// | `nvlinkCentricSched` | undefined | default 0: NVLink-centric scheduling when 1 |
pub fn config_initializer() -> sys::ncclConfig_t {
    sys::ncclConfig_t {
        size: std::mem::size_of::<sys::ncclConfig_t>(),
        magic: CONFIG_MAGIC,
        version: HEADER_VERSION_FIELD,
        blocking: CONFIG_UNDEF_INT,
        cgaClusterSize: CONFIG_UNDEF_INT,
        minCTAs: CONFIG_UNDEF_INT,
        maxCTAs: CONFIG_UNDEF_INT,
        netName: std::ptr::null(),
        splitShare: CONFIG_UNDEF_INT,
        trafficClass: CONFIG_UNDEF_INT,
        commName: std::ptr::null(),
        collnetEnable: CONFIG_UNDEF_INT,
        CTAPolicy: CONFIG_UNDEF_INT,
        shrinkShare: CONFIG_UNDEF_INT,
        nvlsCTAs: CONFIG_UNDEF_INT,
        nChannelsPerNetPeer: CONFIG_UNDEF_INT,
        nvlinkCentricSched: CONFIG_UNDEF_INT,
    }
}

/// The value `NCCL_SIM_INFO_INITIALIZER` of `nccl.h` 2.28.9 gives: size, [`SIM_INFO_MAGIC`], the header version,
/// and [`UNDEF_FLOAT`] as the estimated time. `ncclGroupSimulateEnd` fills in the time.
pub fn sim_info_initializer() -> sys::ncclSimInfo_t {
    sys::ncclSimInfo_t {
        size: std::mem::size_of::<sys::ncclSimInfo_t>(),
        magic: SIM_INFO_MAGIC,
        version: HEADER_VERSION_FIELD,
        estimatedTime: UNDEF_FLOAT,
    }
}

/// One user-settable field of `ncclConfig_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ConfigField {
    /// `blocking`.
    Blocking,
    /// `cgaClusterSize`.
    CgaClusterSize,
    /// `minCTAs`.
    MinCtas,
    /// `maxCTAs`.
    MaxCtas,
    /// `netName`.
    NetName,
    /// `splitShare`.
    SplitShare,
    /// `trafficClass`.
    TrafficClass,
    /// `commName`.
    CommName,
    /// `collnetEnable`.
    CollnetEnable,
    /// `CTAPolicy`.
    CtaPolicy,
    /// `shrinkShare`.
    ShrinkShare,
    /// `nvlsCTAs`.
    NvlsCtas,
    /// `nChannelsPerNetPeer`.
    NChannelsPerNetPeer,
    /// `nvlinkCentricSched`.
    NvlinkCentricSched,
}

impl ConfigField {
    /// Every field, in struct order.
    pub const ALL: &'static [ConfigField] = &[
        ConfigField::Blocking,
        ConfigField::CgaClusterSize,
        ConfigField::MinCtas,
        ConfigField::MaxCtas,
        ConfigField::NetName,
        ConfigField::SplitShare,
        ConfigField::TrafficClass,
        ConfigField::CommName,
        ConfigField::CollnetEnable,
        ConfigField::CtaPolicy,
        ConfigField::ShrinkShare,
        ConfigField::NvlsCtas,
        ConfigField::NChannelsPerNetPeer,
        ConfigField::NvlinkCentricSched,
    ];

    /// The C field name.
    pub const fn name(self) -> &'static str {
        match self {
            ConfigField::Blocking => "blocking",
            ConfigField::CgaClusterSize => "cgaClusterSize",
            ConfigField::MinCtas => "minCTAs",
            ConfigField::MaxCtas => "maxCTAs",
            ConfigField::NetName => "netName",
            ConfigField::SplitShare => "splitShare",
            ConfigField::TrafficClass => "trafficClass",
            ConfigField::CommName => "commName",
            ConfigField::CollnetEnable => "collnetEnable",
            ConfigField::CtaPolicy => "CTAPolicy",
            ConfigField::ShrinkShare => "shrinkShare",
            ConfigField::NvlsCtas => "nvlsCTAs",
            ConfigField::NChannelsPerNetPeer => "nChannelsPerNetPeer",
            ConfigField::NvlinkCentricSched => "nvlinkCentricSched",
        }
    }

    /// The first release that honours this field.
    ///
    /// Taken from NCCL's own config parser (`parseCommConfig` in `init.cc`), which resets `cgaClusterSize`,
    /// `minCTAs`, `maxCTAs` and `netName` for configs older than 2.17, `trafficClass` before 2.25, the four 2.27
    /// fields before 2.27 and the two 2.28 fields before 2.28; `blocking` arrived with `ncclConfig_t` in 2.14 and
    /// `splitShare` with `ncclCommSplit` in 2.18. `commName` sits between `trafficClass` and the 2.27 fields in the
    /// struct, so it arrived between 2.25 and 2.27; the exact release is not verified, so it is gated at 2.27
    /// (late: refusing a knob that might work beats dropping one silently).
    pub const fn introduced(self) -> Version {
        match self {
            ConfigField::Blocking => Version::new(2, 14, 0),
            ConfigField::CgaClusterSize
            | ConfigField::MinCtas
            | ConfigField::MaxCtas
            | ConfigField::NetName => Version::new(2, 17, 0),
            ConfigField::SplitShare => Version::new(2, 18, 0),
            ConfigField::TrafficClass => Version::new(2, 25, 0),
            ConfigField::CommName
            | ConfigField::CollnetEnable
            | ConfigField::CtaPolicy
            | ConfigField::ShrinkShare
            | ConfigField::NvlsCtas => Version::new(2, 27, 0),
            ConfigField::NChannelsPerNetPeer | ConfigField::NvlinkCentricSched => {
                Version::new(2, 28, 0)
            }
        }
    }
}

impl std::fmt::Display for ConfigField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::version::HEADER_VERSION;
    use std::mem::{offset_of, size_of};

    #[test]
    fn header_fields_match_the_macro() {
        let c = config_initializer();
        assert_eq!(c.size, size_of::<sys::ncclConfig_t>());
        assert_eq!(c.magic, 0xcafebeef);
        assert_eq!(c.version, 22809);
        if cfg!(target_pointer_width = "64") {
            // size 8, magic and version 8, four ints 16, netName 8, two ints 8, commName 8, six ints 24: 80 bytes,
            // the size C gives (bindgen's layout check in sys.rs asserts the same).
            assert_eq!(c.size, 80);
        }
    }

    /// Reads one field of the initialised config by name, so the test checks every field listed in
    /// [`ConfigField::ALL`] and fails if a field is added to the table but not to this reader.
    fn int_field(c: &sys::ncclConfig_t, field: ConfigField) -> Option<c_int> {
        Some(match field {
            ConfigField::Blocking => c.blocking,
            ConfigField::CgaClusterSize => c.cgaClusterSize,
            ConfigField::MinCtas => c.minCTAs,
            ConfigField::MaxCtas => c.maxCTAs,
            ConfigField::SplitShare => c.splitShare,
            ConfigField::TrafficClass => c.trafficClass,
            ConfigField::CollnetEnable => c.collnetEnable,
            ConfigField::CtaPolicy => c.CTAPolicy,
            ConfigField::ShrinkShare => c.shrinkShare,
            ConfigField::NvlsCtas => c.nvlsCTAs,
            ConfigField::NChannelsPerNetPeer => c.nChannelsPerNetPeer,
            ConfigField::NvlinkCentricSched => c.nvlinkCentricSched,
            ConfigField::NetName | ConfigField::CommName => return None,
        })
    }

    #[test]
    fn every_knob_is_undefined() {
        let c = config_initializer();
        for &field in ConfigField::ALL {
            if let Some(v) = int_field(&c, field) {
                assert_eq!(v, i32::MIN, "{field}");
            }
        }
        assert!(c.netName.is_null());
        assert!(c.commName.is_null());
    }

    #[test]
    fn table_lists_struct_fields_in_order() {
        let offsets = [
            offset_of!(sys::ncclConfig_t, blocking),
            offset_of!(sys::ncclConfig_t, cgaClusterSize),
            offset_of!(sys::ncclConfig_t, minCTAs),
            offset_of!(sys::ncclConfig_t, maxCTAs),
            offset_of!(sys::ncclConfig_t, netName),
            offset_of!(sys::ncclConfig_t, splitShare),
            offset_of!(sys::ncclConfig_t, trafficClass),
            offset_of!(sys::ncclConfig_t, commName),
            offset_of!(sys::ncclConfig_t, collnetEnable),
            offset_of!(sys::ncclConfig_t, CTAPolicy),
            offset_of!(sys::ncclConfig_t, shrinkShare),
            offset_of!(sys::ncclConfig_t, nvlsCTAs),
            offset_of!(sys::ncclConfig_t, nChannelsPerNetPeer),
            offset_of!(sys::ncclConfig_t, nvlinkCentricSched),
        ];
        assert_eq!(offsets.len(), ConfigField::ALL.len());
        assert!(offsets.windows(2).all(|w| w[0] < w[1]));
        // Fields are appended release by release, so introduction dates never go backwards along the struct.
        let dates: Vec<Version> = ConfigField::ALL.iter().map(|f| f.introduced()).collect();
        assert!(dates.windows(2).all(|w| w[0] <= w[1]), "{dates:?}");
        assert!(dates.iter().all(|&d| d <= HEADER_VERSION));
    }

    #[test]
    fn sim_info_matches_the_macro() {
        let s = sim_info_initializer();
        assert_eq!(s.size, size_of::<sys::ncclSimInfo_t>());
        assert_eq!(s.magic, 0x74685283);
        assert_eq!(s.version, 22809);
        assert_eq!(s.estimatedTime, -1.0);
    }
}
