//! Checks of communicators with a GPU that two test binaries run, written once: `fake_ranks` runs them under
//! fake-gpu (ranks as threads, one fake device each), `gpu` on a GPU (and under the fake in CI). Each takes one
//! rank's communicator (made `with_gpu`) and device, and what differs between the runs: block lengths, counts,
//! rounds, timeouts.
//!
//! - The device operations the one face gained: out-of-place all-reduce, broadcast and reduce
//!   ([`out_of_place_all_reduce_broadcast_and_reduce`]); in-place all-gather and reduce-scatter
//!   ([`in_place_all_gather_and_reduce_scatter`]); all_to_all_v with zero counts
//!   ([`all_to_all_v_with_zero_counts`]); gather and scatter from every root
//!   ([`gather_and_scatter_from_every_root`]); and what NCCL cannot run, refused with the reason ([`refusals`]).
//! - Uneven all-gather and reduce-scatter ([`uneven_all_gather_and_reduce_scatter`]).
//! - The 8-bit floats moved and reduced ([`float8_moves_and_reduces`]).
//! - Premulsum through every reducing operation ([`pre_mul_sum::through_every_reduction`]).
//! - A barrier that waits for the device work issued before it ([`barrier_orders_device_work`]).
//! - A ring exchanged in one batch of sends and receives, in both orders ([`ring_in_one_batch`]).
//! - Twin communicators overlapping on their own streams ([`twins_overlap_in_opposite_orders`]), and a rank that
//!   never joins the NCCL flavor ([`a_rank_that_never_joins_the_device`]).
//! - Groups of operations issued as one NCCL group, and what a group refuses ([`groups`]).
//! - What the GPU's watchdog ends and names: a rank that never calls, a rank that calls another collective, a
//!   ring that sends before it receives ([`watchdog`]).
//! - The small steps every device test repeats ([`done`], [`all_reduced`], [`refused`], [`on_device`]).

#![allow(dead_code)]

pub mod groups;
pub mod pre_mul_sum;
pub mod watchdog;

use std::fmt::{Debug, Display};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use hypercomm_comm::device::{DeviceBuffer, Gpu};
use hypercomm_comm::{CommError, CommOptions, Communicator, Element, P2p, ReduceOp, Work};
use hypercomm_store::{MemoryStore, Store};

/// `data` on `gpu`, or an empty buffer when `data` is empty (what a rank passes where an operation reads or writes
/// nothing).
pub fn on_device<T: Element>(gpu: &Arc<Gpu>, data: &[T]) -> DeviceBuffer<T> {
    if data.is_empty() {
        gpu.alloc_zeros(0).unwrap()
    } else {
        gpu.upload(data).unwrap()
    }
}

/// The result of an operation that must succeed, waited for.
pub fn done<R>(call: Result<Work<R>, CommError>) -> R {
    call.unwrap().wait().unwrap()
}

/// `data` uploaded to `gpu`, all-reduced with `op` on `comm` and downloaded.
pub fn all_reduced<T: Element>(
    comm: &Communicator,
    gpu: &Arc<Gpu>,
    data: &[T],
    op: ReduceOp,
) -> Vec<T> {
    done(comm.all_reduce(gpu.upload(data).unwrap(), op))
        .download()
        .unwrap()
}

/// The error of a call that must be refused (by the call itself, not by its wait); its message must say `says`.
pub fn refused<W>(call: Result<W, CommError>, says: &str) -> CommError {
    match call {
        Ok(_) => panic!("the call ran, but should have been refused with {says:?}"),
        Err(e) => {
            assert!(e.to_string().contains(says), "{e}");
            e
        }
    }
}

/// Requires `got == want`; a failure names `what`, and for a long buffer the first difference rather than both.
fn same<T: PartialEq + Debug>(got: &[T], want: &[T], what: impl Display) {
    if got == want {
        return;
    }
    if want.len() <= 32 {
        panic!("{what}: got {got:?}, want {want:?}");
    }
    match got.iter().zip(want).position(|(g, w)| g != w) {
        Some(i) => panic!(
            "{what}: element {i} is {:?}, want {:?} ({} elements, want {})",
            got[i],
            want[i],
            got.len(),
            want.len()
        ),
        None => panic!("{what}: got {} elements, want {}", got.len(), want.len()),
    }
}

/// `data` at `root`, an empty buffer elsewhere: a buffer only the root uses (a broadcast's input, a reduce's
/// output).
fn only_at<T: Element>(
    comm: &Communicator,
    gpu: &Arc<Gpu>,
    root: usize,
    data: &[T],
) -> DeviceBuffer<T> {
    on_device(gpu, if comm.rank() == root { data } else { &[] })
}

/// all_reduce_into, then broadcast_into and reduce_into from every root, `m` elements a rank: the result lands in
/// the output and the input is left as it was; a root-only buffer is empty elsewhere and stays so.
pub fn out_of_place_all_reduce_broadcast_and_reduce(comm: &Communicator, gpu: &Arc<Gpu>, m: usize) {
    let (n, rank) = (comm.size(), comm.rank());
    // Rank r's element i: the maximum comes from a different rank for each i.
    let of = |r: usize| -> Vec<i32> {
        (0..m)
            .map(|i| (100 * i + 10 * ((r + i) % n) + r) as i32)
            .collect()
    };
    let mine = of(rank);
    let fold = |f: fn(i32, i32) -> i32| -> Vec<i32> {
        (0..m)
            .map(|i| (1..n).fold(of(0)[i], |acc, r| f(acc, of(r)[i])))
            .collect()
    };
    let (input, out) = done(comm.all_reduce_into(
        gpu.upload(&mine).unwrap(),
        gpu.upload(&vec![-1i32; m]).unwrap(),
        ReduceOp::Max,
    ));
    same(
        &out.download().unwrap(),
        &fold(i32::max),
        format!("all_reduce_into on rank {rank}"),
    );
    same(
        &input.download().unwrap(),
        &mine,
        format!("all_reduce_into's input on rank {rank}"),
    );
    for root in 0..n {
        // broadcast_into: only the root's input is read.
        let (input, out) = done(comm.broadcast_into(
            only_at(comm, gpu, root, &mine),
            gpu.upload(&vec![-1i32; m]).unwrap(),
            root,
        ));
        same(
            &out.download().unwrap(),
            &of(root),
            format!("broadcast_into from {root} on rank {rank}"),
        );
        assert_eq!(input.len(), if rank == root { m } else { 0 });
        // reduce_into: only the root's output is written.
        let (input, out) = done(comm.reduce_into(
            gpu.upload(&mine).unwrap(),
            only_at(comm, gpu, root, &vec![-1i32; m]),
            ReduceOp::Sum,
            root,
        ));
        same(
            &input.download().unwrap(),
            &mine,
            format!("reduce_into's input on rank {rank}"),
        );
        if rank == root {
            same(
                &out.download().unwrap(),
                &fold(|a, b| a + b),
                format!("reduce_into to {root}"),
            );
        } else {
            assert!(out.is_empty());
        }
    }
}

/// all_gather and reduce_scatter in place, blocks of `m` elements; a length that does not split into blocks is
/// refused before NCCL sees it.
pub fn in_place_all_gather_and_reduce_scatter(comm: &Communicator, gpu: &Arc<Gpu>, m: usize) {
    let (n, rank) = (comm.size(), comm.rank());
    // All-gather in place: this rank's block filled in, the others junk that must be overwritten. Reading the
    // block anywhere but at this rank's offset gathers junk.
    let block = |r: usize| -> Vec<f32> { (0..m).map(|i| (100_000 * r + i) as f32).collect() };
    let buf: Vec<f32> = (0..n)
        .flat_map(|b| if b == rank { block(b) } else { vec![-1.0; m] })
        .collect();
    let all = done(comm.all_gather(gpu.upload(&buf).unwrap()));
    let want: Vec<f32> = (0..n).flat_map(block).collect();
    same(
        &all.download().unwrap(),
        &want,
        format!("all_gather in place on rank {rank}"),
    );
    // Reduce-scatter in place: block `rank` becomes the sum of every rank's block `rank`; the other blocks are
    // left as they were.
    let input = |r: usize| -> Vec<u64> { (0..n * m).map(|j| (100_000 * r + j) as u64).collect() };
    let out = done(comm.reduce_scatter(gpu.upload(&input(rank)).unwrap(), ReduceOp::Sum));
    let want: Vec<u64> = (0..n * m)
        .map(|j| {
            if j / m == rank {
                (0..n).map(|r| input(r)[j]).sum()
            } else {
                input(rank)[j]
            }
        })
        .collect();
    same(
        &out.download().unwrap(),
        &want,
        format!("reduce_scatter in place on rank {rank}"),
    );
    refused(
        comm.all_gather(gpu.alloc_zeros::<f32>(n + 1).unwrap()),
        &format!("not a multiple of {n} ranks"),
    );
}

/// How many elements rank `s` sends rank `d` in one all_to_all_v round.
pub type Counts = fn(usize, usize) -> usize;

/// all_to_all_v, one call a round of `rounds` (zero counts among them); counts that do not add up to the buffers
/// are refused before NCCL sees them.
pub fn all_to_all_v_with_zero_counts(comm: &Communicator, gpu: &Arc<Gpu>, rounds: &[Counts]) {
    let (n, rank) = (comm.size(), comm.rank());
    // Element k from rank s to rank d (k < 10000, d < 10).
    let value = |s: usize, d: usize, k: usize| (1 + 100_000 * s + 10_000 * d + k) as i64;
    for (round, count) in rounds.iter().enumerate() {
        let send_counts: Vec<usize> = (0..n).map(|d| count(rank, d)).collect();
        let recv_counts: Vec<usize> = (0..n).map(|s| count(s, rank)).collect();
        let input: Vec<i64> = (0..n)
            .flat_map(|d| (0..count(rank, d)).map(move |k| value(rank, d, k)))
            .collect();
        let want: Vec<i64> = (0..n)
            .flat_map(|s| (0..count(s, rank)).map(move |k| value(s, rank, k)))
            .collect();
        let output = on_device(gpu, &vec![-1i64; want.len()]);
        let (back, out) =
            done(comm.all_to_all_v(on_device(gpu, &input), send_counts, output, recv_counts));
        same(
            &out.download().unwrap(),
            &want,
            format!("all_to_all_v round {round} on rank {rank}"),
        );
        assert_eq!(back.len(), input.len());
    }
    refused(
        comm.all_to_all_v(
            gpu.alloc_zeros::<i64>(n - 1).unwrap(),
            vec![1; n],
            gpu.alloc_zeros::<i64>(n).unwrap(),
            vec![1; n],
        ),
        &format!("all_to_all_v input has {}", n - 1),
    );
}

/// gather and scatter from every root, `m` elements a rank (grouped sends and receives on NCCL).
pub fn gather_and_scatter_from_every_root(comm: &Communicator, gpu: &Arc<Gpu>, m: usize) {
    let (n, rank) = (comm.size(), comm.rank());
    let of = |r: usize| -> Vec<u32> { (0..m).map(|i| (100_000 * r + i + 1) as u32).collect() };
    for root in 0..n {
        // Gather: the root's output is every rank's input in rank order; elsewhere the output is empty.
        let (input, out) = done(comm.gather(
            gpu.upload(&of(rank)).unwrap(),
            only_at(comm, gpu, root, &vec![0u32; n * m]),
            root,
        ));
        same(
            &input.download().unwrap(),
            &of(rank),
            format!("gather's input on rank {rank}"),
        );
        if rank == root {
            let want: Vec<u32> = (0..n).flat_map(of).collect();
            same(&out.download().unwrap(), &want, format!("gather to {root}"));
        } else {
            assert!(out.is_empty());
        }
        // Scatter: rank d receives block d of the root's input; elsewhere the input is empty.
        let blocks: Vec<u32> = (0..n * m).map(|j| (1_000_000 * root + j) as u32).collect();
        let (_, out) = done(comm.scatter(
            only_at(comm, gpu, root, &blocks),
            gpu.alloc_zeros::<u32>(m).unwrap(),
            root,
        ));
        same(
            &out.download().unwrap(),
            &blocks[rank * m..(rank + 1) * m],
            format!("scatter from {root} on rank {rank}"),
        );
    }
}

/// What NCCL cannot run, refused with the reason on two ranks: the in-place all-to-all, a nonzero tag, a buffer on
/// another device than the communicator's (where the machine has one), a device buffer on a communicator without a
/// gpu (made over `store`). None of it reaches NCCL: an untagged send and receive of `m` elements afterwards still
/// match, and the host vectors on the same communicator take what the device refuses.
pub fn refusals(comm: &Communicator, gpu: &Arc<Gpu>, store: &Arc<dyn Store>, m: usize) {
    assert_eq!(comm.size(), 2, "the refusals run on two ranks");
    let (rank, peer) = (comm.rank(), 1 - comm.rank());
    let device = comm.nccl().expect("a communicator made with_gpu").name();
    let invalid = |e: &CommError| assert!(matches!(e, CommError::InvalidArgument { .. }), "{e}");
    // The in-place all-to-all: NCCL's sends and receives cannot share one buffer.
    let e = refused(
        comm.all_to_all(gpu.alloc_zeros::<f32>(4).unwrap()),
        "all_to_all in place is not available on a device buffer",
    );
    invalid(&e);
    let text = e.to_string();
    assert!(
        text.contains(&format!("communicator {device}")) && text.contains("use all_to_all_into"),
        "{text}"
    );
    // Tags: NCCL has none, so only tag 0 is taken.
    let e = refused(
        comm.send(gpu.alloc_zeros::<f32>(2).unwrap(), peer, 7),
        "send with tag 7 on a device buffer",
    );
    invalid(&e);
    assert!(e.to_string().contains("has no tags"), "{e}");
    refused(
        comm.recv(gpu.alloc_zeros::<f32>(2).unwrap(), peer, 7),
        "recv with tag 7 on a device buffer",
    );
    // Nothing of the refused calls reached NCCL: an untagged send and receive still match, and the out-of-place
    // all-to-all runs.
    let message: Vec<f32> = (0..m).map(|i| 4.5 + i as f32).collect();
    if rank == 0 {
        done(comm.send(gpu.upload(&message).unwrap(), peer, 0));
    } else {
        let got = done(comm.recv(gpu.alloc_zeros::<f32>(m).unwrap(), peer, 0));
        same(
            &got.download().unwrap(),
            &message,
            "recv after the refusals",
        );
    }
    let (_, out) = done(comm.all_to_all_into(
        gpu.upload(&[rank as f32, 10.0 + rank as f32]).unwrap(),
        gpu.alloc_zeros::<f32>(2).unwrap(),
    ));
    let exchanged = [10.0 * rank as f32, 1.0 + 10.0 * rank as f32];
    assert_eq!(out.download().unwrap(), exchanged);
    // Host vectors on the same communicator take both.
    let host = done(comm.all_to_all(vec![rank as f32, 10.0 + rank as f32]));
    assert_eq!(host, exchanged);
    if rank == 0 {
        done(comm.send(vec![7u8], peer, 7));
    } else {
        assert_eq!(done(comm.recv(vec![0u8], peer, 7)), [7]);
    }
    // A buffer on another device than the communicator's, alone or as one side of an operation.
    let here = gpu.ordinal();
    let runtime = gpu.runtime();
    match (0..runtime.device_count()).find(|&d| d != here) {
        Some(there) => {
            let other = Gpu::open(Arc::clone(runtime), there).unwrap();
            refused(
                comm.all_reduce(other.alloc_zeros::<f32>(2).unwrap(), ReduceOp::Sum),
                &format!(
                    "all_reduce got a buffer on device {there}, but the communicator is on device {here}"
                ),
            );
            refused(
                comm.all_gather_into(
                    gpu.alloc_zeros::<f32>(1).unwrap(),
                    other.alloc_zeros::<f32>(2).unwrap(),
                ),
                &format!("all_gather's input is on device {here} but its output on device {there}"),
            );
        }
        None => eprintln!("refusals: one device only, so no buffer on another device to refuse"),
    }
    // A communicator made without a gpu refuses device buffers, naming itself and what it lacks.
    let host_only = Communicator::new(
        Arc::clone(store),
        vec![0, 1],
        rank,
        CommOptions {
            timeout: Duration::from_secs(30),
            ..CommOptions::named("host-only")
        },
    )
    .unwrap();
    assert!(host_only.gpu().is_none() && host_only.nccl().is_none());
    let e = refused(
        host_only.all_reduce(gpu.alloc_zeros::<f32>(2).unwrap(), ReduceOp::Sum),
        &format!("all_reduce got a buffer on device {here}, but communicator host-only has no gpu"),
    );
    invalid(&e);
    // The refusal left it usable.
    let sum = done(host_only.all_reduce(vec![1u32], ReduceOp::Sum));
    assert_eq!(sum, [2]);
}

/// One small all-gather on `ag`, then one small reduce-scatter on `dp`, each waited for: both connected.
pub fn warm_up(gpu: &Arc<Gpu>, ag: &Communicator, dp: &Communicator) {
    let n = ag.size();
    ag.all_gather_into(
        gpu.upload(&[0f32]).unwrap(),
        gpu.alloc_zeros::<f32>(n).unwrap(),
    )
    .and_then(|w| w.wait())
    .expect("warming up the all-gather twin");
    dp.reduce_scatter_into(
        gpu.upload(&vec![0f32; n]).unwrap(),
        gpu.alloc_zeros::<f32>(1).unwrap(),
        ReduceOp::Sum,
    )
    .and_then(|w| w.wait())
    .expect("warming up the reduce-scatter twin");
}

/// All-gather and reduce-scatter with per-rank counts on device buffers (one NCCL group of sends and receives, and
/// of `ncclReduce`s): rank `r`'s block holds `block(r)` elements (some ranks none); every rank gets every block,
/// and rank `r` the sum of every rank's block `r`.
pub fn uneven_all_gather_and_reduce_scatter(
    comm: &Communicator,
    gpu: &Arc<Gpu>,
    block: fn(usize) -> usize,
) {
    let (n, rank) = (comm.size(), comm.rank());
    let counts: Vec<usize> = (0..n).map(block).collect();
    let total: usize = counts.iter().sum();
    let value = |r: usize, i: usize| (r * 1_000 + i) as i64;
    let mine: Vec<i64> = (0..counts[rank]).map(|i| value(rank, i)).collect();
    let (_, all) = done(comm.all_gather_v(
        on_device(gpu, &mine),
        gpu.alloc_zeros::<i64>(total).unwrap(),
        counts.clone(),
    ));
    let want: Vec<i64> = (0..n)
        .flat_map(|r| (0..counts[r]).map(move |i| value(r, i)))
        .collect();
    same(
        &all.download().unwrap(),
        &want,
        format_args!("rank {rank}'s all_gather_v"),
    );
    let input: Vec<i64> = (0..total).map(|i| value(rank, i)).collect();
    let (_, out) = done(comm.reduce_scatter_v(
        on_device(gpu, &input),
        gpu.alloc_zeros::<i64>(counts[rank]).unwrap(),
        counts.clone(),
        ReduceOp::Sum,
    ));
    let start: usize = counts[..rank].iter().sum();
    let want: Vec<i64> = (start..start + counts[rank])
        .map(|i| (0..n).map(|r| value(r, i)).sum())
        .collect();
    same(
        &out.download().unwrap(),
        &want,
        format_args!("rank {rank}'s reduce_scatter_v"),
    );
}

/// The 8-bit floats on the device: an all-gather of e4m3 values and a sum of e5m2 values, exact in both formats
/// (small integers), and a batch exchange of e4m3 around the ring.
pub fn float8_moves_and_reduces(comm: &Communicator, gpu: &Arc<Gpu>) {
    use float8::{F8E4M3, F8E5M2};
    let (n, rank) = (comm.size(), comm.rank());
    let mine: Vec<F8E4M3> = (0..4)
        .map(|i| F8E4M3::from_f32((rank + i) as f32))
        .collect();
    let (_, all) =
        done(comm.all_gather_into(on_device(gpu, &mine), gpu.alloc_zeros(4 * n).unwrap()));
    let want: Vec<F8E4M3> = (0..n)
        .flat_map(|r| (0..4).map(move |i| F8E4M3::from_f32((r + i) as f32)))
        .collect();
    same(&all.download().unwrap(), &want, "f8e4m3 all_gather");
    let ones = vec![F8E5M2::from_f32(1.0); 8];
    let sum = done(comm.all_reduce(on_device(gpu, &ones), ReduceOp::Sum));
    same(
        &sum.download().unwrap(),
        &[F8E5M2::from_f32(n as f32); 8],
        "f8e5m2 sum",
    );
    if n > 1 {
        let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
        let bufs = done(comm.batch(vec![
            P2p::send(on_device(gpu, &[F8E4M3::from_f32(rank as f32); 3]), next),
            P2p::recv(gpu.alloc_zeros::<F8E4M3>(3).unwrap(), prev),
        ]));
        same(
            &bufs[1].download().unwrap(),
            &[F8E4M3::from_f32(prev as f32); 3],
            "f8e4m3 batch",
        );
    }
}

/// A barrier on a communicator with a GPU orders device work: every rank issues a device all-reduce of `len`
/// elements (the last rank `late` after the others) and then a barrier, without waiting on the all-reduce; once the
/// barrier returns, the all-reduce has finished on every rank's device and holds the sum.
pub fn barrier_orders_device_work(comm: &Communicator, gpu: &Arc<Gpu>, len: usize, late: Duration) {
    let (n, rank) = (comm.size(), comm.rank());
    if rank + 1 == n {
        std::thread::sleep(late);
    }
    let work = comm
        .all_reduce(on_device(gpu, &vec![rank as u32 + 1; len]), ReduceOp::Sum)
        .unwrap();
    done(comm.barrier());
    assert!(
        work.is_completed(),
        "rank {rank}: the barrier returned before this rank's device all-reduce finished"
    );
    let sum = done(Ok(work)).download().unwrap();
    let want = (n * (n + 1) / 2) as u32;
    same(
        &sum,
        &vec![want; len],
        format_args!("rank {rank}'s all-reduce before the barrier"),
    );
}

/// Pipeline and ring context parallelism's exchange on device buffers: every rank sends `len` u32s to the next
/// rank and receives `len` from the previous in one batch (one NCCL group), with the parts in one order on even
/// ranks and the other on odd ranks, then swapped; every element arrives. Then a batch with parts to several
/// peers and zero-length parts, and a tagged part refused with the reason.
pub fn ring_in_one_batch(comm: &Communicator, gpu: &Arc<Gpu>, len: usize) {
    let (n, rank) = (comm.size(), comm.rank());
    let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
    let pattern = |from: usize, i: usize| (i as u32).wrapping_mul(2_654_435_761) ^ from as u32;
    for round in 0..2 {
        let mine: Vec<u32> = (0..len).map(|i| pattern(rank, i)).collect();
        let send = P2p::send(on_device(gpu, &mine), next);
        let recv = P2p::recv(gpu.alloc_zeros::<u32>(len).unwrap(), prev);
        let send_first = (rank + round) % 2 == 0;
        let parts = if send_first {
            vec![send, recv]
        } else {
            vec![recv, send]
        };
        let mut bufs = done(comm.batch(parts));
        let got = bufs.remove(usize::from(send_first)).download().unwrap();
        let want: Vec<u32> = (0..len).map(|i| pattern(prev, i)).collect();
        same(
            &got,
            &want,
            format_args!("ring round {round}, rank {rank} from rank {prev}"),
        );
    }
    // Every peer at once, an empty part with each, both directions in one group.
    let mut parts = Vec::new();
    for peer in (0..n).filter(|&p| p != rank) {
        parts.push(P2p::send(
            on_device(gpu, &[(rank * 10 + peer) as i64; 3]),
            peer,
        ));
        parts.push(P2p::recv(gpu.alloc_zeros::<i64>(3).unwrap(), peer));
        parts.push(P2p::send(gpu.alloc_zeros::<i64>(0).unwrap(), peer));
        parts.push(P2p::recv(gpu.alloc_zeros::<i64>(0).unwrap(), peer));
    }
    let bufs = done(comm.batch(parts));
    for (k, peer) in (0..n).filter(|&p| p != rank).enumerate() {
        let got = bufs[4 * k + 1].download().unwrap();
        same(
            &got,
            &[(peer * 10 + rank) as i64; 3],
            format_args!("part from rank {peer}"),
        );
        assert!(bufs[4 * k + 3].is_empty());
    }
    if n > 1 {
        refused(
            comm.batch(vec![P2p::Send {
                buf: on_device(gpu, &[1u8]),
                peer: next,
                tag: 3,
            }]),
            "has no tags",
        );
    }
}

/// Twin communicators over the same ranks (Megatron's dp_cp and its all-gather twin dp_cp_ag), each with its own
/// stream: alternating ranks issue an all-gather of `n` elements on `ag` and a reduce-scatter into `n` on `dp` in
/// opposite orders, `rounds` times. On one stream that deadlocks (each rank's first operation waits for the
/// other's); on twins both complete, with the right values.
pub fn twins_overlap_in_opposite_orders(
    gpu: &Arc<Gpu>,
    ag: &Communicator,
    dp: &Communicator,
    n: usize,
    rounds: usize,
) {
    let (size, rank) = (dp.size(), dp.rank());
    let stream = |c: &Communicator| c.nccl().expect("made with_gpu").stream().cu_stream();
    assert_ne!(stream(ag), stream(dp), "twins share a stream");
    // First in the same order on every rank: the first collective connects the peers (NCCL's runtime connection,
    // 2.22 and later) and settles only when every rank has reached it, so opposite first operations would wait on
    // each other until the timeout (seen on an H100 with NCCL 2.30.7, 2026-11-23). Once connected, opposite
    // orders are fine.
    warm_up(gpu, ag, dp);
    for round in 0..rounds {
        let shard = vec![(rank * 10 + round) as f32; n];
        let grads: Vec<f32> = (0..size * n)
            .map(|i| ((i % 7) + rank + round) as f32)
            .collect();
        let gather = || {
            ag.all_gather_into(
                gpu.upload(&shard).unwrap(),
                gpu.alloc_zeros(size * n).unwrap(),
            )
            .unwrap()
        };
        let scatter = || {
            dp.reduce_scatter_into(
                gpu.upload(&grads).unwrap(),
                gpu.alloc_zeros(n).unwrap(),
                ReduceOp::Sum,
            )
            .unwrap()
        };
        let (g, s) = if rank % 2 == 0 {
            let g = gather();
            (g, scatter())
        } else {
            let s = scatter();
            (gather(), s)
        };
        let (_, gathered) = g.wait().unwrap();
        let (_, reduced) = s.wait().unwrap();
        let want: Vec<f32> = (0..size)
            .flat_map(|r| vec![(r * 10 + round) as f32; n])
            .collect();
        same(
            &gathered.download().unwrap(),
            &want,
            format!("all_gather of round {round} on rank {rank}"),
        );
        let want: Vec<f32> = (0..n)
            .map(|j| {
                (0..size)
                    .map(|r| (((rank * n + j) % 7) + r + round) as f32)
                    .sum()
            })
            .collect();
        same(
            &reduced.download().unwrap(),
            &want,
            format!("reduce_scatter of round {round} on rank {rank}"),
        );
    }
}

/// Rank 1 of the two-rank communicator `name` joins its host flavor (made without a gpu) but never its NCCL one:
/// rank 0's creation with `gpu`, waiting `timeout`, must end in a timeout naming the NCCL flavor (after aborting
/// it), not hang. Rank 1 gives up after `patience`, and so must rank 0.
pub fn a_rank_that_never_joins_the_device(
    gpu: Arc<Gpu>,
    name: &str,
    timeout: Duration,
    patience: Duration,
) {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let options = |timeout| CommOptions {
        timeout,
        ..CommOptions::named(name)
    };
    let joined = Barrier::new(2);
    let started = Instant::now();
    let e = std::thread::scope(|s| {
        s.spawn(|| {
            let host_only =
                Communicator::new(Arc::clone(&store), vec![0, 1], 1, options(patience)).unwrap();
            joined.wait();
            drop(host_only);
        });
        let e = Communicator::with_gpu(gpu, Arc::clone(&store), vec![0, 1], 0, options(timeout))
            .expect_err("rank 1 never joins the nccl communicator");
        joined.wait();
        e
    });
    eprintln!("{name}: {e} after {:?}", started.elapsed());
    assert!(matches!(e, CommError::Timeout { .. }), "{e}");
    assert!(e.to_string().contains(&format!("{name}/device")), "{e}");
    assert!(started.elapsed() < patience, "{:?}", started.elapsed());
}
