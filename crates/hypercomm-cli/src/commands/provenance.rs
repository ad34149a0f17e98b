//! Where a benchmark's figures came from, written beside them in its JSON: the command line, when it ran (UTC), and
//! how busy the machine was before and after (the 1-minute load average), so that figures from a noisy machine can
//! be told apart and compared only with their own sitting.

use std::time::{SystemTime, UNIX_EPOCH};

use super::bench_runs::load_average;

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

    /// `{"command", "started_utc", "unix_time_s", "load_average_before", "load_average_after"}`, the load after read
    /// now. A load average this machine cannot tell is `null`.
    pub fn json(&self) -> serde_json::Value {
        let secs = self
            .started
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        serde_json::json!({
            "command": self.command,
            "started_utc": utc(secs),
            "unix_time_s": secs,
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
    }
}
