//! [`Backoff`]: how a bounded wait on NCCL or the GPU paces its polls, cheap for what settles in microseconds and
//! easy on the CPU for what takes longer.

use std::time::{Duration, Instant};

/// How long a wait re-polls at once, on the CPU it has. An enqueue that answers `ncclInProgress`, or a small
/// collective's event, usually settles within microseconds, while the shortest `thread::sleep` costs the kernel's
/// timer slack (about 50 µs on Linux): sleeping from the first poll multiplies a two-rank all-reduce's host time
/// several times over (the GPU figures are in `docs/perf/nccl.md`). `yield_now` is no better on a busy machine: it
/// hands the core to another runnable thread for a whole time slice.
const SPIN: Duration = Duration::from_micros(50);

/// After [`SPIN`], how long a wait yields the core between polls before it starts to sleep.
const YIELD: Duration = Duration::from_micros(500);

/// Spin-loop hints between two polls while spinning: a few hundred nanoseconds (a `pause` takes 10-140 cycles
/// depending on the CPU), so that a wait notices NCCL settling within about that. 64 of them took up to 4 us on
/// CPUs with a slow `pause`, which a call that settles in a few microseconds pays on every wait.
const SPIN_PAUSES: u32 = 8;

/// Paces the polls of one bounded wait: spin for [`SPIN`], yield until [`YIELD`], then sleep with doubling
/// pauses up to `max`.
pub(crate) struct Backoff {
    started: Instant,
    pause: Duration,
    max: Duration,
}

impl Backoff {
    pub(crate) fn new(max: Duration) -> Backoff {
        Backoff {
            started: Instant::now(),
            pause: Duration::from_micros(5),
            max,
        }
    }

    /// Waits before the next poll.
    pub(crate) fn pause(&mut self) {
        let waited = self.started.elapsed();
        if waited < SPIN {
            for _ in 0..SPIN_PAUSES {
                std::hint::spin_loop();
            }
        } else if waited < YIELD {
            std::thread::yield_now();
        } else {
            std::thread::sleep(self.pause);
            self.pause = (self.pause * 2).min(self.max);
        }
    }
}
