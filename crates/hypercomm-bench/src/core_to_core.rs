//! How long one cache line takes to travel between two CPUs and back: the latency under every shared-memory round.
//!
//! Two threads, each bound to one of the CPUs, take turns writing one shared counter; a round trip is one write
//! by each. A rank of the shared-memory transport pays this latency for every line a peer wrote, and a core keeps
//! only so many line transfers in flight, so the transport's throughput follows it. On a virtual machine the host
//! decides which physical cores the virtual CPUs run on, and the latency can change by several times from one
//! minute to the next: a slow window slows every size of a host collective while memory bandwidth stays the same,
//! and a very fast one (two hardware threads of one physical core, most likely) slows the in-cache sizes.
//! [`round_trip`] is how `hypercomm bench` tells these states apart: it reports [`probe`] before and after every
//! run. What was measured, and when, is in `docs/perf/`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::cpus::{Placement, bind_current_thread, rank_cpus};
use crate::stats::median;

/// Round trips timed together; the median over batches is reported, which ignores batches the scheduler
/// interrupted.
pub const TRIPS_PER_BATCH: usize = 100;

/// The result of [`round_trip`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RoundTrip {
    /// The two CPUs.
    pub cpus: (usize, usize),
    /// Median over the batches of the mean round trip in a batch, in nanoseconds.
    pub median_ns: f64,
    /// Batches of [`TRIPS_PER_BATCH`] round trips timed.
    pub batches: usize,
}

/// Why [`round_trip`] could not measure.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProbeError {
    /// Both CPUs are the same one: the threads would take turns on it and measure the scheduler.
    #[error("the two CPUs of a core-to-core probe must differ (both are {0})")]
    SameCpu(usize),
    /// No batch was asked for.
    #[error("a core-to-core probe needs at least one batch")]
    NoBatches,
    /// A thread could not be bound to its CPU.
    #[error("cannot bind a probe thread to CPU {cpu}: {error}")]
    Bind {
        /// The CPU.
        cpu: usize,
        /// Why the kernel refused.
        error: String,
    },
    /// The other thread stopped answering (its CPU taken away, or the machine badly overloaded).
    #[error("the core-to-core probe between CPUs {a} and {b} got no answer within {after:?}")]
    Timeout {
        /// The asking thread's CPU.
        a: usize,
        /// The answering thread's CPU.
        b: usize,
        /// The time allowed.
        after: Duration,
    },
}

/// The line the two threads pass back and forth, alone in its cache line (and the next, which adjacent-line
/// prefetchers pull along).
#[repr(align(128))]
struct Line(AtomicU64);

/// What the two threads share: the line they pass, and, on a line of its own (read, not written, while the probe
/// runs, so it adds no transfers), whether one of them gave up.
struct Shared {
    line: Line,
    abandoned: Line,
}

/// Why a probe thread stopped early.
enum Stop {
    /// It failed itself (the error says why).
    Failed(ProbeError),
    /// The other thread gave up first.
    Abandoned,
}

/// Spins until `line` holds `want`.
fn await_value(
    shared: &Shared,
    want: u64,
    deadline: Instant,
    late: &ProbeError,
) -> Result<(), Stop> {
    let mut spins = 0u32;
    while shared.line.0.load(Ordering::Acquire) != want {
        if shared.abandoned.0.load(Ordering::Acquire) != 0 {
            return Err(Stop::Abandoned);
        }
        std::hint::spin_loop();
        spins = spins.wrapping_add(1);
        if spins % 1024 == 0 && Instant::now() >= deadline {
            return Err(Stop::Failed(late.clone()));
        }
    }
    Ok(())
}

/// Runs one side of the probe on its own thread bound to `cpu`; on failure, tells the other side.
fn side<T>(shared: &Shared, cpu: usize, body: impl FnOnce() -> Result<T, Stop>) -> Result<T, Stop> {
    let bound = bind_current_thread(cpu).map_err(|e| {
        Stop::Failed(ProbeError::Bind {
            cpu,
            error: e.to_string(),
        })
    });
    let r = bound.and_then(|()| body());
    if r.is_err() {
        shared.abandoned.0.store(1, Ordering::Release);
    }
    r
}

/// Times `batches` batches of [`TRIPS_PER_BATCH`] round trips of one cache line between CPUs `a` and `b` (a new
/// thread bound to each; the caller's thread keeps its affinity), giving up after `timeout`.
///
/// ```
/// use std::time::Duration;
/// use hypercomm_bench::core_to_core::{round_trip, ProbeError};
///
/// assert_eq!(round_trip(0, 0, 10, Duration::from_secs(1)), Err(ProbeError::SameCpu(0)));
/// ```
pub fn round_trip(
    a: usize,
    b: usize,
    batches: usize,
    timeout: Duration,
) -> Result<RoundTrip, ProbeError> {
    if a == b {
        return Err(ProbeError::SameCpu(a));
    }
    if batches == 0 {
        return Err(ProbeError::NoBatches);
    }
    let shared = Shared {
        line: Line(AtomicU64::new(0)),
        abandoned: Line(AtomicU64::new(0)),
    };
    let deadline = Instant::now() + timeout;
    // A batch count too large to finish meets the deadline; it must not overflow on the way.
    let trips = (batches as u64).saturating_mul(TRIPS_PER_BATCH as u64);
    let late = ProbeError::Timeout {
        a,
        b,
        after: timeout,
    };
    let (asked, answered) = std::thread::scope(|scope| {
        let asker = scope.spawn(|| {
            side(&shared, a, || {
                let mut per_batch = Vec::with_capacity(batches.min(1 << 16));
                for batch in 0..batches as u64 {
                    let start = Instant::now();
                    let first = batch.saturating_mul(TRIPS_PER_BATCH as u64);
                    for i in first..first.saturating_add(TRIPS_PER_BATCH as u64) {
                        shared.line.0.store(2 * i + 1, Ordering::Release);
                        await_value(&shared, 2 * i + 2, deadline, &late)?;
                    }
                    per_batch.push(start.elapsed().as_nanos() as f64 / TRIPS_PER_BATCH as f64);
                }
                Ok(per_batch)
            })
        });
        // The answering thread turns every odd value into the next even one.
        let answerer = scope.spawn(|| {
            side(&shared, b, || {
                for i in 0..trips {
                    await_value(&shared, 2 * i + 1, deadline, &late)?;
                    shared.line.0.store(2 * i + 2, Ordering::Release);
                }
                Ok(())
            })
        });
        // The probe threads do not panic (no indexing, no unwrap); were one to, it reads as a failed probe.
        (
            asker
                .join()
                .unwrap_or_else(|_| Err(Stop::Failed(late.clone()))),
            answerer
                .join()
                .unwrap_or_else(|_| Err(Stop::Failed(late.clone()))),
        )
    });
    match (asked, answered) {
        (Ok(per_batch), Ok(())) => Ok(RoundTrip {
            cpus: (a, b),
            // `per_batch` has `batches` >= 1 entries, so the median exists.
            median_ns: median(&per_batch).unwrap_or(f64::NAN),
            batches,
        }),
        (Err(Stop::Failed(e)), _) | (_, Err(Stop::Failed(e))) => Err(e),
        // Each side abandons only after failing itself, so one of them holds the error; this arm is unreachable
        // in practice and reports the deadline rather than panic.
        _ => Err(late),
    }
}

/// Batches of round trips in each [`probe`] (each batch is [`TRIPS_PER_BATCH`] trips): a few milliseconds.
pub const PROBE_BATCHES: usize = 200;

/// How long a [`probe`] may take before it is reported as a timeout.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// The two CPUs whose round trip a benchmark reports: its ranks 0 and 1's when they are `bound` (to at least two
/// CPUs), otherwise the first two this process may use; `None` with fewer than two.
pub fn probe_pair(bound: Option<&[usize]>) -> Option<(usize, usize)> {
    match bound {
        Some(&[a, b, ..]) => Some((a, b)),
        _ => match rank_cpus(Placement::OneCpuEach, 2)?.as_slice() {
            &[a, b] => Some((a, b)),
            _ => None,
        },
    }
}

/// The median round trip in nanoseconds between the CPUs of `pair` ([`PROBE_BATCHES`] batches, up to
/// [`PROBE_TIMEOUT`]), or `None` without a pair to measure (see [`probe_pair`]).
pub fn probe(pair: Option<(usize, usize)>) -> Result<Option<f64>, ProbeError> {
    let Some((a, b)) = pair else {
        return Ok(None);
    };
    round_trip(a, b, PROBE_BATCHES, PROBE_TIMEOUT).map(|t| Some(t.median_ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_cpus() -> Option<(usize, usize)> {
        let cpus = rank_cpus(Placement::OneCpuEach, 2)?;
        Some((cpus[0], cpus[1]))
    }

    #[test]
    fn the_probe_takes_the_bound_ranks_cpus_or_the_first_two() {
        assert_eq!(probe_pair(Some(&[5, 3, 9])), Some((5, 3)));
        assert_eq!(probe_pair(Some(&[5])), two_cpus());
        assert_eq!(probe_pair(None), two_cpus());
        assert_eq!(probe(None), Ok(None));
        if let Some(pair) = two_cpus() {
            let ns = probe(Some(pair)).unwrap().unwrap();
            assert!(ns.is_finite() && ns > 0.0, "{ns}");
        }
    }

    #[test]
    fn a_round_trip_between_two_cpus_takes_a_positive_finite_time() {
        let Some((a, b)) = two_cpus() else {
            eprintln!("skipped: this process may use fewer than two CPUs");
            return;
        };
        let r = round_trip(a, b, 20, Duration::from_secs(30)).unwrap();
        assert_eq!((r.cpus, r.batches), ((a, b), 20));
        assert!(
            r.median_ns.is_finite() && r.median_ns > 0.0,
            "{}",
            r.median_ns
        );
    }

    #[test]
    fn a_batch_count_too_large_to_finish_ends_at_the_deadline() {
        let Some((a, b)) = two_cpus() else {
            eprintln!("skipped: this process may use fewer than two CPUs");
            return;
        };
        let timeout = Duration::from_millis(300);
        let r = round_trip(a, b, usize::MAX, timeout);
        assert_eq!(
            r,
            Err(ProbeError::Timeout {
                a,
                b,
                after: timeout
            })
        );
    }

    #[test]
    fn bad_arguments_are_refused_before_any_thread_starts() {
        assert_eq!(
            round_trip(3, 3, 5, Duration::from_secs(1)),
            Err(ProbeError::SameCpu(3))
        );
        assert_eq!(
            round_trip(0, 1, 0, Duration::from_secs(1)),
            Err(ProbeError::NoBatches)
        );
    }

    #[test]
    fn a_cpu_this_process_may_not_use_is_a_bind_error_on_either_side_without_waiting_out_the_timeout()
     {
        let max = rustix::thread::CpuSet::MAX_CPU;
        let usable = two_cpus().map_or(0, |(a, _)| a);
        let timeout = Duration::from_secs(60);
        // Repeated, because which side fails first varies from run to run.
        let cases = [(max - 1, max - 2), (usable, max - 1), (max - 1, usable)];
        for (a, b) in cases.into_iter().cycle().take(60) {
            let start = Instant::now();
            let r = round_trip(a, b, 5, timeout);
            assert!(
                matches!(r, Err(ProbeError::Bind { cpu, .. }) if cpu == max - 1 || cpu == max - 2),
                "({a}, {b}): {r:?}"
            );
            // The side that could bind learns of the failure at once instead of waiting for its peer.
            assert!(
                start.elapsed() < timeout / 2,
                "({a}, {b}) waited {:?}",
                start.elapsed()
            );
        }
    }
}
