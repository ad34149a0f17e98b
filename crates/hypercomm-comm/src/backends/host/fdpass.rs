//! Handing the shared-memory segment's file descriptor from rank 0 to the ranks on its host, over a Unix socket
//! in Linux's abstract namespace: nothing of the exchange has a name in any file system, so no process ending,
//! however abruptly, can leave a file behind.
//!
//! Rank 0 listens on `@hypercomm/<pid>/<64 random bits>` (published in its bootstrap record) and serves every
//! connection the same way: it reads a greeting `magic u64 | rank u64` (little-endian), checks with
//! `SO_PEERCRED` that the peer runs as the same user (what the old `0600` file mode guaranteed), and answers
//! `magic u64` with the descriptor attached (`SCM_RIGHTS`). It serves until the bootstrap tells it to stop or its
//! deadline passes; one failed connection is logged and does not stop it. A peer connects, greets, receives,
//! and closes. Every blocking call on either side is bounded by the deadline it is given.

use std::io::{ErrorKind, IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};

use super::liveness::process_alive;
use crate::CommError;

const MAGIC: u64 = 0x6863_6d65_6d66_6401;
/// Connections waiting to be accepted: every peer of a host may knock at once.
const BACKLOG: i32 = 1024;

fn io(comm: &str, what: String) -> impl FnOnce(std::io::Error) -> CommError + '_ {
    move |source| CommError::Io {
        comm: comm.to_owned(),
        what,
        source,
    }
}

fn errno(e: rustix::io::Errno) -> std::io::Error {
    std::io::Error::from_raw_os_error(e.raw_os_error())
}

fn left(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

/// Rank 0's listening socket and its abstract name (without the leading NUL).
pub(crate) struct Listener {
    listener: UnixListener,
    pub name: String,
}

/// Binds a fresh abstract name unique to this process and communicator.
pub(crate) fn listen(comm: &str) -> Result<Listener, CommError> {
    let mut last = None;
    for _ in 0..8 {
        let mut random = [0u8; 8];
        rustix::rand::getrandom(&mut random, rustix::rand::GetRandomFlags::empty())
            .map_err(|e| io(comm, "drawing a socket name".into())(errno(e)))?;
        let name = format!(
            "hypercomm/{}/{:016x}",
            std::process::id(),
            u64::from_le_bytes(random)
        );
        let sock = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::STREAM,
            SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            None,
        )
        .map_err(|e| io(comm, "creating a unix socket".into())(errno(e)))?;
        let addr = SocketAddrUnix::new_abstract_name(name.as_bytes())
            .map_err(|e| io(comm, format!("naming socket @{name}"))(errno(e)))?;
        match rustix::net::bind(&sock, &addr) {
            Ok(()) => {}
            Err(rustix::io::Errno::ADDRINUSE) => {
                last = Some(name);
                continue;
            }
            Err(e) => return Err(io(comm, format!("binding socket @{name}"))(errno(e))),
        }
        rustix::net::listen(&sock, BACKLOG)
            .map_err(|e| io(comm, format!("listening on socket @{name}"))(errno(e)))?;
        return Ok(Listener {
            listener: UnixListener::from(sock),
            name,
        });
    }
    Err(CommError::Io {
        comm: comm.to_owned(),
        what: format!("binding a unique socket name after 8 attempts (last @{last:?})"),
        source: std::io::Error::from(ErrorKind::AddrInUse),
    })
}

impl Listener {
    /// Serves `fd` to ranks `1..n` until `stop` becomes readable or closed, or `deadline` passes; calls `sent`
    /// with each rank served. A connection that fails is logged and skipped; only a failure of the listener itself
    /// ends the service early with an error.
    pub(crate) fn serve(
        &self,
        comm: &str,
        n: usize,
        fd: BorrowedFd<'_>,
        stop: &UnixStream,
        deadline: Instant,
        mut sent: impl FnMut(usize),
    ) -> Result<(), CommError> {
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Ok(());
            }
            let mut fds = [
                PollFd::new(&self.listener, PollFlags::IN),
                PollFd::new(stop, PollFlags::IN),
            ];
            let wait = rustix::event::Timespec::try_from(deadline - now).unwrap_or(
                rustix::event::Timespec {
                    tv_sec: i64::MAX,
                    tv_nsec: 0,
                },
            );
            match rustix::event::poll(&mut fds, Some(&wait)) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(io(comm, "polling the segment socket".into())(errno(e))),
            }
            if !fds[1].revents().is_empty() {
                return Ok(());
            }
            if fds[0].revents().is_empty() {
                continue;
            }
            let conn = match rustix::net::accept_with(&self.listener, SocketFlags::CLOEXEC) {
                Ok(conn) => conn,
                Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => continue,
                // The connecting peer gave up between poll and accept.
                Err(rustix::io::Errno::CONNABORTED) => continue,
                Err(e) => {
                    return Err(io(comm, "accepting on the segment socket".into())(errno(e)));
                }
            };
            match serve_one(comm, n, fd, UnixStream::from(conn), deadline) {
                Ok(rank) => sent(rank),
                Err(e) => tracing::warn!("{e}"),
            }
        }
    }
}

fn serve_one(
    comm: &str,
    n: usize,
    fd: BorrowedFd<'_>,
    mut conn: UnixStream,
    deadline: Instant,
) -> Result<usize, CommError> {
    let what = "serving the shared-memory segment";
    conn.set_read_timeout(Some(left(deadline)))
        .and_then(|()| conn.set_write_timeout(Some(left(deadline))))
        .map_err(io(comm, format!("{what}: configuring a connection")))?;
    let cred = rustix::net::sockopt::socket_peercred(&conn)
        .map_err(|e| io(comm, format!("{what}: reading the peer's credentials"))(errno(e)))?;
    if cred.uid != rustix::process::geteuid() {
        return Err(CommError::Protocol {
            comm: comm.to_owned(),
            what: format!(
                "{what}: pid {} of user {} asked for it; only user {} may",
                cred.pid.as_raw_nonzero(),
                cred.uid.as_raw(),
                rustix::process::geteuid().as_raw()
            ),
        });
    }
    let mut hello = [0u8; 16];
    conn.read_exact(&mut hello).map_err(io(
        comm,
        format!(
            "{what}: reading the greeting of pid {}",
            cred.pid.as_raw_nonzero()
        ),
    ))?;
    let magic = u64::from_le_bytes(hello[..8].try_into().unwrap_or_default());
    let rank = u64::from_le_bytes(hello[8..].try_into().unwrap_or_default());
    if magic != MAGIC || rank == 0 || rank >= n as u64 {
        return Err(CommError::Protocol {
            comm: comm.to_owned(),
            what: format!(
                "{what}: pid {} greeted with magic {magic:#x} and rank {rank}, not a rank of 1..{n}",
                cred.pid.as_raw_nonzero()
            ),
        });
    }
    let rank = rank as usize;
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds = [fd];
    control.push(SendAncillaryMessage::ScmRights(&fds));
    let payload = MAGIC.to_le_bytes();
    let sent = rustix::net::sendmsg(
        &conn,
        &[IoSlice::new(&payload)],
        &mut control,
        SendFlags::NOSIGNAL,
    )
    .map_err(|e| io(comm, format!("{what}: sending it to rank {rank}"))(errno(e)))?;
    if sent != payload.len() {
        // The descriptor went with the first byte; the rest of the magic follows as plain data.
        conn.write_all(&payload[sent..])
            .map_err(io(comm, format!("{what}: sending it to rank {rank}")))?;
    }
    Ok(rank)
}

/// How long a peer whose connection rank 0 closed or reset waits for rank 0's process to be gone before calling
/// the failure an I/O error: a process being killed closes its sockets before it becomes a zombie, and under load
/// the peer sees the reset well before that (seen in CI with a busy loop per core).
const EXIT_GRACE: Duration = Duration::from_secs(1);

/// Whether `e` says the other end closed or reset the connection.
fn closed_by_peer(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::ConnectionReset
            | ErrorKind::BrokenPipe
            | ErrorKind::UnexpectedEof
            | ErrorKind::ConnectionAborted
            | ErrorKind::ConnectionRefused
    )
}

/// Whether process `pid` is gone within [`EXIT_GRACE`] (and before `deadline`), polled every few milliseconds.
fn gone_soon(pid: u32, deadline: Instant) -> bool {
    let until = (Instant::now() + EXIT_GRACE).min(deadline);
    // Bounded by `until`.
    loop {
        if !process_alive(pid) {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Fetches the segment's descriptor from rank 0 (pid `leader_pid`) listening on `@name`, as rank `me`, within
/// `timeout`. Errors name rank 0: [`CommError::PeerDied`] when its process is gone, [`CommError::Timeout`] when it
/// does not answer in time.
pub(crate) fn fetch(
    comm: &str,
    name: &str,
    me: usize,
    leader_pid: u32,
    timeout: Duration,
) -> Result<OwnedFd, CommError> {
    let deadline = Instant::now() + timeout;
    let during = "bootstrap: fetching the shared-memory segment from rank 0";
    let failed = |what: &str, source: std::io::Error| -> CommError {
        // A closed or reset connection gets a moment for rank 0's process to finish dying (`gone_soon` looks at
        // once, then polls); any other failure is judged on one look.
        let dead = if closed_by_peer(&source) {
            gone_soon(leader_pid, deadline)
        } else {
            !process_alive(leader_pid)
        };
        if dead {
            CommError::peer_died(comm, vec![0], during)
        } else if matches!(source.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) {
            CommError::timeout(comm, vec![0], timeout, during)
        } else {
            CommError::Io {
                comm: comm.to_owned(),
                what: format!("{what} rank 0 (pid {leader_pid}) at @{name}"),
                source,
            }
        }
    };
    let sock = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| io(comm, "creating a unix socket".into())(errno(e)))?;
    // Bounds a connect that waits for room in a full backlog.
    rustix::net::sockopt::set_socket_timeout(
        &sock,
        rustix::net::sockopt::Timeout::Send,
        Some(left(deadline)),
    )
    .map_err(|e| io(comm, "configuring a unix socket".into())(errno(e)))?;
    let addr = SocketAddrUnix::new_abstract_name(name.as_bytes())
        .map_err(|e| io(comm, format!("naming socket @{name}"))(errno(e)))?;
    rustix::net::connect(&sock, &addr).map_err(|e| failed("connecting to", errno(e)))?;
    let mut conn = UnixStream::from(sock);
    conn.set_read_timeout(Some(left(deadline)))
        .and_then(|()| conn.set_write_timeout(Some(left(deadline))))
        .map_err(io(comm, "configuring a unix socket".into()))?;
    let mut hello = MAGIC.to_le_bytes().to_vec();
    hello.extend_from_slice(&(me as u64).to_le_bytes());
    conn.write_all(&hello).map_err(|e| failed("greeting", e))?;
    let mut reply = [0u8; 8];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(
        &conn,
        &mut [IoSliceMut::new(&mut reply)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )
    .map_err(|e| failed("receiving the segment from", errno(e)))?;
    let mut fd = None;
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(mut fds) = message {
            // Any further descriptor is closed as the iterator drops it.
            fd = fd.or_else(|| fds.next());
        }
    }
    if got.bytes == 0 {
        return Err(failed(
            "receiving the segment from",
            std::io::Error::from(ErrorKind::UnexpectedEof),
        ));
    }
    conn.read_exact(&mut reply[got.bytes..])
        .map_err(|e| failed("receiving the segment from", e))?;
    match fd {
        Some(fd) if u64::from_le_bytes(reply) == MAGIC => Ok(fd),
        _ => Err(CommError::Protocol {
            comm: comm.to_owned(),
            what: format!(
                "the socket @{name} of rank 0 (pid {leader_pid}) answered without a segment descriptor"
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_reset_is_a_death_only_when_the_process_goes_within_the_grace() {
        assert!(closed_by_peer(&std::io::Error::from(
            ErrorKind::ConnectionReset
        )));
        assert!(!closed_by_peer(&std::io::Error::from(
            ErrorKind::WouldBlock
        )));
        // A process that ends a moment later (unreaped: a zombie, which counts as gone) is waited for.
        let mut short = std::process::Command::new("sleep")
            .arg("0.2")
            .spawn()
            .unwrap();
        let far = Instant::now() + Duration::from_secs(30);
        assert!(
            gone_soon(short.id(), far),
            "the exiting process was not seen gone"
        );
        let _ = short.wait();
        // One that lives on is not, and the wait stops at the grace.
        let mut long = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let started = Instant::now();
        assert!(!gone_soon(long.id(), far));
        let waited = started.elapsed();
        let _ = long.kill();
        let _ = long.wait();
        assert!(
            waited >= EXIT_GRACE && waited < EXIT_GRACE * 10,
            "{waited:?}"
        );
    }

    #[test]
    fn a_descriptor_travels_to_every_rank_and_the_service_stops_on_request() {
        let comm = "fdpass-test";
        let listener = listen(comm).unwrap();
        assert!(
            listener
                .name
                .starts_with(&format!("hypercomm/{}/", std::process::id()))
        );
        let (stop_tx, stop_rx) = UnixStream::pair().unwrap();
        let file = tempfile_with(b"shared");
        let deadline = Instant::now() + Duration::from_secs(20);
        let served = std::thread::scope(|s| {
            let server = s.spawn(|| {
                let mut served = Vec::new();
                listener
                    .serve(comm, 3, file.as_fd(), &stop_rx, deadline, |r| {
                        served.push(r)
                    })
                    .unwrap();
                served
            });
            for rank in [2, 1] {
                let fd = fetch(
                    comm,
                    &listener.name,
                    rank,
                    std::process::id(),
                    Duration::from_secs(20),
                )
                .unwrap();
                // The descriptor shares the sender's file offset: read at an explicit position.
                let mut text = [0u8; 6];
                std::os::unix::fs::FileExt::read_exact_at(&std::fs::File::from(fd), &mut text, 0)
                    .unwrap();
                assert_eq!(&text, b"shared");
            }
            drop(stop_tx);
            server.join().unwrap()
        });
        assert_eq!(served, vec![2, 1]);
    }

    #[test]
    fn a_rank_out_of_range_gets_nothing_and_the_service_goes_on() {
        let comm = "fdpass-range";
        let listener = listen(comm).unwrap();
        let (stop_tx, stop_rx) = UnixStream::pair().unwrap();
        let file = tempfile_with(b"x");
        let deadline = Instant::now() + Duration::from_secs(20);
        std::thread::scope(|s| {
            let server = s.spawn(|| {
                let mut served = Vec::new();
                listener
                    .serve(comm, 2, file.as_fd(), &stop_rx, deadline, |r| {
                        served.push(r)
                    })
                    .unwrap();
                served
            });
            let err = fetch(
                comm,
                &listener.name,
                5,
                std::process::id(),
                Duration::from_secs(20),
            )
            .unwrap_err();
            assert!(
                matches!(err, CommError::Protocol { .. } | CommError::Io { .. }),
                "{err}"
            );
            assert!(err.to_string().contains("rank 0"), "{err}");
            fetch(
                comm,
                &listener.name,
                1,
                std::process::id(),
                Duration::from_secs(20),
            )
            .unwrap();
            drop(stop_tx);
            assert_eq!(server.join().unwrap(), vec![1]);
        });
    }

    #[test]
    fn nobody_listening_is_a_death_when_rank_0_is_gone() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let err = fetch(
            "fdpass-dead",
            "hypercomm/none/0",
            1,
            dead,
            Duration::from_secs(5),
        )
        .unwrap_err();
        // A reused pid would make this an i/o error instead; both name rank 0.
        match err {
            CommError::PeerDied { ranks, .. } => assert_eq!(ranks, vec![0]),
            CommError::Io { what, .. } => assert!(what.contains("rank 0"), "{what}"),
            other => panic!("{other}"),
        }
    }

    #[test]
    fn a_rank_0_that_listens_but_never_answers_is_a_timeout_naming_it() {
        let listener = listen("fdpass-stall").unwrap();
        let start = Instant::now();
        let err = fetch(
            "fdpass-stall",
            &listener.name,
            1,
            std::process::id(),
            Duration::from_millis(300),
        )
        .unwrap_err();
        let waited = start.elapsed();
        match err {
            CommError::Timeout { missing, after, .. } => {
                assert_eq!((missing, after), (vec![0], Duration::from_millis(300)));
            }
            other => panic!("{other}"),
        }
        assert!(
            waited >= Duration::from_millis(250) && waited < Duration::from_secs(10),
            "{waited:?}"
        );
    }

    fn tempfile_with(bytes: &[u8]) -> OwnedFd {
        let fd = rustix::fs::memfd_create("fdpass-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        let mut file = std::fs::File::from(fd);
        file.write_all(bytes).unwrap();
        OwnedFd::from(file)
    }
}
