//! [`GroupId`]: the name of one communicator of a collection. A room of its own, below both the collection's plan
//! and its errors, which name groups.

use std::fmt;

use hypercomm_grid::layout::GroupKind;

/// Names one communicator of a collection: a group kind, a level (for `hcp`; 0 otherwise) and a tag (empty for the
/// primary communicator; distinct tags make further communicators over the same ranks).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupId {
    /// The kind's name: a Megatron field name (`dp_cp`) or a custom kind's name.
    pub kind: String,
    /// The hierarchical cp level, 0 for other kinds.
    pub level: usize,
    /// The tag; empty for the primary communicator.
    pub tag: String,
}

impl GroupId {
    /// The primary communicator of `kind`.
    pub fn kind(kind: impl Into<String>) -> Self {
        GroupId {
            kind: kind.into(),
            level: 0,
            tag: String::new(),
        }
    }

    /// The communicator of `kind` tagged `tag`.
    pub fn tagged(kind: impl Into<String>, tag: impl Into<String>) -> Self {
        GroupId {
            tag: tag.into(),
            ..GroupId::kind(kind)
        }
    }

    /// Level `level` of hierarchical cp.
    pub fn hcp(level: usize) -> Self {
        GroupId {
            level,
            ..GroupId::kind(GroupKind::Hcp.name())
        }
    }
}

impl fmt::Display for GroupId {
    /// `dp_cp`, `hcp[1]`, `dp_cp#overlap`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.kind)?;
        if self.kind == GroupKind::Hcp.name() {
            write!(f, "[{}]", self.level)?;
        }
        if !self.tag.is_empty() {
            write!(f, "#{}", self.tag)?;
        }
        Ok(())
    }
}
