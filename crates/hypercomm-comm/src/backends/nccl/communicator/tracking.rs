//! How a [`DeviceCommunicator`]'s operations are numbered and watched: each one is begun in the communicator's
//! flight recorder (`flight`) before its NCCL calls are enqueued, and registered with the GPU's watchdog
//! (`watchdog`) when its handle's event is recorded, in `finish`, the one place every handle is made. Neither
//! adds a driver call.

use super::super::events::SharedEvent;
use super::super::flight::{FlightRecord, Partners};
use super::DeviceCommunicator;
use crate::CommError;
use crate::element::DType;

impl DeviceCommunicator {
    /// Runs `enqueue`, which enqueues one operation (`op` over `count` elements of `dtype`, exchanging with
    /// `partners` when it is point to point) and makes its handle, as the communicator's next numbered operation; when it fails before the handle exists, the operation is
    /// marked failed. On a broken communicator nothing is numbered (the enqueue fails at once).
    pub(super) fn recorded<R>(
        &self,
        op: &'static str,
        partners: Partners,
        dtype: DType,
        count: usize,
        enqueue: impl FnOnce() -> Result<R, CommError>,
    ) -> Result<R, CommError> {
        if self.comm.broken().is_some() {
            return enqueue();
        }
        let seq = self.comm.recorder.begin(op, dtype, count, partners);
        let result = enqueue();
        if result.is_err() {
            self.comm.recorder.abandon(seq);
        }
        result
    }

    /// Hands the operation whose handle's `event` was just recorded to the GPU's watchdog, with its number (none
    /// for a fence, which is no operation of its own).
    pub(super) fn watch(&self, event: &SharedEvent) -> Result<(), CommError> {
        let seq = self.comm.recorder.take_pending();
        self.gpu
            .watchdog()
            .watch(&self.stream, event, &self.comm, seq)
    }

    /// The communicator's flight record: its last device operations (numbered in issue order, the same numbers on
    /// every rank), their states and times, and why it broke, if it has.
    pub fn flight_record(&self) -> FlightRecord {
        self.comm.recorder.record()
    }
}
