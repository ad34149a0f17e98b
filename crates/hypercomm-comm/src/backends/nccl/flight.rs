//! The flight recorder: every NCCL communicator numbers its device operations and keeps the last few in a ring,
//! so that after a failure one can read what each rank was doing, and the ranks can compare notes
//! (`behind`).
//!
//! Each operation gets the next sequence number of its communicator (`#1`, `#2`, ... in issue order; every rank
//! of a communicator numbers the same collectives alike, so `#41` names one collective on every rank), and an
//! entry: its kind, element type and count, its state ([`OpState`]) and when it was enqueued and finished. The
//! ring keeps the last [`CommOptions::flight_recorder_len`](crate::CommOptions::flight_recorder_len) entries
//! (64 by default); the last started and the last completed operation are kept whatever the length, since the
//! watchdog's comparison between ranks needs them.
//!
//! Read it with [`DeviceCommunicator::flight_record`](crate::device::DeviceCommunicator::flight_record) (a
//! [`FlightRecord`], serde-serialisable). When the communicator breaks (a timeout, an asynchronous error, a
//! failure elsewhere in its failure domain) the record is also written as JSON to
//! `<dir>/<communicator name>.rank<member id>.json`, where `<dir>` is
//! [`CommOptions::flight_recorder_dir`](crate::CommOptions::flight_recorder_dir) or, unset, the environment
//! variable `HYPERCOMM_FLIGHT_RECORDER_DIR` as [`DeviceRuntime::probe_with_env`](super::DeviceRuntime) read it
//! (slashes in the name become `_`). A deliberate [`abort`](crate::device::DeviceCommunicator::abort) writes
//! nothing.
//!
//! Cost on an operation's path: one uncontended lock and an entry written into a preallocated ring; no driver
//! call, and no allocation for a collective (a point-to-point operation's entry lists its peers).
//!
//! Point-to-point operations (sends, receives, batches) are numbered too, and their entries say whom they send to
//! and receive from: between ranks that do not all take part in them the numbers of later operations differ, so
//! the ranks compare point-to-point operations by their peers rather than by their numbers (`behind`).

use std::borrow::Cow;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::element::DType;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Critical sections update a few fields of the ring at a time; a poisoned lock still holds a usable record.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The default number of operations a communicator's flight recorder keeps.
pub const DEFAULT_FLIGHT_RECORDER_LEN: usize = 64;

/// The environment variable naming the folder flight records are written to when a communicator breaks (see the
/// module doc of `flight`); read by [`DeviceRuntime::probe_with_env`](super::DeviceRuntime::probe_with_env).
pub const FLIGHT_RECORDER_DIR_ENV: &str = "HYPERCOMM_FLIGHT_RECORDER_DIR";

/// Where an operation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpState {
    /// Enqueued on the communicator's stream, not seen complete yet.
    Enqueued,
    /// Seen complete on the device.
    Completed,
    /// Its communicator failed (or was aborted) before it was seen complete.
    Failed,
    /// Its deadline (the communicator's timeout) passed before it completed: the failure.
    TimedOut,
}

/// One device operation of a communicator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FlightEntry {
    /// The communicator's sequence number of the operation, from 1.
    pub seq: u64,
    /// What it was (`all_reduce`, `all_gather`, `batch`, ...).
    pub op: Cow<'static, str>,
    /// The element type (`f32`, ...).
    pub dtype: Cow<'static, str>,
    /// Elements of its (input) buffer, over all parts for a batch.
    pub count: usize,
    /// Bytes of those elements.
    pub bytes: usize,
    /// For a point-to-point operation: the member ids it sends to, in the order of its parts (empty otherwise).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub to: Vec<usize>,
    /// For a point-to-point operation: the member ids it receives from, in the order of its parts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from: Vec<usize>,
    /// Where it is.
    pub state: OpState,
    /// When it was enqueued, in microseconds since the Unix epoch.
    pub enqueued_us: u64,
    /// When it was seen complete, failed or timed out, in microseconds since the Unix epoch.
    pub finished_us: Option<u64>,
}

impl FlightEntry {
    /// The operation as errors name it: `all_reduce(#41, dtype=f32, count=1024)`, `send(#7, dtype=f32,
    /// count=8, to=[3])`.
    pub fn describe(&self) -> String {
        format!(
            "{}(#{}, dtype={}, count={}{})",
            self.op,
            self.seq,
            self.dtype,
            self.count,
            self.peers()
        )
    }

    /// The call without its number, as ranks compare it: `all_reduce(dtype=f32, count=1024)`.
    pub fn call(&self) -> String {
        format!(
            "{}(dtype={}, count={}{})",
            self.op,
            self.dtype,
            self.count,
            self.peers()
        )
    }

    /// Whether it is a point-to-point operation (a send, a receive, a batch): one with peers.
    pub fn is_point_to_point(&self) -> bool {
        !(self.to.is_empty() && self.from.is_empty())
    }

    /// `, to=[3], from=[1]` for a point-to-point operation, nothing for a collective.
    fn peers(&self) -> String {
        let mut out = String::new();
        if !self.to.is_empty() {
            out.push_str(&format!(", to={:?}", self.to));
        }
        if !self.from.is_empty() {
            out.push_str(&format!(", from={:?}", self.from));
        }
        out
    }
}

/// Whom a point-to-point operation exchanges with, as ranks within the communicator: what
/// [`FlightRecorder::begin`] records beside the call (member ids in the entry). Empty for a collective.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Partners {
    /// The ranks it sends to.
    pub to: Vec<usize>,
    /// The ranks it receives from.
    pub from: Vec<usize>,
}

impl Partners {
    /// The partners of `op`: its peers when it is point to point, none for a collective.
    pub(crate) fn of(op: &crate::op::Op) -> Partners {
        op.point_to_point()
            .map(|(to, from)| Partners { to, from })
            .unwrap_or_default()
    }
}

/// What a communicator's flight recorder holds: its last operations, oldest first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FlightRecord {
    /// The communicator's name.
    pub comm: String,
    /// This rank's member id (its world rank in a collection).
    pub rank: usize,
    /// The communicator's member ids, in member order.
    pub members: Vec<usize>,
    /// Operations numbered so far.
    pub issued: u64,
    /// The last operation started (enqueued), whether or not it is still in the ring.
    pub last_started: Option<FlightEntry>,
    /// The last operation seen complete.
    pub last_completed: Option<FlightEntry>,
    /// The operations started and not yet seen complete (nor failed), oldest first, whether or not they are
    /// still in the ring.
    pub unfinished: Vec<FlightEntry>,
    /// Why the communicator broke, once it has.
    pub failure: Option<String>,
    /// The last operations, oldest first (at most the recorder's length).
    pub ops: Vec<FlightEntry>,
}

/// The ring and what is kept beside it.
struct Ring {
    issued: u64,
    ops: VecDeque<FlightEntry>,
    /// Enqueued and not finished, oldest first: as many as are in flight.
    open: VecDeque<FlightEntry>,
    last_started: Option<FlightEntry>,
    last_completed: Option<FlightEntry>,
    failure: Option<String>,
    members: Vec<usize>,
    rank: usize,
    /// The operation begun and not yet handed to the watchdog (see [`FlightRecorder::take_pending`]).
    pending: Option<u64>,
}

/// One communicator's flight recorder.
pub(crate) struct FlightRecorder {
    comm: String,
    len: usize,
    dir: Option<PathBuf>,
    ring: Mutex<Ring>,
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

impl FlightRecorder {
    /// A recorder for communicator `comm` keeping `len` operations, writing to `dir` when it breaks.
    pub(crate) fn new(comm: &str, len: usize, dir: Option<PathBuf>) -> FlightRecorder {
        FlightRecorder {
            comm: comm.to_owned(),
            len,
            dir,
            ring: Mutex::new(Ring {
                issued: 0,
                ops: VecDeque::with_capacity(len),
                open: VecDeque::new(),
                last_started: None,
                last_completed: None,
                failure: None,
                members: Vec::new(),
                rank: 0,
                pending: None,
            }),
        }
    }

    /// Sets who this rank is: `members` (member ids, in member order) and `rank`, its own id.
    pub(crate) fn set_members(&self, members: &[usize], rank: usize) {
        let mut r = lock(&self.ring);
        r.members = members.to_vec();
        r.rank = rank;
    }

    /// Numbers a new operation and records it as enqueued; it is the pending one until
    /// [`take_pending`](Self::take_pending) (an earlier pending one that never got there failed).
    /// `partners` are ranks within the communicator; the entry names them by member id.
    pub(crate) fn begin(
        &self,
        op: &'static str,
        dtype: DType,
        count: usize,
        partners: Partners,
    ) -> u64 {
        let mut r = lock(&self.ring);
        r.issued += 1;
        let id = |ranks: Vec<usize>| -> Vec<usize> {
            ranks
                .into_iter()
                .map(|i| r.members.get(i).copied().unwrap_or(i))
                .collect()
        };
        let (to, from) = (id(partners.to), id(partners.from));
        let entry = FlightEntry {
            seq: r.issued,
            op: Cow::Borrowed(op),
            dtype: Cow::Borrowed(dtype.name()),
            count,
            bytes: count.saturating_mul(dtype.size()),
            to,
            from,
            state: OpState::Enqueued,
            enqueued_us: now_us(),
            finished_us: None,
        };
        if let Some(stale) = r.pending.replace(entry.seq) {
            finish(&mut r, stale, OpState::Failed);
        }
        r.last_started = Some(entry.clone());
        r.open.push_back(entry.clone());
        if self.len > 0 {
            if r.ops.len() == self.len {
                r.ops.pop_front();
            }
            r.ops.push_back(entry);
        }
        r.issued
    }

    /// The operation begun last, when it has not been handed on yet: what the handle made now belongs to.
    pub(crate) fn take_pending(&self) -> Option<u64> {
        lock(&self.ring).pending.take()
    }

    /// Operation `seq` as errors name it, while the recorder has it.
    pub(crate) fn describe(&self, seq: u64) -> Option<String> {
        let r = lock(&self.ring);
        r.ops
            .iter()
            .rev()
            .chain(&r.last_started)
            .find(|e| e.seq == seq)
            .map(FlightEntry::describe)
    }

    /// Marks operation `seq` as `state` (the first state other than enqueued sticks).
    pub(crate) fn finish(&self, seq: u64, state: OpState) {
        finish(&mut lock(&self.ring), seq, state);
    }

    /// Marks operation `seq`, begun but never enqueued (its enqueue failed), as failed.
    pub(crate) fn abandon(&self, seq: u64) {
        let mut r = lock(&self.ring);
        if r.pending == Some(seq) {
            r.pending = None;
        }
        finish(&mut r, seq, OpState::Failed);
    }

    /// Marks the oldest operation still enqueued as timed out: operations on one stream complete in order, so it
    /// is the one a timeout is about.
    pub(crate) fn time_out_oldest(&self) {
        let mut r = lock(&self.ring);
        if let Some(seq) = r.open.front().map(|e| e.seq) {
            finish(&mut r, seq, OpState::TimedOut);
        }
    }

    /// Records why the communicator broke and marks every operation still enqueued as failed; writes the record
    /// to the folder, if one is set. Only the first call does anything.
    pub(crate) fn fail(&self, why: &str) {
        let record = {
            let mut r = lock(&self.ring);
            if r.failure.is_some() {
                return;
            }
            r.failure = Some(why.to_owned());
            let open: Vec<u64> = r.open.iter().map(|e| e.seq).collect();
            for seq in open {
                finish(&mut r, seq, OpState::Failed);
            }
            self.snapshot(&r)
        };
        if let Some(dir) = &self.dir
            && let Err(e) = write(dir, &record)
        {
            tracing::warn!(comm = %self.comm, error = %e, "writing the flight record failed");
        }
    }

    /// What the recorder holds now.
    pub(crate) fn record(&self) -> FlightRecord {
        self.snapshot(&lock(&self.ring))
    }

    fn snapshot(&self, r: &Ring) -> FlightRecord {
        FlightRecord {
            comm: self.comm.clone(),
            rank: r.rank,
            members: r.members.clone(),
            issued: r.issued,
            last_started: r.last_started.clone(),
            last_completed: r.last_completed.clone(),
            unfinished: r.open.iter().cloned().collect(),
            failure: r.failure.clone(),
            ops: r.ops.iter().cloned().collect(),
        }
    }
}

fn finish(r: &mut Ring, seq: u64, state: OpState) {
    let at = now_us();
    let Some(i) = r.open.iter().position(|e| e.seq == seq) else {
        return;
    };
    let done = r.open.remove(i).map(|mut e| {
        e.state = state;
        e.finished_us = Some(at);
        e
    });
    if let Some(e) = r
        .ops
        .iter_mut()
        .rev()
        .find(|e| e.seq == seq && e.state == OpState::Enqueued)
    {
        e.state = state;
        e.finished_us = Some(at);
    }
    if let Some(e) = r.last_started.as_mut().filter(|e| e.seq == seq) {
        e.state = state;
        e.finished_us = Some(at);
    }
    if state == OpState::Completed && r.last_completed.as_ref().is_none_or(|c| c.seq < seq) {
        r.last_completed = done;
    }
}

/// The file a record of communicator `comm` at member `rank` goes to in `dir`.
pub(crate) fn file_for(dir: &Path, comm: &str, rank: usize) -> PathBuf {
    let name: String = comm
        .chars()
        .map(|c| {
            if c == '/' || c.is_whitespace() {
                '_'
            } else {
                c
            }
        })
        .collect();
    dir.join(format!("{name}.rank{rank}.json"))
}

fn write(dir: &Path, record: &FlightRecord) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let path = file_for(dir, &record.comm, record.rank);
    let json = serde_json::to_vec_pretty(record).map_err(|e| format!("encoding: {e}"))?;
    std::fs::write(&path, json).map_err(|e| format!("writing {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_last_operations_and_their_states() {
        let r = FlightRecorder::new("m/tp/0/device", 2, None);
        r.set_members(&[4, 6], 6);
        let a = r.begin("all_reduce", DType::F32, 4, Partners::default());
        assert_eq!(r.take_pending(), Some(a));
        let b = r.begin("all_gather", DType::BF16, 8, Partners::default());
        let c = r.begin("broadcast", DType::U8, 3, Partners::default());
        // b was begun but never handed on (its enqueue failed): it is failed, c is pending.
        assert_eq!(r.take_pending(), Some(c));
        r.finish(a, OpState::Completed);
        r.finish(c, OpState::TimedOut);
        let rec = r.record();
        assert_eq!((rec.issued, rec.rank, rec.members), (3, 6, vec![4, 6]));
        let ops: Vec<(u64, OpState)> = rec.ops.iter().map(|e| (e.seq, e.state)).collect();
        assert_eq!(ops, [(b, OpState::Failed), (c, OpState::TimedOut)]);
        assert_eq!(rec.ops[0].bytes, 16);
        assert_eq!(
            rec.last_completed.map(|e| e.seq),
            Some(a),
            "kept past the ring"
        );
        assert_eq!(
            rec.last_started.map(|e| e.describe()),
            Some("broadcast(#3, dtype=u8, count=3)".to_owned())
        );
    }

    #[test]
    fn a_point_to_point_entry_names_its_peers_by_member_id() {
        let r = FlightRecorder::new("m/pp/0/device", 4, None);
        r.set_members(&[3, 7, 11], 7);
        let partners = Partners {
            to: vec![2],
            from: vec![0, 2],
        };
        r.begin("batch", DType::F32, 24, partners);
        r.begin(
            "send",
            DType::F32,
            8,
            Partners {
                to: vec![0],
                from: vec![],
            },
        );
        let rec = r.record();
        assert_eq!(
            (rec.ops[0].to.clone(), rec.ops[0].from.clone()),
            (vec![11], vec![3, 11])
        );
        assert!(rec.ops[0].is_point_to_point());
        assert_eq!(
            rec.ops[0].call(),
            "batch(dtype=f32, count=24, to=[11], from=[3, 11])"
        );
        assert_eq!(
            rec.ops[1].describe(),
            "send(#2, dtype=f32, count=8, to=[3])"
        );
        // A collective's entry has no peers, and its JSON no peer fields.
        r.begin("all_reduce", DType::F32, 8, Partners::default());
        let last = r.record().ops[2].clone();
        assert!(!last.is_point_to_point());
        let json = serde_json::to_string(&last).unwrap();
        assert!(
            !json.contains("\"to\"") && !json.contains("\"from\""),
            "{json}"
        );
    }

    #[test]
    fn a_failure_fails_what_is_enqueued_and_writes_the_record_once() {
        let dir = std::env::temp_dir().join(format!("hc-flight-{}", std::process::id()));
        let r = FlightRecorder::new("a/b c", 8, Some(dir.clone()));
        r.set_members(&[0, 1], 1);
        let a = r.begin("all_reduce", DType::F32, 1, Partners::default());
        let b = r.begin("all_reduce", DType::F32, 1, Partners::default());
        r.finish(a, OpState::Completed);
        r.fail("timed out");
        r.fail("later news is not the failure");
        let path = file_for(&dir, "a/b c", 1);
        assert!(path.ends_with("a_b_c.rank1.json"), "{}", path.display());
        let back: FlightRecord = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(back.failure.as_deref(), Some("timed out"));
        assert_eq!(back.ops[1].seq, b);
        assert_eq!(back.ops[1].state, OpState::Failed);
        assert_eq!(back, r.record());
        // With no ring at all, the numbers and the last operations are still kept.
        let bare = FlightRecorder::new("x", 0, None);
        let s = bare.begin("reduce", DType::I32, 2, Partners::default());
        bare.finish(s, OpState::Completed);
        let rec = bare.record();
        assert!(rec.ops.is_empty());
        assert_eq!(rec.last_completed.map(|e| e.seq), Some(1));
    }
}
