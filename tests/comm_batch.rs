//! Batches of sends and receives on the host (`Communicator::batch`), ranks as threads, over shared memory and TCP:
//! every part arrives whatever the order of the parts and their sizes, parts with one peer keep their order,
//! tags and lengths must match, and bad parts are refused before anything is sent.
//!
//! The 64 MiB ring with ranks as processes is in `comm_processes`.

mod comm_support;

use std::time::Duration;

use comm_support::{on_threads, options};
use hypercomm::comm::{CommError, CommOptions, P2p};

/// Element `i` of what `from` sends to `to` as its `k`-th message.
fn value(from: usize, to: usize, k: usize, i: usize) -> u64 {
    ((from * 1_000 + to * 100 + k) as u64) << 32 | i as u64
}

#[test]
fn every_rank_exchanges_with_every_other_in_one_batch_in_any_order() {
    for tcp in [false, true] {
        // Larger than a mailbox piece (64 KiB) so that messages move in pieces (or by address), and unequal so
        // pieces interleave.
        let len = |from: usize, to: usize| 40_000 * (1 + (from + 2 * to) % 5);
        let n = 4;
        let results = on_threads(n, options("all-pairs", tcp), move |comm| {
            let me = comm.rank();
            let mut parts = Vec::new();
            for peer in (0..n).filter(|&p| p != me) {
                let out: Vec<u64> = (0..len(me, peer)).map(|i| value(me, peer, 0, i)).collect();
                parts.push(P2p::send(out, peer));
                parts.push(P2p::recv(vec![0u64; len(peer, me)], peer));
            }
            // Each rank its own order: rotated by its rank, receives first on odd ranks.
            let count = parts.len();
            parts.rotate_left(me % count);
            if me % 2 == 1 {
                parts.reverse();
            }
            let peers: Vec<(bool, usize)> = parts
                .iter()
                .map(|p| (matches!(p, P2p::Send { .. }), peer_of(p)))
                .collect();
            let bufs = comm.batch(parts).unwrap().wait().unwrap();
            for ((send, peer), buf) in peers.into_iter().zip(bufs) {
                let (from, to) = if send { (me, peer) } else { (peer, me) };
                let want: Vec<u64> = (0..len(from, to)).map(|i| value(from, to, 0, i)).collect();
                assert_eq!(buf, want, "tcp {tcp}: rank {me}'s part with rank {peer}");
            }
        });
        assert_eq!(results.len(), n);
    }
}

fn peer_of<B>(p: &P2p<B>) -> usize {
    match p {
        P2p::Send { peer, .. } | P2p::Recv { peer, .. } => *peer,
    }
}

#[test]
fn parts_with_one_peer_arrive_in_order_with_their_tags_and_zero_lengths() {
    for tcp in [false, true] {
        on_threads(2, options("ordered", tcp), move |comm| {
            let (me, peer) = (comm.rank(), 1 - comm.rank());
            let lens = [3usize, 0, 300_000, 5];
            let mut parts = Vec::new();
            for (k, &len) in lens.iter().enumerate() {
                let out = (0..len).map(|i| value(me, peer, k, i)).collect();
                parts.push(P2p::Send {
                    buf: out,
                    peer,
                    tag: k as u64,
                });
            }
            for (k, &len) in lens.iter().enumerate() {
                parts.push(P2p::Recv {
                    buf: vec![0u64; len],
                    peer,
                    tag: k as u64,
                });
            }
            let bufs = comm.batch(parts).unwrap().wait().unwrap();
            for (k, &len) in lens.iter().enumerate() {
                let want: Vec<u64> = (0..len).map(|i| value(peer, me, k, i)).collect();
                assert_eq!(bufs[lens.len() + k], want, "tcp {tcp}: message {k}");
            }
            // A batch and plain sends and receives mix: a batch's receive matches a plain send.
            if me == 0 {
                comm.send(vec![7u64; 2], 1, 9).unwrap().wait().unwrap();
            } else {
                let got = comm
                    .batch(vec![P2p::Recv {
                        buf: vec![0u64; 2],
                        peer: 0,
                        tag: 9,
                    }])
                    .unwrap()
                    .wait()
                    .unwrap();
                assert_eq!(got[0], [7, 7]);
            }
            // An empty batch is done at once.
            assert!(
                comm.batch(Vec::<P2p<Vec<u8>>>::new())
                    .unwrap()
                    .wait()
                    .unwrap()
                    .is_empty()
            );
        });
    }
}

#[test]
fn a_part_whose_tag_or_length_differs_from_its_peers_is_a_mismatch_on_the_receiver() {
    for tcp in [false, true] {
        let errors = on_threads(
            2,
            CommOptions {
                timeout: Duration::from_secs(10),
                ..options("mismatch", tcp)
            },
            move |comm| {
                if comm.rank() == 0 {
                    comm.batch(vec![P2p::Send {
                        buf: vec![1u32; 4],
                        peer: 1,
                        tag: 5,
                    }])
                    .unwrap()
                    .wait()
                    .err()
                } else {
                    comm.batch(vec![P2p::Recv {
                        buf: vec![0u32; 4],
                        peer: 0,
                        tag: 6,
                    }])
                    .unwrap()
                    .wait()
                    .err()
                }
            },
        );
        let e = errors[1].as_ref().expect("the receiver sees the mismatch");
        assert!(matches!(e, CommError::Mismatch { .. }), "tcp {tcp}: {e}");
    }
}

#[test]
fn bad_parts_are_refused_before_anything_is_sent() {
    on_threads(2, options("refused", false), |comm| {
        let me = comm.rank();
        for (parts, what) in [
            (vec![P2p::send(vec![1u8], me)], format!("peer {me}")),
            (vec![P2p::recv(vec![1u8], 2)], "peer 2".to_owned()),
        ] {
            let e = comm.batch(parts).unwrap_err().to_string();
            assert!(e.contains(&what) && e.contains("refused"), "{e}");
        }
        // The communicator is still good: nothing was sent.
        let peer = 1 - me;
        let got = comm
            .batch(vec![
                P2p::send(vec![me as u8], peer),
                P2p::recv(vec![9u8], peer),
            ])
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(got[1], [peer as u8]);
    });
}
