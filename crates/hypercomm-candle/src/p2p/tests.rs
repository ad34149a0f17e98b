use candle_core::{DType, Device, Tensor};

use crate::testing::{f8_bits, f8_sample, on_world, run_ranks, sample, values};
use crate::{Error, TensorGroup, TensorP2p};

/// 2 ranks per group: the tp groups {0, 1} and {2, 3}; `f(rank in group, group)` on each.
fn on_pairs(f: impl Fn(usize, TensorGroup) + Send + Sync + 'static) {
    run_ranks(4, 2, move |_, pgc| {
        let tp = TensorGroup::kind(&pgc, "tp").expect("tp group");
        f(tp.rank(), tp);
    });
}

#[test]
fn exchange_sends_next_and_receives_previous_whatever_the_order() {
    on_world(|rank, ring| {
        let (next, prev) = ((rank + 1) % 4, (rank + 3) % 4);
        for dtype in [DType::F32, DType::F64, DType::BF16, DType::I64, DType::U32] {
            let mine = sample(rank, &[2, 3], dtype);
            let send = TensorP2p::send(&mine, next);
            let recv = TensorP2p::recv((3, 2), dtype, &Device::Cpu, prev);
            // Odd ranks list the receive first: the parts' order does not matter.
            let (parts, at) = if rank % 2 == 0 {
                (vec![send, recv], 1)
            } else {
                (vec![recv, send], 0)
            };
            let got = ring.exchange(parts).expect("exchange");
            assert_eq!(got.len(), 2);
            assert_eq!(got[at].dims(), [3, 2], "{dtype:?}");
            assert_eq!(got[at].dtype(), dtype);
            assert_eq!(values(&got[at]), values(&sample(prev, &[2, 3], dtype)));
            // A send's result is the tensor it sent.
            assert_eq!(got[1 - at].id(), mine.id());
        }
    });
}

#[test]
fn exchange_moves_views_and_several_messages_per_peer_in_order() {
    on_pairs(|me, pair| {
        let other = 1 - me;
        // A transposed view goes in its logical row-major order; two messages to one peer arrive in order.
        let view = sample(me, &[2, 3], DType::F32).t().expect("t");
        assert!(!view.is_contiguous());
        let second = sample(me + 10, &[4], DType::F32);
        let got = pair
            .exchange(vec![
                TensorP2p::send(&view, other),
                TensorP2p::recv((3, 2), DType::F32, &Device::Cpu, other),
                TensorP2p::send(&second, other),
                TensorP2p::recv(4, DType::F32, &Device::Cpu, other),
            ])
            .expect("exchange");
        let want = sample(other, &[2, 3], DType::F32).t().expect("t");
        assert_eq!(values(&got[1]), values(&want));
        assert_eq!(
            values(&got[3]),
            values(&sample(other + 10, &[4], DType::F32))
        );
    });
}

#[test]
fn large_messages_both_ways_complete_in_one_exchange() {
    // 4 MiB each way at once: as separate blocking sends, both ranks would wait on each other.
    on_pairs(|me, pair| {
        let other = 1 - me;
        let n = 1 << 20;
        let mine = Tensor::arange(0u32, n as u32, &Device::Cpu)
            .and_then(|t| t.affine(1.0, (me * n) as f64))
            .expect("mine");
        let got = pair
            .exchange(vec![
                TensorP2p::send(&mine, other),
                TensorP2p::recv(n, DType::U32, &Device::Cpu, other),
            ])
            .expect("exchange");
        let got: Vec<u32> = got[1].to_vec1().expect("values");
        assert!(
            got.iter()
                .enumerate()
                .all(|(i, &v)| v as usize == other * n + i)
        );
    });
}

#[test]
fn send_and_recv_pair_up_in_order() {
    on_pairs(|me, pair| {
        let other = 1 - me;
        let mine = sample(me, &[2, 2], DType::F64);
        let received = if me == 0 {
            pair.send(&mine, other).expect("send");
            pair.recv(4, DType::F64, &Device::Cpu, other).expect("recv")
        } else {
            let got = pair
                .recv((2, 2), DType::F64, &Device::Cpu, other)
                .expect("recv");
            pair.send(&mine, other).expect("send");
            got
        };
        assert_eq!(
            values(&received),
            values(&sample(other, &[2, 2], DType::F64))
        );
    });
}

#[test]
fn empty_messages_and_empty_exchanges() {
    on_pairs(|me, pair| {
        let other = 1 - me;
        let empty = Tensor::zeros((0, 3), DType::F32, &Device::Cpu).expect("empty");
        let got = pair
            .exchange(vec![
                TensorP2p::send(&empty, other),
                TensorP2p::recv((0, 3), DType::F32, &Device::Cpu, other),
            ])
            .expect("exchange of empty tensors");
        assert_eq!(got[1].dims(), [0, 3]);
        assert!(pair.exchange(Vec::new()).expect("no parts").is_empty());
    });
}

#[test]
fn bad_peers_and_mixed_dtypes_are_refused_before_anything_moves() {
    on_pairs(|me, pair| {
        let t = sample(me, &[2], DType::F32);
        let name = pair.name().to_owned();
        let err = pair.send(&t, 2).expect_err("peer 2 of 2 ranks");
        assert!(matches!(err, Error::Argument { op: "send", .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            format!(
                "send on group {name}: peer 2 is not another rank of this 2-rank group (this is rank {me})"
            )
        );
        let err = pair
            .recv(2, DType::F32, &Device::Cpu, me)
            .expect_err("itself");
        assert!(
            err.to_string().ends_with(&format!(
                "peer {me} is not another rank of this 2-rank group (this is rank {me})"
            )),
            "{err}"
        );
        let err = pair
            .exchange(vec![
                TensorP2p::send(&t, 1 - me),
                TensorP2p::recv(2, DType::F64, &Device::Cpu, 1 - me),
            ])
            .expect_err("two dtypes");
        assert_eq!(
            err.to_string(),
            format!(
                "exchange on group {name}: part 1 is F64 but part 0 is F32: all parts of one exchange have one dtype"
            )
        );
        let err = pair
            .exchange(vec![TensorP2p::send(&t, 1 - me), TensorP2p::send(&t, 7)])
            .expect_err("peer 7");
        assert!(
            err.to_string()
                .contains("part 1: peer 7 is not another rank"),
            "{err}"
        );
        let err = pair
            .recv(2, DType::I16, &Device::Cpu, 1 - me)
            .expect_err("i16");
        assert!(
            matches!(
                err,
                Error::UnsupportedDType {
                    dtype: DType::I16,
                    ..
                }
            ),
            "{err:?}"
        );
        // Nothing moved: the pair still exchanges.
        let got = pair
            .exchange(vec![
                TensorP2p::send(&t, 1 - me),
                TensorP2p::recv(2, DType::F32, &Device::Cpu, 1 - me),
            ])
            .expect("exchange after refusals");
        assert_eq!(values(&got[1]), values(&sample(1 - me, &[2], DType::F32)));
    });
}

#[test]
fn a_receive_that_disagrees_with_the_send_fails_and_leaves_the_message() {
    on_pairs(|me, pair| {
        if me == 0 {
            pair.send(&sample(0, &[2], DType::F32), 1).expect("send");
            return;
        }
        let err = pair
            .recv(2, DType::F64, &Device::Cpu, 0)
            .expect_err("f64 receive of an f32 send");
        assert!(matches!(err, Error::Comm { .. }), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains("ranks disagree")
                && text.contains("dtype=f64")
                && text.contains("dtype=f32"),
            "{text}"
        );
        // The message waits for a receive that matches it.
        let got = pair.recv(2, DType::F32, &Device::Cpu, 0).expect("recv");
        assert_eq!(values(&got), [0.0, 1.0]);
    });
}

#[test]
fn f8e4m3_goes_around_the_ring_bit_for_bit() {
    on_world(|rank, ring| {
        let (next, prev) = ((rank + 1) % 4, (rank + 3) % 4);
        // 256 elements: every bit pattern, NaNs and both zeros included.
        let mine = f8_sample(rank, &[16, 16]);
        let got = ring
            .exchange(vec![
                TensorP2p::send(&mine, next),
                TensorP2p::recv((16, 16), DType::F8E4M3, &Device::Cpu, prev),
            ])
            .expect("exchange");
        assert_eq!(got[1].dtype(), DType::F8E4M3);
        assert_eq!(f8_bits(&got[1]), f8_bits(&f8_sample(prev, &[16, 16])));
        // send and recv alone, a transposed view in its logical order: even ranks send first, odd ranks receive
        // first, so every send meets its receive.
        let view = mine.t().expect("t");
        let received = if rank % 2 == 0 {
            ring.send(&view, next).expect("send");
            ring.recv(256, DType::F8E4M3, &Device::Cpu, prev)
                .expect("recv")
        } else {
            let got = ring
                .recv(256, DType::F8E4M3, &Device::Cpu, prev)
                .expect("recv");
            ring.send(&view, next).expect("send");
            got
        };
        let want = f8_sample(prev, &[16, 16]).t().expect("t");
        assert_eq!(f8_bits(&received), f8_bits(&want));
    });
}
