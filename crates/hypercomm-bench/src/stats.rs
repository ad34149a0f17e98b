//! The one [`median`] every benchmark of the workspace reports, and what it can be taken of ([`Sample`]).
//!
//! Benchmarks report medians rather than means: one iteration that the scheduler interrupted, or one run on a
//! machine that was briefly busy, moves a mean by as much as it likes and a median hardly at all.

use std::time::Duration;

/// A value a [`median`] can be taken of: ordered, with a value halfway between two of them.
pub trait Sample: Copy + PartialOrd {
    /// The value halfway between `a` and `b`.
    fn midpoint(a: Self, b: Self) -> Self;
}

impl Sample for f64 {
    fn midpoint(a: f64, b: f64) -> f64 {
        f64::midpoint(a, b)
    }
}

impl Sample for Duration {
    fn midpoint(a: Duration, b: Duration) -> Duration {
        let (lo, hi) = (a.min(b), a.max(b));
        lo + (hi - lo) / 2
    }
}

/// The median of `values`: the middle value of an odd count, **the mean of the two middle values** of an even
/// count; `None` for no values.
///
/// Why this convention: it is the textbook median, the one numpy, Python's `statistics.median` and R compute, so a
/// figure recomputed from the values a benchmark writes to its JSON (every run's time with `hypercomm bench
/// --runs`) is the figure it reported; and it leans neither way, where picking one of the two middle values
/// reports the slower half's best (the upper middle) or the faster half's worst (the lower middle). The price is
/// that for an even count the median need not be a measured value: a summary that shows one run per size
/// ([`runs::Summary`](crate::runs::Summary)) builds that size's result from the median time.
///
/// Values that do not compare (a NaN) sort as equal to their neighbours rather than panic; timings have none.
///
/// ```
/// use std::time::Duration;
/// use hypercomm_bench::median;
///
/// assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
/// assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
/// assert_eq!(
///     median(&[Duration::from_micros(9), Duration::from_micros(2)]),
///     Some(Duration::from_nanos(5_500))
/// );
/// assert_eq!(median::<f64>(&[]), None);
/// ```
pub fn median<T: Sample>(values: &[T]) -> Option<T> {
    let mut sorted = values.to_vec();
    sorted.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let n = sorted.len();
    let upper = *sorted.get(n / 2)?;
    if n % 2 == 1 {
        return Some(upper);
    }
    Some(T::midpoint(sorted[n / 2 - 1], upper))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_odd_count_takes_the_middle_and_an_even_count_the_mean_of_the_two_middles() {
        assert_eq!(median(&[5.0, 1.0, 9.0, 3.0, 7.0]), Some(5.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[7.0]), Some(7.0));
        assert_eq!(median(&[2.0, 8.0]), Some(5.0));
        // Equal middles: their mean is that value.
        assert_eq!(median(&[1.0, 4.0, 4.0, 9.0]), Some(4.0));
        assert_eq!(
            median(&[
                Duration::from_micros(9),
                Duration::from_micros(2),
                Duration::from_micros(4),
                Duration::from_micros(100),
            ]),
            Some(Duration::from_micros(6) + Duration::from_nanos(500))
        );
        assert_eq!(median::<f64>(&[]), None);
        assert_eq!(median::<Duration>(&[]), None);
    }

    #[test]
    fn a_midpoint_neither_overflows_nor_depends_on_the_order() {
        assert_eq!(f64::midpoint(f64::MAX, f64::MAX), f64::MAX);
        let (a, b) = (Duration::MAX, Duration::MAX - Duration::from_secs(2));
        assert_eq!(
            Sample::midpoint(a, b),
            Duration::MAX - Duration::from_secs(1)
        );
        assert_eq!(Sample::midpoint(b, a), Sample::midpoint(a, b));
    }

    #[test]
    fn a_nan_does_not_panic() {
        assert!(median(&[1.0, f64::NAN, 3.0]).is_some());
    }
}
