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
    match extension.as_deref() {
        Some("svg") => draw::svg(scene, path),
        Some("png") => draw::png(scene, path),
        _ => Err(CliError::Usage(format!(
            "--render {}: the file name must end in .svg or .png",
            path.display()
        ))),
    }
}
