//! One module per subcommand: each has an `Args` (clap) and a `run` that returns a [`CliError`](crate::error::CliError).

pub mod bench;
pub mod collection_bench;
pub mod grid;
pub mod launch;
pub mod layout;
pub mod plan;
pub mod sizes;
pub mod store;
