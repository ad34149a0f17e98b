//! Every collective x element type x reduction x size (0, 1, odd, multi-piece, 1 MiB+) x rank count (1, 2, 3, 4,
//! 8), in place and out of place, shared memory and TCP, with several operations in flight. Ranks are threads;
//! `comm_processes.rs` runs ranks as processes.

mod comm_support;

use comm_support::checks::*;
use comm_support::*;
use hypercomm::comm::CommOptions;

/// One world per (rank count, transport), running the whole matrix (see `full_matrix`) on a pipelining-heavy
/// communicator.
fn matrix(n: usize, tcp: bool) {
    let name = format!("matrix-{n}-{tcp}");
    on_threads(
        n,
        CommOptions {
            scratch_bytes: Some(SMALL_SCRATCH),
            ..options(&name, tcp)
        },
        move |comm| full_matrix(&comm),
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
