//! [`OpGroup`]: operations on one or several communicators of this rank, issued together as one NCCL group, each
//! with its own handle.
//!
//! What it is for: Megatron's `_coalescing_manager`, which issues a bucket's reduce-scatters as one launch; weight
//! synchronisation in RL, which issues many broadcasts at once; and twin communicators (a collection's all-gather
//! twins) whose operations ranks issue in different orders: NCCL connects a communicator's peers on its first
//! operation, which waits for every rank, so two ranks that first use two communicators in opposite orders wait on
//! each other, unless both operations are in one group, which connects them together.
//!
//! How: while a communicator is in a group, each operation on a device buffer is checked and builds its NCCL
//! calls as usual but is recorded instead of enqueued (see `backends/nccl/communicator/group.rs`), and returns
//! its usual [`Work`](crate::Work). [`OpGroup::end`] issues every recorded call between one `ncclGroupStart`
//! and `ncclGroupEnd` and completes the handles. Operations on host vectors are not held: they run as they would
//! outside a group, each communicator's lane progressing them in the background, so host operations on different
//! communicators progress together already.

use std::sync::Arc;

use super::Communicator;
use crate::CommError;
use crate::backends::nccl::communicator::group::Recording;

/// Operations on the communicators of a group, issued together when the group ends: on device buffers as one NCCL
/// group (`ncclGroupStart`, every operation's calls, `ncclGroupEnd`), each operation keeping its own
/// [`Work`](crate::Work) handle.
///
/// [`start`](Self::start) puts the communicators in the group; every operation issued on one of them until
/// [`end`](Self::end), from any thread, belongs to it. [`run`](Self::run) does both around a closure. A device
/// operation's handle completes only after the end: waiting on it before fails at once (it has not started, so a
/// wait could only hang), and polling it says it is not complete. Operations on host vectors run as they always
/// do, at once, and may be waited on inside the group.
///
/// Refused with an error naming the communicators, before anything is recorded: a communicator already in
/// another open group; communicators whose NCCL flavors differ in `NcclOptions::blocking` (NCCL refuses blocking
/// and non-blocking communicators in one group) or load different NCCL libraries; inside the group, a barrier on
/// a communicator with a GPU, raw NCCL calls and the strided all-reduce of a non-contiguous view (each would run
/// before the operations the group issues at its end); and an operation issued while the group is ending.
///
/// Dropping a group without [`end`](Self::end) issues none of its operations: their handles fail saying so, their
/// buffers are released, and the communicators leave the group. The peers' matching operations then wait until
/// their timeout, as for any rank that stops midway.
///
/// ```
/// use std::sync::Arc;
/// use hypercomm_comm::{CommError, CommOptions, Communicator, OpGroup, ReduceOp};
/// use hypercomm_store::{MemoryStore, Store};
///
/// // Two ranks as threads, each with a dp and a tp communicator over both.
/// let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
/// let ranks: Vec<_> = (0..2)
///     .map(|me| {
///         let store = Arc::clone(&store);
///         std::thread::spawn(move || -> Result<(), CommError> {
///             let dp = Communicator::world(Arc::clone(&store), 2, me, CommOptions::named("dp"))?;
///             let tp = Communicator::world(store, 2, me, CommOptions::named("tp"))?;
///             // One handle per operation; on device buffers the four run as one NCCL group.
///             let (grads, weights) = OpGroup::run(&[&dp, &tp], || {
///                 let grads = (0..2)
///                     .map(|b| dp.reduce_scatter(vec![b as f32 + me as f32; 4], ReduceOp::Sum))
///                     .collect::<Result<Vec<_>, _>>()?;
///                 let weights = (0..2)
///                     .map(|_| tp.broadcast(vec![me as u32; 3], 0))
///                     .collect::<Result<Vec<_>, _>>()?;
///                 Ok((grads, weights))
///             })?;
///             for (b, work) in grads.into_iter().enumerate() {
///                 let block = work.wait()?[2 * me..2 * me + 2].to_vec();
///                 assert_eq!(block, [2.0 * b as f32 + 1.0; 2]);
///             }
///             for work in weights {
///                 assert_eq!(work.wait()?, [0; 3]);
///             }
///             Ok(())
///         })
///     })
///     .collect();
/// for r in ranks {
///     r.join().unwrap()?;
/// }
/// # Ok::<(), CommError>(())
/// ```
#[must_use = "a group issues its device operations only at end(); dropping it issues none"]
pub struct OpGroup<'a> {
    /// The communicators, each once, in the order given.
    comms: Vec<&'a Communicator>,
    recording: Arc<Recording>,
    /// Whether [`end`](Self::end) has not run yet (so that dropping the group abandons it).
    open: bool,
}

impl std::fmt::Debug for OpGroup<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpGroup")
            .field("communicators", &self.recording.label())
            .field("open", &self.open)
            .finish()
    }
}

impl<'a> OpGroup<'a> {
    /// Starts a group over `comms` (a communicator listed twice counts once): every operation issued on them from
    /// now until [`end`](Self::end) belongs to it. Fails, leaving every communicator as it was, when one of them
    /// is in another open group, or when their NCCL flavors cannot share one NCCL group (they differ in
    /// `NcclOptions::blocking`, or load different NCCL libraries).
    pub fn start(comms: &[&'a Communicator]) -> Result<OpGroup<'a>, CommError> {
        let mut members: Vec<&'a Communicator> = Vec::with_capacity(comms.len());
        for &c in comms {
            if !members.iter().any(|m| std::ptr::eq(*m, c)) {
                members.push(c);
            }
        }
        let names: Vec<&str> = members.iter().map(|c| c.name()).collect();
        let label = format!("[{}]", names.join(", "));
        Self::check_device_flavors(&members, &label)?;
        let recording = Recording::new(label);
        for (i, c) in members.iter().enumerate() {
            if let Err(other) = c.group.join(&recording) {
                for joined in &members[..i] {
                    joined.group.leave(&recording);
                }
                return Err(c.invalid(format!(
                    "is already in an open OpGroup over {}; end that group before starting one over {}",
                    other.label(),
                    recording.label()
                )));
            }
        }
        Ok(OpGroup {
            comms: members,
            recording,
            open: true,
        })
    }

    /// Runs `issue` inside a group over `comms` and ends the group: the handles `issue` returns complete as
    /// usual. When `issue` fails, the group is dropped without issuing anything, and its error returned.
    pub fn run<R>(
        comms: &[&'a Communicator],
        issue: impl FnOnce() -> Result<R, CommError>,
    ) -> Result<R, CommError> {
        let group = OpGroup::start(comms)?;
        let handles = issue()?;
        group.end()?;
        Ok(handles)
    }

    /// Ends the group: the device operations issued in it are enqueued on the calling thread, every call of every
    /// operation between one `ncclGroupStart` and `ncclGroupEnd`, in the order they were issued (waiting, on
    /// non-blocking communicators, until NCCL has taken them), then each operation's handle gets its event, and
    /// the communicators leave the group. On an NCCL error every handle not yet completed fails with it, and so
    /// does this.
    pub fn end(mut self) -> Result<(), CommError> {
        self.open = false;
        let issued = self.recording.issue();
        self.leave();
        issued
    }

    /// Takes every communicator out of the group.
    fn leave(&self) {
        for c in &self.comms {
            c.group.leave(&self.recording);
        }
    }

    /// The NCCL flavors of `comms` must be able to share one NCCL group: all blocking or all non-blocking, and on
    /// one loaded NCCL.
    fn check_device_flavors(comms: &[&Communicator], label: &str) -> Result<(), CommError> {
        let mut device = comms.iter().filter_map(|c| c.nccl().map(|d| (c, d)));
        let Some((first, reference)) = device.next() else {
            return Ok(());
        };
        let mode = |non_blocking: bool| {
            if non_blocking {
                "non-blocking"
            } else {
                "blocking (NcclOptions::blocking)"
            }
        };
        for (c, d) in device {
            if d.non_blocking() != reference.non_blocking() {
                return Err(c.invalid(format!(
                    "cannot join an OpGroup over {label}: it is {} but {} is {}, and NCCL refuses blocking and \
                     non-blocking communicators in one group",
                    mode(d.non_blocking()),
                    first.name(),
                    mode(reference.non_blocking())
                )));
            }
            if !Arc::ptr_eq(d.gpu().runtime(), reference.gpu().runtime()) {
                return Err(c.invalid(format!(
                    "cannot join an OpGroup over {label}: its NCCL ({}) is another library than {}'s ({}), and one \
                     NCCL group runs on one library",
                    d.gpu().runtime().nccl().origin(),
                    first.name(),
                    reference.gpu().runtime().nccl().origin()
                )));
            }
        }
        Ok(())
    }
}

impl Drop for OpGroup<'_> {
    /// A group dropped without [`end`](OpGroup::end) issues nothing: its device operations' handles fail, saying
    /// so, and the communicators leave the group.
    fn drop(&mut self) {
        if self.open {
            self.recording.abandon();
            self.leave();
        }
    }
}

#[cfg(test)]
mod tests {
    //! Groups over communicators without a GPU: membership and its refusals, which every flavor shares (the
    //! device half runs under fake-gpu in `tests/fake_ranks/groups.rs`).

    use std::sync::Arc;

    use hypercomm_store::MemoryStore;

    use super::*;
    use crate::{CommOptions, ReduceOp};

    fn single(name: &str) -> Communicator {
        Communicator::world(Arc::new(MemoryStore::new()), 1, 0, CommOptions::named(name))
            .expect("one-rank communicator")
    }

    #[test]
    fn a_communicator_is_in_one_open_group_at_a_time() {
        let (a, b) = (single("a"), single("b"));
        let first = OpGroup::start(&[&a, &a]).unwrap();
        let e = OpGroup::start(&[&b, &a]).expect_err("a is in a group");
        assert_eq!(
            e.to_string(),
            "communicator a: is already in an open OpGroup over [a]; end that group before starting one over \
             [b, a]"
        );
        // The refused group holds nothing: b is free, and a is free once its group is dropped.
        OpGroup::start(&[&b]).unwrap().end().unwrap();
        drop(first);
        OpGroup::start(&[&a, &b]).unwrap().end().unwrap();
    }

    #[test]
    fn host_operations_run_inside_a_group_and_a_failed_closure_ends_it() {
        let a = single("host");
        let sum = OpGroup::run(&[&a], || {
            // Not held: it completes before the group ends.
            a.all_reduce(vec![2u32; 3], ReduceOp::Sum)?.wait()
        })
        .unwrap();
        assert_eq!(sum, [2; 3]);
        let e = OpGroup::run(&[&a], || a.broadcast(vec![1u8], 3)).expect_err("root 3 of one rank");
        assert!(e.to_string().contains("root 3"), "{e}");
        drop(OpGroup::start(&[&a]).expect("the failed run left a in no group"));
    }
}
