//! The model a refit command is given (`--model`): Megatron's GPT described in a line, or a sharding JSON file.
//! Shared by `hypercomm plan --refit` and `hypercomm bench --refit`.

use std::path::Path;

use hypercomm_refit::{GptConfig, Sharding};

use crate::error::CliError;

/// The model of `--model`: a GPT description or a sharding file.
pub fn read_model(text: &str) -> Result<(String, Sharding), CliError> {
    if let Some(spec) = text.strip_prefix("gpt:") {
        let gpt: GptConfig = spec.parse()?;
        return Ok((format!("gpt {gpt}"), gpt.sharding()?));
    }
    let path = Path::new(text);
    let json = std::fs::read_to_string(path).map_err(|e| {
        CliError::Usage(format!(
            "--model {text}: not gpt:... and cannot read it as a file: {e}"
        ))
    })?;
    let sharding: Sharding =
        serde_json::from_str(&json).map_err(|e| CliError::Usage(format!("--model {text}: {e}")))?;
    Ok((format!("sharding {}", path.display()), sharding))
}
