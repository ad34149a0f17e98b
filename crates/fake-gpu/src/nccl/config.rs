//! The checks NCCL's `parseCommConfig` (2.28, 2.30) makes on an `ncclConfig_t`, with its quirks, and the log
//! line of every config the fake receives.

use std::ffi::{CStr, c_char};

use nccl_sys::sys::ncclConfig_t;

/// `NCCL_API_MAGIC`.
const MAGIC: u32 = 0xcafe_beef;
/// `NCCL_CONFIG_UNDEF_INT`.
const UNDEF: i32 = i32::MIN;

/// What NCCL would say, as `Err(its WARN text)`, when it refuses `config`.
pub(crate) fn check(config: &ncclConfig_t) -> Result<(), String> {
    if config.magic != MAGIC {
        return Err("ncclConfig_t argument not initialized via NCCL_CONFIG_INITIALIZER".into());
    }
    if config.size < 16 || config.size > 4096 {
        return Err(format!(
            "ncclConfig_t size {} is not a config's size",
            config.size
        ));
    }
    if config.version < 21400 {
        return Err(format!(
            "ncclConfig_t version {} predates configs (2.14)",
            config.version
        ));
    }
    if config.blocking != UNDEF && config.blocking != 0 && config.blocking != 1 {
        return Err(format!(
            "Invalid config blocking attribute value {}",
            config.blocking
        ));
    }
    if config.cgaClusterSize != UNDEF && config.cgaClusterSize < 0 {
        return Err(format!(
            "Invalid config cgaClusterSize attribute value {}",
            config.cgaClusterSize
        ));
    }
    // NCCL compares the two bounds even when one is unset (INT_MIN), so one bound alone is refused.
    let (lo, hi) = (config.minCTAs, config.maxCTAs);
    if (lo != UNDEF && lo <= 0) || (hi != UNDEF && hi <= 0) || lo > hi {
        return Err(format!(
            "Invalid config min/max channels attribute value {lo}/{hi}"
        ));
    }
    if config.splitShare != UNDEF && config.splitShare != 0 && config.splitShare != 1 {
        return Err(format!(
            "Invalid config splitShare attribute value {}",
            config.splitShare
        ));
    }
    Ok(())
}

fn text(p: *const c_char) -> String {
    if p.is_null() {
        "(null)".to_owned()
    } else {
        // SAFETY: the config's strings are null or NUL-terminated (the C API's contract, which callers keep).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// The line the fake logs for a config: every field hypercomm sets.
pub(crate) fn describe(c: &ncclConfig_t) -> String {
    format!(
        "blocking={} cgaClusterSize={} minCTAs={} maxCTAs={} splitShare={} trafficClass={} netName={} commName={}",
        c.blocking,
        c.cgaClusterSize,
        c.minCTAs,
        c.maxCTAs,
        c.splitShare,
        c.trafficClass,
        text(c.netName),
        text(c.commName)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use nccl_sys::config::config_initializer;

    #[test]
    fn refuses_what_nccl_refuses() {
        assert!(check(&config_initializer()).is_ok());
        let mut c = config_initializer();
        c.minCTAs = 1;
        let e = check(&c).unwrap_err();
        assert_eq!(
            e,
            "Invalid config min/max channels attribute value 1/-2147483648"
        );
        c.maxCTAs = 64;
        assert!(check(&c).is_ok());
        c.minCTAs = 8;
        c.maxCTAs = 4;
        assert!(check(&c).is_err());
        let mut c = config_initializer();
        c.maxCTAs = 4;
        assert!(check(&c).is_ok(), "max alone passes: INT_MIN > 4 is false");
        let mut c = config_initializer();
        c.magic = 0;
        assert!(check(&c).unwrap_err().contains("NCCL_CONFIG_INITIALIZER"));
        let mut c = config_initializer();
        c.cgaClusterSize = -3;
        assert!(check(&c).is_err());
        let mut c = config_initializer();
        c.blocking = 2;
        assert!(check(&c).is_err());
        let mut c = config_initializer();
        c.splitShare = 7;
        assert!(check(&c).is_err());
    }
}
