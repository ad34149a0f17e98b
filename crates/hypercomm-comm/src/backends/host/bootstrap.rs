//! Bootstrap: how the ranks of a new communicator find each other through the store and pick a transport, with a
//! constant number of store operations per rank whatever the communicator's size.
//!
//! Keys (all under `comm/<name>/`):
//!
//! 1. `leader`: rank 0 publishes `"<host identity>\n<pid>\n<socket name or empty>"`. Unless TCP is forced, it has
//!    just created the shared-memory segment (an anonymous memfd), attached to it and started serving its
//!    descriptor on a socket in the abstract namespace (see `fdpass`), from a thread of its own until step 4.
//! 2. Every other rank reads `leader`. A rank on the leader's host (same boot id and hostname) fetches the segment
//!    over the socket, maps it and attaches (writes its pid into its control block) before going on.
//! 3. `arrivals`: rank 0's record is its arrival; every other rank adds to the counter, with a weight saying
//!    whether it shares the leader's host. In a group of up to 31 ranks it adds `1 << rank` if it does,
//!    `1 << (n + rank)` if not, so the counter says exactly who has arrived and who is remote; in a larger group
//!    it adds 1 or `n + 1` (`sum mod (n+1)` plus `sum div (n+1)` arrived, `sum div (n+1)` remote) and marks
//!    `arrived/<rank>` (read only to name the absent ranks when the bootstrap times out). The rank whose add
//!    completes the count writes `decision`: `shm` (all local, TCP not forced), `tcp-local` (all local, TCP forced)
//!    or `tcp`.
//! 4. Everyone else reads `decision`; rank 0 stops serving the segment. Under `shm` every rank attached before its
//!    add; the peers' pids come from the segment. Under TCP the segment is dropped, the leader publishes its
//!    listening address under `tcp`, and the mesh is built peer to peer through the leader (see `mesh`).
//!
//! A rank alone (`n = 1`) needs nobody: it publishes nothing and decides by itself, without a store request.
//!
//! No step leaves anything named behind: the segment and the socket vanish with the last process holding them.
//! The caller's [`StepHook`](crate::StepHook) runs at each [`Step`].
//!
//! Per rank, in a group of up to 31 ranks: rank 0 makes 2 requests (its record, the decision), the others 3 (the
//! record, their add, the decision, which the rank that decides writes instead of reading), a few hundred bytes;
//! one more each (the arrival mark) in a larger group. Before the record counted as rank 0's arrival and the
//! counter's bits named the absent, every rank made 4 or 5.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Instant;

use hypercomm_store::{Key, Store, StoreError};

use super::fdpass;
use super::liveness::process_alive;
use super::mesh;
use super::segment::Segment;
use super::shm::ShmTransport;
use super::tcp::TcpTransport;
use super::transport::Transport;
use crate::options::CommOptions;
use crate::{CommError, Step};

/// Default bytes of staging area per rank and round.
const DEFAULT_SCRATCH: usize = 1 << 20;

/// Bytes per point-to-point mailbox: enough for small messages in one piece without growing the segment much.
const MAILBOX_BYTES: usize = 64 * 1024;

fn key(name: &str, what: &str) -> Key {
    Key::new("comm").push(name).push(what)
}

fn store_err(comm: &str) -> impl FnOnce(StoreError) -> CommError + '_ {
    move |source| CommError::Store {
        comm: comm.to_owned(),
        source,
    }
}

/// Runs the caller's hook, if any, at `step`.
fn step(options: &CommOptions, step: Step<'_>) {
    if let Some(hook) = &options.on_step {
        hook.call(&step);
    }
}

/// Reads `key`, waiting up to the timeout. A timeout becomes [`CommError::Timeout`] naming the ranks that
/// `missing()` finds absent (called only on that path); other store errors stay store errors.
fn get_or_name_missing(
    store: &dyn Store,
    key: &Key,
    options: &CommOptions,
    during: &str,
    missing: impl FnOnce() -> Vec<usize>,
) -> Result<Vec<u8>, CommError> {
    match store.get(key, options.timeout) {
        Ok(value) => Ok(value),
        Err(StoreError::Timeout { .. }) => Err(CommError::timeout(
            &options.name,
            missing(),
            options.timeout,
            during,
        )),
        Err(source) => Err(store_err(&options.name)(source)),
    }
}

/// Groups of at most this many ranks count arrivals in the bits of the counter (two per rank: local, remote), so
/// that the counter itself says who arrived; larger ones count with weights and mark each arrival under its own key.
const BIT_RANKS: usize = 31;

/// What rank `me` of `n` adds to `arrivals`: `1 << me` (local) or `1 << (n + me)` (remote) in a group of up to
/// [`BIT_RANKS`] ranks, else 1 (local) or `n + 1` (remote).
fn arrival_weight(n: usize, me: usize, local: bool) -> i64 {
    match (n <= BIT_RANKS, local) {
        (true, true) => 1 << me,
        (true, false) => 1 << (n + me),
        (false, true) => 1,
        (false, false) => n as i64 + 1,
    }
}

/// In a group of up to [`BIT_RANKS`] ranks, the `arrivals` counter's ranks that have added to it (bit `r` for rank
/// `r`), and those of them that are remote.
fn arrival_bits(n: usize, sum: i64) -> (i64, i64) {
    let mask = (1i64 << n) - 1;
    let remote = (sum >> n) & mask;
    ((sum | remote) & mask, remote)
}

/// From the `arrivals` counter of an `n`-rank group: how many ranks have added to it, and how many of them are
/// remote.
fn tally(n: usize, sum: i64) -> (i64, i64) {
    if n <= BIT_RANKS {
        let (arrived, remote) = arrival_bits(n, sum);
        (
            i64::from(arrived.count_ones()),
            i64::from(remote.count_ones()),
        )
    } else {
        let (remote, near) = (sum / (n as i64 + 1), sum % (n as i64 + 1));
        (remote + near, remote)
    }
}

/// The ranks a stuck bootstrap is waiting for: ranks `1..n` that have not counted themselves in (by the bits of
/// `arrivals` in a small group, else by their `arrived/<rank>` marks), and the ranks whose process is known to be
/// dead: rank 0 by the pid in its record (its record is its arrival), the attached ranks by the pids in the segment
/// (a rank killed after counting in).
fn not_arrived(
    store: &dyn Store,
    name: &str,
    n: usize,
    leader_pid: Option<u32>,
    segment: Option<&Segment>,
) -> Vec<usize> {
    let counter = (n <= BIT_RANKS).then(|| {
        match store.try_get(&key(name, "arrivals")) {
            Ok(Some(bytes)) => String::from_utf8_lossy(&bytes).trim().parse::<i64>().ok(),
            // Nobody has counted in yet.
            Ok(None) => Some(0),
            Err(_) => None,
        }
    });
    (0..n)
        .filter(|&r| {
            let absent = match (r, counter) {
                (0, _) => false,
                (_, Some(Some(sum))) => arrival_bits(n, sum).0 & (1 << r) == 0,
                // An unreadable counter names nobody by it; the pids still can.
                (_, Some(None)) => false,
                (_, None) => !matches!(store.try_get(&key(name, "arrived").push(r)), Ok(Some(_))),
            };
            let pid = match (r, segment) {
                (0, _) => leader_pid,
                (_, Some(seg)) => Some(
                    seg.rank_ctl(r)
                        .pid
                        .load(std::sync::atomic::Ordering::SeqCst),
                )
                .filter(|&p| p != 0),
                (_, None) => None,
            };
            absent || pid.is_some_and(|p| !process_alive(p))
        })
        .collect()
}

fn protocol(comm: &str, what: String) -> CommError {
    CommError::Protocol {
        comm: comm.to_owned(),
        what,
    }
}

/// This machine's identity: ranks with equal identities share memory.
fn host_identity() -> String {
    let read = |p: &str| std::fs::read_to_string(p).map(|s| s.trim().to_owned());
    match (
        read("/proc/sys/kernel/random/boot_id"),
        read("/proc/sys/kernel/hostname"),
    ) {
        (Ok(boot), Ok(host)) => format!("{boot}/{host}"),
        // Unknown identity: make it unique so that this rank is never assumed to share memory.
        _ => format!("unknown/{}", std::process::id()),
    }
}

/// What rank 0 publishes.
struct LeaderRecord {
    identity: String,
    pid: u32,
    /// The abstract socket name the segment is served on, when there is a segment.
    socket: Option<String>,
}

impl LeaderRecord {
    fn encode(&self) -> Vec<u8> {
        let socket = self.socket.as_deref().unwrap_or_default();
        format!("{}\n{}\n{socket}", self.identity, self.pid).into_bytes()
    }

    fn decode(comm: &str, bytes: &[u8]) -> Result<LeaderRecord, CommError> {
        let text = String::from_utf8_lossy(bytes);
        let mut lines = text.splitn(3, '\n');
        match (lines.next(), lines.next(), lines.next()) {
            (Some(identity), Some(pid), Some(socket)) if pid.parse::<u32>().is_ok() => {
                Ok(LeaderRecord {
                    identity: identity.to_owned(),
                    pid: pid.parse().unwrap_or_default(),
                    socket: (!socket.is_empty()).then(|| socket.to_owned()),
                })
            }
            _ => Err(protocol(
                comm,
                format!("rank 0's bootstrap record {text:?} is not \"identity\\npid\\nsocket\""),
            )),
        }
    }
}

/// How the communicator's ranks will talk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decision {
    Shm,
    TcpLocal,
    Tcp,
}

impl Decision {
    fn name(self) -> &'static str {
        match self {
            Decision::Shm => "shm",
            Decision::TcpLocal => "tcp-local",
            Decision::Tcp => "tcp",
        }
    }

    fn parse(comm: &str, bytes: &[u8]) -> Result<Decision, CommError> {
        [Decision::Shm, Decision::TcpLocal, Decision::Tcp]
            .into_iter()
            .find(|d| d.name().as_bytes() == bytes)
            .ok_or_else(|| {
                protocol(
                    comm,
                    format!(
                        "bootstrap decision {:?} is none of shm, tcp-local, tcp",
                        String::from_utf8_lossy(bytes)
                    ),
                )
            })
    }
}

/// Where this rank stands after step 2: its mapping of the segment (ranks on rank 0's host, unless TCP is forced)
/// and whether it shares rank 0's host.
struct Joined {
    segment: Option<Segment>,
    local: bool,
    leader_pid: Option<u32>,
}

/// A connected rank: its transport, the transport's name, and under shared memory the segment (whose symmetric
/// windows the communicator's user side shares).
pub(crate) struct Connected {
    pub transport: Box<dyn Transport>,
    pub name: &'static str,
    pub segment: Option<Arc<Segment>>,
}

/// Connects rank `me` of `n`.
pub(crate) fn connect(
    store: &dyn Store,
    n: usize,
    me: usize,
    options: &CommOptions,
) -> Result<Connected, CommError> {
    let name = options.name.as_str();
    let scratch = options.scratch_bytes.unwrap_or(DEFAULT_SCRATCH);
    let identity = host_identity();
    if me != 0 {
        let bytes = get_or_name_missing(
            store,
            &key(name, "leader"),
            options,
            "bootstrap: waiting for rank 0's record",
            || vec![0],
        )?;
        let record = LeaderRecord::decode(name, &bytes)?;
        step(
            options,
            Step::RecordRead {
                comm: name,
                rank: me,
            },
        );
        let local = record.identity == identity;
        let segment = match (&record.socket, local) {
            (Some(socket), true) => {
                let fd = fdpass::fetch(name, socket, me, record.pid, options.timeout)?;
                step(
                    options,
                    Step::SegmentReceived {
                        comm: name,
                        rank: me,
                    },
                );
                let seg = Segment::from_fd(name, &fd, n)?;
                // The mapping keeps the memory; the descriptor is no longer needed.
                drop(fd);
                seg.rank_ctl(me)
                    .pid
                    .store(std::process::id(), std::sync::atomic::Ordering::SeqCst);
                step(
                    options,
                    Step::SegmentAttached {
                        comm: name,
                        rank: me,
                    },
                );
                Some(seg)
            }
            _ => None,
        };
        let joined = Joined {
            segment,
            local,
            leader_pid: local.then_some(record.pid),
        };
        return finish(store, n, me, options, scratch, joined);
    }
    if options.force_tcp {
        if n > 1 {
            publish(store, options, &identity, None)?;
        }
        let joined = Joined {
            segment: None,
            local: true,
            leader_pid: None,
        };
        return finish(store, n, me, options, scratch, joined);
    }
    let (seg, fd): (Segment, OwnedFd) = Segment::create(
        name,
        n,
        scratch,
        MAILBOX_BYTES.min(scratch),
        options.symmetric_bytes,
    )?;
    seg.rank_ctl(0)
        .pid
        .store(std::process::id(), std::sync::atomic::Ordering::SeqCst);
    step(options, Step::SegmentCreated { comm: name });
    if n == 1 {
        // Nobody to share the segment with: no socket, no service thread, no record, no store request.
        drop(fd);
        let joined = Joined {
            segment: Some(seg),
            local: true,
            leader_pid: None,
        };
        return finish(store, n, me, options, scratch, joined);
    }
    let listener = fdpass::listen(name)?;
    step(options, Step::Listening { comm: name });
    let (stop, stopped) = UnixStream::pair().map_err(|source| CommError::Io {
        comm: name.to_owned(),
        what: "creating the stop signal of the segment service".into(),
        source,
    })?;
    // The service runs while this thread meets the others in the store, and stops when the decision is known (or
    // the bootstrap fails): dropping `stop` wakes it.
    let deadline = Instant::now() + options.timeout;
    std::thread::scope(|scope| {
        let server = std::thread::Builder::new()
            .name(format!("hypercomm-{name}-segment"))
            .spawn_scoped(scope, || {
                listener.serve(name, n, fd.as_fd(), &stopped, deadline, |peer| {
                    step(options, Step::SegmentSent { comm: name, peer });
                })
            })
            .map_err(|source| CommError::Io {
                comm: name.to_owned(),
                what: "starting the segment service thread".into(),
                source,
            })?;
        let joined = Joined {
            segment: Some(seg),
            local: true,
            leader_pid: None,
        };
        let result = publish(store, options, &identity, Some(&listener.name))
            .and_then(|()| finish_with(store, n, me, options, scratch, joined, || drop(stop)));
        match server.join() {
            // A hook that panicked on the service thread panics the caller as it would on this one.
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(served) => {
                if let Err(e) = served {
                    tracing::warn!("{e}");
                }
            }
        }
        result
    })
}

/// Rank 0's step 1: its record.
fn publish(
    store: &dyn Store,
    options: &CommOptions,
    identity: &str,
    socket: Option<&str>,
) -> Result<(), CommError> {
    let record = LeaderRecord {
        identity: identity.to_owned(),
        pid: std::process::id(),
        socket: socket.map(str::to_owned),
    };
    store
        .set(&key(&options.name, "leader"), &record.encode())
        .map_err(store_err(&options.name))?;
    step(
        options,
        Step::RecordPublished {
            comm: &options.name,
        },
    );
    Ok(())
}

fn finish(
    store: &dyn Store,
    n: usize,
    me: usize,
    options: &CommOptions,
    scratch: usize,
    joined: Joined,
) -> Result<Connected, CommError> {
    finish_with(store, n, me, options, scratch, joined, || {})
}

/// Steps 3 and 4; `decided` runs as soon as the decision is known or the wait for it failed.
fn finish_with(
    store: &dyn Store,
    n: usize,
    me: usize,
    options: &CommOptions,
    scratch: usize,
    joined: Joined,
    decided: impl FnOnce(),
) -> Result<Connected, CommError> {
    let name = options.name.as_str();
    let timeout = options.timeout;
    let Joined {
        segment,
        local,
        leader_pid,
    } = joined;
    // 3: arrivals, and the decision by whoever completes them. Rank 0's record is its arrival (every other rank
    // reads it before counting in); the others add to `arrivals` (and, in a group too large for the counter's bits,
    // mark `arrived/<rank>`, read only to name the absent ranks when the decision never comes; written after
    // counting in, so that a rank that dies between the two is named too). A rank alone decides by itself.
    let choose = |remote: i64| match (remote, options.force_tcp) {
        (0, false) => Decision::Shm,
        (0, true) => Decision::TcpLocal,
        _ => Decision::Tcp,
    };
    let known = if me == 0 {
        step(
            options,
            Step::Arrived {
                comm: name,
                rank: me,
            },
        );
        (n == 1).then(|| choose(0))
    } else {
        let sum = store
            .add(&key(name, "arrivals"), arrival_weight(n, me, local))
            .map_err(store_err(name))?;
        if n > BIT_RANKS {
            store
                .set(&key(name, "arrived").push(me), b"")
                .map_err(store_err(name))?;
        }
        step(
            options,
            Step::Arrived {
                comm: name,
                rank: me,
            },
        );
        let (arrived, remote) = tally(n, sum);
        if arrived == n as i64 - 1 {
            let decision = choose(remote);
            store
                .set(&key(name, "decision"), decision.name().as_bytes())
                .map_err(store_err(name))?;
            Some(decision)
        } else {
            None
        }
    };

    // 4: everyone learns the decision (the rank that made it knows it).
    let decision = match known {
        Some(decision) => {
            decided();
            decision
        }
        None => {
            let bytes = get_or_name_missing(
                store,
                &key(name, "decision"),
                options,
                "bootstrap: waiting for every rank to arrive",
                || not_arrived(store, name, n, leader_pid, segment.as_ref()),
            );
            decided();
            Decision::parse(name, &bytes?)?
        }
    };
    let transport = if decision == Decision::Shm {
        "shm"
    } else {
        "tcp"
    };
    step(
        options,
        Step::Decided {
            comm: name,
            rank: me,
            transport,
        },
    );
    let built = match decision {
        Decision::Shm => {
            let seg = segment.ok_or_else(|| {
                protocol(
                    name,
                    "the ranks chose shared memory, but this rank could not map the segment".into(),
                )
            })?;
            let pids: Vec<u32> = (0..n)
                .map(|r| {
                    seg.rank_ctl(r)
                        .pid
                        .load(std::sync::atomic::Ordering::SeqCst)
                })
                .collect();
            if let Some(r) = pids.iter().position(|&p| p == 0) {
                return Err(protocol(
                    name,
                    format!("rank {r} never attached to the shared-memory segment"),
                ));
            }
            let seg = Arc::new(seg);
            Connected {
                transport: Box::new(ShmTransport::new(
                    Arc::clone(&seg),
                    name.to_owned(),
                    me,
                    timeout,
                    pids,
                )),
                name: "shm",
                segment: Some(seg),
            }
        }
        decision => {
            // Dropping the segment unmaps it.
            drop(segment);
            let own = mesh::listen(name, decision == Decision::TcpLocal, options.host_addr)?;
            let leader = if me == 0 {
                if n > 1 {
                    store
                        .set(&key(name, "tcp"), own.advertised.to_string().as_bytes())
                        .map_err(store_err(name))?;
                }
                None
            } else {
                let bytes = get_or_name_missing(
                    store,
                    &key(name, "tcp"),
                    options,
                    "bootstrap: waiting for rank 0's address",
                    || vec![0],
                )?;
                let text = String::from_utf8_lossy(&bytes);
                Some(text.parse().map_err(|_| {
                    protocol(
                        name,
                        format!("rank 0 published {text:?}, not a socket address"),
                    )
                })?)
            };
            let peers = mesh::connect(name, n, me, own, leader, timeout)?;
            let tcp = TcpTransport::from_streams(peers, me, options, scratch)?;
            Connected {
                transport: Box::new(tcp),
                name: "tcp",
                segment: None,
            }
        }
    };
    step(
        options,
        Step::Ready {
            comm: name,
            rank: me,
        },
    );
    Ok(built)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hypercomm_store::MemoryStore;

    #[test]
    fn the_counter_tells_who_arrived_and_who_is_remote_in_small_and_large_groups() {
        for n in [2, 5, BIT_RANKS, BIT_RANKS + 1, 100] {
            // Ranks 1..n arrive one by one, every third remote; rank 0 never adds (its record is its arrival).
            let mut sum = 0;
            let mut remote = 0;
            for me in 1..n {
                let local = me % 3 != 0;
                remote += i64::from(!local);
                sum += arrival_weight(n, me, local);
                assert_eq!(tally(n, sum), (me as i64, remote), "n {n}, after rank {me}");
            }
        }
    }

    #[test]
    fn a_stuck_bootstrap_names_the_ranks_that_did_not_count_in() {
        let store = MemoryStore::new();
        // A group of 4 (bits): ranks 1 (local) and 3 (remote) counted in, rank 2 did not.
        for (me, local) in [(1, true), (3, false)] {
            store
                .add(&key("small", "arrivals"), arrival_weight(4, me, local))
                .unwrap();
        }
        assert_eq!(
            not_arrived(&store, "small", 4, Some(std::process::id()), None),
            vec![2]
        );
        // Nobody counted in yet: all but rank 0, whose record is its arrival (and whose process lives).
        assert_eq!(
            not_arrived(&store, "none", 3, Some(std::process::id()), None),
            vec![1, 2]
        );
        // A group of 40 (marks): only the marked ranks arrived.
        let n = BIT_RANKS + 9;
        for me in 1..n - 1 {
            store.set(&key("large", "arrived").push(me), b"").unwrap();
        }
        assert_eq!(not_arrived(&store, "large", n, None, None), vec![n - 1]);
        // A dead rank 0 is named although its record counted it in.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        assert_eq!(
            not_arrived(&store, "small", 4, Some(dead), None),
            vec![0, 2]
        );
    }
}
