//! Bootstrap: how the ranks of a new communicator find each other through the store and pick a transport.
//!
//! Keys live under `comm/<name>/...`:
//!
//! 1. `comm/<name>/host/<rank>`: `"<boot id>/<hostname>\n<pid>"`. Every rank writes its own and reads all.
//! 2. All on one host and TCP not forced: rank 0 creates the segment and writes its path to `comm/<name>/shm`;
//!    the others map it and write `comm/<name>/attached/<rank>`; once all have, rank 0 unlinks the file.
//! 3. Otherwise: every rank listens on an ephemeral loopback port, writes it to `comm/<name>/tcp/<rank>`, connects
//!    to every lower rank and accepts every higher one.

use std::path::PathBuf;
use std::time::Duration;

use hypercomm_store::{Key, Store};

use super::DEFAULT_SCRATCH;
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

fn store_err(comm: &str) -> impl FnOnce(hypercomm_store::StoreError) -> CommError + '_ {
    move |source| CommError::Store {
        comm: comm.to_owned(),
        source,
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

/// Reads every rank's value under `comm/<name>/<what>/<rank>`, waiting up to `timeout`.
fn gather_all(
    store: &dyn Store,
    name: &str,
    what: &str,
    n: usize,
    timeout: Duration,
) -> Result<Vec<Vec<u8>>, CommError> {
    let keys: Vec<Key> = (0..n).map(|r| key(name, what).push(r)).collect();
    store.wait(&keys, timeout).map_err(store_err(name))?;
    keys.iter()
        .map(|k| store.get(k, timeout).map_err(store_err(name)))
        .collect()
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
    let record = format!("{}\n{}", host_identity(), std::process::id());
    store
        .set(&key(name, "host").push(me), record.as_bytes())
        .map_err(store_err(name))?;
    let records = gather_all(store, name, "host", n, timeout)?;
    let mut hosts = Vec::with_capacity(n);
    let mut pids = Vec::with_capacity(n);
    for (r, rec) in records.iter().enumerate() {
        let text = String::from_utf8_lossy(rec);
        let (host, pid) = text.split_once('\n').ok_or_else(|| CommError::Protocol {
            comm: name.to_owned(),
            what: format!("rank {r}'s bootstrap record {text:?} is not \"host\\npid\""),
        })?;
        hosts.push(host.to_owned());
        pids.push(pid.parse::<u32>().map_err(|_| CommError::Protocol {
            comm: name.to_owned(),
            what: format!("rank {r}'s bootstrap record has pid {pid:?}"),
        })?);
    }
    let one_host = hosts.iter().all(|h| *h == hosts[0]);
    let scratch = options.scratch_bytes.unwrap_or(DEFAULT_SCRATCH);
    if one_host && !options.force_tcp {
        let shm = connect_shm(store, n, me, options, scratch, pids)?;
        Ok((Box::new(shm), "shm"))
    } else {
        let tcp = TcpTransport::connect(store, &key(name, "tcp"), n, me, options, scratch)?;
        Ok((Box::new(tcp), "tcp"))
    }
}

fn connect_shm(
    store: &dyn Store,
    n: usize,
    me: usize,
    options: &CommOptions,
    scratch: usize,
    pids: Vec<u32>,
) -> Result<ShmTransport, CommError> {
    let name = options.name.as_str();
    let timeout = options.timeout;
    let seg = if me == 0 {
        let seg = Segment::create(name, n, scratch, MAILBOX_BYTES.min(scratch))?;
        let path = seg
            .path()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        store
            .set(&key(name, "shm"), path.as_bytes())
            .map_err(store_err(name))?;
        seg
    } else {
        let path = store
            .get(&key(name, "shm"), timeout)
            .map_err(store_err(name))?;
        let path = PathBuf::from(String::from_utf8_lossy(&path).into_owned());
        Segment::open(name, &path, n)?
    };
    let mut transport = ShmTransport::new(seg, name.to_owned(), me, timeout, pids);
    store
        .set(&key(name, "attached").push(me), b"1")
        .map_err(store_err(name))?;
    if me == 0 {
        // Once every rank has mapped the segment, its name is no longer needed: remove it now so that no file is
        // left behind however the processes end. On timeout the segment is dropped, which also unlinks it.
        let keys: Vec<Key> = (0..n).map(|r| key(name, "attached").push(r)).collect();
        store.wait(&keys, timeout).map_err(store_err(name))?;
        transport.unlink();
    }
    Ok(transport)
}
