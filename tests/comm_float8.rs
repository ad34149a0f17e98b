//! The 8-bit floats (`float8::F8E4M3`, `float8::F8E5M2`) on the host, ranks as threads over shared memory and TCP:
//! every operation that only moves elements carries them bit for bit; every reduction is refused before anything
//! is sent, naming the type and the way out. (On a device NCCL 2.24+ reduces them too: `tests/device_checks`.)

mod comm_support;

use comm_support::on_threads;
use float8::{F8E4M3, F8E5M2};
use hypercomm::comm::{CommError, CommOptions, Communicator, P2p, ReduceOp};

/// Every bit pattern in turn, offset by `rank`, so that a byte moved to the wrong place shows.
fn e4m3(rank: usize, len: usize) -> Vec<F8E4M3> {
    (0..len)
        .map(|i| F8E4M3::from_bits((i * 7 + rank * 31) as u8))
        .collect()
}

fn e5m2(rank: usize, len: usize) -> Vec<F8E5M2> {
    (0..len)
        .map(|i| F8E5M2::from_bits((i * 3 + rank * 17) as u8))
        .collect()
}

fn bits<T: Copy>(v: &[T], to: impl Fn(T) -> u8) -> Vec<u8> {
    v.iter().map(|&x| to(x)).collect()
}

#[test]
fn moving_operations_carry_every_bit_pattern() {
    for tcp in [false, true] {
        let n = 3;
        let options = CommOptions {
            force_tcp: tcp,
            ..CommOptions::named("fp8-moves")
        };
        on_threads(n, options, move |comm: Communicator| {
            let me = comm.rank();
            let len = 300;
            let b = |v: &[F8E4M3]| bits(v, |x| x.to_bits());
            // Broadcast and all-gather.
            let got = comm.broadcast(e4m3(me, len), 1).unwrap().wait().unwrap();
            assert_eq!(b(&got), b(&e4m3(1, len)), "tcp {tcp}: broadcast");
            let (_, all) = comm
                .all_gather_into(e4m3(me, len), vec![F8E4M3::from_bits(0); n * len])
                .unwrap()
                .wait()
                .unwrap();
            let want: Vec<F8E4M3> = (0..n).flat_map(|r| e4m3(r, len)).collect();
            assert_eq!(b(&all), b(&want), "tcp {tcp}: all_gather");
            // all_to_all_v with split sizes: rank s sends s + d + 1 elements to rank d.
            let counts = |s: usize, d: usize| s + d + 1;
            let send_counts: Vec<usize> = (0..n).map(|d| counts(me, d)).collect();
            let recv_counts: Vec<usize> = (0..n).map(|s| counts(s, me)).collect();
            let input = e5m2(me, send_counts.iter().sum());
            let output = vec![F8E5M2::from_bits(0); recv_counts.iter().sum()];
            let (_, output) = comm
                .all_to_all_v(input, send_counts, output, recv_counts)
                .unwrap()
                .wait()
                .unwrap();
            let mut want = Vec::new();
            for s in 0..n {
                let theirs = e5m2(s, (0..n).map(|d| counts(s, d)).sum());
                let start: usize = (0..me).map(|d| counts(s, d)).sum();
                want.extend_from_slice(&theirs[start..start + counts(s, me)]);
            }
            assert_eq!(
                bits(&output, |x| x.to_bits()),
                bits(&want, |x| x.to_bits()),
                "tcp {tcp}: all_to_all_v"
            );
            // A batch around the ring.
            let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
            let bufs = comm
                .batch(vec![
                    P2p::send(e4m3(me, len), next),
                    P2p::recv(vec![F8E4M3::from_bits(0); len], prev),
                ])
                .unwrap()
                .wait()
                .unwrap();
            assert_eq!(b(&bufs[1]), b(&e4m3(prev, len)), "tcp {tcp}: batch");
        });
    }
}

#[test]
fn host_reductions_of_8_bit_floats_are_refused_with_the_way_out() {
    let options = CommOptions {
        symmetric_bytes: 4096,
        ..CommOptions::named("fp8-reduce")
    };
    on_threads(2, options, |comm: Communicator| {
        let refused = |e: CommError, op: &str, dtype: &str| {
            let text = e.to_string();
            assert!(matches!(e, CommError::InvalidArgument { .. }), "{text}");
            assert!(
                text.contains(op) && text.contains(dtype) && text.contains("device buffer"),
                "{text}"
            );
        };
        let x = || vec![F8E4M3::from_f32(1.0); 4];
        refused(
            comm.all_reduce(x(), ReduceOp::Sum).unwrap_err(),
            "all_reduce",
            "f8e4m3",
        );
        refused(
            comm.reduce(x(), ReduceOp::Max, 0).unwrap_err(),
            "reduce",
            "f8e4m3",
        );
        refused(
            comm.reduce_scatter_into(x(), vec![F8E4M3::from_bits(0); 2], ReduceOp::Sum)
                .unwrap_err(),
            "reduce_scatter",
            "f8e4m3",
        );
        let y = vec![F8E5M2::from_f32(1.0); 4];
        refused(
            comm.all_reduce(y, ReduceOp::Avg).unwrap_err(),
            "all_reduce",
            "f8e5m2",
        );
        let sym = comm.symmetric_buffer(4, F8E5M2::from_f32(1.0)).unwrap();
        refused(
            comm.all_reduce_symmetric(sym, ReduceOp::Sum).unwrap_err(),
            "all_reduce_symmetric",
            "f8e5m2",
        );
        // Nothing was sent: the communicator still runs a reduction of another type.
        let sum = comm
            .all_reduce(vec![1.0f32], ReduceOp::Sum)
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(sum, [2.0]);
    });
}
