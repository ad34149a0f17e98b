//! [`placement`]: which device each rank of a job on one machine runs on, and whether the loaded NCCL allows it.
//!
//! One rank per device is what NCCL has always run. More ranks than devices means several ranks of one
//! communicator on one GPU, which NCCL runs only from [`MULTI_RANK_GPU_VERSION`] on and only when the job sets
//! `NCCL_MULTI_RANK_GPU_ENABLE=1`; an older NCCL fails such a communicator at creation with a generic error, so
//! the placement says which condition is missing before any communicator is made.

use nccl_sys::Version;

use crate::CommError;

/// The first NCCL release that runs several ranks of one communicator on one GPU (with
/// `NCCL_MULTI_RANK_GPU_ENABLE=1`).
pub const MULTI_RANK_GPU_VERSION: Version = Version::new(2, 30, 0);

/// The device ordinal of each of `ranks` ranks, given `devices` visible devices and the loaded `nccl`: rank `r`
/// on device `r` where there are enough devices, otherwise round-robin (`r % devices`), which needs `nccl` at
/// least [`MULTI_RANK_GPU_VERSION`] and `multi_rank_gpu_enabled` (the job's `NCCL_MULTI_RANK_GPU_ENABLE=1`, read
/// by the caller: a library does not read the environment behind its user's back).
///
/// Fails with [`CommError::Unavailable`] naming the missing condition: no rank, no device, an NCCL too old, the
/// variable unset.
///
/// ```
/// use hypercomm_comm::device::placement;
/// use nccl_sys::Version;
///
/// // Two ranks, eight devices: one each.
/// assert_eq!(placement(2, 8, Version::new(2, 28, 9), false).unwrap(), [0, 1]);
/// // Three ranks on one device: NCCL 2.30 with the variable set.
/// assert_eq!(placement(3, 1, Version::new(2, 30, 0), true).unwrap(), [0, 0, 0]);
/// let e = placement(2, 1, Version::new(2, 28, 9), true).unwrap_err();
/// assert!(e.to_string().contains("nccl >= 2.30.0"), "{e}");
/// ```
pub fn placement(
    ranks: usize,
    devices: usize,
    nccl: Version,
    multi_rank_gpu_enabled: bool,
) -> Result<Vec<usize>, CommError> {
    let refuse = |why: String| CommError::Unavailable {
        what: format!("a placement of {ranks} rank(s) on {devices} device(s)"),
        why,
    };
    if ranks == 0 {
        return Err(refuse("a placement needs at least one rank".into()));
    }
    if devices == 0 {
        return Err(refuse("no cuda device is visible".into()));
    }
    if ranks <= devices {
        return Ok((0..ranks).collect());
    }
    if nccl < MULTI_RANK_GPU_VERSION {
        return Err(refuse(format!(
            "several ranks per gpu need nccl >= {MULTI_RANK_GPU_VERSION}; the loaded nccl is {nccl}"
        )));
    }
    if !multi_rank_gpu_enabled {
        return Err(refuse(
            "several ranks per gpu need NCCL_MULTI_RANK_GPU_ENABLE=1 in the environment".into(),
        ));
    }
    Ok((0..ranks).map(|r| r % devices).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(ranks: usize, devices: usize, nccl: Version, enabled: bool) -> String {
        placement(ranks, devices, nccl, enabled)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn placement_spreads_ranks_and_names_what_is_missing() {
        let old = Version::new(2, 28, 9);
        let new = Version::new(2, 30, 1);
        assert_eq!(placement(4, 8, old, false).unwrap(), [0, 1, 2, 3]);
        assert_eq!(placement(5, 2, new, true).unwrap(), [0, 1, 0, 1, 0]);
        let e = refusal(2, 1, old, true);
        assert!(
            e.contains("2 rank(s) on 1 device(s)")
                && e.contains("nccl >= 2.30.0")
                && e.contains("2.28.9"),
            "{e}"
        );
        let e = refusal(2, 1, new, false);
        assert!(e.contains("NCCL_MULTI_RANK_GPU_ENABLE=1"), "{e}");
        assert!(refusal(0, 1, new, true).contains("at least one rank"));
        assert!(refusal(1, 0, new, true).contains("no cuda device"));
    }
}
