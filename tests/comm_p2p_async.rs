//! Separate asynchronous sends and receives on the host, as gloo's `isend`/`irecv`: issued one by one before any
//! is waited on, they progress together (a ring of ranks that each send before they receive completes, whatever
//! the sizes), a send issued long before its receive still completes, and each operation completes on its own (a
//! waiter gets its send back while the receive issued after it still waits). Ranks as threads, over shared
//! memory and TCP; the same ring with ranks as processes under `hypercomm launch` is in `comm_processes`.

mod comm_support;

use std::time::Duration;

use comm_support::{on_threads, options};

/// Element `i` of the message `from` sends to `to`.
fn value(from: usize, to: usize, i: usize) -> u32 {
    (from * 100 + to) as u32 * 1_000_000 + i as u32
}

fn message(from: usize, to: usize, len: usize) -> Vec<u32> {
    (0..len).map(|i| value(from, to, i)).collect()
}

/// Short enough that a ring that does not progress fails the test quickly, long enough for a loaded machine.
fn ring_options(name: &str, tcp: bool) -> hypercomm::comm::CommOptions {
    hypercomm::comm::CommOptions {
        timeout: Duration::from_secs(20),
        ..options(name, tcp)
    }
}

#[test]
fn a_ring_of_separate_sends_then_receives_completes_whatever_the_wait_order() {
    // 8 MiB messages: far larger than a mailbox piece (64 KiB) or a socket buffer, so every send must wait for its
    // receive, which each rank issues only after its own send.
    let len = 2 << 20;
    for tcp in [false, true] {
        for recv_first_wait in [false, true] {
            let n = 4;
            on_threads(n, ring_options("ring", tcp), move |comm| {
                let me = comm.rank();
                let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
                let sent = comm.send(message(me, next, len), next, 0).unwrap();
                let received = comm.recv(vec![0u32; len], prev, 0).unwrap();
                let (sent, got) = if recv_first_wait {
                    let got = received.wait().unwrap();
                    (sent.wait().unwrap(), got)
                } else {
                    (sent.wait().unwrap(), received.wait().unwrap())
                };
                assert_eq!(
                    sent,
                    message(me, next, len),
                    "tcp {tcp}: rank {me}'s send buffer came back"
                );
                assert!(
                    got == message(prev, me, len),
                    "tcp {tcp}: rank {me} received from rank {prev}"
                );
            });
        }
    }
}

#[test]
fn receives_issued_before_sends_complete_too() {
    let len = 1 << 20;
    for tcp in [false, true] {
        let n = 3;
        on_threads(n, ring_options("recv-first", tcp), move |comm| {
            let me = comm.rank();
            let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
            let received = comm.recv(vec![0u32; len], prev, 7).unwrap();
            let sent = comm.send(message(me, next, len), next, 7).unwrap();
            let got = received.wait().unwrap();
            sent.wait().unwrap();
            assert!(got == message(prev, me, len), "tcp {tcp}: rank {me}");
        });
    }
}

#[test]
fn a_send_already_under_way_takes_in_the_receive_issued_after_it() {
    // The send starts on the progress thread (it is issued, then the rank sleeps well past the lane's nap) and
    // blocks on its peer; the receive issued afterwards must join it rather than queue behind it.
    let len = 2 << 20;
    for tcp in [false, true] {
        let n = 4;
        on_threads(n, ring_options("late-recv", tcp), move |comm| {
            let me = comm.rank();
            let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
            let sent = comm.send(message(me, next, len), next, 0).unwrap();
            std::thread::sleep(Duration::from_millis(100));
            let received = comm.recv(vec![0u32; len], prev, 0).unwrap();
            let got = received.wait().unwrap();
            sent.wait().unwrap();
            assert!(got == message(prev, me, len), "tcp {tcp}: rank {me}");
        });
    }
}

#[test]
fn each_operation_completes_on_its_own() {
    // Rank 0 sends to rank 1 and receives from rank 2, then waits on its send only, and only then sends rank 2
    // what rank 2 waits for before it sends the message rank 0's receive expects. If the send completed only
    // with the receive issued after it, rank 0 would wait forever.
    for tcp in [false, true] {
        on_threads(
            3,
            ring_options("own-completion", tcp),
            move |comm| match comm.rank() {
                0 => {
                    let sent = comm.send(message(0, 1, 1000), 1, 0).unwrap();
                    let received = comm.recv(vec![0u32; 10], 2, 0).unwrap();
                    sent.wait().unwrap();
                    comm.send(message(0, 2, 5), 2, 1).unwrap().wait().unwrap();
                    assert_eq!(received.wait().unwrap(), message(2, 0, 10), "tcp {tcp}");
                }
                1 => {
                    let got = comm.recv(vec![0u32; 1000], 0, 0).unwrap().wait().unwrap();
                    assert_eq!(got, message(0, 1, 1000), "tcp {tcp}");
                }
                _ => {
                    let got = comm.recv(vec![0u32; 5], 0, 1).unwrap().wait().unwrap();
                    assert_eq!(got, message(0, 2, 5), "tcp {tcp}");
                    comm.send(message(2, 0, 10), 0, 0).unwrap().wait().unwrap();
                }
            },
        );
    }
}

#[test]
fn point_to_point_keeps_its_place_around_collectives() {
    // Sends, a collective, then receives: the collective runs between them on every rank, and the messages
    // still arrive (the receives cannot join the sends across the all-reduce).
    for tcp in [false, true] {
        let n = 3;
        on_threads(n, ring_options("around", tcp), move |comm| {
            let me = comm.rank();
            let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
            let sent = comm.send(message(me, next, 100), next, 0).unwrap();
            let sum = comm
                .all_reduce(vec![me as u32 + 1; 4], hypercomm::comm::ReduceOp::Sum)
                .unwrap();
            let received = comm.recv(vec![0u32; 100], prev, 0).unwrap();
            sent.wait().unwrap();
            assert_eq!(sum.wait().unwrap(), vec![6u32; 4], "tcp {tcp}");
            assert_eq!(
                received.wait().unwrap(),
                message(prev, me, 100),
                "tcp {tcp}"
            );
        });
    }
}

#[test]
fn a_receive_that_never_gets_its_message_fails_within_the_timeout_naming_the_peer() {
    for tcp in [false, true] {
        let opts = hypercomm::comm::CommOptions {
            timeout: Duration::from_secs(2),
            ..options("silent-peer", tcp)
        };
        let results = on_threads(2, opts, move |comm| {
            if comm.rank() == 1 {
                // Stays alive, sends nothing, until rank 0 has given up.
                std::thread::sleep(Duration::from_secs(4));
                return None;
            }
            let started = std::time::Instant::now();
            let err = comm.recv(vec![0u32; 8], 1, 0).unwrap().wait().unwrap_err();
            Some((err.to_string(), started.elapsed()))
        });
        let (err, took) = results[0].clone().unwrap();
        assert!(err.contains("rank 1"), "tcp {tcp}: {err}");
        assert!(took < Duration::from_secs(4), "tcp {tcp}: took {took:?}");
    }
}

#[test]
fn a_rank_that_may_not_read_its_peers_gets_large_messages_streamed() {
    // Large messages go by address (the receiver copies straight out of the sender's memory) where the receiver
    // may read it; rank 1 may not, so what it receives is streamed instead, and what it sends still goes by address.
    let len = 1 << 20; // u32s: 4 MiB, above the by-address threshold
    let results = on_threads(2, ring_options("by-address-refused", false), move |comm| {
        let me = comm.rank();
        // Before the first operation, so the progress thread (started by it) inherits the filter too.
        let forbidden = me == 1 && comm_support::forbid_reading_other_processes();
        let peer = 1 - me;
        for round in 0..3 {
            let sent = comm.send(message(me + round, peer, len), peer, 0).unwrap();
            let received = comm.recv(vec![0u32; len], peer, 0).unwrap();
            let got = received.wait().unwrap();
            sent.wait().unwrap();
            assert!(
                got == message(peer + round, me, len),
                "round {round}: rank {me}"
            );
        }
        forbidden
    });
    if !results[1] {
        println!("skipped: a seccomp filter could not be installed on this machine");
    }
}

#[test]
fn a_dropped_connection_fails_sends_and_receives_under_way() {
    // Over TCP, rank 0 writes a large message (on a writer thread, as it also waits to receive) to rank 1, which
    // drops the connection instead of reading: rank 0 fails, well before its timeout, rather than hang.
    let opts = hypercomm::comm::CommOptions {
        timeout: Duration::from_secs(20),
        ..options("dropped", true)
    };
    let results = on_threads(2, opts, move |comm| {
        if comm.rank() == 1 {
            comm.inject_connection_drop(0).unwrap().wait().unwrap();
            std::thread::sleep(Duration::from_secs(2));
            return None;
        }
        let started = std::time::Instant::now();
        let sent = comm.send(message(0, 1, 4 << 20), 1, 0).unwrap();
        let received = comm.recv(vec![0u32; 8], 1, 0).unwrap();
        let err = received.wait().err().or_else(|| sent.wait().err());
        Some((err.map(|e| e.to_string()), started.elapsed()))
    });
    let (err, took) = results[0].clone().unwrap();
    let err = err.expect("rank 0's exchange with a dropped peer succeeded");
    assert!(err.contains("rank 1"), "{err}");
    assert!(took < Duration::from_secs(15), "took {took:?}: {err}");
}

#[test]
fn a_ring_of_ranks_each_waiting_to_receive_before_it_sends_is_one_cycle_on_every_rank() {
    // Each rank waits for its receive from the previous rank before it sends to the next: nobody sends, every
    // rank times out waiting for a different peer. Every rank reports the same cycle, naming all four, and
    // nobody as lost.
    for tcp in [false, true] {
        let opts = hypercomm::comm::CommOptions {
            timeout: Duration::from_secs(2),
            ..options("recv-ring", tcp)
        };
        let results = on_threads(4, opts, move |comm| {
            let me = comm.rank();
            let (next, prev) = ((me + 1) % 4, (me + 3) % 4);
            let started = std::time::Instant::now();
            let err = comm
                .recv(vec![0u32; 8], prev, 0)
                .and_then(|w| w.wait())
                .expect_err("nobody sends");
            let took = started.elapsed();
            // Never reached: the send that would have fed the next rank.
            drop(comm.send(vec![1u32; 8], next, 0));
            let cause = err
                .root_cause()
                .cloned()
                .unwrap_or_else(|| panic!("tcp {tcp}: rank {me}: no root cause: {err}"));
            (
                err.lost_ranks().to_vec(),
                err.culprits().to_vec(),
                cause,
                took,
            )
        });
        for (rank, (lost, culprits, cause, took)) in results.iter().enumerate() {
            assert!(lost.is_empty(), "tcp {tcp}: rank {rank} lost {lost:?}");
            assert_eq!(culprits, &[0, 1, 2, 3], "tcp {tcp}: rank {rank}: {cause}");
            assert_eq!(
                cause.fault,
                hypercomm::comm::Fault::Deadlocked,
                "tcp {tcp}: {cause}"
            );
            assert!(
                cause.detail.starts_with("a cycle of waits on recv-ring")
                    && cause.detail.contains("rank 0 (in ")
                    && cause.detail.contains("waits for rank 3"),
                "tcp {tcp}: {cause}"
            );
            assert_eq!(
                cause.detail, results[0].2.detail,
                "tcp {tcp}: every rank tells it alike"
            );
            assert!(
                *took < Duration::from_secs(7),
                "tcp {tcp}: rank {rank} took {took:?}"
            );
        }
    }
}
