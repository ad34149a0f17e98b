//! Symmetric buffers (`Communicator::symmetric_buffer` and the all-reduce, all-gather and reduce-scatter over
//! them): results bit-identical to the ordinary in-place collectives for every reduction, several types, sizes on both sides of the latency limit and of a
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

/// A whole buffer compared bit for bit, then against `want`.
fn same_bits<T: TestElem>(got: &[T], ordinary: &[T], want: &[T], what: &str) {
    assert!(
        got.iter()
            .zip(ordinary)
            .all(|(a, b)| a.to_f64().to_bits() == b.to_f64().to_bits()),
        "{what}: symmetric and ordinary results differ"
    );
    assert_close(got, want, what);
}

/// In-place all-gather and reduce-scatter of `block` elements per rank, symmetric against ordinary: the whole
/// buffers must agree (so the reduce-scatter's other blocks are left as they were on both).
fn gather_and_scatter_like_ordinary<T: TestElem>(comm: &Communicator, op: ReduceOp, block: usize) {
    let (n, me) = (comm.size(), comm.rank());
    let what = format!("{:?} {op:?} n={n} block={block}", T::DTYPE);
    // All-gather: block r holds rank r's values; this rank fills only its own.
    let mut mine = vec![T::default(); n * block];
    mine[me * block..(me + 1) * block].copy_from_slice(&values::<T>(op, me, block));
    let mut buf = comm.symmetric_buffer(n * block, T::default()).unwrap();
    buf.copy_from_slice(&mine);
    let got = comm.all_gather_symmetric(buf).unwrap().wait().unwrap();
    let ordinary = comm.all_gather(mine).unwrap().wait().unwrap();
    let want: Vec<T> = (0..n).flat_map(|r| values::<T>(op, r, block)).collect();
    same_bits(&got, &ordinary, &want, &format!("all_gather {what}"));
    // Reduce-scatter: every rank contributes values over the whole buffer; block `me` gets the reduction.
    let input = values::<T>(op, me, n * block);
    let mut buf = comm.symmetric_buffer(n * block, T::default()).unwrap();
    buf.copy_from_slice(&input);
    let got = comm
        .reduce_scatter_symmetric(buf, op)
        .unwrap()
        .wait()
        .unwrap();
    let ordinary = comm
        .reduce_scatter(input.clone(), op)
        .unwrap()
        .wait()
        .unwrap();
    let mut want = input;
    want[me * block..(me + 1) * block]
        .copy_from_slice(&expected::<T>(op, n, n * block)[me * block..(me + 1) * block]);
    same_bits(&got, &ordinary, &want, &format!("reduce_scatter {what}"));
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
            // 0, fewer elements than ranks, odd, both sides of the 4 KiB staging limit for 4-byte elements (1000 and
            // 1025), past the ordinary latency limit at three ranks, many 16 KiB steps with uneven parts.
            for len in [0, 1, 2, 7, 1000, 1025, 40_000, 200_003] {
                for op in ReduceOp::ALL {
                    same_as_ordinary::<f32>(&comm, op, len);
                }
                same_as_ordinary::<i64>(&comm, ReduceOp::Sum, len);
                same_as_ordinary::<half::bf16>(&comm, ReduceOp::Avg, len);
                same_as_ordinary::<u8>(&comm, ReduceOp::Max, len);
            }
            for block in [0, 1, 7, 1000, 100_003] {
                for op in ReduceOp::ALL {
                    gather_and_scatter_like_ordinary::<f32>(&comm, op, block);
                }
                gather_and_scatter_like_ordinary::<i32>(&comm, ReduceOp::Sum, block);
                gather_and_scatter_like_ordinary::<half::f16>(&comm, ReduceOp::Max, block);
            }
        },
    );
}

#[test]
fn results_match_the_ordinary_collectives_over_shared_memory() {
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
fn results_match_the_ordinary_collectives_over_tcp() {
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
fn gathers_and_scatters_reuse_their_buffers_step_after_step() {
    // Each step a rank rewrites its buffer for the next step the moment an operation returns, before it looks at
    // the result: a rank that returned while a peer still read its buffer would hand that peer next step's values.
    let block = 200_000;
    on_threads(2, symmetric("sym-reuse-ag-rs", false), move |comm| {
        let (n, me) = (comm.size(), comm.rank());
        let value = |step: u32, r: usize, i: usize| step * 1_000_000 + (r * block + i) as u32;
        let mut gather = comm.symmetric_buffer(n * block, 0u32).unwrap();
        for i in 0..block {
            gather[me * block + i] = value(0, me, i);
        }
        for step in 0..8 {
            gather = comm.all_gather_symmetric(gather).unwrap().wait().unwrap();
            for i in 0..block {
                gather[me * block + i] = value(step + 1, me, i);
            }
            for r in (0..n).filter(|&r| r != me) {
                for i in 0..block {
                    let got = gather[r * block + i];
                    assert_eq!(
                        got,
                        value(step, r, i),
                        "all_gather step {step} block {r} index {i}"
                    );
                }
            }
        }
        // Block `r` of this rank's buffer (the one rank r reads), from its far end, for `step`.
        let fill = |buf: &mut [u32], r: usize, step: u32| {
            for i in (r * block..(r + 1) * block).rev() {
                buf[i] = value(step, me, i % block) + i as u32;
            }
        };
        let mut scatter = comm.symmetric_buffer(n * block, 0u32).unwrap();
        (0..n).for_each(|r| fill(&mut scatter, r, 0));
        for step in 0..8 {
            scatter = comm
                .reduce_scatter_symmetric(scatter, ReduceOp::Sum)
                .unwrap()
                .wait()
                .unwrap();
            for r in (0..n).filter(|&r| r != me) {
                fill(&mut scatter, r, step + 1);
            }
            for i in 0..block {
                let at = me * block + i;
                let want: u32 = (0..n).map(|r| value(step, r, i) + at as u32).sum();
                assert_eq!(scatter[at], want, "reduce_scatter step {step} index {at}");
            }
            fill(&mut scatter, me, step + 1);
        }
    });
}

#[test]
fn an_all_gather_past_the_cache_streams_its_blocks_and_is_right() {
    // A 12 MiB buffer is past the size where the in-place all-gather writes with non-temporal stores.
    let block = 3 << 19;
    let options = CommOptions {
        symmetric_bytes: 16 << 20,
        ..options("sym-stream", false)
    };
    let gathered = on_threads(2, options, move |comm| {
        let me = comm.rank();
        let mut buf = comm.symmetric_buffer(2 * block, 0u32).unwrap();
        for i in 0..block {
            buf[me * block + i] = (me * block + i) as u32 ^ 0x5a5a;
        }
        let buf = comm.all_gather_symmetric(buf).unwrap().wait().unwrap();
        buf.iter()
            .enumerate()
            .filter(|&(i, &x)| x != i as u32 ^ 0x5a5a)
            .count()
    });
    assert_eq!(gathered, [0, 0], "elements wrong per rank");
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
fn gathers_and_scatters_allocated_out_of_step_fail_with_a_mismatch_too() {
    let errors = on_threads(2, symmetric("sym-step-ag", false), |comm| {
        let _extra = (comm.rank() == 0).then(|| comm.symmetric_buffer(1, 0u8).unwrap());
        let gather = comm.symmetric_buffer(64, 1.0f32).unwrap();
        let ag = comm
            .all_gather_symmetric(gather)
            .unwrap()
            .wait()
            .unwrap_err();
        let scatter = comm.symmetric_buffer(64, 1.0f32).unwrap();
        let rs = comm
            .reduce_scatter_symmetric(scatter, ReduceOp::Sum)
            .unwrap()
            .wait()
            .unwrap_err();
        (ag.to_string(), rs.to_string())
    });
    for (ag, rs) in &errors {
        assert!(
            ag.contains("rank(s) [1] called all_gather_symmetric(#1, dtype=f32, count=32, window offset=0) \
                 but rank(s) [0] called all_gather_symmetric(#1, dtype=f32, count=32, window offset=64)"),
            "{ag}"
        );
        // The failed all-gather's buffers stay out of the free list (a peer might still read them), so the
        // reduce-scatter's come after them.
        assert!(
            rs.contains("rank(s) [1] called reduce_scatter_symmetric(#2, dtype=f32, count=32, op=sum, window \
                 offset=256) but rank(s) [0] called reduce_scatter_symmetric(#2, dtype=f32, count=32, op=sum, \
                 window offset=320)"),
            "{rs}"
        );
    }
    // A buffer that does not split into one block per rank is refused before anything runs.
    let refused = on_threads(2, symmetric("sym-ragged", false), |comm| {
        let ragged = comm.symmetric_buffer(5, 0u8).unwrap();
        comm.all_gather_symmetric(ragged).unwrap_err().to_string()
    });
    for err in refused {
        assert!(
            err.contains("all_gather_symmetric buffer has 5 elements, not a multiple of 2 ranks"),
            "{err}"
        );
    }
}

#[test]
fn a_peer_that_gives_up_fails_the_operation_and_its_buffer_stays_out_of_reuse() {
    let results = on_threads(
        2,
        CommOptions {
            timeout: std::time::Duration::from_secs(20),
            ..symmetric("sym-abort", false)
        },
        |comm| {
            let buf = comm.symmetric_buffer(100_000, 1.0f32).unwrap();
            let offset = buf.offset();
            if comm.rank() == 1 {
                // Gives up instead of joining the all-reduce.
                comm.abort();
                return (offset, None, None);
            }
            let err = comm
                .all_reduce_symmetric(buf, ReduceOp::Sum)
                .unwrap()
                .wait()
                .unwrap_err();
            // The failed buffer's bytes are not handed out again: the next buffer comes after them.
            let next = comm.symmetric_buffer(16, 0u8).unwrap().offset();
            (offset, Some(err.to_string()), Some(next))
        },
    );
    let (offset, err, next) = &results[0];
    let err = err.as_ref().unwrap();
    assert!(
        err.contains(
            "communicator sym-abort (members [0, 1]): aborted by rank 1 (in all_reduce_symmetric("
        ),
        "{err}"
    );
    assert!(
        next.unwrap() >= offset + 400_000,
        "reused a retired buffer: {next:?}"
    );
}

#[test]
fn bad_requests_are_errors_that_say_what_is_wrong() {
    let results = on_threads(1, symmetric("sym-bad", false), |comm| {
        let too_big = comm
            .symmetric_buffer(WINDOW / 4 + 1, 0.0f32)
            .unwrap_err()
            .to_string();
        let plain = Communicator::world(
            std::sync::Arc::new(hypercomm::store::MemoryStore::new()),
            1,
            0,
            options("sym-none", false),
        )
        .unwrap();
        let none = plain.symmetric_buffer(4, 0u8).unwrap_err().to_string();
        let theirs = comm.symmetric_buffer(4, 0u8).unwrap();
        let other = Communicator::world(
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
fn a_window_too_large_to_address_is_an_error_not_a_panic() {
    for tcp in [false, true] {
        let err = Communicator::world(
            std::sync::Arc::new(hypercomm::store::MemoryStore::new()),
            1,
            0,
            CommOptions {
                symmetric_bytes: usize::MAX - 10,
                ..options(&format!("sym-huge-{tcp}"), tcp)
            },
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("overflows usize"), "tcp={tcp}: {err}");
    }
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
                Communicator::world(store, 2, me, options).map(|_| ())
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
