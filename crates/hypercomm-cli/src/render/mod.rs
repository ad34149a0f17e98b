//! Pictures of layouts: [`scene`] lays a layout out as shapes, [`draw`] draws them as SVG or PNG with plotters, and
//! [`font`] supplies PNG text without system fonts; [`plot`] lays out benchmark charts as scenes too.

pub mod draw;
pub mod font;
pub mod plot;
pub mod scene;

use std::path::Path;

use crate::error::CliError;
use scene::Scene;

/// Writes `scene` to `path` as SVG or PNG, by the file's extension.
pub fn write(scene: &Scene, path: &Path) -> Result<(), CliError> {
    let extension = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let draw = match extension.as_deref() {
        Some("svg") => draw::svg,
        Some("png") => draw::png,
        _ => {
            return Err(CliError::Usage(format!(
                "--render {}: the file name must end in .svg or .png",
                path.display()
            )));
        }
    };
    create(path)?;
    draw(scene, path)
}

/// Creates (or empties) the output file before anything is drawn, so that a path that cannot be written is bad
/// input reported in one line naming it, rather than a drawing backend's error chain after the work is done.
fn create(path: &Path) -> Result<(), CliError> {
    let dir = path
        .parent()
        .filter(|dir| !dir.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !dir.is_dir() {
        return Err(CliError::Usage(format!(
            "--render {}: the directory {} does not exist",
            path.display(),
            dir.display()
        )));
    }
    std::fs::File::create(path).map(drop).map_err(|e| {
        CliError::Usage(format!(
            "--render {}: cannot create the file: {e}",
            path.display()
        ))
    })
}
