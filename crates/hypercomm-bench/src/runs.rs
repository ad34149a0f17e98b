//! Several runs of one benchmark summarised per size: the median of the runs' medians and their spread
//! (`hypercomm bench --runs N`).
//!
//! One run of a small-message benchmark on a shared machine can be lucky or unlucky (a rank that once sleeps on
//! the futex moves its median by tens of microseconds), so targets such as "median under 8 µs in five consecutive
//! runs" are judged on this summary, with the machine's load average before and after
//! ([`provenance::load_average`](crate::provenance::load_average)).

use crate::op::BenchResult;
use crate::stats::median;

/// The runs' results gathered per size.
pub struct Summary {
    /// Per size (in the order measured), every run's result for it.
    sizes: Vec<Vec<BenchResult>>,
}

impl Summary {
    /// Gathers `runs` (each run's results in size order; every run measured the same sizes).
    pub fn of(runs: &[Vec<BenchResult>]) -> Summary {
        let per_run = runs.iter().map(Vec::len).min().unwrap_or(0);
        let sizes = (0..per_run)
            .map(|i| runs.iter().map(|run| run[i].clone()).collect())
            .collect();
        Summary { sizes }
    }

    /// Per size, the result at the [`median`] of the runs' times (the median run's for an odd count; for an even
    /// count, the mean of the two middle times, with the bandwidths that time gives).
    pub fn median_results(&self) -> Vec<BenchResult> {
        self.sizes
            .iter()
            .filter_map(|runs| {
                let times: Vec<f64> = runs.iter().map(|r| r.time_us).collect();
                let time_us = median(&times)?;
                let first = runs.first()?;
                Some(BenchResult::new(
                    first.op,
                    first.ranks,
                    first.count,
                    time_us,
                    first.transport,
                ))
            })
            .collect()
    }

    /// The summary table: size, median time, min and max time, and busbw at the median.
    pub fn table(&self) -> String {
        let mut out = format!(
            "{:>12} {:>13} {:>11} {:>11} {:>13}\n",
            "size(B)", "median(us)", "min(us)", "max(us)", "busbw(GB/s)"
        );
        for (runs, med) in self.sizes.iter().zip(self.median_results()) {
            let (min, max) = spread(runs);
            out += &format!(
                "{:>12} {:>13.2} {:>11.2} {:>11.2} {:>13.3}\n",
                med.bytes, med.time_us, min, max, med.busbw_gbps
            );
        }
        out
    }

    /// The summary as JSON: the load averages and, per size, every run's time and busbw with their median.
    pub fn json(&self, load_before: Option<f64>, load_after: Option<f64>) -> serde_json::Value {
        let sizes: Vec<_> = self
            .sizes
            .iter()
            .zip(self.median_results())
            .map(|(runs, med)| {
                let (min, max) = spread(runs);
                serde_json::json!({
                    "bytes": med.bytes,
                    "time_us": runs.iter().map(|r| r.time_us).collect::<Vec<_>>(),
                    "busbw_GBps": runs.iter().map(|r| r.busbw_gbps).collect::<Vec<_>>(),
                    "median_time_us": med.time_us,
                    "min_time_us": min,
                    "max_time_us": max,
                })
            })
            .collect();
        serde_json::json!({
            "runs": self.sizes.first().map_or(0, Vec::len),
            "load_average_before": load_before,
            "load_average_after": load_after,
            "sizes": sizes,
        })
    }
}

/// The fastest and slowest of the runs' times.
fn spread(runs: &[BenchResult]) -> (f64, f64) {
    runs.iter().fold((f64::INFINITY, 0.0_f64), |(lo, hi), r| {
        (lo.min(r.time_us), hi.max(r.time_us))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::BenchOp;

    fn result(bytes: usize, time_us: f64) -> BenchResult {
        BenchResult::new(BenchOp::AllReduce, 2, bytes / 4, time_us, "shm")
    }

    #[test]
    fn the_summary_takes_each_sizes_median_run_and_spread() {
        let runs = vec![
            vec![result(4, 6.0), result(1024, 20.0)],
            vec![result(4, 50.0), result(1024, 10.0)],
            vec![result(4, 5.0), result(1024, 30.0)],
            vec![result(4, 9.0), result(1024, 25.0)],
            vec![result(4, 7.0), result(1024, 15.0)],
        ];
        let summary = Summary::of(&runs);
        let med = summary.median_results();
        assert_eq!(
            med.iter().map(|r| (r.bytes, r.time_us)).collect::<Vec<_>>(),
            [(4, 7.0), (1024, 20.0)]
        );
        let json = summary.json(Some(1.5), None);
        assert_eq!(json["runs"], 5);
        assert_eq!(json["load_average_after"], serde_json::Value::Null);
        assert_eq!(json["sizes"][0]["min_time_us"], 5.0);
        assert_eq!(json["sizes"][0]["max_time_us"], 50.0);
        assert_eq!(json["sizes"][1]["time_us"][2], 30.0);
        let table = summary.table();
        assert!(
            table.lines().nth(1).is_some_and(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols[..4] == ["4", "7.00", "5.00", "50.00"]
            }),
            "{table}"
        );
    }

    #[test]
    fn an_even_count_takes_the_mean_of_the_two_middle_runs_like_every_other_bench() {
        let runs = vec![
            vec![result(4096, 8.0)],
            vec![result(4096, 2.0)],
            vec![result(4096, 5.0)],
            vec![result(4096, 3.0)],
        ];
        let med = &Summary::of(&runs).median_results()[0];
        assert_eq!((med.bytes, med.time_us), (4096, 4.0));
        // The bandwidths are those of the median time, not of any one run.
        assert_eq!(med.algbw_gbps, 4096.0 / 4e3);
        assert_eq!(med.busbw_gbps, med.algbw_gbps);
        assert!(Summary::of(&[]).median_results().is_empty());
    }
}
