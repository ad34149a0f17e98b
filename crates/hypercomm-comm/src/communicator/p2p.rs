//! Point-to-point operations on a communicator's host lane: sends, receives and batches queued back to back run
//! as one exchange that progresses all of them, and takes in those queued while it runs.
//!
//! This is what makes separate asynchronous sends and receives behave as gloo's `isend`/`irecv` do: four pipeline
//! stages that each issue a send to the next stage and then a receive from the previous one, before waiting on
//! either, all complete, whatever the sizes. Run one after the other, every stage's send would wait for a receive
//! its peer has queued behind its own send. So the lane keeps consecutive point-to-point operations together
//! ([`Exchange`]), and a running exchange stops whenever another one is queued behind it, takes it in and goes on
//! from where it was ([`Backend::p2p_step`]). Each operation completes as soon as its own parts have, so a waiter
//! gets its buffers back without waiting for the operations issued after it.
//!
//! Collectives keep the lane's issue order: an exchange takes in only the point-to-point operations queued directly
//! behind it, never across a collective.

use super::engine::Engine;
use crate::CommError;
use crate::backend::{Part, Payload, Progress};
use crate::element::{DType, Element, as_bytes, as_bytes_mut};
use crate::host_work::Completer;
use crate::op::Message;

/// A point-to-point operation queued on a lane, its element type erased so that operations of several types run
/// in one exchange.
pub(crate) trait P2pOp: Send {
    /// The parts, as byte views of the operation's buffers, each with its element type.
    fn parts(&mut self) -> Vec<(Part<'_>, DType)>;
    /// Hands the buffers back through the operation's handle, or the error that stopped it.
    fn finish(self: Box<Self>, result: Result<(), CommError>);
}

/// A point-to-point operation over host vectors it owns until it completes.
pub(crate) struct Owned<T, R> {
    bufs: Vec<Vec<T>>,
    /// What moves each buffer: its direction, peer and tag.
    messages: Vec<Message>,
    done: Completer<R>,
    /// Turns the buffers back into what the handle holds (one vector, or all of them).
    wrap: fn(Vec<Vec<T>>) -> R,
}

impl<T: Element, R: Send + 'static> Owned<T, R> {
    /// An operation moving `bufs[i]` as `messages[i]` says, completed through `done` with `wrap(bufs)`.
    pub(crate) fn new(
        bufs: Vec<Vec<T>>,
        messages: Vec<Message>,
        done: Completer<R>,
        wrap: fn(Vec<Vec<T>>) -> R,
    ) -> Self {
        Owned {
            bufs,
            messages,
            done,
            wrap,
        }
    }
}

impl<T: Element, R: Send + 'static> P2pOp for Owned<T, R> {
    fn parts(&mut self) -> Vec<(Part<'_>, DType)> {
        self.bufs
            .iter_mut()
            .zip(&self.messages)
            .map(|(buf, m)| {
                let payload = if m.send {
                    Payload::Out(as_bytes(buf))
                } else {
                    Payload::In(as_bytes_mut(buf))
                };
                let part = Part {
                    peer: m.peer,
                    tag: m.tag,
                    op: None,
                    payload,
                };
                (part, T::DTYPE)
            })
            .collect()
    }

    fn finish(self: Box<Self>, result: Result<(), CommError>) {
        let Owned {
            bufs, done, wrap, ..
        } = *self;
        done.complete(result.map(|()| wrap(bufs)));
    }
}

/// Point-to-point operations that run as one exchange, each with its job id and number of parts, and how far
/// their parts have come.
pub(super) struct Exchange {
    ops: Vec<(u64, usize, Box<dyn P2pOp>)>,
    progress: Progress,
}

impl Exchange {
    /// An exchange of one operation, job `id` of its lane.
    pub(super) fn new(id: u64, mut op: Box<dyn P2pOp>) -> Exchange {
        let parts = op.parts().len();
        Exchange {
            ops: vec![(id, parts, op)],
            progress: Progress::new(parts),
        }
    }

    /// Appends `other`'s operations (issued after this exchange's), keeping how far each has come.
    pub(super) fn absorb(&mut self, other: Exchange) {
        self.ops.extend(other.ops);
        self.progress.append(other.progress);
    }

    /// Whether job `id` is one of this exchange's operations.
    pub(super) fn contains(&self, id: u64) -> bool {
        self.ops.iter().any(|(op, _, _)| *op == id)
    }

    /// The job id of the first operation, which the lane files the exchange under.
    pub(super) fn first_id(&self) -> Option<u64> {
        self.ops.first().map(|(id, _, _)| *id)
    }

    /// Runs the exchange on `engine`, taking in the exchanges `more` yields whenever `queued` says one is waiting,
    /// and finishing each operation as its parts complete. Returns when every operation has finished (`None`), or,
    /// with `until`, as soon as job `until` has, with what is left, for the lane to run on. A failure finishes
    /// every operation: the first with the error, the others as broken by it.
    pub(super) fn run(
        mut self,
        engine: &mut Engine,
        until: Option<u64>,
        queued: &dyn Fn() -> bool,
        more: &mut dyn FnMut() -> Option<Exchange>,
    ) -> Option<Exchange> {
        loop {
            let step = {
                let Exchange { ops, progress } = &mut self;
                let mut parts: Vec<(Part<'_>, DType)> =
                    ops.iter_mut().flat_map(|(_, _, op)| op.parts()).collect();
                engine.execute(|b| b.p2p_step(&mut parts, progress, queued))
            };
            if let Err(e) = step {
                self.fail(&engine.comm, e);
                return None;
            }
            if self.finish_completed(until) {
                // The waiter's operation is done; the lane's thread runs the rest.
                return (!self.ops.is_empty()).then_some(self);
            }
            if self.ops.is_empty() {
                match more() {
                    Some(next) => self = next,
                    None => return None,
                }
                continue;
            }
            while let Some(next) = more() {
                self.absorb(next);
            }
        }
    }

    /// Finishes the operations whose parts have all completed and drops them from the exchange; says whether job
    /// `until` was among them.
    fn finish_completed(&mut self, until: Option<u64>) -> bool {
        let mut keep = Vec::with_capacity(self.progress.messages.len());
        let mut at = 0;
        let mut waited_done = false;
        let mut left = Vec::with_capacity(self.ops.len());
        for (id, parts, op) in self.ops.drain(..) {
            let complete = self.progress.messages[at..at + parts]
                .iter()
                .all(|m| m.done);
            at += parts;
            keep.extend(std::iter::repeat_n(!complete, parts));
            if complete {
                waited_done |= until == Some(id);
                op.finish(Ok(()));
            } else {
                left.push((id, parts, op));
            }
        }
        self.ops = left;
        self.progress.retain(&keep);
        waited_done
    }

    /// Finishes every operation with `error` (the first) or as broken by it (the others).
    fn fail(self, comm: &str, error: CommError) {
        let cause = error.to_string();
        let root = error.root_cause().cloned();
        let mut error = Some(error);
        for (_, _, op) in self.ops {
            let e = error
                .take()
                .unwrap_or_else(|| CommError::broken(comm, cause.clone(), root.clone()));
            op.finish(Err(e));
        }
    }
}
