//! How the news of a failure reaches every rank, with its root cause: [`FailureDomain`].
//!
//! When a rank sees a peer die, stall or disagree, it aborts the communicator so that the others stop waiting at
//! once. An abort alone would tell them only *who aborted*, and a peer that exits after its own error looks dead
//! to the others; either way they would blame the messenger. So every failing rank first writes a **failure
//! record** to the store under `<domain prefix>/<its member id>`: the root cause as it resolved it (which ranks,
//! how, in which communicator). A rank stopped by a peer (an abort, a vanished process, a peer that never came)
//! reads that peer's record, waiting briefly, and reports the root cause, naming the peer as the messenger.
//!
//! A rank that times out first writes a *provisional* record (the ranks it waits for) before looking for records
//! itself: a missing rank that leaves one was alive and stuck on a failure of its own (its communicator was waiting
//! for a stopped rank, say), so a reader follows it one more hop to the rank really at fault instead of blaming
//! the stuck survivor; when the provisional records lead back to where they started through three ranks or more,
//! the root cause is that cycle of waits, the same on every rank of it ([`cycle`]). Disagreements are recorded too (without aborting: the communicator stays usable), so ranks
//! that see the disagreeing ranks exit afterwards report the disagreement.
//!
//! A communicator made alone has a domain of its own, keyed under `comm/<name>/failure`. A
//! `ProcessGroupCollection` gives all its communicators one shared domain (through [`CommOptions`]), keyed under
//! the collection: a rank whose communicator fails records the root cause once and aborts **every** communicator
//! of the domain, host and NCCL, so its peers in other groups stop too and find the same record. No global state:
//! the domain is an object passed in; two collections in one process have two.
//!
//! The NCCL halves are members too. A device communicator made with a domain in its options (a collection with a
//! GPU makes each one so) registers itself as a [`Member`]: a failure of a host communicator aborts it as well
//! (`ncclCommAbort`, which breaks it), so this rank's NCCL work stops at once instead of leaving its peers' NCCL
//! work to NCCL's own timeouts. When an NCCL communicator fails fatally itself (its timeout, an asynchronous
//! error), it records what it knows with [`FailureDomain::settle_device`] (NCCL does not say which rank was lost:
//! a root cause without ranks, which a later cause naming ranks replaces) and aborts every other member, host
//! and device, so that the rank's peers learn of it at once through the host communicators.
//!
//! Aborting the members (a deliberate [`FailureDomain::abort`], or another member's failure) stops them all at
//! once, NCCL communicators in one NCCL group where the loaded NCCL allows, within one bound ([`abort`]).
//!
//! Writes run on a short-lived thread the writer waits for at most [`PUBLISH_WAIT`] (a dead store must not hold
//! an abort up); every read is bounded.
//!
//! [`CommOptions`]: crate::CommOptions

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use hypercomm_store::{Key, Store};

use crate::CommError;
use crate::error::{Call, Fault, RootCause};

mod abort;
mod cycle;
mod record;

pub(crate) use abort::{JointStop, Member, STOP_TRY, Step};
pub(crate) use cycle::from_lowest;
use record::{Record, decode, encode};

/// How long a failing rank waits for its failure record to reach the store before going on anyway.
pub(crate) const PUBLISH_WAIT: Duration = Duration::from_millis(500);

/// How long a rank stopped by a peer's abort waits for that peer's failure record (written before the abort).
pub(crate) const FETCH_WAIT: Duration = Duration::from_millis(1500);

/// How long a rank that saw peers vanish waits, in all, for their failure records (written before they exited).
pub(crate) const MESSENGER_WAIT: Duration = Duration::from_millis(1000);

/// How long a rank that timed out waits for the records of the ranks it was waiting for: they time out on their
/// own failure at about the same moment, give or take the skew between the ranks' waits.
pub(crate) fn stuck_wait(timeout: Duration) -> Duration {
    (timeout / 2).clamp(Duration::from_millis(250), Duration::from_secs(3))
}

/// Where failure records go and which communicators fall together: one per collection (shared by all its
/// communicators), or one per communicator made alone.
///
/// ```
/// use std::sync::Arc;
/// use hypercomm_comm::{CommOptions, FailureDomain};
/// use hypercomm_store::{Key, MemoryStore, Store};
///
/// // Communicators of one job step that should fail together, as rank 3 of the job.
/// let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
/// let domain = FailureDomain::new(Arc::clone(&store), Key::new("step").push("failures"), 3);
/// let options = CommOptions { failure_domain: Some(domain), ..CommOptions::named("tp") };
/// # let _ = options;
/// ```
pub struct FailureDomain {
    store: Arc<dyn Store>,
    prefix: Key,
    me: usize,
    /// What this rank has recorded so far.
    own: Mutex<Option<Record>>,
    /// The members that abort together: host communicators and NCCL communicators.
    comms: Mutex<Vec<Weak<dyn Member>>>,
}

impl std::fmt::Debug for FailureDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FailureDomain")
            .field("prefix", &self.prefix)
            .field("me", &self.me)
            .finish_non_exhaustive()
    }
}

/// Domains compare by identity: two options are equal only when they share the same domain object.
impl PartialEq for FailureDomain {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

/// What a rank's error turned out to be, after the peers' records.
#[derive(Debug, PartialEq)]
enum Resolution {
    /// The ranks themselves are at fault (no record of theirs says otherwise).
    Direct(Vec<usize>),
    /// `by` recorded (or was stuck on) this root cause.
    Recorded(usize, RootCause),
    /// `by` gave up without a cause.
    NoCause(usize),
}

/// The communicator a failure happened in, as the resolution needs it.
pub(crate) struct Context<'a> {
    pub comm: &'a str,
    pub timeout: Duration,
}

impl FailureDomain {
    /// A domain whose records live in `store` under `prefix`, for the rank whose member id is `me` (every
    /// communicator put in it must be joined as `me`).
    pub fn new(store: Arc<dyn Store>, prefix: Key, me: usize) -> Arc<FailureDomain> {
        Arc::new(FailureDomain {
            store,
            prefix,
            me,
            own: Mutex::new(None),
            comms: Mutex::new(Vec::new()),
        })
    }

    /// The member id of this rank in the domain.
    pub fn rank(&self) -> usize {
        self.me
    }

    /// The root cause this rank recorded, once one of its communicators failed (or disagreed).
    pub fn root_cause(&self) -> Option<RootCause> {
        match lock(&self.own).as_ref() {
            Some(Record::Final(c)) => Some(c.clone()),
            _ => None,
        }
    }

    fn key(&self, rank: usize) -> Key {
        self.prefix.clone().push(rank)
    }

    /// Adds `member` to the members aborted when another fails (until it is dropped).
    pub(crate) fn register<M: Member + 'static>(&self, member: &Arc<M>) {
        let weak: Weak<dyn Member> = Arc::downgrade(member) as Weak<dyn Member>;
        let mut comms = lock(&self.comms);
        comms.retain(|w| w.strong_count() > 0);
        comms.push(weak);
    }

    /// Writes `record` as this rank's, unless it already recorded something at least as definite: a root cause
    /// is never replaced, except a disagreement by a fatal failure; a provisional record or a cause-less abort
    /// yields to a root cause.
    fn record(&self, record: Record) {
        {
            let mut own = lock(&self.own);
            let replace = match (own.as_ref(), &record) {
                (None, _) => true,
                (Some(Record::Provisional(_)), Record::Final(_) | Record::NoCause) => true,
                // A deliberate abort of one communicator does not hide a later failure of another.
                (Some(Record::NoCause), Record::Final(_)) => true,
                (Some(Record::Final(c)), Record::Final(n)) => {
                    (c.fault == Fault::Disagreed && n.fault != Fault::Disagreed)
                        // A cause without ranks (an NCCL failure) yields to one that names them.
                        || (c.ranks.is_empty() && !n.ranks.is_empty() && n.fault != Fault::Disagreed)
                }
                _ => false,
            };
            if !replace {
                return;
            }
            *own = Some(record.clone());
        }
        self.publish(&record);
    }

    /// Writes this rank's record to the store, waiting at most [`PUBLISH_WAIT`]: long enough for a live store,
    /// short enough that a dead one barely delays the abort. The write goes on in the background past that.
    fn publish(&self, record: &Record) {
        self.publish_bytes(self.key(self.me), encode(record));
    }

    /// Writes `value` under `key`, waiting at most [`PUBLISH_WAIT`] (see [`publish`](Self::publish)).
    fn publish_bytes(&self, key: Key, value: Vec<u8>) {
        let store = Arc::clone(&self.store);
        let (done, written) = std::sync::mpsc::channel();
        // A failure to start the thread or to write only costs the peers the detail; they still fail.
        let spawned = std::thread::Builder::new()
            .name("hypercomm-failure".into())
            .spawn(move || {
                let _ = store.set(&key, &value);
                let _ = done.send(());
            });
        if spawned.is_ok() {
            // Waiting matters: a process that exits right after its error would otherwise kill the write.
            let _ = written.recv_timeout(PUBLISH_WAIT);
        }
    }

    fn read(&self, rank: usize, wait: Duration) -> Option<Record> {
        self.store
            .get(&self.key(rank), wait)
            .ok()
            .and_then(|v| decode(&v))
    }

    /// Records a deliberate abort (unless this rank already recorded something), so that peers stopped by it do
    /// not wait for a cause.
    pub(crate) fn record_abort(&self) {
        self.record(Record::NoCause);
    }

    /// Reads the records of `start` (at most `wait` for this hop, the same again for a second hop through a
    /// stuck rank) and says who is really at fault.
    fn resolve(&self, start: &[usize], wait: Duration) -> Resolution {
        let start: Vec<usize> = start.iter().copied().filter(|&r| r != self.me).collect();
        let deadline = Instant::now() + wait;
        let (mut direct, mut stuck, mut no_cause) = (Vec::new(), None, None);
        for &r in &start {
            // Each later rank still gets a moment: its record may have landed while we waited for an earlier one.
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(20));
            match self.read(r, left) {
                // A record that blames this (live) rank is the other end of a broken link between the two: it
                // explains nothing here. A cycle of waits that this rank is on blames it along with the others.
                Some(Record::Final(c) | Record::Provisional(c))
                    if c.ranks.contains(&self.me) && c.fault != Fault::Deadlocked =>
                {
                    direct.push(r)
                }
                Some(Record::Final(c)) => return Resolution::Recorded(r, c),
                Some(Record::Provisional(c)) => {
                    stuck.get_or_insert((r, c));
                }
                Some(Record::NoCause) => {
                    no_cause.get_or_insert(r);
                }
                None => direct.push(r),
            }
        }
        if !direct.is_empty() {
            return Resolution::Direct(direct);
        }
        if let Some((by, cause)) = stuck {
            // `by` was alive and waiting for `cause.ranks`: follow one more hop.
            let deadline = Instant::now() + wait;
            let mut culprits = Vec::new();
            for &r in cause
                .ranks
                .iter()
                .filter(|&&r| r != self.me && !start.contains(&r))
            {
                let left = deadline
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(20));
                match self.read(r, left) {
                    Some(Record::Final(c)) => return Resolution::Recorded(by, c),
                    Some(_) => {}
                    None => culprits.push(r),
                }
            }
            if culprits.is_empty() {
                culprits = cause.ranks.clone();
            }
            return Resolution::Recorded(
                by,
                RootCause {
                    ranks: culprits,
                    ..cause
                },
            );
        }
        match no_cause {
            Some(by) => Resolution::NoCause(by),
            None => Resolution::Direct(start),
        }
    }

    /// The cycle of waits this rank is on, stuck as `mine` says, in a communicator of `size` ranks with timeout
    /// `timeout`, when the ranks' provisional records show one (`cycle`). Each rank on a cycle records its wait as
    /// it times out, at about the same moment as this one, give or take the skew between the ranks' waits: the
    /// walk reads for [`stuck_wait`] at most, which only a chain that is no cycle (ending at a rank without a
    /// record) spends in full.
    fn cycle(&self, mine: RootCause, size: usize, timeout: Duration) -> Option<RootCause> {
        let deadline = Instant::now() + stuck_wait(timeout);
        cycle::find(
            self.me,
            &mine,
            |r| {
                let left = deadline
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(20));
                self.read(r, left).map(|record| match record {
                    Record::Provisional(c) => cycle::Seen::Waiting(c),
                    Record::Final(c) => cycle::Seen::Settled(c),
                    Record::NoCause => cycle::Seen::NoCause,
                })
            },
            size,
        )
    }

    /// Turns `error` (ranks already member ids) into what this rank reports: the root cause as the peers'
    /// records tell it. Records this rank's own finding for the others; a fatal error also aborts every other
    /// communicator of the domain (the caller aborts the failing one).
    pub(crate) fn settle(&self, error: CommError, cx: &Context<'_>) -> CommError {
        let own = |ranks: Vec<usize>, fault: Fault, detail: String| RootCause {
            ranks,
            fault,
            comm: cx.comm.to_owned(),
            seen_by: self.me,
            detail,
        };
        let error = match error {
            CommError::Mismatch {
                comm,
                members,
                culprits,
                calls,
            } => {
                let detail = describe(&calls);
                self.record(Record::Final(own(
                    culprits.clone(),
                    Fault::Disagreed,
                    detail,
                )));
                return CommError::Mismatch {
                    comm,
                    members,
                    culprits,
                    calls,
                };
            }
            CommError::Timeout {
                comm,
                members,
                missing,
                after,
                during,
                cause: None,
            } => {
                // Say at once that this rank is alive and stuck, then look for the missing ranks' records.
                self.record(Record::Provisional(own(
                    missing.clone(),
                    Fault::Missing,
                    during.clone(),
                )));
                let resolution = match self.resolve(&missing, stuck_wait(cx.timeout)) {
                    // The rank waited for was stuck too: perhaps every rank of a cycle waits for the next.
                    Resolution::Recorded(by, c) if c.fault == Fault::Missing => {
                        let mine = own(missing.clone(), Fault::Missing, during.clone());
                        match self.cycle(mine, members.len(), cx.timeout) {
                            Some(cycle) => Resolution::Recorded(by, cycle),
                            None => Resolution::Recorded(by, c),
                        }
                    }
                    other => other,
                };
                let (cause, recorded) = match resolution {
                    Resolution::Recorded(_, c) => (Some(Box::new(c.clone())), c),
                    Resolution::Direct(d) if d != missing => {
                        let c = own(d, Fault::Missing, during.clone());
                        (Some(Box::new(c.clone())), c)
                    }
                    _ => (None, own(missing.clone(), Fault::Missing, during.clone())),
                };
                self.record(Record::Final(recorded));
                CommError::Timeout {
                    comm,
                    members,
                    missing,
                    after,
                    during,
                    cause,
                }
            }
            CommError::PeerDied {
                comm,
                members,
                ranks,
                during,
            } => match self.resolve(&ranks, MESSENGER_WAIT) {
                Resolution::Recorded(by, c) => {
                    self.record(Record::Final(c.clone()));
                    aborted(comm, members, by, during, Some(c))
                }
                Resolution::NoCause(by) => {
                    self.record(Record::NoCause);
                    aborted(comm, members, by, during, None)
                }
                Resolution::Direct(_) => {
                    self.record(Record::Final(own(
                        ranks.clone(),
                        Fault::Died,
                        during.clone(),
                    )));
                    CommError::PeerDied {
                        comm,
                        members,
                        ranks,
                        during,
                    }
                }
            },
            CommError::AbortedByPeer {
                comm,
                members,
                by,
                during,
                cause: None,
                ..
            } => match self.resolve(&[by], FETCH_WAIT) {
                Resolution::Recorded(m, c) => {
                    self.record(Record::Final(c.clone()));
                    aborted(comm, members, m, during, Some(c))
                }
                _ => {
                    self.record(Record::NoCause);
                    aborted(comm, members, by, during, None)
                }
            },
            other if other.is_fatal() => {
                self.record(Record::NoCause);
                other
            }
            other => return other,
        };
        self.abort_all(&error);
        error
    }

    /// Settles the fatal failure `error` of the NCCL communicator `comm` (already broken): records it as this
    /// rank's root cause unless it has one, and aborts every other member of the domain. The cause is the
    /// error's own when it has one (a timeout whose ranks compared their progress names the rank behind);
    /// otherwise NCCL did not say which rank was lost: a cause without ranks, timed out as [`Fault::Missing`],
    /// anything else as [`Fault::Died`].
    pub(crate) fn settle_device(&self, comm: &str, error: &CommError) {
        let fault = match error {
            CommError::Timeout { .. } => Fault::Missing,
            _ => Fault::Died,
        };
        let cause = error.root_cause().cloned().unwrap_or_else(|| RootCause {
            ranks: Vec::new(),
            fault,
            comm: comm.to_owned(),
            seen_by: self.me,
            detail: format!("nccl communicator {comm} failed: {error}"),
        });
        self.record(Record::Final(cause));
        self.abort_all(error);
    }

    /// The key under which this rank's progress on the NCCL communicator `comm` goes (see `behind`): beside the
    /// failure records, under the domain's prefix.
    fn progress_key(&self, comm: &str, rank: usize) -> Key {
        self.prefix.clone().push("progress").push(comm).push(rank)
    }

    /// Publishes `value` as this rank's progress on the NCCL communicator `comm`, waiting at most
    /// [`PUBLISH_WAIT`].
    pub(crate) fn publish_progress(&self, comm: &str, value: Vec<u8>) {
        self.publish_bytes(self.progress_key(comm, self.me), value);
    }

    /// Member `rank`'s progress on the NCCL communicator `comm`, waiting up to `wait` for it to appear.
    pub(crate) fn read_progress(&self, comm: &str, rank: usize, wait: Duration) -> Option<Vec<u8>> {
        self.store.get(&self.progress_key(comm, rank), wait).ok()
    }

    /// Gives up on every communicator of the domain at once: the host ones tell their peers (whose operations then
    /// fail at once), the NCCL ones are stopped, split and shrink children included, since they join their
    /// parent's domain. This rank's record says it gave up deliberately (unless it recorded a failure already,
    /// which stays its record), so its peers blame no rank of their own. Every later operation on any of them
    /// fails with [`CommError::Broken`].
    ///
    /// The members are stopped together, not one after another (see `failure::abort`): every one is marked
    /// broken first; the NCCL communicators of one loaded library are then freed in one NCCL group
    /// (`ncclCommAbort` of each between `ncclGroupStart` and `ncclGroupEnd`, NCCL 2.22 and later; one at a time
    /// before), which is how NCCL stops communicators whose kernels wait on each other's device; the host ones
    /// tell their peers, each on a thread of its own. An NCCL communicator with a call of another thread inside
    /// NCCL is not freed under that call: it is revoked (`ncclCommRevoke`, NCCL 2.28 and later) and freed by the
    /// call on its way out.
    ///
    /// Bounded: returns within 1.55 s whatever the members, the store and NCCL do: at most 0.5 s for this rank's
    /// record to reach the store, 50 ms for calls inside NCCL to return, and 1 s for the peers to be told and
    /// the NCCL communicators to be freed; what is not done by then (a freeing that NCCL holds up, a peer's full
    /// socket) finishes in the background.
    pub fn abort(&self) {
        self.record_abort();
        abort::stop_all(self.members(), "aborted by this rank");
    }

    /// The members still alive, in the order they joined.
    fn members(&self) -> Vec<Arc<dyn Member>> {
        lock(&self.comms).iter().filter_map(Weak::upgrade).collect()
    }

    /// Aborts every member of the domain that is not broken yet, with `error` as their cause, all at once (as
    /// [`abort`](Self::abort) does, within 1.05 s).
    fn abort_all(&self, error: &CommError) {
        let comms = self.members();
        if comms.len() <= 1 {
            return;
        }
        abort::stop_all(
            comms,
            &format!("another communicator of this rank failed: {error}"),
        );
    }
}

fn aborted(
    comm: String,
    members: Vec<usize>,
    by: usize,
    during: String,
    cause: Option<RootCause>,
) -> CommError {
    let lost = cause
        .as_ref()
        .filter(|c| c.fault.loses_ranks())
        .map_or_else(Vec::new, |c| c.ranks.clone());
    CommError::AbortedByPeer {
        comm,
        members,
        by,
        during,
        lost,
        cause: cause.map(Box::new),
    }
}

fn describe(calls: &[Call]) -> String {
    calls
        .iter()
        .map(|c| format!("rank(s) {:?} called {}", c.ranks, c.call))
        .collect::<Vec<_>>()
        .join(", ")
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every critical section here is a single assignment or read; a poisoned lock holds a consistent value.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hypercomm_store::MemoryStore;

    fn domain(store: &Arc<dyn Store>, me: usize) -> Arc<FailureDomain> {
        FailureDomain::new(Arc::clone(store), Key::new("d"), me)
    }

    fn cause(ranks: Vec<usize>, fault: Fault, seen_by: usize) -> RootCause {
        RootCause {
            ranks,
            fault,
            comm: "c/1".into(),
            seen_by,
            detail: "all_reduce(#2)\nsecond line".into(),
        }
    }

    #[test]
    fn a_vanished_peer_with_a_record_was_the_messenger() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        // Rank 0 lost rank 3, recorded that and exited; rank 1 was killed and recorded nothing.
        domain(&store, 0).record(Record::Final(cause(vec![3], Fault::Died, 0)));
        let two = domain(&store, 2);
        assert_eq!(
            two.resolve(&[1, 0], Duration::from_millis(100)),
            Resolution::Recorded(0, cause(vec![3], Fault::Died, 0))
        );
        assert_eq!(
            two.resolve(&[1], Duration::from_millis(50)),
            Resolution::Direct(vec![1]),
            "a killed rank leaves no record"
        );
        // A deliberate abort names no culprit.
        domain(&store, 4).record_abort();
        assert_eq!(
            two.resolve(&[4], Duration::from_millis(50)),
            Resolution::NoCause(4)
        );
    }

    #[test]
    fn a_record_blaming_the_reader_is_no_explanation() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        // The link 0-1 broke: rank 1 recorded rank 0 as dead. Rank 0, alive, sees rank 1 vanish: rank 1 is its
        // culprit, not itself.
        domain(&store, 1).record(Record::Final(cause(vec![0], Fault::Died, 1)));
        assert_eq!(
            domain(&store, 0).resolve(&[1], Duration::from_millis(50)),
            Resolution::Direct(vec![1])
        );
    }

    #[test]
    fn a_stuck_peer_is_followed_to_the_rank_it_waited_for() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        // Rank 3 timed out waiting for rank 2 (stopped: no record); rank 1 timed out waiting for rank 3.
        domain(&store, 3).record(Record::Provisional(cause(vec![2], Fault::Missing, 3)));
        let one = domain(&store, 1);
        assert_eq!(
            one.resolve(&[3], Duration::from_millis(50)),
            Resolution::Recorded(3, cause(vec![2], Fault::Missing, 3))
        );
        // Once rank 2's own record says it was stuck on rank 0's death, that is the cause.
        domain(&store, 2).record(Record::Final(cause(vec![0], Fault::Died, 2)));
        assert_eq!(
            one.resolve(&[3], Duration::from_millis(50)),
            Resolution::Recorded(3, cause(vec![0], Fault::Died, 2))
        );
    }

    #[test]
    fn a_final_record_is_kept_but_a_disagreement_yields_to_a_fatal_cause() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let d = domain(&store, 0);
        d.record(Record::Provisional(cause(vec![1], Fault::Missing, 0)));
        assert_eq!(d.root_cause(), None);
        d.record(Record::Final(cause(vec![1], Fault::Disagreed, 0)));
        d.record(Record::Final(cause(vec![2], Fault::Died, 0)));
        d.record(Record::Final(cause(vec![3], Fault::Died, 0)));
        d.record_abort();
        assert_eq!(d.root_cause(), Some(cause(vec![2], Fault::Died, 0)));
        // A deliberate abort first, a failure later: the failure is the record.
        let e = domain(&store, 7);
        e.record_abort();
        e.record(Record::Final(cause(vec![4], Fault::Missing, 7)));
        assert_eq!(e.root_cause(), Some(cause(vec![4], Fault::Missing, 7)));
        assert_eq!(
            domain(&store, 5).read(0, Duration::from_millis(50)),
            Some(Record::Final(cause(vec![2], Fault::Died, 0)))
        );
    }

    /// A member that remembers why it was aborted.
    #[derive(Default)]
    struct Probe(Mutex<Option<String>>);

    impl Member for Probe {
        fn abort_with(&self, cause: &str) {
            lock(&self.0).get_or_insert_with(|| cause.to_owned());
        }
    }

    #[test]
    fn an_nccl_failure_is_recorded_without_ranks_and_aborts_every_member() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let d = domain(&store, 1);
        let (host, device) = (Arc::new(Probe::default()), Arc::new(Probe::default()));
        d.register(&host);
        d.register(&device);
        let error = CommError::Device {
            comm: "m/tp/0/device".into(),
            what: "polling: ncclRemoteError".into(),
        };
        d.settle_device("m/tp/0/device", &error);
        for member in [&host, &device] {
            let cause = lock(&member.0).clone().expect("aborted");
            assert!(cause.contains("ncclRemoteError"), "{cause}");
        }
        let nccl = d.root_cause().expect("recorded");
        assert_eq!((nccl.ranks.as_slice(), nccl.fault), (&[][..], Fault::Died));
        assert!(
            nccl.to_string().starts_with("an unknown rank died (seen by rank 1 in communicator m/tp/0/device: nccl communicator m/tp/0/device failed:"),
            "{nccl}"
        );
        // A peer reads it as the root cause.
        assert_eq!(
            domain(&store, 0).resolve(&[1], Duration::from_millis(50)),
            Resolution::Recorded(1, nccl.clone())
        );
        // A cause that names ranks replaces it; a disagreement does not.
        d.record(Record::Final(cause(vec![3], Fault::Disagreed, 1)));
        assert_eq!(d.root_cause(), Some(nccl));
        d.record(Record::Final(cause(vec![3], Fault::Died, 1)));
        assert_eq!(d.root_cause(), Some(cause(vec![3], Fault::Died, 1)));
        // A timed-out NCCL communicator left its peers missing.
        let e = domain(&store, 2);
        e.settle_device(
            "c",
            &CommError::timeout("c", Vec::new(), Duration::from_secs(1), "x"),
        );
        assert_eq!(e.root_cause().map(|c| c.fault), Some(Fault::Missing));
    }

    #[test]
    fn the_bound_stated_for_abort_is_the_sum_of_its_waits() {
        // FailureDomain::abort's rustdoc and docs/perf/reliability.md state these numbers.
        assert_eq!(PUBLISH_WAIT, Duration::from_millis(500));
        assert_eq!(abort::STOP_TRY, Duration::from_millis(50));
        assert_eq!(abort::STOP_WAIT, Duration::from_secs(1));
        assert_eq!(
            PUBLISH_WAIT + abort::STOP_TRY + abort::STOP_WAIT,
            Duration::from_millis(1550)
        );
    }
}
