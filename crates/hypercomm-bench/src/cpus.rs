//! Where a benchmark's rank threads run: bound one to a CPU, as MPI and nccl-tests bind ranks to cores, or left to
//! the scheduler.
//!
//! Left to the scheduler, the two threads of a 2-rank run on a 2-core machine sometimes share one core for a whole
//! run (most likely the scheduler waking a thread on its waker's core: two threads that take turns never look busy
//! enough to be split again). Such a run measures the scheduler, not the collective: it shows the figures of a run
//! confined to one core with `taskset -c 0`. Binding rank `i` to the `i`-th CPU the process may use rules that out.

/// Where the rank threads of a benchmark run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Placement {
    /// Rank `i` is bound to the `i`-th CPU this process may run on, when there are at least as many CPUs as
    /// ranks; with more ranks than CPUs the threads float (see [`rank_cpus`]).
    #[default]
    OneCpuEach,
    /// The scheduler places the threads and may move them.
    Free,
}

impl Placement {
    /// How a benchmark's JSON names it: `one-cpu-each` or `free`.
    pub fn name(self) -> &'static str {
        match self {
            Placement::OneCpuEach => "one-cpu-each",
            Placement::Free => "free",
        }
    }
}

/// The CPUs this process may run on, in order; empty when the affinity mask cannot be read.
pub fn allowed_cpus() -> Vec<usize> {
    let Ok(allowed) = rustix::thread::sched_getaffinity(None) else {
        return Vec::new();
    };
    (0..rustix::thread::CpuSet::MAX_CPU)
        .filter(|&c| allowed.is_set(c))
        .collect()
}

/// The CPU each rank thread is bound to under `placement`: `Some(cpus)`, rank `i` on `cpus[i]`, or `None` when
/// the threads float ([`Placement::Free`], more ranks than CPUs this process may use, or an affinity mask that
/// cannot be read).
///
/// ```
/// use hypercomm_bench::cpus::{Placement, rank_cpus};
///
/// assert_eq!(rank_cpus(Placement::Free, 2), None);
/// if let Some(cpus) = rank_cpus(Placement::OneCpuEach, 1) {
///     assert_eq!(cpus.len(), 1);
/// }
/// ```
pub fn rank_cpus(placement: Placement, ranks: usize) -> Option<Vec<usize>> {
    if placement == Placement::Free {
        return None;
    }
    let cpus: Vec<usize> = allowed_cpus().into_iter().take(ranks).collect();
    (cpus.len() == ranks).then_some(cpus)
}

/// Binds the calling thread to `cpu` alone (the rank threads of [`host`](crate::host), the probe threads of
/// [`core_to_core`](crate::core_to_core)).
pub fn bind_current_thread(cpu: usize) -> rustix::io::Result<()> {
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    rustix::thread::sched_setaffinity(None, &set)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_get_distinct_allowed_cpus_or_float_when_there_are_too_few() {
        let allowed = allowed_cpus();
        assert!(!allowed.is_empty(), "a test process may run somewhere");
        let cpus = rank_cpus(Placement::OneCpuEach, allowed.len()).expect("one CPU per rank");
        assert_eq!(cpus, allowed);
        assert_eq!(rank_cpus(Placement::OneCpuEach, allowed.len() + 1), None);
        assert_eq!(rank_cpus(Placement::Free, 1), None);
    }

    #[test]
    fn a_bound_thread_runs_on_its_cpu_alone() {
        let allowed = allowed_cpus();
        let last = *allowed.last().expect("some CPU");
        let seen = std::thread::spawn(move || {
            bind_current_thread(last).unwrap();
            allowed_cpus()
        })
        .join()
        .unwrap();
        assert_eq!(seen, [last]);
        // The caller's own mask is untouched.
        assert_eq!(allowed_cpus(), allowed);
    }
}
