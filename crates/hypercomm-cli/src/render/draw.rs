//! Drawing a [`Scene`] with plotters: SVG through its SVG backend (real `<text>`, no font needed), PNG through its
//! bitmap backend with text from the built-in pixel font ([`super::font`]).

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::error::CliError;
use crate::render::font;
use crate::render::scene::{Anchor, Rgb, Scene, Shape, WHITE};

fn color(c: Rgb) -> RGBColor {
    RGBColor(c.0, c.1, c.2)
}

fn failed(path: &Path, e: impl std::fmt::Display) -> CliError {
    CliError::Failed(format!("cannot draw {}: {e}", path.display()))
}

fn rect<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    (x, y, w, h): (i32, i32, i32, i32),
    style: ShapeStyle,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    area.draw(&Rectangle::new([(x, y), (x + w, y + h)], style))
}

/// Draws every rectangle of `scene`, and its text with `text`.
fn draw_scene<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    scene: &Scene,
    mut text: impl FnMut(
        &DrawingArea<DB, Shift>,
        &Shape,
    ) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>>,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    area.fill(&color(WHITE))?;
    for shape in &scene.shapes {
        match *shape {
            Shape::Rect {
                x,
                y,
                w,
                h,
                fill,
                stroke,
            } => {
                if let Some(fill) = fill {
                    rect(area, (x, y, w, h), color(fill).filled())?;
                }
                if let Some(stroke) = stroke {
                    rect(area, (x, y, w, h), color(stroke).stroke_width(1))?;
                }
            }
            Shape::Line {
                ref points,
                color: c,
                width,
            } => {
                area.draw(&PathElement::new(
                    points.clone(),
                    color(c).stroke_width(width),
                ))?;
            }
            Shape::Text { .. } => text(area, shape)?,
        }
    }
    area.present()
}

/// Writes `scene` as SVG to `path`.
pub fn svg(scene: &Scene, path: &Path) -> Result<(), CliError> {
    let area = SVGBackend::new(path, (scene.width, scene.height)).into_drawing_area();
    draw_scene(&area, scene, |area, shape| {
        let Shape::Text {
            x,
            y,
            ref text,
            size,
            anchor,
            color: c,
        } = *shape
        else {
            return Ok(());
        };
        // plotters writes font-size as this value / 1.24: 11, 14 and 17 px.
        let px = match size {
            1 => 13.6,
            2 => 17.4,
            _ => 21.1,
        };
        let h = match anchor {
            Anchor::Left => HPos::Left,
            Anchor::Centre => HPos::Center,
            Anchor::Right => HPos::Right,
        };
        let style = ("sans-serif", px)
            .into_font()
            .color(&color(c))
            .pos(Pos::new(h, VPos::Center));
        area.draw(&Text::new(text.as_str(), (x, y), style))
    })
    .map_err(|e| failed(path, e))
}

/// Writes `scene` as PNG to `path`.
pub fn png(scene: &Scene, path: &Path) -> Result<(), CliError> {
    let area = BitMapBackend::new(path, (scene.width, scene.height)).into_drawing_area();
    draw_scene(&area, scene, |area, shape| {
        let Shape::Text {
            x,
            y,
            ref text,
            size,
            anchor,
            color: c,
        } = *shape
        else {
            return Ok(());
        };
        let scale = if size <= 2 { 2 } else { 3 };
        let width = font::text_width(text, scale) as i32;
        let left = match anchor {
            Anchor::Left => x,
            Anchor::Centre => x - width / 2,
            Anchor::Right => x - width,
        };
        // Centre the part above the baseline (seven of nine rows) on y.
        let top = y - (7 * scale) as i32 / 2;
        let s = scale as i32;
        let ink = color(c);
        for (px, py) in font::lit_pixels(text, scale) {
            let (px, py) = (left + px as i32, top + py as i32);
            for dy in 0..s {
                for dx in 0..s {
                    area.draw_pixel((px + dx, py + dy), &ink)?;
                }
            }
        }
        Ok(())
    })
    .map_err(|e| failed(path, e))
}
