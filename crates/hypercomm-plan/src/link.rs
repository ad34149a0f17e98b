//! [`LinkClass`]: how two devices of a cluster reach each other, from fastest to slowest.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The slowest kind of link on the best path between two devices, ordered fastest first.
///
/// A path's class is the slowest link it uses; between two devices, the class that counts is that of the path whose
/// slowest link is fastest. Two GPUs of one HGX host meet over NVLink; two GPUs of one NVL72 rack meet over NVLink
/// even on different hosts; two hosts in one rack (or in a cluster without racks) meet through their NICs and one
/// switch; two racks meet through the spine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkClass {
    /// Both ranks on one device: no link at all.
    SameDevice,
    /// One NVLink/NVSwitch domain, which may span hosts (NVL72).
    Nvlink,
    /// One host, over PCIe (hosts without NVLink).
    Pcie,
    /// Different hosts under one switch, over their NICs.
    Nic,
    /// Different racks, through the spine switches.
    Spine,
}

impl LinkClass {
    /// Every class, fastest first.
    pub const ALL: [LinkClass; 5] = [
        LinkClass::SameDevice,
        LinkClass::Nvlink,
        LinkClass::Pcie,
        LinkClass::Nic,
        LinkClass::Spine,
    ];

    /// The snake_case name used in JSON (`nvlink`, `nic`, ...).
    pub fn name(self) -> &'static str {
        match self {
            LinkClass::SameDevice => "same_device",
            LinkClass::Nvlink => "nvlink",
            LinkClass::Pcie => "pcie",
            LinkClass::Nic => "nic",
            LinkClass::Spine => "spine",
        }
    }

    /// The position in [`LinkClass::ALL`].
    pub(crate) fn level(self) -> usize {
        self as usize
    }

    /// Whether traffic of this class leaves the host through a NIC.
    pub fn uses_nic(self) -> bool {
        self >= LinkClass::Nic
    }
}

impl fmt::Display for LinkClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_ordered_fastest_first_and_levels_match() {
        for (i, class) in LinkClass::ALL.into_iter().enumerate() {
            assert_eq!(class.level(), i);
            let json = serde_json::to_string(&class).unwrap();
            assert_eq!(json, format!("\"{}\"", class.name()));
        }
        assert!(LinkClass::Nvlink < LinkClass::Pcie && LinkClass::Nic < LinkClass::Spine);
        assert!(
            !LinkClass::Pcie.uses_nic() && LinkClass::Nic.uses_nic() && LinkClass::Spine.uses_nic()
        );
    }
}
