//! Every collective x element type x reduction x size (0, 1, odd, multi-piece, 1 MiB+) x rank count (1, 2, 3, 4,
//! 8), in place and out of place, shared memory and TCP, with several operations in flight. Ranks are threads;
//! `comm_processes.rs` runs ranks as processes.

mod comm_support;

use comm_support::checks::*;
use comm_support::*;
use hypercomm::comm::{Algorithm, CommOptions};

/// Small per-round scratch so that even short buffers are cut into many pieces (pipelining is exercised).
const SMALL_SCRATCH: usize = 256;
const SIZES: [usize; 4] = [0, 1, 7, 1000];

/// One world per (rank count, transport): every type and size on a pipelining-heavy communicator, all-reduce with
/// each algorithm forced, and 1 MiB+ buffers with the default scratch.
fn matrix(n: usize, tcp: bool) {
    let name = format!("matrix-{n}-{tcp}");
    on_threads(
        n,
        CommOptions {
            scratch_bytes: Some(SMALL_SCRATCH),
            ..options(&name, tcp)
        },
        move |comm| {
            for len in SIZES {
                check_all_types(&comm, len);
            }
            for algorithm in [Algorithm::Latency, Algorithm::Bandwidth] {
                let opts = CommOptions {
                    algorithm,
                    ..comm.options().clone()
                };
                let forced = comm.split_with(Some(0), 0, opts).unwrap().unwrap();
                check_type::<f32>(&forced, 33);
                check_type::<half::bf16>(&forced, 1000);
                check_type::<i64>(&forced, 7);
            }
            // 1 MiB+ per rank (odd element count) with the default scratch: the bandwidth path in several pieces.
            let opts = CommOptions {
                scratch_bytes: None,
                ..comm.options().clone()
            };
            let big = comm.split_with(Some(0), 0, opts).unwrap().unwrap();
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
        },
    );
}

macro_rules! worlds {
    ($($name:ident: $n:expr, $tcp:expr;)*) => {$(
        #[test]
        fn $name() {
            matrix($n, $tcp);
        }
    )*};
}

worlds! {
    one_rank_shm: 1, false;
    two_ranks_shm: 2, false;
    three_ranks_shm: 3, false;
    four_ranks_shm: 4, false;
    eight_ranks_shm: 8, false;
    one_rank_tcp: 1, true;
    two_ranks_tcp: 2, true;
    three_ranks_tcp: 3, true;
    four_ranks_tcp: 4, true;
    eight_ranks_tcp: 8, true;
}
