//! Line charts as [`Scene`]s, so that benchmark plots draw to PNG or SVG through the same code as layout pictures
//! and need no fonts on the machine.

use crate::render::scene::{Anchor, GREY, INK, PALETTE, Rgb, Scene, Shape};

const WIDTH: u32 = 900;
const HEIGHT: u32 = 560;
const LEFT: i32 = 90;
const RIGHT: i32 = 30;
const TOP: i32 = 85;
const BOTTOM: i32 = 70;
const GRID: Rgb = Rgb(225, 225, 225);
/// Pixels kept clear on each side of the title.
const TITLE_MARGIN: u32 = 10;

fn text(x: i32, y: i32, text: String, size: u32, anchor: Anchor) -> Shape {
    Shape::Text {
        x,
        y,
        text,
        size,
        anchor,
        color: INK,
    }
}

/// The title's size class: the title size (3) when the title fits the chart's width in the pixel font of PNG
/// output (which is wider than SVG text), else the normal size (2), whose letters are two thirds as wide; a title
/// too long even for that is left to overflow rather than shrunk to an unreadable size.
fn title_size(title: &str) -> u32 {
    let room = WIDTH - 2 * TITLE_MARGIN;
    if crate::render::font::text_width(title, 3) <= room {
        3
    } else {
        2
    }
}

/// A chart of `points` (x > 0, y >= 0) with a log-2 x axis labelled by `x_label` and a linear y axis from 0.
pub fn log_x_chart(
    title: &str,
    x_desc: &str,
    y_desc: &str,
    points: &[(f64, f64)],
    x_label: impl Fn(f64) -> String,
) -> Scene {
    let mut shapes = Vec::new();
    let (w, h) = (WIDTH as i32 - LEFT - RIGHT, HEIGHT as i32 - TOP - BOTTOM);
    let lo = points
        .iter()
        .map(|p| p.0)
        .fold(f64::INFINITY, f64::min)
        .max(1.0);
    let hi = points.iter().map(|p| p.0).fold(1.0, f64::max).max(lo * 2.0);
    let y_max = points.iter().map(|p| p.1).fold(0.0, f64::max).max(1e-3) * 1.1;
    let (l0, l1) = (lo.log2(), hi.log2());
    let px = |x: f64| LEFT + ((x.max(lo).log2() - l0) / (l1 - l0) * w as f64).round() as i32;
    let py = |y: f64| TOP + h - (y / y_max * h as f64).round() as i32;
    shapes.push(text(
        WIDTH as i32 / 2,
        25,
        title.to_owned(),
        title_size(title),
        Anchor::Centre,
    ));
    // Horizontal grid and y labels: five steps of a round size.
    let step = nice_step(y_max / 5.0);
    let mut y = 0.0;
    while y <= y_max {
        shapes.push(Shape::Line {
            points: vec![(LEFT, py(y)), (LEFT + w, py(y))],
            color: GRID,
            width: 1,
        });
        shapes.push(text(LEFT - 8, py(y), format_number(y), 1, Anchor::Right));
        y += step;
    }
    // Vertical grid and x labels at powers of two, every few so that labels do not collide.
    let every = (((l1 - l0) / 8.0).ceil() as i32).max(1);
    let mut e = l0.ceil() as i32;
    while f64::from(e) <= l1 {
        let x = 2f64.powi(e);
        shapes.push(Shape::Line {
            points: vec![(px(x), TOP), (px(x), TOP + h)],
            color: GRID,
            width: 1,
        });
        if (e - l0.ceil() as i32) % every == 0 {
            shapes.push(text(px(x), TOP + h + 14, x_label(x), 1, Anchor::Centre));
        }
        e += 1;
    }
    shapes.push(Shape::Rect {
        x: LEFT,
        y: TOP,
        w,
        h,
        fill: None,
        stroke: Some(GREY),
    });
    shapes.push(text(
        LEFT + w / 2,
        HEIGHT as i32 - 20,
        x_desc.to_owned(),
        2,
        Anchor::Centre,
    ));
    shapes.push(text(12, TOP - 18, y_desc.to_owned(), 2, Anchor::Left));
    let series: Vec<(i32, i32)> = points.iter().map(|&(x, y)| (px(x), py(y))).collect();
    shapes.push(Shape::Line {
        points: series.clone(),
        color: PALETTE[4],
        width: 2,
    });
    for (x, y) in series {
        shapes.push(Shape::Rect {
            x: x - 3,
            y: y - 3,
            w: 6,
            h: 6,
            fill: Some(PALETTE[4]),
            stroke: None,
        });
    }
    Scene {
        width: WIDTH,
        height: HEIGHT,
        shapes,
    }
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    let magnitude = 10f64.powf(raw.max(1e-9).log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * magnitude)
        .find(|&s| s >= raw)
        .unwrap_or(10.0 * magnitude)
}

fn format_number(y: f64) -> String {
    if y == 0.0 || y >= 10.0 {
        format!("{y:.0}")
    } else if y >= 1.0 {
        format!("{y:.1}")
    } else {
        format!("{y:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_places_points_inside_the_frame_and_labels_the_axes() {
        let points = [(8.0, 0.1), (1024.0, 2.0), (1048576.0, 5.0)];
        let scene = log_x_chart("t", "size", "GB/s", &points, |x| format!("{x:.0}"));
        let series = scene
            .shapes
            .iter()
            .find_map(|s| match s {
                Shape::Line {
                    points, width: 2, ..
                } => Some(points.clone()),
                _ => None,
            })
            .unwrap();
        assert_eq!(series.len(), 3);
        // Left to right, higher values higher up, all inside the frame.
        assert!(
            series
                .windows(2)
                .all(|w| w[0].0 < w[1].0 && w[0].1 > w[1].1)
        );
        for (x, y) in series {
            assert!(
                (LEFT..=WIDTH as i32 - RIGHT).contains(&x)
                    && (TOP..=HEIGHT as i32 - BOTTOM).contains(&y)
            );
        }
        let labels: Vec<&str> = scene
            .shapes
            .iter()
            .filter_map(|s| match s {
                Shape::Text { text, .. } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        assert!(labels.contains(&"size") && labels.contains(&"GB/s") && labels.contains(&"0"));
    }

    #[test]
    fn a_long_title_drops_to_the_normal_size_so_that_it_fits_the_png() {
        let title_of = |title: &str| {
            let scene = log_x_chart(title, "x", "y", &[(1.0, 1.0), (2.0, 2.0)], |x| {
                format!("{x}")
            });
            scene
                .shapes
                .into_iter()
                .find_map(|s| match s {
                    Shape::Text { text, size, .. } if text == title => Some(size),
                    _ => None,
                })
                .unwrap()
        };
        let short = "hypercomm all_reduce busbw, 2 ranks (shm)";
        let long = "hypercomm all_reduce busbw, 2 ranks (shm, symmetric buffers)";
        assert_eq!(title_of(short), 3);
        assert_eq!(title_of(long), 2);
        // Whatever the size, the PNG text (scale 3 for the title size, 2 below) lies inside the picture.
        for title in [short, long] {
            let scale = if title_of(title) == 3 { 3 } else { 2 };
            assert!(
                crate::render::font::text_width(title, scale) <= WIDTH,
                "{title}"
            );
        }
    }

    #[test]
    fn steps_are_round() {
        assert_eq!(nice_step(0.7), 1.0);
        assert_eq!(nice_step(1.3), 2.0);
        assert_eq!(nice_step(3.0), 5.0);
        assert_eq!(nice_step(12.0), 20.0);
    }
}
