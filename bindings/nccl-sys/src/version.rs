//! NCCL release numbers: decoding the integer `ncclGetVersion` returns, and comparing releases.
//!
//! NCCL packs its version into one `int` with the `NCCL_VERSION(X, Y, Z)` macro of `nccl.h`, which changed scheme
//! at 2.9: releases up to 2.8 use `major * 1000 + minor * 100 + patch` (2.8.4 is `2804`), later ones
//! `major * 10000 + minor * 100 + patch` (2.28.9 is `22809`). The two ranges do not overlap (old codes are below
//! 10000, new ones at or above 20900), so a code decodes unambiguously.
//!
//! ```
//! use nccl_sys::version::Version;
//!
//! let v = Version::from_code(22809).unwrap();
//! assert_eq!(v, Version::new(2, 28, 9));
//! assert_eq!(v.to_string(), "2.28.9");
//! assert_eq!(Version::from_code(2804).unwrap(), Version::new(2, 8, 4));
//! assert!(Version::new(2, 27, 0) < v);
//! ```

use std::fmt;

/// An NCCL release, `major.minor.patch`. Ordered the way releases are: 2.9.0 < 2.10.0 < 2.28.9.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// Major release, 2 for every NCCL this crate knows.
    pub major: u32,
    /// Minor release.
    pub minor: u32,
    /// Patch level.
    pub patch: u32,
}

/// The release whose `nccl.h` the checked-in bindings were generated from.
pub const HEADER_VERSION: Version = Version::new(2, 28, 9);

/// Why an integer is not an NCCL version code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VersionError {
    /// The code is zero or negative, which no NCCL release reports.
    #[error("nccl version code {code} is not positive")]
    NotPositive {
        /// The code as received.
        code: i32,
    },
    /// The code is positive but decodes to no release either scheme can produce.
    #[error(
        "nccl version code {code} fits neither scheme (major*1000+minor*100+patch up to 2.8, \
         major*10000+minor*100+patch from 2.9)"
    )]
    Malformed {
        /// The code as received.
        code: i32,
    },
}

impl Version {
    /// The release `major.minor.patch`.
    pub const fn new(major: u32, minor: u32, patch: u32) -> Self {
        Version {
            major,
            minor,
            patch,
        }
    }

    /// Decodes the integer that `ncclGetVersion` writes (also `NCCL_VERSION_CODE` of a header).
    ///
    /// Codes below 10000 use the pre-2.9 scheme, which has one digit for the minor release; codes at or above
    /// 10000 use the current scheme. A code that the matching scheme cannot have produced is an error rather than
    /// a guess, because the caller gates features on the result.
    pub fn from_code(code: i32) -> Result<Version, VersionError> {
        if code <= 0 {
            return Err(VersionError::NotPositive { code });
        }
        // `code` is positive here, so the conversion cannot fail; fall back to the error path anyway.
        let c = u32::try_from(code).map_err(|_| VersionError::NotPositive { code })?;
        let version = if c < 10_000 {
            // Old scheme: X*1000 + Y*100 + Z with Y <= 8 (the macro switches scheme above 2.8).
            Version::new(c / 1000, (c % 1000) / 100, c % 100)
        } else {
            Version::new(c / 10_000, (c % 10_000) / 100, c % 100)
        };
        // Re-encoding must give the code back; it does not when, say, an old-scheme code names minor 9.
        if version.major == 0 || version.code() != Some(code) {
            return Err(VersionError::Malformed { code });
        }
        Ok(version)
    }

    /// Encodes this release the way `NCCL_VERSION(major, minor, patch)` does, or `None` when it does not fit an
    /// `i32` or a field is too wide for its digits (patch and, in the new scheme, minor must be below 100).
    pub fn code(self) -> Option<i32> {
        let Version {
            major,
            minor,
            patch,
        } = self;
        if patch >= 100 || minor >= 100 {
            return None;
        }
        let code = if major <= 2 && minor <= 8 {
            u64::from(major) * 1000 + u64::from(minor) * 100 + u64::from(patch)
        } else {
            u64::from(major) * 10_000 + u64::from(minor) * 100 + u64::from(patch)
        };
        i32::try_from(code).ok()
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_current_scheme() {
        assert_eq!(Version::from_code(22809), Ok(Version::new(2, 28, 9)));
        assert_eq!(Version::from_code(20900), Ok(Version::new(2, 9, 0)));
        assert_eq!(Version::from_code(21803), Ok(Version::new(2, 18, 3)));
        assert_eq!(Version::from_code(30001), Ok(Version::new(3, 0, 1)));
    }

    #[test]
    fn decodes_old_scheme() {
        assert_eq!(Version::from_code(2804), Ok(Version::new(2, 8, 4)));
        assert_eq!(Version::from_code(2408), Ok(Version::new(2, 4, 8)));
        assert_eq!(Version::from_code(2000), Ok(Version::new(2, 0, 0)));
    }

    #[test]
    fn header_version_matches_generated_constant() {
        let code = i32::try_from(crate::sys::NCCL_VERSION_CODE).unwrap();
        assert_eq!(Version::from_code(code), Ok(HEADER_VERSION));
        assert_eq!(HEADER_VERSION.major, crate::sys::NCCL_MAJOR);
        assert_eq!(HEADER_VERSION.minor, crate::sys::NCCL_MINOR);
        assert_eq!(HEADER_VERSION.patch, crate::sys::NCCL_PATCH);
    }

    #[test]
    fn rejects_codes_no_release_produces() {
        assert_eq!(
            Version::from_code(0),
            Err(VersionError::NotPositive { code: 0 })
        );
        assert_eq!(
            Version::from_code(-5),
            Err(VersionError::NotPositive { code: -5 })
        );
        // Old scheme with minor 9 cannot happen: 2.9 switched to the new scheme.
        assert_eq!(
            Version::from_code(2900),
            Err(VersionError::Malformed { code: 2900 })
        );
        // Major 0 in the old scheme.
        assert_eq!(
            Version::from_code(812),
            Err(VersionError::Malformed { code: 812 })
        );
        // New-scheme 2.8.x would have used the old scheme.
        assert_eq!(
            Version::from_code(20800),
            Err(VersionError::Malformed { code: 20800 })
        );
    }

    #[test]
    fn round_trips_every_plausible_release() {
        for major in 2..=3 {
            for minor in 0..=40 {
                for patch in [0, 1, 9, 42, 99] {
                    let v = Version::new(major, minor, patch);
                    let code = v.code().unwrap();
                    assert_eq!(Version::from_code(code), Ok(v), "{v} -> {code}");
                }
            }
        }
    }

    #[test]
    fn orders_like_releases() {
        assert!(Version::new(2, 9, 0) < Version::new(2, 10, 0));
        assert!(Version::new(2, 27, 7) < Version::new(2, 28, 0));
        assert!(Version::new(2, 28, 9) < Version::new(3, 0, 0));
        assert_eq!(Version::new(2, 8, 4).to_string(), "2.8.4");
    }

    #[test]
    fn errors_name_the_code() {
        let e = Version::from_code(2900).unwrap_err().to_string();
        assert!(e.contains("2900"), "{e}");
    }
}
