//! [`BuildStep`] and [`BuildHook`]: the named points of a collection build, and a caller's function that runs at
//! each of them (fault injection: a chaos test kills, stalls or panics a rank at a chosen point of a build).
//!
//! Set with [`CollectionBuilder::with_step_hook`](crate::CollectionBuilder::with_step_hook); nothing is
//! registered globally. The hook sees every [`Step`] of every group's host communicator bootstrap (wrapped in
//! [`BuildStep::Comm`] with the group), then [`BuildStep::GroupCreated`] as each group of an eager build is done,
//! and [`BuildStep::Built`] once the closing barrier passed.

use std::fmt;
use std::sync::Arc;

use hypercomm_comm::Step;

use crate::GroupId;

/// A point of a collection build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BuildStep<'a> {
    /// A step of the bootstrap of `group`'s host communicator.
    Comm {
        /// The group being created.
        group: &'a GroupId,
        /// The communicator's step.
        step: &'a Step<'a>,
    },
    /// This rank's communicators of `group` exist (eager builds).
    GroupCreated {
        /// The collection.
        collection: &'a str,
        /// The group.
        group: &'a GroupId,
    },
    /// Every group exists and the closing barrier passed; the build returns next.
    Built {
        /// The collection.
        collection: &'a str,
    },
}

impl BuildStep<'_> {
    /// Every step's [`name`](Self::name): the communicator steps' ([`Step::NAMES`]), then `group_created`, `built`.
    pub const NAMES: [&'static str; Step::NAMES.len() + 2] = {
        let mut names = [""; Step::NAMES.len() + 2];
        let mut i = 0;
        while i < Step::NAMES.len() {
            names[i] = Step::NAMES[i];
            i += 1;
        }
        names[i] = "group_created";
        names[i + 1] = "built";
        names
    };

    /// The step's name: [`Step::name`] for a communicator step, else `group_created` or `built`.
    pub fn name(&self) -> &'static str {
        match self {
            BuildStep::Comm { step, .. } => step.name(),
            BuildStep::GroupCreated { .. } => "group_created",
            BuildStep::Built { .. } => "built",
        }
    }

    /// The group the step belongs to (none for `built`).
    pub fn group(&self) -> Option<&GroupId> {
        match self {
            BuildStep::Comm { group, .. } | BuildStep::GroupCreated { group, .. } => Some(group),
            BuildStep::Built { .. } => None,
        }
    }
}

/// A function called at every [`BuildStep`]. Cloning shares the function.
#[derive(Clone)]
pub struct BuildHook(Arc<dyn Fn(&BuildStep<'_>) + Send + Sync>);

impl BuildHook {
    /// Wraps `f`.
    pub fn new(f: impl Fn(&BuildStep<'_>) + Send + Sync + 'static) -> BuildHook {
        BuildHook(Arc::new(f))
    }

    /// Runs the function on `step`.
    pub fn call(&self, step: &BuildStep<'_>) {
        (self.0)(step);
    }
}

impl fmt::Debug for BuildHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BuildHook(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_list_the_comm_steps_then_the_collection_steps() {
        assert_eq!(BuildStep::NAMES[..Step::NAMES.len()], Step::NAMES);
        assert_eq!(
            BuildStep::NAMES[Step::NAMES.len()..],
            ["group_created", "built"]
        );
        let tp = GroupId::kind("tp");
        let step = Step::Arrived { comm: "c", rank: 1 };
        let comm = BuildStep::Comm {
            group: &tp,
            step: &step,
        };
        assert_eq!((comm.name(), comm.group()), ("arrived", Some(&tp)));
        let built = BuildStep::Built { collection: "c" };
        assert_eq!((built.name(), built.group()), ("built", None));
    }
}
