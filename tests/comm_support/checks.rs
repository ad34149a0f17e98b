//! The checks every transport and rank count must pass: each collective, in place and out of place, with several
//! operations in flight, compared with independently computed results.

use hypercomm::comm::{Communicator, ReduceOp};

use super::*;

pub fn pattern<T: TestElem>(src: usize, dst: usize, i: usize) -> T {
    T::from_i64(((src * 31 + dst * 7 + i) % 100) as i64)
}

pub fn check_type<T: TestElem>(comm: &Communicator, len: usize) {
    let (n, me) = (comm.size(), comm.rank());
    let ctx = |what: &str| format!("{} n={n} rank={me} len={len} {what}", T::DTYPE);

    // All-reduce, every op issued before any is waited for (in flight together), in place and out of place.
    let in_place: Vec<_> = ReduceOp::ALL
        .iter()
        .map(|&op| (op, comm.all_reduce(values::<T>(op, me, len), op).unwrap()))
        .collect();
    let out_of_place: Vec<_> = ReduceOp::ALL
        .iter()
        .map(|&op| {
            (
                op,
                comm.all_reduce_into(values::<T>(op, me, len), vec![T::default(); len], op)
                    .unwrap(),
            )
        })
        .collect();
    for (op, w) in in_place {
        assert_close(
            &w.wait().unwrap(),
            &expected::<T>(op, n, len),
            &ctx(&format!("all_reduce {op}")),
        );
    }
    for (op, w) in out_of_place {
        let (input, output) = w.wait().unwrap();
        assert_eq!(
            input,
            values::<T>(op, me, len),
            "{}",
            ctx("all_reduce_into keeps its input")
        );
        assert_close(
            &output,
            &expected::<T>(op, n, len),
            &ctx(&format!("all_reduce_into {op}")),
        );
    }

    // Broadcast from the last rank.
    let root = n - 1;
    let b = comm
        .broadcast(values::<T>(ReduceOp::Sum, me, len), root)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(
        b,
        values::<T>(ReduceOp::Sum, root, len),
        "{}",
        ctx("broadcast")
    );
    let (_, b) = comm
        .broadcast_into(
            values::<T>(ReduceOp::Sum, me, len),
            vec![T::default(); len],
            root,
        )
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(
        b,
        values::<T>(ReduceOp::Sum, root, len),
        "{}",
        ctx("broadcast_into")
    );

    // Reduce to rank 0, every op; other ranks' buffers stay as they were.
    for op in ReduceOp::ALL {
        let r = comm
            .reduce(values::<T>(op, me, len), op, 0)
            .unwrap()
            .wait()
            .unwrap();
        if me == 0 {
            assert_close(
                &r,
                &expected::<T>(op, n, len),
                &ctx(&format!("reduce {op}")),
            );
        } else {
            assert_eq!(
                r,
                values::<T>(op, me, len),
                "{}",
                ctx("reduce leaves non-roots alone")
            );
        }
        let out = if me == 0 {
            vec![T::default(); len]
        } else {
            vec![]
        };
        let (_, r) = comm
            .reduce_into(values::<T>(op, me, len), out, op, 0)
            .unwrap()
            .wait()
            .unwrap();
        if me == 0 {
            assert_close(
                &r,
                &expected::<T>(op, n, len),
                &ctx(&format!("reduce_into {op}")),
            );
        }
    }

    // All-gather into one buffer, out of place and in place.
    let gathered: Vec<T> = (0..n)
        .flat_map(|r| values::<T>(ReduceOp::Sum, r, len))
        .collect();
    let (_, g) = comm
        .all_gather_into(
            values::<T>(ReduceOp::Sum, me, len),
            vec![T::default(); n * len],
        )
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(g, gathered, "{}", ctx("all_gather_into"));
    let mut buf = vec![T::default(); n * len];
    buf[me * len..(me + 1) * len].copy_from_slice(&values::<T>(ReduceOp::Sum, me, len));
    assert_eq!(
        comm.all_gather(buf).unwrap().wait().unwrap(),
        gathered,
        "{}",
        ctx("all_gather")
    );

    // Reduce-scatter from one buffer, every op, out of place and in place.
    for op in ReduceOp::ALL {
        let want = expected::<T>(op, n, n * len)[me * len..(me + 1) * len].to_vec();
        let (_, rs) = comm
            .reduce_scatter_into(values::<T>(op, me, n * len), vec![T::default(); len], op)
            .unwrap()
            .wait()
            .unwrap();
        assert_close(&rs, &want, &ctx(&format!("reduce_scatter_into {op}")));
        let input = values::<T>(op, me, n * len);
        let rs = comm
            .reduce_scatter(input.clone(), op)
            .unwrap()
            .wait()
            .unwrap();
        assert_close(
            &rs[me * len..(me + 1) * len],
            &want,
            &ctx(&format!("reduce_scatter {op}")),
        );
        for r in (0..n).filter(|&r| r != me) {
            assert_eq!(
                rs[r * len..(r + 1) * len],
                input[r * len..(r + 1) * len],
                "{}",
                ctx("other blocks kept")
            );
        }
    }

    // All-to-all with equal blocks.
    let send: Vec<T> = (0..n)
        .flat_map(|d| (0..len).map(move |i| pattern::<T>(me, d, i)))
        .collect();
    let want: Vec<T> = (0..n)
        .flat_map(|s| (0..len).map(move |i| pattern::<T>(s, me, i)))
        .collect();
    let (_, a) = comm
        .all_to_all_into(send.clone(), vec![T::default(); n * len])
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(a, want, "{}", ctx("all_to_all_into"));
    assert_eq!(
        comm.all_to_all(send).unwrap().wait().unwrap(),
        want,
        "{}",
        ctx("all_to_all")
    );

    // All-to-all with per-peer counts (a symmetric formula so that counts agree).
    let count = |s: usize, d: usize| (s + d) % 3 + len % 4 + len / 3;
    let send_counts: Vec<usize> = (0..n).map(|d| count(me, d)).collect();
    let recv_counts: Vec<usize> = (0..n).map(|s| count(s, me)).collect();
    let input: Vec<T> = (0..n)
        .flat_map(|d| (0..count(me, d)).map(move |i| pattern::<T>(me, d, i)))
        .collect();
    let want: Vec<T> = (0..n)
        .flat_map(|s| (0..count(s, me)).map(move |i| pattern::<T>(s, me, i)))
        .collect();
    let (_, v) = comm
        .all_to_all_v(
            input,
            send_counts,
            vec![T::default(); want.len()],
            recv_counts,
        )
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(v, want, "{}", ctx("all_to_all_v"));

    // Gather to rank 0, scatter from the last rank.
    let out = if me == 0 {
        vec![T::default(); n * len]
    } else {
        vec![]
    };
    let (_, g) = comm
        .gather(values::<T>(ReduceOp::Sum, me, len), out, 0)
        .unwrap()
        .wait()
        .unwrap();
    if me == 0 {
        assert_eq!(g, gathered, "{}", ctx("gather"));
    }
    let input = if me == root { gathered.clone() } else { vec![] };
    let (_, s) = comm
        .scatter(input, vec![T::default(); len], root)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(s, values::<T>(ReduceOp::Sum, me, len), "{}", ctx("scatter"));

    // Tagged send/recv around a ring; even ranks send first so that a blocking send always has a receiver.
    if n > 1 {
        let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
        let msg = values::<T>(ReduceOp::Sum, me, len);
        let (sent, got) = if me % 2 == 0 {
            let s = comm.send(msg.clone(), next, 5).unwrap();
            (s, comm.recv(vec![T::default(); len], prev, 5).unwrap())
        } else {
            let g = comm.recv(vec![T::default(); len], prev, 5).unwrap();
            (comm.send(msg.clone(), next, 5).unwrap(), g)
        };
        assert_eq!(sent.wait().unwrap(), msg);
        assert_eq!(
            got.wait().unwrap(),
            values::<T>(ReduceOp::Sum, prev, len),
            "{}",
            ctx("recv")
        );
    }
    comm.barrier().unwrap().wait().unwrap();
}

pub fn check_all_types(comm: &Communicator, len: usize) {
    check_type::<f32>(comm, len);
    check_type::<f64>(comm, len);
    check_type::<half::f16>(comm, len);
    check_type::<half::bf16>(comm, len);
    check_type::<i8>(comm, len);
    check_type::<u8>(comm, len);
    check_type::<i32>(comm, len);
    check_type::<i64>(comm, len);
    check_type::<u32>(comm, len);
    check_type::<u64>(comm, len);
}

/// All-reduce (every op), all-gather and reduce-scatter on buffers of just over 1 MiB.
pub fn big_buffers<T: TestElem>(comm: &Communicator) {
    let (n, me) = (comm.size(), comm.rank());
    let len = (1 << 20) / std::mem::size_of::<T>() + 3;
    for op in ReduceOp::ALL {
        let r = comm
            .all_reduce(values::<T>(op, me, len), op)
            .unwrap()
            .wait()
            .unwrap();
        assert_close(
            &r,
            &expected::<T>(op, n, len),
            &format!("{} big all_reduce {op}", T::DTYPE),
        );
    }
    all_gather_checked::<T>(comm, len, "big all_gather");
    let want = expected::<T>(ReduceOp::Sum, n, n * len)[me * len..(me + 1) * len].to_vec();
    let (_, rs) = comm
        .reduce_scatter_into(
            values::<T>(ReduceOp::Sum, me, n * len),
            vec![T::default(); len],
            ReduceOp::Sum,
        )
        .unwrap()
        .wait()
        .unwrap();
    assert_close(&rs, &want, &format!("{} big reduce_scatter", T::DTYPE));
}

/// All-gathers `len` elements per rank and checks that every rank's block arrived (`what` names the check).
fn all_gather_checked<T: TestElem>(comm: &Communicator, len: usize, what: &str) {
    let (n, me) = (comm.size(), comm.rank());
    let (_, g) = comm
        .all_gather_into(
            values::<T>(ReduceOp::Sum, me, len),
            vec![T::default(); n * len],
        )
        .unwrap()
        .wait()
        .unwrap();
    for r in 0..n {
        assert!(
            g[r * len..(r + 1) * len] == values::<T>(ReduceOp::Sum, r, len)[..],
            "{what}: rank {r}'s block"
        );
    }
}

/// Collectives whose whole output reaches the size the host backend writes with non-temporal stores (8 MiB),
/// with an element count that leaves unaligned heads and tails: all-gather, broadcast, all-to-all and gather.
pub fn streamed_outputs<T: TestElem>(comm: &Communicator) {
    let (n, me) = (comm.size(), comm.rank());
    let len = (8 << 20) / (n * std::mem::size_of::<T>()) + 3;
    let what = |op: &str| {
        format!(
            "{} {op} into {} bytes",
            T::DTYPE,
            n * len * std::mem::size_of::<T>()
        )
    };
    all_gather_checked::<T>(comm, len, &what("all_gather"));
    let root = n - 1;
    let sent = values::<T>(ReduceOp::Sum, root, n * len);
    let mine = if me == root {
        sent.clone()
    } else {
        vec![T::default(); n * len]
    };
    let b = comm.broadcast(mine, root).unwrap().wait().unwrap();
    assert!(b == sent, "{}", what("broadcast"));
    let blocks: Vec<T> = (0..n)
        .flat_map(|d| (0..len).map(move |i| pattern::<T>(me, d, i)))
        .collect();
    let (_, a) = comm
        .all_to_all_into(blocks, vec![T::default(); n * len])
        .unwrap()
        .wait()
        .unwrap();
    for src in 0..n {
        let want: Vec<T> = (0..len).map(|i| pattern::<T>(src, me, i)).collect();
        assert!(
            a[src * len..(src + 1) * len] == want[..],
            "{}",
            what("all_to_all")
        );
    }
    let (_, gathered) = comm
        .gather(
            values::<T>(ReduceOp::Sum, me, len),
            vec![T::default(); n * len],
            0,
        )
        .unwrap()
        .wait()
        .unwrap();
    if me == 0 {
        for r in 0..n {
            assert!(
                gathered[r * len..(r + 1) * len] == values::<T>(ReduceOp::Sum, r, len)[..],
                "{}",
                what("gather")
            );
        }
    }
}

/// Small per-round scratch so that even short buffers are cut into many pieces (pipelining is exercised).
pub const SMALL_SCRATCH: usize = 256;
/// Element counts every collective and type is checked at: empty, one, odd, multi-piece.
pub const SIZES: [usize; 4] = [0, 1, 7, 1000];

/// The whole matrix on `comm` (best with `SMALL_SCRATCH`): every collective, type and reduction at `SIZES`;
/// every collective with each algorithm forced (direct reads at every size and type); and 1 MiB+ buffers of every
/// type with the default scratch, and of two types with the staged pipeline forced.
pub fn full_matrix(comm: &Communicator) {
    for len in SIZES {
        check_all_types(comm, len);
    }
    for algorithm in [
        hypercomm::comm::Algorithm::Latency,
        hypercomm::comm::Algorithm::Bandwidth,
        hypercomm::comm::Algorithm::Direct,
    ] {
        let opts = hypercomm::comm::CommOptions {
            algorithm,
            ..comm.options().clone()
        };
        let forced = comm.split_with(Some(0), 0, opts).unwrap().unwrap();
        check_type::<f32>(&forced, 33);
        check_type::<half::bf16>(&forced, 1000);
        check_type::<i64>(&forced, 7);
        if algorithm == hypercomm::comm::Algorithm::Direct {
            // Every type, empty and one-element buffers: parts and blocks of zero bytes read nothing.
            for len in SIZES {
                check_all_types(&forced, len);
            }
        }
    }
    // 1 MiB+ per rank (odd element count) with the default scratch: the bandwidth path in several pieces.
    let opts = hypercomm::comm::CommOptions {
        scratch_bytes: None,
        ..comm.options().clone()
    };
    let big = comm.split_with(Some(0), 0, opts.clone()).unwrap().unwrap();
    // From 2 ranks Auto reads the all-gather's and reduce-scatter's buffers (n blocks of 1 MiB+) directly where
    // it can; the staged pipeline gets them too.
    let staged = hypercomm::comm::CommOptions {
        algorithm: hypercomm::comm::Algorithm::Bandwidth,
        ..opts
    };
    let staged = comm.split_with(Some(0), 0, staged).unwrap().unwrap();
    big_buffers::<f32>(&staged);
    big_buffers::<half::bf16>(&staged);
    big_buffers::<f32>(&big);
    big_buffers::<f64>(&big);
    big_buffers::<half::f16>(&big);
    big_buffers::<half::bf16>(&big);
    big_buffers::<i8>(&big);
    big_buffers::<u8>(&big);
    big_buffers::<i32>(&big);
    big_buffers::<i64>(&big);
    big_buffers::<u32>(&big);
    big_buffers::<u64>(&big);
    // f32 with an odd element count already starts blocks off 16-byte boundaries and ends them mid-lane.
    streamed_outputs::<f32>(&big);
}
