//! The device half of an [`OpGroup`](crate::OpGroup): operations recorded while their communicator is grouped,
//! and issued together, as one NCCL group, when the group ends.
//!
//! While a communicator's [`GroupMark`] holds a group's [`Recording`], each device operation on it takes its
//! buffers' addresses and builds its NCCL calls as it always does, but records them instead of enqueueing them;
//! its handle holds a [`Deferred`] slot where an event would be. [`Recording::issue`] enqueues every recorded
//! call, of every communicator of the group, between one `ncclGroupStart` and one `ncclGroupEnd` on the calling
//! thread, waits for the communicators to settle when NCCL answers `ncclInProgress` (non-blocking ones), and
//! records each operation's event on its communicator's stream, which completes its handle as usual.
//!
//! Recording rather than opening NCCL's group at once keeps NCCL's group state, which belongs to a thread, out of
//! the user's hands: operations may be issued from any thread, a group dropped without ending issues nothing
//! ([`Recording::abandon`]), and a handle waited on before the end fails rather than hangs.

use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::CudaStream;

use super::super::comm::NcclComm;
use super::super::events::SharedEvent;
use super::super::gpu::{DeviceBuffer, Gpu, cuda_err};
use super::super::raw::{self, Call, Progress};
use crate::CommError;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Critical sections only read or replace a value; a poisoned lock still holds a consistent one.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Which open group, if any, a communicator is in: one per communicator, shared by its face and its NCCL flavor,
/// so that both see the same group.
#[derive(Default)]
pub(crate) struct GroupMark {
    group: Mutex<Option<Arc<Recording>>>,
}

impl GroupMark {
    /// The open group the communicator is in.
    pub(crate) fn current(&self) -> Option<Arc<Recording>> {
        lock(&self.group).clone()
    }

    /// Puts the communicator in `recording`'s group; when it is already in an open group, leaves it there and
    /// gives that group back.
    pub(crate) fn join(&self, recording: &Arc<Recording>) -> Result<(), Arc<Recording>> {
        let mut group = lock(&self.group);
        match &*group {
            Some(other) => Err(Arc::clone(other)),
            None => {
                *group = Some(Arc::clone(recording));
                Ok(())
            }
        }
    }

    /// Takes the communicator out of `recording`'s group (and out of no other).
    pub(crate) fn leave(&self, recording: &Arc<Recording>) {
        let mut group = lock(&self.group);
        if group.as_ref().is_some_and(|g| Arc::ptr_eq(g, recording)) {
            *group = None;
        }
    }
}

/// Why a recorded operation will not complete.
#[derive(Clone, Debug)]
enum Failure {
    /// Its group was dropped without ending: it was never issued.
    Abandoned { group: String },
    /// Issuing its group failed.
    Issue { group: String, cause: String },
}

/// Where a recorded operation is: its buffers until its handle takes them, and its event once issued.
enum Deferral<R> {
    /// Recorded; the group has not ended.
    Open(R),
    /// Issued, with the event recorded after it on its stream.
    Issued(R, SharedEvent),
    /// Will not complete.
    Failed(Failure),
    /// The handle took the buffers and the event.
    Taken,
}

/// The slot a recorded operation's handle waits on, filled when its group ends. It holds the operation's
/// buffers meanwhile, so that they stay allocated until the calls that use them are enqueued, even if the handle is
/// dropped first.
pub(crate) struct Deferred<R> {
    state: Mutex<Deferral<R>>,
}

impl<R> Deferred<R> {
    /// The buffers and the event, once the group has issued the operation; otherwise why not yet, or why never.
    /// `comm` names the communicator in the error.
    pub(crate) fn take(&self, comm: &str) -> Result<(R, SharedEvent), CommError> {
        let mut state = lock(&self.state);
        match std::mem::replace(&mut *state, Deferral::Taken) {
            Deferral::Issued(value, event) => Ok((value, event)),
            Deferral::Open(value) => {
                *state = Deferral::Open(value);
                Err(crate::checks::invalid(
                    comm,
                    "this operation was issued inside an OpGroup that has not ended, so it has not started and \
                     cannot complete: end the group (OpGroup::end) before waiting on its operations"
                        .into(),
                ))
            }
            Deferral::Failed(failure) => {
                *state = Deferral::Failed(failure.clone());
                Err(match failure {
                    Failure::Abandoned { group } => crate::checks::invalid(
                        comm,
                        format!(
                            "the OpGroup over {group} was dropped without end(), so this operation was never \
                             issued"
                        ),
                    ),
                    Failure::Issue { group, cause } => CommError::Device {
                        comm: comm.to_owned(),
                        what: format!("issuing the OpGroup over {group}: {cause}"),
                    },
                })
            }
            Deferral::Taken => Err(CommError::broken(
                comm,
                "the operation's buffers were already taken",
                None,
            )),
        }
    }

    /// Whether the operation will not start or has finished: its group failed or was dropped, or its event has
    /// completed. Never blocks.
    pub(crate) fn is_settled(&self) -> bool {
        match &*lock(&self.state) {
            Deferral::Open(_) => false,
            Deferral::Issued(_, event) => event.is_complete(),
            Deferral::Failed(_) | Deferral::Taken => true,
        }
    }

    /// The event of an issued operation whose handle never took it, for the pool.
    pub(crate) fn take_event(&self) -> Option<SharedEvent> {
        let mut state = lock(&self.state);
        match std::mem::replace(&mut *state, Deferral::Taken) {
            Deferral::Issued(_, event) => Some(event),
            other => {
                *state = other;
                None
            }
        }
    }
}

/// What a group does to a recorded operation's slot, whatever the type of its buffers.
trait Resolve: Send + Sync {
    /// The operation was issued; `event` follows it on its stream.
    fn issued(&self, event: SharedEvent);
    /// The operation will not complete (its buffers are released).
    fn fail(&self, failure: Failure);
}

impl<R: Send> Resolve for Deferred<R> {
    fn issued(&self, event: SharedEvent) {
        let mut state = lock(&self.state);
        if let Deferral::Open(value) = std::mem::replace(&mut *state, Deferral::Taken) {
            *state = Deferral::Issued(value, event);
        }
    }

    fn fail(&self, failure: Failure) {
        let mut state = lock(&self.state);
        if matches!(&*state, Deferral::Open(_)) {
            *state = Deferral::Failed(failure);
        }
    }
}

/// One recorded operation: its calls, where they run, and its handle's slot.
struct Recorded {
    comm: Arc<NcclComm>,
    stream: Arc<CudaStream>,
    gpu: Arc<Gpu>,
    calls: Vec<Call>,
    slot: Arc<dyn Resolve>,
    /// Its number in its communicator's flight recorder, for the watchdog.
    seq: Option<u64>,
    /// Staging buffers that must outlive the calls.
    _keep: Vec<DeviceBuffer<u8>>,
}

/// The recorded operations of one group, in the order they were issued; closed once the group ends.
struct Log {
    ended: bool,
    ops: Vec<Recorded>,
}

/// One open group's operations, shared by the marks of its communicators.
pub(crate) struct Recording {
    /// The group's communicators, for errors: `[tp, dp]`.
    label: String,
    log: Mutex<Log>,
}

impl Recording {
    /// An empty recording for the group over `label`.
    pub(crate) fn new(label: String) -> Arc<Recording> {
        Arc::new(Recording {
            label,
            log: Mutex::new(Log {
                ended: false,
                ops: Vec::new(),
            }),
        })
    }

    /// The group's communicators, as errors name them.
    pub(crate) fn label(&self) -> &str {
        &self.label
    }

    /// Records `calls`, to run on `comm` and `stream` (of `gpu`) when the group ends, and gives the slot the
    /// operation's handle waits on, which holds `value` (the operation's buffers) until then. Every address in
    /// `calls` comes from [`DeviceBuffer::address_on`] on `stream`, taken from buffers in `value` or `keep`. Fails
    /// once the group has ended: its calls are being issued or were, and a call recorded now would never be. `seq`
    /// is the operation's number in `comm`'s flight recorder, for the watchdog once the operation is issued.
    pub(crate) fn record<R: Send + 'static>(
        &self,
        (comm, stream, gpu): (&Arc<NcclComm>, &Arc<CudaStream>, &Arc<Gpu>),
        calls: Vec<Call>,
        value: R,
        keep: Vec<DeviceBuffer<u8>>,
        seq: Option<u64>,
    ) -> Result<Arc<Deferred<R>>, CommError> {
        let mut log = lock(&self.log);
        if log.ended {
            return Err(crate::checks::invalid(
                &comm.name,
                format!(
                    "an operation was issued on it while its OpGroup over {} was ending: the group's operations \
                     are issued already, so this one would never be; issue it after OpGroup::end returns",
                    self.label
                ),
            ));
        }
        let slot = Arc::new(Deferred {
            state: Mutex::new(Deferral::Open(value)),
        });
        log.ops.push(Recorded {
            comm: Arc::clone(comm),
            stream: Arc::clone(stream),
            gpu: Arc::clone(gpu),
            calls,
            slot: Arc::clone(&slot) as Arc<dyn Resolve>,
            seq,
            _keep: keep,
        });
        Ok(slot)
    }

    /// Ends the group and takes its operations; later records fail.
    fn close(&self) -> Vec<Recorded> {
        let mut log = lock(&self.log);
        log.ended = true;
        std::mem::take(&mut log.ops)
    }

    /// Ends the group without issuing anything: every recorded operation's handle fails, saying so, and its
    /// buffers are released (no call was enqueued with them).
    pub(crate) fn abandon(&self) {
        let group = self.label.clone();
        for op in self.close() {
            op.slot.fail(Failure::Abandoned {
                group: group.clone(),
            });
        }
    }

    /// Ends the group: every recorded call, in issue order, between one `ncclGroupStart` and `ncclGroupEnd` on
    /// this thread, then each operation's event on its stream. Every communicator's calls are serialised for the
    /// whole group. On a failure every operation not yet given its event fails with the cause, and the first
    /// error is returned.
    pub(crate) fn issue(&self) -> Result<(), CommError> {
        let ops = self.close();
        if ops.is_empty() {
            return Ok(());
        }
        if let Err(e) = self.enqueue(&ops) {
            let failure = Failure::Issue {
                group: self.label.clone(),
                cause: e.to_string(),
            };
            for op in &ops {
                op.slot.fail(failure.clone());
            }
            return Err(e);
        }
        let mut first_error = None;
        for op in &ops {
            // Every operation gets its event and is watched, its handle dropped or not: the GPU's watchdog
            // follows it to completion (a handle already dropped needs the event for nothing else).
            let watched = Self::event_after(op).and_then(|event| {
                op.gpu
                    .watchdog()
                    .watch(&op.stream, &event, &op.comm, op.seq)?;
                Ok(event)
            });
            match watched {
                Ok(event) => op.slot.issued(event),
                Err(e) => {
                    op.slot.fail(Failure::Issue {
                        group: self.label.clone(),
                        cause: e.to_string(),
                    });
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// An event of `op`'s GPU recorded on its stream, after its calls.
    fn event_after(op: &Recorded) -> Result<SharedEvent, CommError> {
        let event = op.gpu.take_event()?;
        match event.record(&op.stream) {
            Ok(()) => Ok(event),
            Err(e) => {
                op.gpu.return_event(event);
                Err(cuda_err(&op.comm.name, "recording an event")(e))
            }
        }
    }

    /// Enqueues every call of `ops` as one NCCL group, and waits for the communicators to settle if NCCL
    /// answered `ncclInProgress`.
    fn enqueue(&self, ops: &[Recorded]) -> Result<(), CommError> {
        let mut comms: Vec<&NcclComm> = Vec::new();
        let at: Vec<usize> = ops
            .iter()
            .map(
                |op| match comms.iter().position(|c| std::ptr::eq(*c, &*op.comm)) {
                    Some(i) => i,
                    None => {
                        comms.push(&op.comm);
                        comms.len() - 1
                    }
                },
            )
            .collect();
        let first = &ops[0].comm;
        let nccl = first.runtime.nccl();
        let pending = NcclComm::with_handles(&comms, |handles| {
            raw::group_start(nccl)
                .map_err(|e| first.error(&format!("opening the OpGroup over {}", self.label), e))?;
            let mut pending = false;
            let mut failed = None;
            'ops: for (op, &i) in ops.iter().zip(&at) {
                let stream = op.stream.cu_stream() as nccl_sys::sys::cudaStream_t;
                for &call in &op.calls {
                    // SAFETY: `handles[i]` is `op.comm`'s live handle, its calls serialised by `with_handles`
                    // until the group is closed; `stream` is that communicator's, on its device; every address
                    // in `call` was taken on `stream` from a buffer the operation's slot (or `_keep`) holds,
                    // checked large enough when the operation was recorded, and released only after this work
                    // is enqueued (stream-ordered, so after it completes).
                    match unsafe { raw::enqueue(nccl, handles[i], call, stream) } {
                        Ok(p) => pending |= p == Progress::Pending,
                        Err(e) => {
                            failed = Some(op.comm.error("enqueueing in an OpGroup", e));
                            break 'ops;
                        }
                    }
                }
            }
            // Close the group even after a failed call: NCCL's group state belongs to this thread, and a group
            // left open would swallow its later calls on every communicator.
            let end = raw::group_end(nccl);
            match failed {
                Some(e) => Err(e),
                None => {
                    let end = end.map_err(|e| {
                        first.error(&format!("ending the OpGroup over {}", self.label), e)
                    })?;
                    Ok(pending || end == Progress::Pending)
                }
            }
        })?;
        if pending {
            for comm in comms {
                comm.wait_ready("issuing an OpGroup")?;
            }
        }
        Ok(())
    }
}
