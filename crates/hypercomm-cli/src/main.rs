//! `hypercomm`: the command-line face of the library.
//!
//! Each subcommand lives in its own module under `commands/`, parses its arguments, calls the library and prints.
//! Bad input exits with status 2 and a one-line error; a command that ran and failed exits with status 1.

mod commands;
mod error;
mod numbers;
mod output;
mod render;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Process-group topology for distributed training.
#[derive(Parser, Debug)]
#[command(name = "hypercomm", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Measure a collective nccl-tests style: table, JSON and busbw plot.
    Bench(commands::bench::Args),
    /// Print the groups of a grid over named dimensions.
    Grid(commands::grid::Args),
    /// Print the groups of a Megatron-Core layout, or one rank's groups.
    Layout(commands::layout::Args),
    /// Rank every dimension order of a layout by its communication time on a described cluster, or (--refit) plan
    /// a weight refit between two layouts.
    Plan(commands::plan::Args),
    /// Run a standalone rendezvous store server.
    Store(commands::store::Args),
    /// Start N local ranks with rendezvous variables set, and supervise them.
    Launch(commands::launch::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench(args) => commands::bench::run(args),
        Command::Grid(args) => commands::grid::run(args),
        Command::Layout(args) => commands::layout::run(args),
        Command::Plan(args) => commands::plan::run(args),
        Command::Store(args) => commands::store::run(args),
        Command::Launch(args) => commands::launch::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("hypercomm: {err}");
            err.exit_code()
        }
    }
}
