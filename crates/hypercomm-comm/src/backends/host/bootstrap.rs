//! Bootstrap: how the ranks of a new communicator find each other through the store and pick a transport, with a
//! constant number of store operations per rank whatever the communicator's size.
//!
//! Keys (all under `comm/<name>/`):
//!
//! 1. `leader`: rank 0 publishes `"<host identity>\n<pid>\n<segment path or empty>"`. Unless TCP is forced, it has
//!    just created the shared-memory segment and attached to it.
//! 2. Every other rank reads `leader`. A rank on the leader's host (same boot id and hostname) maps the segment
//!    and attaches (writes its pid into its control block) before going on.
//! 3. `arrived/<rank>`: every rank marks its arrival (read only to name the absent ranks when the bootstrap times
//!    out); then `arrivals`: every rank adds 1 if it shares the leader's host, `n + 1` otherwise. The sum tells how many have
//!    arrived (`sum mod (n+1)` plus `sum div (n+1)`) and how many are remote; the rank whose add completes the count
//!    writes `decision`: `shm` (all local, TCP not forced), `tcp-local` (all local, TCP forced) or `tcp`.
//! 4. Everyone reads `decision`. Under `shm` every rank attached before its add, so the leader removes the
//!    segment's file name at once; the peers' pids come from the segment. Under TCP the segment is dropped, the
//!    leader publishes its listening address under `tcp`, and the mesh is built peer to peer through the leader
//!    (see `mesh`).
//!
//! Per rank: 4 or 5 requests (one more for the rank that decides), a few hundred bytes.

use std::path::PathBuf;

use hypercomm_store::{Key, Store, StoreError};

use super::DEFAULT_SCRATCH;
use super::mesh;
use super::segment::Segment;
use super::shm::ShmTransport;
use super::tcp::TcpTransport;
use super::transport::Transport;
use crate::CommError;
use crate::options::CommOptions;

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

/// The ranks of `0..n` that have not written `arrived/<rank>`: the ones a stuck bootstrap is waiting for.
fn not_arrived(store: &dyn Store, name: &str, n: usize) -> Vec<usize> {
    (0..n)
        .filter(|&r| !matches!(store.try_get(&key(name, "arrived").push(r)), Ok(Some(_))))
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
    segment: Option<PathBuf>,
}

impl LeaderRecord {
    fn encode(&self) -> Vec<u8> {
        let path = self
            .segment
            .as_ref()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        format!("{}\n{}\n{path}", self.identity, std::process::id()).into_bytes()
    }

    fn decode(comm: &str, bytes: &[u8]) -> Result<LeaderRecord, CommError> {
        let text = String::from_utf8_lossy(bytes);
        let mut lines = text.splitn(3, '\n');
        match (lines.next(), lines.next(), lines.next()) {
            (Some(identity), Some(pid), Some(path)) if pid.parse::<u32>().is_ok() => {
                Ok(LeaderRecord {
                    identity: identity.to_owned(),
                    segment: (!path.is_empty()).then(|| PathBuf::from(path)),
                })
            }
            _ => Err(protocol(
                comm,
                format!("rank 0's bootstrap record {text:?} is not \"identity\\npid\\npath\""),
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

/// Connects rank `me` of `n`; returns the transport and its name.
pub(crate) fn connect(
    store: &dyn Store,
    n: usize,
    me: usize,
    options: &CommOptions,
) -> Result<(Box<dyn Transport>, &'static str), CommError> {
    let name = options.name.as_str();
    let timeout = options.timeout;
    let scratch = options.scratch_bytes.unwrap_or(DEFAULT_SCRATCH);
    let identity = host_identity();

    // 1-2: the leader's record, and the segment for ranks on its host.
    let (segment, local) = if me == 0 {
        let segment = if options.force_tcp {
            None
        } else {
            let seg = Segment::create(name, n, scratch, MAILBOX_BYTES.min(scratch))?;
            seg.rank_ctl(0)
                .pid
                .store(std::process::id(), std::sync::atomic::Ordering::SeqCst);
            Some(seg)
        };
        let record = LeaderRecord {
            identity: identity.clone(),
            segment: segment.as_ref().and_then(Segment::path).map(PathBuf::from),
        };
        store
            .set(&key(name, "leader"), &record.encode())
            .map_err(store_err(name))?;
        (segment, true)
    } else {
        let bytes = get_or_name_missing(
            store,
            &key(name, "leader"),
            options,
            "bootstrap: waiting for rank 0's record",
            || vec![0],
        )?;
        let record = LeaderRecord::decode(name, &bytes)?;
        let local = record.identity == identity;
        let segment = match (&record.segment, local) {
            (Some(path), true) => {
                let seg = Segment::open(name, path, n)?;
                seg.rank_ctl(me)
                    .pid
                    .store(std::process::id(), std::sync::atomic::Ordering::SeqCst);
                Some(seg)
            }
            _ => None,
        };
        (segment, local)
    };

    // 3: arrivals, and the decision by whoever completes them. `arrived/<rank>` is read only when the decision
    // never comes, to name the ranks that did not arrive; it is written after counting in, so that a rank that
    // dies between the two is named too.
    let weight = if local { 1 } else { n as i64 + 1 };
    let sum = store
        .add(&key(name, "arrivals"), weight)
        .map_err(store_err(name))?;
    store
        .set(&key(name, "arrived").push(me), b"")
        .map_err(store_err(name))?;
    let (remote, near) = (sum / (n as i64 + 1), sum % (n as i64 + 1));
    if remote + near == n as i64 {
        let decision = match (remote, options.force_tcp) {
            (0, false) => Decision::Shm,
            (0, true) => Decision::TcpLocal,
            _ => Decision::Tcp,
        };
        store
            .set(&key(name, "decision"), decision.name().as_bytes())
            .map_err(store_err(name))?;
    }

    // 4: everyone learns the decision.
    let bytes = get_or_name_missing(
        store,
        &key(name, "decision"),
        options,
        "bootstrap: waiting for every rank to arrive",
        || not_arrived(store, name, n),
    )?;
    match Decision::parse(name, &bytes)? {
        Decision::Shm => {
            let mut seg = segment.ok_or_else(|| {
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
            // Every rank attached before adding to `arrivals`: the file name is no longer needed.
            seg.unlink();
            Ok((
                Box::new(ShmTransport::new(seg, name.to_owned(), me, timeout, pids)),
                "shm",
            ))
        }
        decision => {
            // Dropping the segment unmaps it (and, on the leader, removes its file).
            drop(segment);
            let own = mesh::listen(name, decision == Decision::TcpLocal, options.host_addr)?;
            let leader = if me == 0 {
                store
                    .set(&key(name, "tcp"), own.advertised.to_string().as_bytes())
                    .map_err(store_err(name))?;
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
            Ok((Box::new(tcp), "tcp"))
        }
    }
}
