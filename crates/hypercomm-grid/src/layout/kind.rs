//! [`GroupKind`]: the kinds of process group a Megatron-Core layout defines, named exactly as the fields of
//! Megatron-Core's `ProcessGroupCollection`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::layout::LayoutError;

/// A kind of process group. `name()` is the Megatron-Core `ProcessGroupCollection` field name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupKind {
    /// Tensor parallel.
    Tp,
    /// Pipeline parallel.
    Pp,
    /// Model parallel: tensor and pipeline together.
    Mp,
    /// Embedding: the first and last stage of each pipeline group (one rank when pp = 1).
    Embd,
    /// Position embedding: the first stage of each pipeline group.
    PosEmbd,
    /// Context parallel.
    Cp,
    /// Tensor and context parallel.
    TpCp,
    /// Hierarchical context parallel: one group per level, from the hierarchical cp sizes.
    Hcp,
    /// Expert parallel (expert grid).
    Ep,
    /// Expert tensor parallel (expert grid).
    ExptTp,
    /// Expert tensor and expert parallel (expert grid).
    TpEp,
    /// Expert tensor, expert and pipeline parallel (expert grid).
    TpEpPp,
    /// Tensor, data and context parallel.
    TpDpCp,
    /// Data parallel.
    Dp,
    /// Data and context parallel.
    DpCp,
    /// A second communicator over the `dp_cp` ranks, for all-gather overlapping reduce-scatter.
    DpCpAg,
    /// Expert data parallel (expert grid).
    ExptDp,
    /// A second communicator over the `expt_dp` ranks; only when ep > 1.
    ExptDpAg,
    /// One distributed-optimizer instance's slice of a `dp_cp` group.
    IntraDpCp,
    /// One distributed-optimizer instance's slice of an `expt_dp` group.
    IntraExptDp,
    /// The ranks holding the same shard in every distributed-optimizer instance; only when instances > 1.
    InterDistOpt,
    /// All ranks of one distributed-optimizer instance.
    IntraDistOpt,
}

impl GroupKind {
    /// Every kind, in `ProcessGroupCollection` field order.
    pub const ALL: [GroupKind; 22] = [
        GroupKind::Tp,
        GroupKind::Pp,
        GroupKind::Mp,
        GroupKind::Embd,
        GroupKind::PosEmbd,
        GroupKind::Cp,
        GroupKind::TpCp,
        GroupKind::Hcp,
        GroupKind::Ep,
        GroupKind::ExptTp,
        GroupKind::TpEp,
        GroupKind::TpEpPp,
        GroupKind::TpDpCp,
        GroupKind::Dp,
        GroupKind::DpCp,
        GroupKind::DpCpAg,
        GroupKind::ExptDp,
        GroupKind::ExptDpAg,
        GroupKind::IntraDpCp,
        GroupKind::IntraExptDp,
        GroupKind::InterDistOpt,
        GroupKind::IntraDistOpt,
    ];

    /// The Megatron-Core `ProcessGroupCollection` field name.
    pub fn name(self) -> &'static str {
        match self {
            GroupKind::Tp => "tp",
            GroupKind::Pp => "pp",
            GroupKind::Mp => "mp",
            GroupKind::Embd => "embd",
            GroupKind::PosEmbd => "pos_embd",
            GroupKind::Cp => "cp",
            GroupKind::TpCp => "tp_cp",
            GroupKind::Hcp => "hcp",
            GroupKind::Ep => "ep",
            GroupKind::ExptTp => "expt_tp",
            GroupKind::TpEp => "tp_ep",
            GroupKind::TpEpPp => "tp_ep_pp",
            GroupKind::TpDpCp => "tp_dp_cp",
            GroupKind::Dp => "dp",
            GroupKind::DpCp => "dp_cp",
            GroupKind::DpCpAg => "dp_cp_ag",
            GroupKind::ExptDp => "expt_dp",
            GroupKind::ExptDpAg => "expt_dp_ag",
            GroupKind::IntraDpCp => "intra_dp_cp",
            GroupKind::IntraExptDp => "intra_expt_dp",
            GroupKind::InterDistOpt => "inter_dist_opt",
            GroupKind::IntraDistOpt => "intra_dist_opt",
        }
    }

    /// Whether the kind's groups live on the expert grid.
    pub fn is_expert(self) -> bool {
        matches!(
            self,
            GroupKind::Ep
                | GroupKind::ExptTp
                | GroupKind::TpEp
                | GroupKind::TpEpPp
                | GroupKind::ExptDp
                | GroupKind::ExptDpAg
                | GroupKind::IntraExptDp
                | GroupKind::InterDistOpt
                | GroupKind::IntraDistOpt
        )
    }
}

impl fmt::Display for GroupKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for GroupKind {
    type Err = LayoutError;

    /// Parses a field name such as `dp_cp`.
    fn from_str(name: &str) -> Result<GroupKind, LayoutError> {
        GroupKind::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .ok_or_else(|| LayoutError::UnknownKind {
                name: name.to_owned(),
                known: GroupKind::ALL.map(GroupKind::name).join(", "),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_parsing_and_serde() {
        for kind in GroupKind::ALL {
            assert_eq!(kind.name().parse::<GroupKind>().unwrap(), kind);
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{}\"", kind.name()));
        }
        let err = "dpcp".parse::<GroupKind>().unwrap_err();
        assert!(
            err.to_string()
                .starts_with("unknown group kind \"dpcp\" (known: tp, pp, mp"),
            "{err}"
        );
    }
}
