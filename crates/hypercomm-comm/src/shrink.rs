//! [`Communicator::shrink`]: a new communicator over the ranks that are still alive, after a failure.
//!
//! This follows NCCL's `ncclCommShrink`: every surviving rank passes the same list of ranks to exclude (their
//! ranks in the parent), and gets a communicator over the others, in the parent's order. The parent may be broken
//! (that is the point); shrink never runs an operation on it, so a dead or stalled rank cannot block it.
//!
//! Host backend: the survivors first publish their exclusion lists under `comm/<child>/shrink-exclude/<rank>`
//! and compare them, so ranks that disagree about who is gone all get [`CommError::Mismatch`] instead of
//! bootstrapping different member sets; then they bootstrap the child like any new communicator.
//!
//! With a GPU, the child gets a new NCCL communicator over the survivors, its unique id exchanged through the
//! store after the exclusion lists agree, as any new communicator's. It does not call `ncclCommShrink` on the
//! parent's NCCL communicator: after a failure that one is aborted (so its handle is gone), and a fresh one works
//! with every NCCL version.

use std::sync::Arc;

use hypercomm_store::{Key, StoreError};

use crate::communicator::DeviceSource;
use crate::error::Call;
use crate::{CommError, CommOptions, Communicator};

impl Communicator {
    /// Shrinks the communicator to every rank not in `exclude` (ranks of this communicator, in any order), like
    /// `ncclCommShrink`. Collective over the survivors: each must pass the same set, and calls must come in the
    /// same order relative to other shrinks of this communicator. The child keeps the parent's member ids and
    /// order, is named `<parent>/shrink<n>` (`n` counts this communicator's shrinks) and inherits its options.
    ///
    /// Works on a broken communicator; the parent is left as it is (abort it when done with it). A survivor
    /// that never calls makes the others fail within the timeout, naming it.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use hypercomm_comm::{CommOptions, Communicator, ReduceOp};
    /// use hypercomm_store::MemoryStore;
    ///
    /// // Three ranks as threads; rank 2 leaves, ranks 0 and 1 carry on without it.
    /// let store = Arc::new(MemoryStore::new());
    /// let ranks: Vec<_> = (0..3)
    ///     .map(|me| {
    ///         let store = Arc::clone(&store);
    ///         std::thread::spawn(move || {
    ///             let comm = Communicator::world(store, 3, me, CommOptions::named("w"))?;
    ///             if me == 2 {
    ///                 return Ok(());
    ///             }
    ///             let small = comm.shrink(&[2])?;
    ///             assert_eq!((small.name(), small.ranks()), ("w/shrink0", &[0, 1][..]));
    ///             let sum = small.all_reduce(vec![1u32; 2], ReduceOp::Sum)?.wait()?;
    ///             assert_eq!(sum, vec![2, 2]);
    ///             Ok::<_, hypercomm_comm::CommError>(())
    ///         })
    ///     })
    ///     .collect();
    /// for r in ranks {
    ///     r.join().unwrap()?;
    /// }
    /// # Ok::<(), hypercomm_comm::CommError>(())
    /// ```
    pub fn shrink(&self, exclude: &[usize]) -> Result<Communicator, CommError> {
        self.shrink_with(exclude, self.options().clone())
    }

    /// [`shrink`](Self::shrink) with other options for the child; `options.name` is replaced by the derived name.
    pub fn shrink_with(
        &self,
        exclude: &[usize],
        options: CommOptions,
    ) -> Result<Communicator, CommError> {
        let id = self.next_shrink();
        let name = format!("{}/shrink{id}", self.name());
        let excluded = crate::checks::exclusions(self.name(), self.size(), self.rank(), exclude)?;
        let options = CommOptions { name, ..options };
        Communicator::check_options(self.gpu().map(|g| &**g), &options)?;
        let survivors: Vec<usize> = (0..self.size())
            .filter(|r| excluded.binary_search(r).is_err())
            .collect();
        self.agree_on_exclusions(&options, &excluded, &survivors)?;
        let ids: Vec<usize> = survivors.iter().map(|&r| self.ranks()[r]).collect();
        let me = self.ranks()[self.rank()];
        let device = self.gpu().map(|gpu| DeviceSource::Fresh(Arc::clone(gpu)));
        Communicator::create(Arc::clone(self.store()), ids, me, options, device)
    }

    /// Publishes this rank's exclusion list and checks that every survivor passed the same one.
    fn agree_on_exclusions(
        &self,
        options: &CommOptions,
        excluded: &[usize],
        survivors: &[usize],
    ) -> Result<(), CommError> {
        let child = options.name.as_str();
        let key = |r: usize| Key::new("comm").push(child).push("shrink-exclude").push(r);
        let store_err = |source| CommError::Store {
            comm: child.to_owned(),
            source,
        };
        // As member ids, so that a disagreement names what the callers meant.
        let ids: Vec<usize> = excluded.iter().map(|&r| self.ranks()[r]).collect();
        let encoded = format!("{ids:?}");
        let store = self.store().as_ref();
        store
            .set(&key(self.rank()), encoded.as_bytes())
            .map_err(store_err)?;
        let keys: Vec<Key> = survivors.iter().map(|&r| key(r)).collect();
        match store.wait(&keys, options.timeout) {
            Ok(()) => {}
            Err(StoreError::Timeout { missing, after }) => {
                let ids: Vec<usize> = survivors
                    .iter()
                    .filter(|&&r| missing.contains(&key(r)))
                    .map(|&r| self.ranks()[r])
                    .collect();
                return Err(CommError::Timeout {
                    comm: child.to_owned(),
                    members: survivors.iter().map(|&r| self.ranks()[r]).collect(),
                    missing: ids.clone(),
                    after,
                    during: format!(
                        "shrink of {}: rank(s) {ids:?} never called shrink",
                        self.name()
                    ),
                    cause: None,
                });
            }
            Err(e) => return Err(store_err(e)),
        }
        // Every survivor's list, grouped: the sides of a disagreement, in member ids.
        let mut sides: Vec<Call> = Vec::new();
        for &r in survivors {
            let theirs = store.get(&key(r), options.timeout).map_err(store_err)?;
            let call = format!("shrink excluding {}", String::from_utf8_lossy(&theirs));
            match sides.iter_mut().find(|c| c.call == call) {
                Some(side) => side.ranks.push(self.ranks()[r]),
                None => sides.push(Call {
                    ranks: vec![self.ranks()[r]],
                    call,
                }),
            }
        }
        if sides.len() > 1 {
            let members = survivors.iter().map(|&r| self.ranks()[r]).collect();
            return Err(CommError::mismatch(child, members, sides));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use hypercomm_store::{MemoryStore, Store};

    use crate::{CommError, CommOptions, Communicator, ReduceOp};

    fn options(name: &str, tcp: bool) -> CommOptions {
        CommOptions {
            timeout: Duration::from_secs(2),
            force_tcp: tcp,
            ..CommOptions::named(name)
        }
    }

    /// Runs `f(comm)` on `n` threads, one rank each, over one store; returns the results in rank order.
    fn on_threads<R: Send + 'static>(
        n: usize,
        options: CommOptions,
        f: impl Fn(Communicator) -> R + Send + Sync + 'static,
    ) -> Vec<R> {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let f = Arc::new(f);
        let handles: Vec<_> = (0..n)
            .map(|me| {
                let (store, options, f) = (Arc::clone(&store), options.clone(), Arc::clone(&f));
                std::thread::spawn(move || f(Communicator::world(store, n, me, options).unwrap()))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn survivors_of_a_stalled_rank_shrink_and_reduce_correctly() {
        for tcp in [false, true] {
            let results = on_threads(4, options(&format!("s{tcp}"), tcp), |comm| {
                let me = comm.rank();
                if me == 1 {
                    // The "lost" rank: stays silent until the others gave up on it, then leaves.
                    std::thread::sleep(Duration::from_secs(4));
                    return None;
                }
                let start = Instant::now();
                let err = comm
                    .all_reduce(vec![1u32; 100], ReduceOp::Sum)
                    .unwrap()
                    .wait()
                    .unwrap_err();
                let waited = start.elapsed();
                let text = err.to_string();
                let small = comm.shrink(&[1]).unwrap();
                let sum = small
                    .all_reduce(vec![me as u32 + 1; 100], ReduceOp::Sum)
                    .unwrap()
                    .wait()
                    .unwrap();
                Some((
                    text,
                    waited,
                    small.name().to_owned(),
                    small.ranks().to_vec(),
                    sum,
                ))
            });
            for (r, res) in results.into_iter().enumerate() {
                let Some((text, waited, name, ranks, sum)) = res else {
                    assert_eq!(r, 1);
                    continue;
                };
                assert!(text.contains(&format!("s{tcp}")), "{text}");
                assert!(text.contains("[1]"), "names the lost rank: {text}");
                assert!(waited < Duration::from_secs(10), "{waited:?}");
                assert_eq!(name, format!("s{tcp}/shrink0"));
                assert_eq!(ranks, vec![0, 2, 3]);
                assert_eq!(sum, vec![1 + 3 + 4; 100]);
            }
        }
    }

    #[test]
    fn disagreeing_exclusions_fail_on_every_survivor() {
        let results = on_threads(3, options("dis", false), |comm| {
            // Rank 0 thinks rank 2 is gone; ranks 1 and 2 think nobody is.
            let exclude: &[usize] = if comm.rank() == 0 { &[2] } else { &[] };
            comm.shrink(exclude)
                .map(|c| c.size())
                .map_err(|e| (e.to_string(), e.culprits().to_vec()))
        });
        for (r, res) in results.iter().enumerate() {
            let (e, culprits) = res.as_ref().unwrap_err();
            assert!(e.contains("dis/shrink0"), "{e}");
            assert!(
                e.contains("ranks disagree") && e.contains("shrink excluding [2]"),
                "{e}"
            );
            // Ranks 1 and 2 see all three lists: the majority excludes nobody, so rank 0 is to blame. Rank 0 sees
            // only its own survivors' lists (0 and 1), a tie settled for the lowest member.
            if r > 0 {
                assert_eq!(culprits, &vec![0], "{e}");
            }
        }
    }

    #[test]
    fn bad_exclusion_lists_are_rejected_before_anything_is_published() {
        let results = on_threads(3, options("bad", false), |comm| {
            let me = comm.rank();
            let errs = [
                comm.shrink(&[3]).unwrap_err().to_string(),
                comm.shrink(&[(me + 1) % 3, (me + 1) % 3])
                    .unwrap_err()
                    .to_string(),
                comm.shrink(&[me]).unwrap_err().to_string(),
            ];
            // Still usable afterwards.
            let sum = comm.all_reduce(vec![1u8], ReduceOp::Sum).unwrap().wait();
            (errs, sum.unwrap())
        });
        for (errs, sum) in results {
            assert!(
                errs[0].contains("rank 3, which is not a rank of a 3-rank"),
                "{}",
                errs[0]
            );
            assert!(errs[1].contains("twice"), "{}", errs[1]);
            assert!(errs[2].contains("excludes itself"), "{}", errs[2]);
            assert!(errs.iter().all(|e| e.contains("communicator bad")));
            assert_eq!(sum, vec![3]);
        }
    }

    #[test]
    fn a_survivor_that_never_calls_shrink_is_named() {
        let results = on_threads(3, options("late", false), |comm| {
            if comm.rank() == 2 {
                std::thread::sleep(Duration::from_secs(3));
                return None;
            }
            Some(comm.shrink(&[]).map(|_| ()).unwrap_err())
        });
        for e in results.into_iter().flatten() {
            match &e {
                CommError::Timeout { missing, comm, .. } => {
                    assert_eq!(missing, &vec![2]);
                    assert_eq!(comm, "late/shrink0");
                }
                other => panic!("expected a timeout, got {other}"),
            }
            assert!(
                e.to_string().contains("rank(s) [2] never called shrink"),
                "{e}"
            );
        }
    }
}
