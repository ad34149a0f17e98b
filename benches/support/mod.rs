//! A small timing harness for `cargo bench` targets with `harness = false`: run a closure many times and report
//! the median, so one noisy sample does not move the figure.

#![allow(dead_code)]

use std::hint::black_box;
use std::time::{Duration, Instant};

/// The median of `samples` timings of `f`, after one warm-up call. Each sample runs `f` `iters` times and the
/// result is the time per call.
pub fn median_per_call<R>(samples: usize, iters: usize, mut f: impl FnMut() -> R) -> Duration {
    black_box(f());
    let mut times: Vec<Duration> = (0..samples.max(1))
        .map(|_| {
            let start = Instant::now();
            for _ in 0..iters.max(1) {
                black_box(f());
            }
            start.elapsed() / iters.max(1) as u32
        })
        .collect();
    times.sort();
    times[times.len() / 2]
}

/// Formats a duration with a unit that keeps three significant digits.
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

/// Whether the bench was started by `cargo test --benches` (a quick smoke run) rather than `cargo bench`.
pub fn smoke_run() -> bool {
    !std::env::args().any(|a| a == "--bench")
}
