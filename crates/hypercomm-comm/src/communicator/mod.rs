//! [`Communicator`]: the one public face of every backend.
//!
//! A communicator is created collectively by every member rank from a store, a rank list and [`CommOptions`].
//! Each collective checks its local arguments at once (wrong lengths, roots and peers are errors before anything
//! is sent), then moves its buffers into a job on the communicator's lane, where jobs run one at a time in issue
//! order, and returns a [`Work`] handle that gives the buffers back. A job runs on the thread that waits on it
//! when it is next (the usual issue-then-wait), otherwise on the communicator's progress thread.
//!
//! The progress thread starts with the first operation, not with the communicator: a collection builds a
//! communicator for every group of a layout (22 kinds), and the groups a program never uses then cost no thread.
//! [`Communicator::barrier_now`] runs a barrier on the caller's thread while nothing is queued, so that the
//! collection's closing barrier on each group costs none either.
//!
//! The queue and the progress thread are in `lane`; what runs a job on the backend, in `engine`; the collectives,
//! each a job, in `collectives`.

mod collectives;
mod engine;
mod lane;
mod symmetric;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use hypercomm_store::Store;

use crate::CommError;
use crate::backend::Backend;
use crate::backends::host::HostBackend;
use crate::failure::{self, Context, FailureDomain};
use crate::options::{BackendKind, CommOptions};
use crate::work::{RunInline, Work, pair};

use engine::{Engine, Job, lock};
use lane::Lane;

/// What an out-of-place operation gives back: its `(input, output)` buffers.
pub type InOut<T> = (Vec<T>, Vec<T>);

/// A communicator over a fixed list of ranks.
///
/// ```
/// use std::sync::Arc;
/// use hypercomm_comm::{BackendKind, CommOptions, Communicator, ReduceOp};
/// use hypercomm_store::MemoryStore;
///
/// // Two ranks as two threads sharing a store.
/// let store = Arc::new(MemoryStore::new());
/// let ranks: Vec<_> = (0..2)
///     .map(|me| {
///         let store = Arc::clone(&store);
///         std::thread::spawn(move || {
///             let comm = Communicator::new(BackendKind::Host, store, vec![0, 1], me, CommOptions::named("doc"))?;
///             let sum = comm.all_reduce(vec![me as f32 + 1.0; 4], ReduceOp::Sum)?.wait()?;
///             assert_eq!(sum, vec![3.0; 4]);
///             Ok::<_, hypercomm_comm::CommError>(())
///         })
///     })
///     .collect();
/// for r in ranks {
///     r.join().unwrap()?;
/// }
/// # Ok::<(), hypercomm_comm::CommError>(())
/// ```
pub struct Communicator {
    name: String,
    rank: usize,
    ranks: Vec<usize>,
    kind: BackendKind,
    options: CommOptions,
    store: Arc<dyn Store>,
    transport: &'static str,
    shared: Arc<Shared>,
    domain: Arc<FailureDomain>,
    splits: AtomicU64,
    shrinks: AtomicU64,
    /// The symmetric windows, when the options ask for them (see [`crate::symmetric`]).
    windows: Option<Arc<crate::symmetric::Windows>>,
}

/// What a communicator shares with its [`FailureDomain`]: enough to abort it from another communicator's
/// progress thread.
pub(crate) struct Shared {
    broken: Arc<Mutex<Option<String>>>,
    lane: Arc<Lane>,
}

impl Shared {
    /// Marks the communicator broken with `cause` and tells its peers, unless it is broken already (then it has
    /// told them itself). Queued operations fail fast; one in flight ends on its own (its peers stop it).
    pub(crate) fn abort_with(&self, cause: &str) {
        {
            let mut broken = lock(&self.broken);
            if broken.is_some() {
                return;
            }
            *broken = Some(cause.to_owned());
        }
        self.lane.close(true);
    }
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("name", &self.name)
            .field("rank", &self.rank)
            .field("ranks", &self.ranks)
            .field("backend", &self.kind)
            .field("transport", &self.transport)
            .finish()
    }
}

impl Communicator {
    /// Joins the communicator `options.name` whose members are `ranks` (ids in any numbering the caller uses,
    /// for example global ranks), as member `me`. Every member must call this with the same list and name; the
    /// call returns once all have connected (or fails after `options.timeout`). This rank's rank in the
    /// communicator is `me`'s position in `ranks`.
    pub fn new(
        kind: BackendKind,
        store: Arc<dyn Store>,
        ranks: Vec<usize>,
        me: usize,
        options: CommOptions,
    ) -> Result<Communicator, CommError> {
        options.validate_for(kind)?;
        let rank = crate::checks::member_position(&options.name, &ranks, me)?;
        let domain = match &options.failure_domain {
            Some(d) if d.rank() != me => {
                return Err(crate::checks::invalid(
                    &options.name,
                    format!(
                        "joined as rank {me} but its failure domain belongs to rank {}",
                        d.rank()
                    ),
                ));
            }
            Some(d) => Arc::clone(d),
            None => FailureDomain::new(
                Arc::clone(&store),
                hypercomm_store::Key::new("comm")
                    .push(options.name.as_str())
                    .push("failure"),
                me,
            ),
        };
        let cx = Context {
            comm: &options.name,
            timeout: options.timeout,
        };
        let backend: Box<dyn Backend> = match kind {
            BackendKind::Host => Box::new(
                HostBackend::connect(store.as_ref(), ranks.len(), rank, &options)
                    .map_err(|e| domain.settle(failure::to_members(e, &ranks), &cx))?,
            ),
        };
        let transport = backend.transport_name();
        let windows = backend.symmetric_windows();
        let broken = Arc::new(Mutex::new(None));
        let engine = Engine {
            backend,
            broken: Arc::clone(&broken),
            comm: options.name.clone(),
            domain: Arc::clone(&domain),
            members: ranks.clone(),
            timeout: options.timeout,
        };
        let shared = Arc::new(Shared {
            broken,
            lane: Lane::new(&options.name, Box::new(engine)),
        });
        domain.register(&shared);
        Ok(Communicator {
            name: options.name.clone(),
            rank,
            ranks,
            kind,
            options,
            store,
            transport,
            shared,
            domain,
            splits: AtomicU64::new(0),
            shrinks: AtomicU64::new(0),
            windows,
        })
    }

    /// The communicator over ranks `0..size`, as rank `rank`.
    pub fn world(
        kind: BackendKind,
        store: Arc<dyn Store>,
        size: usize,
        rank: usize,
        options: CommOptions,
    ) -> Result<Communicator, CommError> {
        Communicator::new(kind, store, (0..size).collect(), rank, options)
    }

    /// This rank's rank within the communicator.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.ranks.len()
    }

    /// The communicator's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The member list it was created with (`ranks()[rank()]` is this rank's id).
    pub fn ranks(&self) -> &[usize] {
        &self.ranks
    }

    /// The options it was created with.
    pub fn options(&self) -> &CommOptions {
        &self.options
    }

    /// The backend.
    pub fn backend(&self) -> BackendKind {
        self.kind
    }

    /// The transport the backend chose (`"shm"` or `"tcp"` for the host backend).
    pub fn transport(&self) -> &'static str {
        self.transport
    }

    /// The store it bootstrapped through.
    pub(crate) fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The number of the next shrink of this communicator (each call takes one).
    pub(crate) fn next_shrink(&self) -> u64 {
        self.shrinks.fetch_add(1, Ordering::Relaxed)
    }

    /// The first fatal error, if the communicator is broken.
    pub fn broken(&self) -> Option<String> {
        lock(&self.shared.broken).clone()
    }

    /// The member ids of this communicator's ranks at `positions` (ranks within it, as `shrink` takes them).
    ///
    /// Fails naming the first position that is not a rank of this communicator.
    pub fn ids_of(&self, positions: &[usize]) -> Result<Vec<usize>, CommError> {
        positions
            .iter()
            .map(|&p| {
                self.ranks.get(p).copied().ok_or_else(|| {
                    self.invalid(format!(
                        "{p} is not a rank of this {}-rank communicator",
                        self.size()
                    ))
                })
            })
            .collect()
    }

    /// The positions within this communicator (ranks as `shrink` takes them) of the member ids `ids`, such as the
    /// world ranks of [`CommError::lost_ranks`]. Fails naming the first id that is not a member.
    pub fn positions_of(&self, ids: &[usize]) -> Result<Vec<usize>, CommError> {
        ids.iter()
            .map(|&id| {
                self.ranks.iter().position(|&m| m == id).ok_or_else(|| {
                    self.invalid(format!("rank {id} is not a member of {:?}", self.ranks))
                })
            })
            .collect()
    }

    /// The failure domain the communicator reports to: the one in its options, or its own.
    pub fn failure_domain(&self) -> &Arc<FailureDomain> {
        &self.domain
    }

    fn invalid(&self, what: String) -> CommError {
        crate::checks::invalid(&self.name, what)
    }

    fn check_root(&self, root: usize) -> Result<(), CommError> {
        crate::checks::root(&self.name, self.size(), root)
    }

    fn check_len(&self, what: &str, got: usize, expected: usize) -> Result<(), CommError> {
        crate::checks::len(&self.name, what, got, expected)
    }

    fn check_multiple(&self, what: &str, len: usize) -> Result<(), CommError> {
        if len % self.size() != 0 {
            return Err(self.invalid(format!(
                "{what} has {len} elements, not a multiple of {} ranks",
                self.size()
            )));
        }
        Ok(())
    }

    fn submit<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut dyn Backend) -> Result<R, CommError> + Send + 'static,
    ) -> Result<Work<R>, CommError> {
        if let Some(cause) = self.broken() {
            return Err(CommError::Broken {
                comm: self.name.clone(),
                cause,
            });
        }
        let (work, done) = pair(&self.name);
        let job: Job = Box::new(move |engine: &mut Engine| done.complete(engine.execute(f)));
        let id = self.shared.lane.push(job)?;
        Ok(work.runs_inline(Arc::clone(&self.shared.lane) as Arc<dyn RunInline>, id))
    }

    /// A barrier run to completion on the calling thread without queueing it, when nothing is queued or running
    /// (so a communicator whose only operation is this barrier never starts a thread, as a collection's closing
    /// barriers are); otherwise `barrier()?.wait()`, after the queued operations. Errors, failure reporting and
    /// timeouts are those of [`barrier`](Self::barrier). An abort from another thread meanwhile takes effect
    /// when the barrier ends, as it would after an operation already queued.
    pub fn barrier_now(&self) -> Result<(), CommError> {
        // A broken communicator fails either way: the engine checks before running, `barrier()` before queueing.
        let Some(mut engine) = self.shared.lane.borrow_idle() else {
            return self.barrier()?.wait();
        };
        let result = engine.execute(|b| b.barrier());
        self.shared.lane.give_back(engine);
        result
    }

    /// Splits the communicator, with NCCL's semantics: ranks passing the same `color` form a new communicator,
    /// ordered by `key` and then by rank here; `None` (NCCL's `NCCL_SPLIT_NOCOLOR`) joins nothing and returns
    /// `None`. Collective: every rank must call it, in the same order relative to other splits. The child's name
    /// is `<parent>/split<n>/color<c>`, where `n` counts this communicator's splits, so repeated splits never
    /// collide. The child inherits the parent's options.
    pub fn split(&self, color: Option<u32>, key: i64) -> Result<Option<Communicator>, CommError> {
        self.split_with(color, key, self.options.clone())
    }

    /// [`split`](Self::split) with other options for the child (like `ncclCommSplit`'s config argument).
    /// `options.name` is replaced by the derived child name.
    pub fn split_with(
        &self,
        color: Option<u32>,
        key: i64,
        options: CommOptions,
    ) -> Result<Option<Communicator>, CommError> {
        let mut children = self.split_many(vec![(color, key, options)])?;
        // One split asked for, one child to take; `None` only if the iterator were already spent.
        children.next().unwrap_or(Ok(None))
    }

    /// Many splits at once: `splits[i]` is the `(color, key, options)` of the `i`-th split, with the same
    /// semantics, names and order as that many calls of [`split_with`](Self::split_with), but one all-gather of
    /// every rank's colors and keys instead of one per split. Collective: every rank must pass the same number of
    /// splits. The children are created as the returned iterator is advanced, in order, so that the caller can
    /// interleave its own steps between them; every rank must take every child, as it would call every split.
    pub fn split_many(
        &self,
        splits: Vec<(Option<u32>, i64, CommOptions)>,
    ) -> Result<Splits<'_>, CommError> {
        let count = splits.len();
        let first = self.splits.fetch_add(count as u64, Ordering::Relaxed);
        let mine: Vec<u64> = splits
            .iter()
            .flat_map(|(color, key, _)| [color.map_or(u64::MAX, u64::from), *key as u64])
            .collect();
        let (_, all) = if count == 0 {
            (Vec::new(), Vec::new())
        } else {
            let n = self.size();
            self.all_gather_into(mine, vec![0u64; 2 * count * n])?
                .wait()?
        };
        Ok(Splits {
            parent: self,
            all,
            count,
            first,
            pending: splits.into_iter(),
        })
    }

    /// Gives up on the communicator: marks it broken, tells the peers (their pending and later operations fail
    /// at once), lets queued operations fail fast and stops the progress thread (joined when the communicator is
    /// dropped). Every later operation fails with [`CommError::Broken`]. Takes `&self`, as the device
    /// communicator's does, so a communicator shared (say, by a collection) can be aborted.
    pub fn abort(&self) {
        let first = lock(&self.shared.broken).is_none();
        lock(&self.shared.broken).get_or_insert_with(|| "aborted by this rank".to_owned());
        if first {
            // A deliberate abort loses no rank; saying so spares the peers the wait for a failure record (unless
            // this rank already recorded a failure in its domain, which stays its record).
            self.domain.record_abort();
        }
        self.shared.lane.close(true);
        // Drop joins the progress thread.
    }
}

/// The children of [`Communicator::split_many`], each created (collectively, with its members) when taken.
pub struct Splits<'a> {
    parent: &'a Communicator,
    /// Every rank's `(color, key)` per split: rank `r`'s for split `i` at `2 * (r * count + i)`.
    all: Vec<u64>,
    count: usize,
    /// The parent's split number of split 0.
    first: u64,
    pending: std::vec::IntoIter<(Option<u32>, i64, CommOptions)>,
}

impl std::fmt::Debug for Splits<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Splits")
            .field("parent", &self.parent.name)
            .field("count", &self.count)
            .field("taken", &(self.count - self.pending.len()))
            .finish()
    }
}

impl Iterator for Splits<'_> {
    type Item = Result<Option<Communicator>, CommError>;

    fn next(&mut self) -> Option<Self::Item> {
        // The index of the split about to be taken: those already taken.
        let i = self.count - self.pending.len();
        let (color, _, options) = self.pending.next()?;
        let Some(color) = color else {
            return Some(Ok(None));
        };
        let parent = self.parent;
        let n = parent.size();
        let (all, count) = (&self.all, self.count);
        let mut members: Vec<(i64, usize)> = (0..n)
            .filter(|r| all[2 * (r * count + i)] == u64::from(color))
            .map(|r| (all[2 * (r * count + i) + 1] as i64, r))
            .collect();
        members.sort_unstable();
        let ranks = members.iter().map(|&(_, r)| parent.ranks[r]).collect();
        let options = CommOptions {
            name: format!(
                "{}/split{}/color{color}",
                parent.name,
                self.first + i as u64
            ),
            ..options
        };
        Some(
            Communicator::new(
                parent.kind,
                Arc::clone(&parent.store),
                ranks,
                parent.ranks[parent.rank],
                options,
            )
            .map(Some),
        )
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.pending.size_hint()
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // The progress thread ends after the operations already issued (an engine that never ran an operation
        // retires here).
        self.shared.lane.shut();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use hypercomm_store::MemoryStore;

    use super::Communicator;
    use crate::{BackendKind, CommOptions, ReduceOp};

    /// How many threads of this process carry `name` (Linux truncates thread names to 15 bytes).
    fn threads_named(name: &str) -> usize {
        let short = &name[..name.len().min(15)];
        std::fs::read_dir("/proc/self/task")
            .map(|tasks| {
                tasks
                    .filter_map(Result::ok)
                    .filter(|t| {
                        std::fs::read_to_string(t.path().join("comm"))
                            .is_ok_and(|c| c.trim_end() == short)
                    })
                    .count()
            })
            .unwrap_or(0)
    }

    /// [`threads_named`], once it reaches `at_least` or after 5 s: a new thread names itself when it first
    /// runs, which may be a moment after the operation that started it (which ran on the waiting thread).
    fn threads_named_soon(name: &str, at_least: usize) -> usize {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let count = threads_named(name);
            if count >= at_least || std::time::Instant::now() >= deadline {
                return count;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    #[test]
    fn the_progress_thread_starts_with_the_first_operation_and_ends_with_the_communicator() {
        let store = Arc::new(MemoryStore::new());
        let comm = Communicator::world(BackendKind::Host, store, 1, 0, CommOptions::named("lzy"))
            .expect("one-rank communicator");
        assert_eq!(
            threads_named("hypercomm-lzy"),
            0,
            "no thread before any operation"
        );
        let sum = comm
            .all_reduce(vec![2.0f32], ReduceOp::Sum)
            .and_then(|w| w.wait())
            .expect("all-reduce");
        assert_eq!(sum, [2.0]);
        assert_eq!(
            threads_named_soon("hypercomm-lzy", 1),
            1,
            "the first operation started it"
        );
        drop(comm);
        assert_eq!(
            threads_named("hypercomm-lzy"),
            0,
            "dropping the communicator joined it"
        );
    }

    #[test]
    fn an_idle_communicator_aborts_and_drops_without_a_thread() {
        let store = Arc::new(MemoryStore::new());
        let comm = Communicator::world(BackendKind::Host, store, 1, 0, CommOptions::named("lzi"))
            .expect("one-rank communicator");
        comm.abort();
        assert_eq!(threads_named("hypercomm-lzi"), 0);
        let err = comm
            .all_reduce(vec![1.0f32], ReduceOp::Sum)
            .expect_err("an aborted communicator runs nothing");
        assert!(matches!(err, crate::CommError::Broken { .. }), "{err}");
        assert_eq!(threads_named("hypercomm-lzi"), 0, "not even to fail");
    }

    /// Runs `f(rank, comm)` on `n` threads, each with its rank of a host communicator `name` over one store.
    fn on_ranks<T: Send + 'static>(
        n: usize,
        name: &'static str,
        f: impl Fn(usize, Communicator) -> T + Send + Sync + 'static,
    ) -> Vec<T> {
        let store = Arc::new(MemoryStore::new());
        let f = Arc::new(f);
        let threads: Vec<_> = (0..n)
            .map(|me| {
                let (store, f) = (Arc::clone(&store), Arc::clone(&f));
                std::thread::spawn(move || {
                    let comm = Communicator::world(
                        BackendKind::Host,
                        store,
                        n,
                        me,
                        CommOptions::named(name),
                    )
                    .expect("communicator");
                    f(me, comm)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("rank thread"))
            .collect()
    }

    #[test]
    fn barrier_now_runs_on_the_calling_thread_and_starts_no_progress_thread() {
        let seen = on_ranks(2, "bnw", |_, comm| {
            comm.barrier_now().expect("first barrier");
            comm.barrier_now().expect("second barrier");
            // Both ranks are past their barriers here: any progress thread of theirs would still be alive.
            let idle = threads_named("hypercomm-bnw");
            comm.barrier_now().expect("third barrier");
            let sum = comm
                .all_reduce(vec![1.0f32], ReduceOp::Sum)
                .and_then(|w| w.wait())
                .expect("all-reduce");
            // The progress thread exists now; with nothing queued, this barrier still runs here.
            comm.barrier_now()
                .expect("barrier after the thread started");
            (idle, sum, threads_named_soon("hypercomm-bnw", 1) >= 1)
        });
        for (idle, sum, running) in seen {
            assert_eq!(idle, 0, "barrier_now started a progress thread");
            assert_eq!(sum, [2.0]);
            assert!(running, "the all-reduce started no progress thread");
        }
    }

    #[test]
    fn an_operation_waited_on_when_it_is_next_runs_on_the_waiting_thread() {
        let ran_here = on_ranks(2, "inl", |_, comm| {
            (0..3)
                .map(|_| {
                    let on = comm
                        .submit(|b| {
                            b.barrier()?;
                            Ok(std::thread::current().id())
                        })
                        .and_then(|w| w.wait())
                        .expect("barrier");
                    on == std::thread::current().id()
                })
                .collect::<Vec<bool>>()
        });
        for seen in ran_here {
            assert_eq!(seen, [true, true, true]);
        }
    }

    #[test]
    fn operations_nobody_waits_on_or_polls_complete_on_the_progress_thread() {
        let seen = on_ranks(2, "bgd", |_, comm| {
            let unwaited = |comm: &Communicator| {
                let work = comm
                    .submit(|b| {
                        b.barrier()?;
                        Ok(std::thread::current().id())
                    })
                    .expect("barrier");
                // No wait and no poll for a while: only the progress thread can run it meanwhile.
                std::thread::sleep(std::time::Duration::from_millis(100));
                let completed = work.is_completed();
                (
                    completed,
                    work.wait().expect("barrier") != std::thread::current().id(),
                )
            };
            comm.barrier()
                .and_then(|w| w.wait())
                .expect("first barrier");
            // Quiet for longer than the busy window: the progress thread sleeps until a job wakes it.
            std::thread::sleep(std::time::Duration::from_millis(200));
            let after_quiet = unwaited(&comm);
            // Busy (a job issued just now): the progress thread naps, and a job does not wake it.
            comm.barrier().and_then(|w| w.wait()).expect("busy barrier");
            let while_busy = unwaited(&comm);
            (after_quiet, while_busy)
        });
        for (after_quiet, while_busy) in seen {
            assert_eq!(
                after_quiet,
                (true, true),
                "(completed, elsewhere) after a quiet spell"
            );
            assert_eq!(
                while_busy,
                (true, true),
                "(completed, elsewhere) while busy"
            );
        }
    }

    #[test]
    fn waiting_on_a_later_operation_first_keeps_the_issue_order() {
        let seen = on_ranks(2, "ord", |me, comm| {
            let order = Arc::new(std::sync::Mutex::new(Vec::new()));
            let log = |step: u32| {
                let order = Arc::clone(&order);
                move |b: &mut dyn crate::backend::Backend| {
                    b.barrier()?;
                    super::lock(&order).push(step);
                    Ok(step)
                }
            };
            let first = comm.submit(log(1)).expect("first");
            let second = comm.submit(log(2)).expect("second");
            // Rank 1 waits on the second first: it cannot run before the first, here or anywhere.
            let results = if me == 1 {
                let b = second.wait().expect("second");
                (first.wait().expect("first"), b)
            } else {
                (first.wait().expect("first"), second.wait().expect("second"))
            };
            (results, super::lock(&order).clone())
        });
        for (results, order) in seen {
            assert_eq!(results, (1, 2));
            assert_eq!(order, [1, 2]);
        }
    }

    #[test]
    fn barrier_now_on_an_aborted_communicator_is_broken_and_tells_the_peer() {
        let seen = on_ranks(2, "bna", |me, comm| {
            if me == 0 {
                comm.abort();
                let err = comm.barrier_now().expect_err("aborted");
                return matches!(err, crate::CommError::Broken { .. });
            }
            // Rank 1 waits in its barrier until rank 0's abort reaches it, well within the 5-minute timeout.
            let start = std::time::Instant::now();
            let failed = comm.barrier_now().is_err();
            failed && start.elapsed() < std::time::Duration::from_secs(60)
        });
        assert_eq!(seen, [true, true]);
    }

    #[test]
    fn an_abort_during_barrier_now_takes_effect_when_the_barrier_ends() {
        let seen = on_ranks(2, "bnd", |me, comm| {
            if me == 1 {
                // Let rank 0 wait in its barrier while its communicator is aborted from another thread.
                std::thread::sleep(std::time::Duration::from_millis(300));
                // Rank 0's barrier completes once this rank arrives, and its deferred abort follows at once. If
                // that abort lands before this rank has looked at the finished round, the transport refuses to
                // consume it (after an abort nothing more is consumed), so this barrier may fail too, and then
                // as aborted by rank 0; otherwise it succeeds and the abort fails the next operation. Either way
                // the abort reaches this rank promptly, not after the 5-minute timeout.
                let start = std::time::Instant::now();
                let failure = match comm.barrier_now() {
                    Ok(()) => comm.barrier_now().err(),
                    Err(e) => Some(e)
                        .filter(|e| matches!(e, crate::CommError::AbortedByPeer { by: 0, .. })),
                };
                return failure.is_some() && start.elapsed() < std::time::Duration::from_secs(60);
            }
            std::thread::scope(|s| {
                s.spawn(|| {
                    std::thread::sleep(std::time::Duration::from_millis(100));
                    comm.abort();
                });
                // The barrier borrowed the engine before the abort: it completes with rank 1's.
                comm.barrier_now().expect("rank 0's barrier");
            });
            matches!(comm.barrier_now(), Err(crate::CommError::Broken { .. }))
        });
        assert_eq!(seen, [true, true]);
    }

    #[test]
    fn split_many_names_and_orders_children_as_that_many_splits_do() {
        let seen = on_ranks(4, "spm", |me, comm| {
            let named = |n: &str| CommOptions::named(n);
            // Split 0: even and odd ranks, ordered by descending rank; split 1: only ranks 0 and 3; split 2:
            // everyone in one color.
            let parity = Some((me % 2) as u32);
            let pair = [0, 3].contains(&me).then_some(7);
            let children: Vec<Option<Communicator>> = comm
                .split_many(vec![
                    (parity, -(me as i64), named("a")),
                    (pair, 0, named("b")),
                    (Some(1), 0, named("c")),
                ])
                .expect("split_many")
                .collect::<Result<_, _>>()
                .expect("children");
            let summary: Vec<Option<(String, Vec<usize>)>> = children
                .iter()
                .map(|c| {
                    c.as_ref()
                        .map(|c| (c.name().to_owned(), c.ranks().to_vec()))
                })
                .collect();
            // Each child works, and a later split is numbered after the batch.
            for child in children.iter().flatten() {
                child.barrier_now().expect("child barrier");
            }
            let later = comm.split(Some(0), 0).expect("split").expect("child");
            (summary, later.name().to_owned())
        });
        for (me, (summary, later)) in seen.into_iter().enumerate() {
            let parity = if me % 2 == 0 { vec![2, 0] } else { vec![3, 1] };
            assert_eq!(
                summary[0],
                Some((format!("spm/split0/color{}", me % 2), parity)),
                "rank {me}"
            );
            let pair = [0, 3]
                .contains(&me)
                .then(|| ("spm/split1/color7".to_owned(), vec![0, 3]));
            assert_eq!(summary[1], pair, "rank {me}");
            assert_eq!(
                summary[2],
                Some(("spm/split2/color1".to_owned(), vec![0, 1, 2, 3])),
                "rank {me}"
            );
            assert_eq!(later, "spm/split3/color0");
        }
    }
}
