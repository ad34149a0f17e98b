//! A small timing harness for the workspace's `cargo bench` targets (`harness = false`): run a closure many times
//! and report the [`median`], so one noisy sample does not move the figure.

use std::hint::black_box;
use std::time::{Duration, Instant};

use crate::stats::median;

/// The median of `samples` timings of `f`, after one warm-up call. Each sample runs `f` `iters` times and the
/// result is the time per call.
///
/// ```
/// use hypercomm_bench::harness::median_per_call;
///
/// let per_call = median_per_call(5, 100, || (0..100u64).sum::<u64>());
/// assert!(per_call.as_secs() < 1);
/// ```
pub fn median_per_call<R>(samples: usize, iters: usize, mut f: impl FnMut() -> R) -> Duration {
    black_box(f());
    let iters = iters.max(1);
    let times: Vec<Duration> = (0..samples.max(1))
        .map(|_| {
            let start = Instant::now();
            for _ in 0..iters {
                black_box(f());
            }
            start.elapsed() / u32::try_from(iters).unwrap_or(u32::MAX)
        })
        .collect();
    // At least one sample was taken, so the median exists.
    median(&times).unwrap_or_default()
}

/// Formats a duration with a unit that keeps three significant digits.
///
/// ```
/// use std::time::Duration;
/// use hypercomm_bench::harness::human;
///
/// assert_eq!(human(Duration::from_nanos(950)), "950.0 ns");
/// assert_eq!(human(Duration::from_micros(1_500)), "1.50 ms");
/// ```
pub fn human(d: Duration) -> String {
    let ns = d.as_secs_f64() * 1e9;
    if ns < 1e3 {
        format!("{ns:.1} ns")
    } else if ns < 1e6 {
        format!("{:.2} µs", ns / 1e3)
    } else if ns < 1e9 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.2} s", ns / 1e9)
    }
}

/// Whether the bench was started by `cargo test --benches` (a quick smoke run) rather than `cargo bench`, which
/// passes `--bench`.
pub fn smoke_run() -> bool {
    !std::env::args().any(|a| a == "--bench")
}
