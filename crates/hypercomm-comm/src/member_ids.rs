//! Errors as the user reads them: a backend names ranks by their position within the communicator, the user by
//! the member ids the communicator was created with (world ranks in a collection). [`to_members`] maps one to
//! the other once, where an error leaves the communicator.

use crate::CommError;
use crate::error::Call;

/// Maps `error`'s ranks from positions within the communicator to member ids (`members[position]`) and fills in
/// the members. Errors that already carry their members are left alone.
pub(crate) fn to_members(error: CommError, members: &[usize]) -> CommError {
    let id = |p: usize| members.get(p).copied().unwrap_or(p);
    let ids = |ps: Vec<usize>| ps.into_iter().map(id).collect::<Vec<_>>();
    match error {
        CommError::Timeout {
            comm,
            members: m,
            missing,
            after,
            during,
            cause,
        } if m.is_empty() => CommError::Timeout {
            comm,
            members: members.to_vec(),
            missing: ids(missing),
            after,
            during,
            cause,
        },
        CommError::PeerDied {
            comm,
            members: m,
            ranks,
            during,
        } if m.is_empty() => CommError::PeerDied {
            comm,
            members: members.to_vec(),
            ranks: ids(ranks),
            during,
        },
        CommError::AbortedByPeer {
            comm,
            members: m,
            by,
            during,
            lost,
            cause,
        } if m.is_empty() => CommError::AbortedByPeer {
            comm,
            members: members.to_vec(),
            by: id(by),
            during,
            lost: ids(lost),
            cause,
        },
        CommError::Mismatch {
            comm,
            members: m,
            calls,
            ..
        } if m.is_empty() => {
            let calls = calls
                .into_iter()
                .map(|c| Call {
                    ranks: ids(c.ranks),
                    call: c.call,
                })
                .collect();
            CommError::mismatch(&comm, members.to_vec(), calls)
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_become_member_ids() {
        let e = to_members(CommError::peer_died("dp/0", vec![1], "all_reduce"), &[0, 2]);
        assert_eq!(e.lost_ranks(), [2]);
        assert_eq!(
            e.to_string(),
            "communicator dp/0 (members [0, 2]): rank(s) [2] died (in all_reduce)"
        );
        // Already converted: left alone.
        assert_eq!(to_members(e, &[7, 9]).lost_ranks(), [2]);
    }
}
