//! `hypercomm store`: run a standalone rendezvous store server until interrupted.

use std::io::Write;
use std::thread;
use std::time::{Duration, Instant};

use hypercomm_store::frame::DEFAULT_MAX_FRAME;
use hypercomm_store::{SECRET_ENV, Secret, ServerOptions, TcpStore};

use crate::error::CliError;
use crate::numbers::non_negative;

/// Arguments of `hypercomm store`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Address to listen on, `HOST:PORT` (port 0 picks a free port; the chosen address is printed).
    #[arg(long, default_value = "127.0.0.1:29500")]
    bind: String,
    /// Largest frame accepted, in bytes.
    #[arg(long, default_value_t = DEFAULT_MAX_FRAME, allow_negative_numbers = true, value_parser = non_negative::<u32>)]
    max_frame: u32,
    /// Connections served at once. Without it, the open-file limit (`ulimit -n`) is the only limit, and a client
    /// refused for it is told the limit.
    #[arg(long, allow_negative_numbers = true, value_parser = non_negative::<usize>)]
    max_connections: Option<usize>,
    /// Stop after this many seconds instead of running until SIGINT or SIGTERM.
    #[arg(long, allow_negative_numbers = true, value_parser = non_negative::<u64>)]
    duration_secs: Option<u64>,
}

/// Serves until SIGINT/SIGTERM (or `--duration-secs`). The secret comes from `HYPERCOMM_STORE_SECRET`.
pub fn run(args: Args) -> Result<(), CliError> {
    let secret = Secret::from_env().map_err(|e| CliError::Usage(e.to_string()))?;
    if secret.is_none() {
        eprintln!("hypercomm store: {SECRET_ENV} is not set; serving any client that can connect");
    }
    let options = ServerOptions {
        secret,
        max_frame: args.max_frame,
        max_connections: args.max_connections.unwrap_or(usize::MAX),
        ..ServerOptions::default()
    };
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])
    .map_err(|e| CliError::Failed(format!("cannot install signal handling: {e}")))?;
    let server = TcpStore::server(args.bind.as_str(), options)
        .map_err(|e| CliError::Failed(e.to_string()))?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "hypercomm store listening on {}", server.local_addr())?;
    let open_files = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    if let (Some(limit), None) = (open_files, args.max_connections) {
        // Each client holds one descriptor; the server keeps a handful for itself.
        eprintln!(
            "hypercomm store: up to about {limit} connections (the open-file limit, ulimit -n)"
        );
    }
    out.flush()?;
    drop(out);
    let deadline = args
        .duration_secs
        .map(|s| Instant::now() + Duration::from_secs(s));
    // Ends on a signal or at the deadline; without a deadline the server runs as long as the operator wants.
    loop {
        if let Some(sig) = signals.pending().next() {
            eprintln!("hypercomm store: received signal {sig}, stopping");
            break;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        thread::sleep(Duration::from_millis(50));
    }
    drop(server);
    Ok(())
}
