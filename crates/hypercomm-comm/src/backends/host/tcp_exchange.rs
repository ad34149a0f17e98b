//! The TCP transport's point-to-point exchange, in steps that can stop and go on (see
//! [`Transport::exchange_some`](super::transport::Transport::exchange_some)).
//!
//! Sends are written on threads of their own, one per peer and in order, while the calling thread reads the
//! receives as their data arrives: a write blocked on a full socket buffer (a large message to a peer that is itself
//! still sending) never keeps this rank from reading, so the peer's write completes and so does ours. To stop, the
//! writers write in slices ([`SLICE`] of write timeout each) and look at a stop flag between them; each records
//! how many bytes of its frame it has written, and the next step resumes from there. The calling thread polls the
//! sockets it reads from in slices as well, so it notices in time that it should stop.

use std::io::{ErrorKind, IoSlice, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};

use super::tcp::{HEAD, KIND_P2P, TcpTransport, frame_head};
use super::transport::Message;
use crate::CommError;
use crate::backend::{Payload, Progress};

/// How long a writer's write, or the reader's poll, blocks before it looks whether it should stop.
const SLICE: Duration = Duration::from_millis(2);

/// A send under way: message `index`'s frame, of which `written` bytes are on the wire.
struct Outgoing<'a> {
    index: usize,
    head: [u8; HEAD],
    data: &'a [u8],
    written: usize,
}

impl Outgoing<'_> {
    fn len(&self) -> usize {
        HEAD + self.data.len()
    }
}

/// Why a writer stopped early: what it was writing, and the error.
type WriteFailure = (String, std::io::Error);

/// What a writer thread tells the reading thread.
enum Written {
    /// Message `index` is on the wire.
    Message(usize),
    /// The writer has stopped: done, told to stop, or failed (`true`).
    Ended(bool),
}

/// Writes `queue` in order to `stream` (whose write timeout is [`SLICE`]) until done, or until `stop` holds at a
/// slice's end, or nothing moves for `timeout`; reports each completed message's index on `done`.
fn write_queue(
    mut stream: &TcpStream,
    queue: &mut [Outgoing<'_>],
    peer: usize,
    stop: &dyn Fn() -> bool,
    timeout: Duration,
    done: &dyn Fn(usize),
) -> Result<(), WriteFailure> {
    let mut last = Instant::now();
    for out in queue.iter_mut() {
        while out.written < out.len() {
            let wrote = if out.written < HEAD {
                let parts = [
                    IoSlice::new(&out.head[out.written..]),
                    IoSlice::new(out.data),
                ];
                stream.write_vectored(&parts)
            } else {
                stream.write(&out.data[out.written - HEAD..])
            };
            match wrote {
                Ok(0) => {
                    return Err((
                        format!("a message to rank {peer}"),
                        ErrorKind::WriteZero.into(),
                    ));
                }
                Ok(n) => {
                    out.written += n;
                    last = Instant::now();
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    if stop() {
                        return Ok(());
                    }
                    if last.elapsed() >= timeout {
                        return Err((format!("a message to rank {peer}"), e));
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err((format!("a message to rank {peer}"), e)),
            }
        }
        done(out.index);
    }
    Ok(())
}

impl TcpTransport {
    /// [`Transport::exchange_some`](super::transport::Transport::exchange_some) over TCP; a message's
    /// [`moved`](crate::backend::MessageProgress::moved) counts the bytes of a send's frame written (a receive's
    /// goes from 0 to 1).
    pub(super) fn exchange_step(
        &mut self,
        messages: &mut [Message<'_>],
        progress: &mut Progress,
        pause: &dyn Fn() -> bool,
    ) -> Result<bool, CommError> {
        progress.grow(messages.len());
        // Per peer, its unfinished sends in order; the receives still due.
        let mut sends: Vec<(usize, Vec<Outgoing<'_>>)> = Vec::new();
        let mut recvs: Vec<usize> = Vec::new();
        for (index, m) in messages.iter().enumerate() {
            if progress.messages[index].done {
                continue;
            }
            match &m.payload {
                Payload::Out(data) => {
                    let out = Outgoing {
                        index,
                        head: frame_head(KIND_P2P, &m.header, data.len()),
                        data,
                        written: progress.messages[index].moved,
                    };
                    match sends.iter_mut().find(|(p, _)| *p == m.peer) {
                        Some((_, queue)) => queue.push(out),
                        None => sends.push((m.peer, vec![out])),
                    }
                }
                Payload::In(_) => recvs.push(index),
            }
        }
        if sends.is_empty() && recvs.is_empty() {
            return Ok(true);
        }
        let mut streams = Vec::with_capacity(sends.len());
        for (peer, _) in &sends {
            let stream = self.stream(*peer)?;
            let clone = stream.try_clone().map_err(|source| CommError::Io {
                comm: self.comm.clone(),
                what: format!("duplicating the connection to rank {peer}"),
                source,
            })?;
            // The clone shares the socket: this is the socket's write timeout, put back below.
            clone
                .set_write_timeout(Some(SLICE))
                .map_err(|source| CommError::Io {
                    comm: self.comm.clone(),
                    what: format!("configuring the connection to rank {peer}"),
                    source,
                })?;
            streams.push(clone);
        }
        let result = self.run_step(messages, progress, pause, &mut sends, &streams, recvs);
        for (stream, (peer, _)) in streams.iter().zip(&sends) {
            if let Err(source) = stream.set_write_timeout(Some(self.timeout)) {
                // The connection is unusable for rounds with a 2 ms write timeout; say so rather than go on.
                return Err(CommError::Io {
                    comm: self.comm.clone(),
                    what: format!("configuring the connection to rank {peer}"),
                    source,
                });
            }
        }
        for (_, queue) in &sends {
            for out in queue {
                let state = &mut progress.messages[out.index];
                state.moved = out.written;
                if out.written == out.len() {
                    state.done = true;
                }
            }
        }
        result?;
        Ok(progress.finished())
    }

    /// The body of [`exchange_step`](Self::exchange_step): the writers on their threads (or, for one peer and no
    /// receives, on this one) and the receives here, until all are done or it is time to stop.
    fn run_step(
        &mut self,
        messages: &mut [Message<'_>],
        progress: &mut Progress,
        pause: &dyn Fn() -> bool,
        sends: &mut [(usize, Vec<Outgoing<'_>>)],
        streams: &[TcpStream],
        mut recvs: Vec<usize>,
    ) -> Result<(), CommError> {
        let timeout = self.timeout;
        if recvs.is_empty() && sends.len() == 1 {
            let (peer, queue) = &mut sends[0];
            let before = queue.iter().filter(|o| o.written == o.len()).count();
            return write_queue(&streams[0], queue, *peer, pause, timeout, &|_| {})
                .map(|()| {
                    if queue.iter().filter(|o| o.written == o.len()).count() > before {
                        progress.moved_now();
                    }
                })
                .map_err(|(during, e)| self.failure(*peer, e, &during));
        }
        let stop = AtomicBool::new(false);
        let (tx, rx) = mpsc::channel::<Written>();
        std::thread::scope(|scope| {
            let writers: Vec<_> = sends
                .iter_mut()
                .zip(streams)
                .map(|((peer, queue), stream)| {
                    let (peer, tx, stop) = (*peer, tx.clone(), &stop);
                    let thread = scope.spawn(move || {
                        let done = |i: usize| {
                            let _ = tx.send(Written::Message(i));
                        };
                        let result = write_queue(
                            stream,
                            queue,
                            peer,
                            &|| stop.load(Ordering::Relaxed),
                            timeout,
                            &done,
                        );
                        let _ = tx.send(Written::Ended(result.is_err()));
                        result
                    });
                    (peer, thread)
                })
                .collect();
            drop(tx);
            let mut result =
                self.read_until_stop(messages, progress, pause, &mut recvs, &rx, writers.len());
            stop.store(true, Ordering::Relaxed);
            for (peer, thread) in writers {
                let written = thread.join().unwrap_or_else(|_| {
                    Err((
                        format!("a message to rank {peer}"),
                        std::io::Error::other("the writing thread panicked"),
                    ))
                });
                if let (Ok(()), Err((during, e))) = (&result, written) {
                    result = Err(self.failure(peer, e, &during));
                }
            }
            result
        })
    }

    /// Reads the receives in `recvs` as their data arrives (the first unfinished one per peer at a time) while
    /// `writers` threads write, until everything is done, or until nothing moves within a slice and it is time to
    /// stop: `pause` holds, or a message completed in this step.
    fn read_until_stop(
        &mut self,
        messages: &mut [Message<'_>],
        progress: &mut Progress,
        pause: &dyn Fn() -> bool,
        recvs: &mut Vec<usize>,
        written: &mpsc::Receiver<Written>,
        writers: usize,
    ) -> Result<(), CommError> {
        let mut ended = 0;
        let mut finished_here = false;
        // What a writer said: whether a message completed; a failed writer ends the step (its error is reported
        // when it is joined).
        let heard = |news: Written, progress: &mut Progress, ended: &mut usize| match news {
            Written::Message(i) => {
                progress.messages[i].done = true;
                Ok(true)
            }
            Written::Ended(failed) => {
                *ended += 1;
                if failed { Err(()) } else { Ok(false) }
            }
        };
        loop {
            let mut moved = false;
            while let Ok(news) = written.try_recv() {
                match heard(news, progress, &mut ended) {
                    Ok(m) => moved |= m,
                    Err(()) => return Ok(()),
                }
            }
            // The first unfinished receive of each peer, with a frame already stashed or not.
            let mut due: Vec<usize> = Vec::new();
            for &i in recvs.iter() {
                if !due.iter().any(|&j| messages[j].peer == messages[i].peer) {
                    due.push(i);
                }
            }
            let mut ready: Vec<usize> = due
                .iter()
                .copied()
                .filter(|&i| self.has_p2p_frame(messages[i].peer))
                .collect();
            if ready.is_empty() && !due.is_empty() {
                ready = self.poll_readable(&due, messages)?;
            } else if due.is_empty() && ended < writers && !moved {
                if let Ok(news) = written.recv_timeout(SLICE) {
                    match heard(news, progress, &mut ended) {
                        Ok(m) => moved |= m,
                        Err(()) => return Ok(()),
                    }
                }
            }
            for i in ready {
                let m = &mut messages[i];
                let Payload::In(data) = &mut m.payload else {
                    continue;
                };
                let header = m.header;
                self.receive(m.peer, &header, data)?;
                let state = &mut progress.messages[i];
                state.moved = 1;
                state.done = true;
                recvs.retain(|&j| j != i);
                moved = true;
            }
            if moved {
                progress.moved_now();
                finished_here = true;
            }
            if recvs.is_empty() && ended == writers {
                return Ok(());
            }
            if moved {
                continue;
            }
            if finished_here || pause() {
                return Ok(());
            }
            let since = progress.stalled();
            if !recvs.is_empty() && since.elapsed() >= self.timeout {
                let peers: Vec<usize> = due.iter().map(|&i| messages[i].peer).collect();
                let during = due
                    .iter()
                    .map(|&i| format!("{} from rank {}", messages[i].header, messages[i].peer))
                    .collect::<Vec<_>>()
                    .join(", ");
                return Err(CommError::timeout(&self.comm, peers, self.timeout, during));
            }
        }
    }

    /// Of the receives `due`, those whose peer's socket has data to read, after waiting up to a [`SLICE`] for one.
    fn poll_readable(
        &self,
        due: &[usize],
        messages: &[Message<'_>],
    ) -> Result<Vec<usize>, CommError> {
        let mut fds = Vec::with_capacity(due.len());
        for &i in due {
            fds.push(PollFd::new(self.stream(messages[i].peer)?, PollFlags::IN));
        }
        let slice = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: SLICE.as_nanos() as _,
        };
        match rustix::event::poll(&mut fds, Some(&slice)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                return Err(CommError::Io {
                    comm: self.comm.clone(),
                    what: "polling the connections".into(),
                    source: std::io::Error::from_raw_os_error(e.raw_os_error()),
                });
            }
        }
        // Readable, hung up or failed: the read that follows tells which.
        Ok(due
            .iter()
            .zip(&fds)
            .filter(|(_, fd)| !fd.revents().is_empty())
            .map(|(&i, _)| i)
            .collect())
    }
}
