//! Cross-memory attach: one rank reading another process's buffer with a single copy made by the kernel
//! (`process_vm_readv(2)`), instead of the owner copying it into shared memory and the reader copying it out.
//!
//! The shared-memory transport stages every byte twice: the owner publishes it into its slot, the reader copies
//! (or reduces) it out. Where the ranks of a communicator are processes (or threads) on one host that may read each
//! other's memory, the large collectives read the peers' buffers where they are instead (see the `direct`
//! module): each rank publishes a [`Record`] of its buffer in an ordinary round, and the peers copy from it.
//!
//! Whether a rank may read another's memory is the kernel's call (the same user, no `PR_SET_DUMPABLE` cleared,
//! Yama's `ptrace_scope`, a container's seccomp profile, one pid namespace). So before the first direct operation
//! of a communicator every rank reads a nonce out of each peer and compares it with the value the peer published
//! through shared memory, which also proves that the pid names the right process, and the ranks agree in a
//! second round: direct reads for all, or for none. The answer is kept for the communicator's life ([`Attach`]).

use std::io;
use std::time::{SystemTime, UNIX_EPOCH};

/// Bytes of a [`Record`] on the wire.
pub(crate) const RECORD_BYTES: usize = 40;

/// Where a rank's buffer for one operation is, for its peers to read: its process, address and length, and the
/// nonce that lets a reader check it reaches the right process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    pub pid: u32,
    pub addr: usize,
    pub len: usize,
    nonce_addr: usize,
    nonce: u64,
}

impl Record {
    pub(crate) fn encode(&self) -> [u8; RECORD_BYTES] {
        let mut out = [0u8; RECORD_BYTES];
        let words = [
            u64::from(self.pid),
            self.addr as u64,
            self.len as u64,
            self.nonce_addr as u64,
            self.nonce,
        ];
        for (chunk, w) in out.chunks_exact_mut(8).zip(words) {
            chunk.copy_from_slice(&w.to_le_bytes());
        }
        out
    }

    /// The record in `bytes`; `None` when they are not one (wrong length, or a pid or address out of range).
    pub(crate) fn decode(bytes: &[u8]) -> Option<Record> {
        if bytes.len() != RECORD_BYTES {
            return None;
        }
        let mut words = bytes.chunks_exact(8).map(|c| {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            u64::from_le_bytes(w)
        });
        let mut next = || words.next();
        Some(Record {
            pid: u32::try_from(next()?).ok()?,
            addr: usize::try_from(next()?).ok()?,
            len: usize::try_from(next()?).ok()?,
            nonce_addr: usize::try_from(next()?).ok()?,
            nonce: next()?,
        })
    }

    /// Copies bytes `at..at + dst.len()` of this buffer into `dst`. Fails when the range leaves the buffer, or the
    /// kernel refuses or cannot complete the read.
    pub(crate) fn read(&self, at: usize, dst: &mut [u8]) -> io::Result<()> {
        let end = at.checked_add(dst.len()).filter(|&e| e <= self.len);
        if end.is_none() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "bytes {at}..{} lie outside the {}-byte buffer",
                    at.saturating_add(dst.len()),
                    self.len
                ),
            ));
        }
        read_process(self.pid, self.addr + at, dst)
    }

    /// Whether the kernel lets this process read the record's owner, and the pid names the process that published
    /// it: the nonce read out of it matches the one it published.
    pub(crate) fn reachable(&self) -> bool {
        let mut got = [0u8; 8];
        read_process(self.pid, self.nonce_addr, &mut got).is_ok()
            && u64::from_le_bytes(got) == self.nonce
    }
}

/// Copies `dst.len()` bytes at `addr` in process `pid` into `dst`, looping over partial reads.
fn read_process(pid: u32, addr: usize, dst: &mut [u8]) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("pid {pid}")))?;
    let mut done = 0;
    while done < dst.len() {
        let rest = &mut dst[done..];
        let local = libc::iovec {
            iov_base: rest.as_mut_ptr().cast(),
            iov_len: rest.len(),
        };
        let remote = libc::iovec {
            iov_base: (addr + done) as *mut libc::c_void,
            iov_len: rest.len(),
        };
        // SAFETY: `local` describes `rest`, memory this function borrows mutably for the call, so the kernel's
        // writes land in it alone; `remote` is only an address in the other process, which the kernel checks
        // (EFAULT when unmapped) and which this process never dereferences.
        let got = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
        match got {
            n if n > 0 => done += n as usize,
            0 => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("process {pid} gave no bytes at {:#x}", addr + done),
                ));
            }
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

/// Whether this communicator's ranks read each other's memory directly, once they have found out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Agreement {
    /// Not tried yet: the first direct operation probes and agrees.
    Untested,
    /// Every rank reached every peer.
    Works,
    /// Some rank could not reach some peer: every rank stages through shared memory.
    Refused,
}

/// One rank's side of cross-memory attach on a communicator: the nonce its peers read to check they reach it,
/// and what the ranks agreed.
pub(crate) struct Attach {
    /// Boxed so that its address, which the records carry, stays put however the transport moves.
    nonce: Box<u64>,
    pub agreement: Agreement,
}

impl Attach {
    pub(crate) fn new() -> Attach {
        let mut nonce = Box::new(0u64);
        // Unique enough to tell processes apart: the time, this process and where the box landed. A reader that
        // reached the wrong process would have to find this very value at this very address.
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let mixed = nanos
            ^ u64::from(std::process::id()).rotate_left(32)
            ^ (&*nonce as *const u64 as u64).rotate_left(17)
            ^ 0x9e37_79b9_7f4a_7c15;
        *nonce = mixed;
        Attach {
            nonce,
            agreement: Agreement::Untested,
        }
    }

    /// The record peers read `len` bytes at `addr` of this process with.
    pub(crate) fn record(&self, addr: *const u8, len: usize) -> Record {
        Record {
            pid: std::process::id(),
            addr: addr as usize,
            len,
            nonce_addr: &*self.nonce as *const u64 as usize,
            nonce: *self.nonce,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_survives_encoding_and_rejects_wrong_lengths() {
        let attach = Attach::new();
        let data = [1u8, 2, 3];
        let rec = attach.record(data.as_ptr(), data.len());
        assert_eq!(Record::decode(&rec.encode()), Some(rec));
        assert_eq!(Record::decode(&rec.encode()[..RECORD_BYTES - 1]), None);
        let mut bad = rec.encode();
        bad[4] = 1; // a pid above u32::MAX
        assert_eq!(Record::decode(&bad), None);
    }

    #[test]
    fn a_record_reads_its_buffer_and_refuses_ranges_outside_it() {
        let attach = Attach::new();
        let data: Vec<u8> = (0..=255).collect();
        let rec = attach.record(data.as_ptr(), data.len());
        assert!(rec.reachable());
        let mut got = [0u8; 16];
        rec.read(100, &mut got).unwrap();
        assert_eq!(got.to_vec(), (100..116).collect::<Vec<u8>>());
        let err = rec.read(250, &mut got).unwrap_err();
        assert!(err.to_string().contains("250..266"), "{err}");
    }

    #[test]
    fn a_wrong_nonce_or_process_is_unreachable() {
        let attach = Attach::new();
        let data = [0u8; 8];
        let mut rec = attach.record(data.as_ptr(), data.len());
        rec.nonce ^= 1;
        assert!(!rec.reachable(), "a different nonce at the address");
        let mut rec = attach.record(data.as_ptr(), data.len());
        // pid 1 is init (or the sandbox's), which this process may not read, or which holds something else there.
        rec.pid = 1;
        assert!(!rec.reachable() || std::process::id() == 1);
    }
}
