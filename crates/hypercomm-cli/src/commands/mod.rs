//! One module per subcommand: each has an `Args` (clap) and a `run` that returns a [`CliError`](crate::error::CliError).
//! A subcommand's helper module is named after it (`bench_processes`).

pub mod bench;
pub mod bench_nccl;
pub mod bench_output;
pub mod bench_processes;
pub mod bench_refit;
pub mod collection_bench;
pub mod grid;
pub mod launch;
pub mod layout;
pub mod plan;
pub mod plan_refit;
pub mod refit_model;
pub mod sizes;
pub mod store;
