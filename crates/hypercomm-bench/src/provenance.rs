//! Where a benchmark's figures came from, written beside them in its JSON: the command line, when it ran (UTC),
//! the machine (host name, kernel, architecture, CPU model and count), the commit the benchmark was built from,
//! and how busy the machine was before and after (the 1-minute load average), so that figures can be compared only
//! with their own kind and a noisy sitting told apart.

use std::time::{SystemTime, UNIX_EPOCH};

/// The commit this crate was built from (see its build script); `None` outside a git checkout.
pub const COMMIT: Option<&str> = option_env!("HYPERCOMM_BENCH_COMMIT");

/// The 1-minute load average from `/proc/loadavg`, if this machine has one.
pub fn load_average() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// The first line of `path` without surrounding blanks, if it can be read and is not empty.
fn first_line(path: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().next()?.trim();
    (!line.is_empty()).then(|| line.to_owned())
}

/// The CPU model `/proc/cpuinfo` names first (`model name` on x86, `Model` or `CPU part` elsewhere).
fn cpu_model() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    text.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        let value = value.trim();
        (matches!(key.trim(), "model name" | "Model" | "CPU part") && !value.is_empty())
            .then(|| value.to_owned())
    })
}

/// The machine a benchmark runs on: `{"host", "kernel", "arch", "cpu_model", "cpus"}`, where `cpus` is how many
/// this process may use. What this machine cannot tell is `null`.
pub fn machine() -> serde_json::Value {
    serde_json::json!({
        "host": first_line("/proc/sys/kernel/hostname"),
        "kernel": first_line("/proc/sys/kernel/osrelease"),
        "arch": std::env::consts::ARCH,
        "cpu_model": cpu_model(),
        "cpus": std::thread::available_parallelism().ok().map(usize::from),
    })
}

/// Taken when a benchmark starts; [`Provenance::json`] adds what holds at its end.
pub struct Provenance {
    command: Vec<String>,
    started: SystemTime,
    load_before: Option<f64>,
}

impl Provenance {
    /// The command line of this process, the time and the load average, now.
    pub fn start() -> Provenance {
        Provenance {
            command: std::env::args().collect(),
            started: SystemTime::now(),
            load_before: load_average(),
        }
    }

    /// The load average when it started.
    pub fn load_before(&self) -> Option<f64> {
        self.load_before
    }

    /// `{"command", "started_utc", "unix_time_s", "commit", "machine", "load_average_before",
    /// "load_average_after"}` (see [`COMMIT`] and [`machine`]), the load after read now. What this machine or
    /// build cannot tell is `null`.
    pub fn json(&self) -> serde_json::Value {
        let secs = self
            .started
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        serde_json::json!({
            "command": self.command,
            "started_utc": utc(secs),
            "unix_time_s": secs,
            "commit": COMMIT,
            "machine": machine(),
            "load_average_before": self.load_before,
            "load_average_after": load_average(),
        })
    }
}

/// `secs` after the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ` (proleptic Gregorian calendar).
fn utc(secs: u64) -> String {
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01, counting in 400-year eras that start on 0000-03-01 (H. Hinnant's
    // days-to-civil algorithm): an era is 146,097 days, and starting the year in March puts the leap day last.
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3_600,
        rest / 60 % 60,
        rest % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates_cross_leap_days_months_and_centuries() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        // 2000 is a leap year (divisible by 400), 2100 is not.
        assert_eq!(utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc(951_868_799), "2000-02-29T23:59:59Z");
        assert_eq!(utc(951_868_800), "2000-03-01T00:00:00Z");
        assert_eq!(utc(4_107_456_000), "2100-02-28T00:00:00Z");
        assert_eq!(utc(4_107_542_400), "2100-03-01T00:00:00Z");
        assert_eq!(utc(1_795_427_245), "2026-11-23T09:47:25Z");
        assert_eq!(utc(1_767_225_599), "2025-12-31T23:59:59Z");
    }

    #[test]
    fn the_json_names_the_command_and_the_sitting() {
        let p = Provenance::start();
        let json = p.json();
        assert_eq!(json["command"][0], std::env::args().next().unwrap());
        assert!(json["started_utc"].as_str().unwrap().ends_with('Z'));
        assert!(json["unix_time_s"].as_u64().unwrap() > 1_700_000_000);
        // Either a number (Linux) or null, never missing.
        assert!(
            json.get("load_average_before").is_some() && json.get("load_average_after").is_some()
        );
        // Built in a git checkout: a full commit hash.
        if let Some(commit) = json["commit"].as_str() {
            assert!(
                commit.len() == 40 && commit.bytes().all(|b| b.is_ascii_hexdigit()),
                "{commit}"
            );
        }
        let machine = &json["machine"];
        assert_eq!(machine["arch"], std::env::consts::ARCH);
        assert!(machine["cpus"].as_u64().unwrap() >= 1, "{machine}");
        for key in ["host", "kernel", "cpu_model"] {
            assert!(machine.get(key).is_some(), "{key}: {machine}");
        }
    }
}
