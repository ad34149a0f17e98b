//! hypercomm's benchmarks as a library: everything `hypercomm bench` and the root `benches/` measure, in one crate
//! that is never published, so that the library crates carry no measuring code. `hypercomm bench` parses
//! arguments, prints and plots; the measuring is here.
//!
//! 1. [`op`]: what is measured, counted as nccl-tests counts it: the collectives ([`BenchOp`]), their buffer sizes
//!    and bus-bandwidth factors, one size's result ([`BenchResult`]); [`split_sizes`]: the all-to-all-v's counts,
//!    drawn from a seed; [`delivery`]: checking what the sendrecv and the all-to-all-v delivered.
//! 2. [`host`]: host-backend collectives, ranks as threads ([`host::run`]) or as processes each calling
//!    [`host::run_rank`]; [`cpus`]: binding the rank threads to CPUs.
//! 3. [`device`]: NCCL collectives on GPUs, and the host time per call against calling NCCL directly
//!    ([`device::bare_nccl`]).
//! 4. [`core_to_core`]: the cache-line round trip between two CPUs that every shared-memory round waits on.
//! 5. [`collection`]: building a full process-group collection, by each bootstrap.
//! 6. [`refit`]: a weight refit between two layouts ([`refit::run`]) against gathering every full tensor on source
//!    rank 0 and broadcasting it to the destination ranks, same model, same ranks, same run.
//! 7. [`stats`]: the one [`median`] every benchmark reports; [`runs`]: several runs of a benchmark summarised.
//! 8. [`provenance`]: where figures came from (command, time, machine, commit, load), written beside them.
//! 9. [`harness`]: timing closures for the `cargo bench` targets.
//!
//! The figures measured with these, each with its command, machine, date and JSON, are in `docs/perf/`.

pub mod collection;
pub mod core_to_core;
pub mod cpus;
pub mod delivery;
pub mod device;
pub mod harness;
pub mod host;
pub mod op;
pub mod provenance;
pub mod refit;
pub mod runs;
pub mod split_sizes;
pub mod stats;

pub use op::{BenchOp, BenchResult};
pub use stats::median;
