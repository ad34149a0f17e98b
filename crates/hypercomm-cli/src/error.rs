//! [`CliError`]: how a subcommand fails, and the exit status that goes with it.

use std::process::ExitCode;

/// A subcommand's failure. Its `Display` is the one line printed after `hypercomm: `.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The input was wrong: exit status 2.
    #[error("{0}")]
    Usage(String),
    /// The command ran and failed: exit status 1.
    #[error("{0}")]
    Failed(String),
    /// The command ran a job that failed with its own status (1 to 255), passed on as ours.
    #[error("{message}")]
    Exit {
        /// The status to exit with.
        code: u8,
        /// What failed.
        message: String,
    },
}

impl CliError {
    /// The process exit status for this error.
    pub fn exit_code(&self) -> ExitCode {
        match self {
            CliError::Usage(_) => ExitCode::from(2),
            CliError::Failed(_) => ExitCode::from(1),
            CliError::Exit { code, .. } => ExitCode::from(*code),
        }
    }
}

impl From<hypercomm_grid::GridError> for CliError {
    fn from(err: hypercomm_grid::GridError) -> Self {
        CliError::Usage(err.to_string())
    }
}

impl From<hypercomm_grid::layout::LayoutError> for CliError {
    fn from(err: hypercomm_grid::layout::LayoutError) -> Self {
        CliError::Usage(err.to_string())
    }
}

impl From<hypercomm_plan::TopologyError> for CliError {
    fn from(err: hypercomm_plan::TopologyError) -> Self {
        CliError::Usage(err.to_string())
    }
}

impl From<hypercomm_refit::RefitError> for CliError {
    fn from(err: hypercomm_refit::RefitError) -> Self {
        CliError::Usage(err.to_string())
    }
}

impl From<std::io::Error> for CliError {
    fn from(err: std::io::Error) -> Self {
        CliError::Failed(format!("cannot write output: {err}"))
    }
}
