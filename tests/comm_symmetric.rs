//! Symmetric buffers (`Communicator::symmetric_buffer`, `all_reduce_symmetric`): results bit-identical to the
//! ordinary all-reduce for every reduction, several types, sizes on both sides of the latency limit and of a
//! pipeline piece, 1 to 4 ranks, shared memory (read in place) and TCP (ordinary algorithms on the window);
//! buffers reused across operations; and the errors: buffers allocated out of step, a window too small, none at
//! all, a buffer from another communicator. Ranks are threads; `comm_processes.rs` runs them as processes.

mod comm_support;

use comm_support::*;
use hypercomm::comm::{Algorithm, CommError, CommOptions, Communicator, ReduceOp};

const WINDOW: usize = 8 << 20;

fn symmetric(name: &str, tcp: bool) -> CommOptions {
    CommOptions {
        symmetric_bytes: WINDOW,
        ..options(name, tcp)
    }
}

/// All-reduces `len` elements of `T` both ways and requires the same bits, and the reference values.
fn same_as_ordinary<T: TestElem>(comm: &Communicator, op: ReduceOp, len: usize) {
    let n = comm.size();
    let mine = values::<T>(op, comm.rank(), len);
    let mut buf = comm.symmetric_buffer(len, T::default()).unwrap();
    buf.copy_from_slice(&mine);
    let got = comm.all_reduce_symmetric(buf, op).unwrap().wait().unwrap();
    let ordinary = comm.all_reduce(mine, op).unwrap().wait().unwrap();
    let what = format!("{:?} {op:?} n={n} len={len}", T::DTYPE);
    assert!(
        got.iter()
            .zip(&ordinary)
            .all(|(a, b)| a.to_f64().to_bits() == b.to_f64().to_bits()),
        "{what}: symmetric and ordinary results differ"
    );
    assert_close(&got, &expected::<T>(op, n, len), &what);
}

fn matrix(n: usize, tcp: bool, algorithm: Algorithm) {
    let name = format!("sym-{n}-{tcp}-{algorithm:?}");
    on_threads(
        n,
        CommOptions {
            algorithm,
            ..symmetric(&name, tcp)
        },
        move |comm| {
            // 0, fewer elements than ranks, odd, just past the latency limit, several 256 KiB pieces plus a tail.
            for len in [0, 1, 2, 7, 1000, 40_000, 200_003] {
                for op in ReduceOp::ALL {
                    same_as_ordinary::<f32>(&comm, op, len);
                }
                same_as_ordinary::<i64>(&comm, ReduceOp::Sum, len);
                same_as_ordinary::<half::bf16>(&comm, ReduceOp::Avg, len);
                same_as_ordinary::<u8>(&comm, ReduceOp::Max, len);
            }
        },
    );
}

#[test]
fn results_match_the_ordinary_all_reduce_over_shared_memory() {
    for n in [1, 2, 3, 4] {
        matrix(n, false, Algorithm::Auto);
    }
}

#[test]
fn small_buffers_forced_onto_the_in_place_path_are_right_too() {
    for n in [2, 3] {
        matrix(n, false, Algorithm::Bandwidth);
    }
}

#[test]
fn results_match_the_ordinary_all_reduce_over_tcp() {
    for n in [1, 2, 3] {
        matrix(n, true, Algorithm::Auto);
    }
}

#[test]
fn buffers_are_read_in_place_only_where_the_ranks_share_memory() {
    for tcp in [false, true] {
        let shared = on_threads(2, symmetric(&format!("sym-where-{tcp}"), tcp), |comm| {
            comm.symmetric_buffer(16, 0u32).unwrap().is_shared()
        });
        assert_eq!(shared, vec![!tcp; 2], "tcp={tcp}");
    }
}

#[test]
fn one_buffer_serves_many_operations_in_a_row() {
    // Each step doubles every rank's values and all-reduces them again: a rank that left an operation early, while
    // a peer still read its buffer, would show here as a wrong sum.
    let results = on_threads(3, symmetric("sym-reuse", false), |comm| {
        let len = 300_000;
        let mut buf = comm.symmetric_buffer(len, 0.0f64).unwrap();
        for (i, x) in buf.iter_mut().enumerate() {
            *x = (comm.rank() * len + i) as f64;
        }
        for _ in 0..5 {
            buf = comm
                .all_reduce_symmetric(buf, ReduceOp::Sum)
                .unwrap()
                .wait()
                .unwrap();
            buf.iter_mut().for_each(|x| *x *= 2.0);
        }
        buf.to_vec()
    });
    let len = 300_000;
    for got in &results {
        for (i, &x) in got.iter().enumerate() {
            // Sum over 3 ranks of (r*len + i) = 3i + 3len; each step then sums three equal copies (x3) and doubles.
            let first = (3 * i + 3 * len) as f64;
            let want = first * 2.0 * 6f64.powi(4);
            assert_eq!(x, want, "index {i}");
        }
    }
}

#[test]
fn buffers_allocated_out_of_step_fail_every_rank_with_a_mismatch() {
    let errors = on_threads(2, symmetric("sym-step", false), |comm| {
        // Rank 1 allocates one buffer more first, so its next buffer sits at another offset.
        let _extra = (comm.rank() == 1).then(|| comm.symmetric_buffer(100, 0u8).unwrap());
        let buf = comm.symmetric_buffer(100_000, 1.0f32).unwrap();
        let offset = buf.offset();
        let err = comm
            .all_reduce_symmetric(buf, ReduceOp::Sum)
            .unwrap()
            .wait()
            .unwrap_err();
        (offset, err)
    });
    assert_ne!(errors[0].0, errors[1].0);
    for (_, err) in &errors {
        assert!(matches!(err, CommError::Mismatch { .. }), "{err}");
        let text = err.to_string();
        assert!(text.contains("all_reduce_symmetric"), "{text}");
        assert!(
            text.contains("window offset=0") && text.contains("window offset=128"),
            "{text}"
        );
    }
}

#[test]
fn bad_requests_are_errors_that_say_what_is_wrong() {
    let results = on_threads(1, symmetric("sym-bad", false), |comm| {
        let too_big = comm
            .symmetric_buffer(WINDOW / 4 + 1, 0.0f32)
            .unwrap_err()
            .to_string();
        let plain = Communicator::world(
            hypercomm::comm::BackendKind::Host,
            std::sync::Arc::new(hypercomm::store::MemoryStore::new()),
            1,
            0,
            options("sym-none", false),
        )
        .unwrap();
        let none = plain.symmetric_buffer(4, 0u8).unwrap_err().to_string();
        let theirs = comm.symmetric_buffer(4, 0u8).unwrap();
        let other = Communicator::world(
            hypercomm::comm::BackendKind::Host,
            std::sync::Arc::new(hypercomm::store::MemoryStore::new()),
            1,
            0,
            symmetric("sym-other", false),
        )
        .unwrap();
        let foreign = other
            .all_reduce_symmetric(theirs, ReduceOp::Sum)
            .unwrap_err()
            .to_string();
        (too_big, none, foreign)
    });
    let (too_big, none, foreign) = &results[0];
    assert!(
        too_big.contains(&format!("{} bytes does not fit", WINDOW + 4)),
        "{too_big}"
    );
    assert!(none.contains("no symmetric window"), "{none}");
    assert!(
        foreign.contains("belongs to another communicator"),
        "{foreign}"
    );
}

#[test]
fn ranks_that_ask_for_different_windows_are_told_at_creation() {
    let store = std::sync::Arc::new(hypercomm::store::MemoryStore::new());
    let handles: Vec<_> = (0..2)
        .map(|me| {
            let store = std::sync::Arc::clone(&store);
            std::thread::spawn(move || {
                let options = CommOptions {
                    symmetric_bytes: if me == 0 { 1 << 20 } else { 2 << 20 },
                    ..options("sym-sizes", false)
                };
                Communicator::world(hypercomm::comm::BackendKind::Host, store, 2, me, options)
                    .map(|_| ())
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let err = results[1].as_ref().unwrap_err().to_string();
    assert!(
        err.contains("asked for symmetric windows of 2097152 bytes, rank 0 made them 1048576"),
        "{err}"
    );
}
