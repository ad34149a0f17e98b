//! The picture of a layout as plain shapes: one panel per group kind, ranks drawn as cells in host rows (one
//! column per device), each cell coloured by its group and labelled with its rank and group number, and a legend.
//! Pure geometry, so it can be tested without drawing.

use hypercomm_grid::layout::{GroupKind, ParallelLayout};

use crate::error::CliError;

/// A colour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rgb(pub u8, pub u8, pub u8);

/// Background, text and frame colours.
pub const WHITE: Rgb = Rgb(255, 255, 255);
/// Text.
pub const INK: Rgb = Rgb(20, 20, 20);
/// Host frames and muted text.
pub const GREY: Rgb = Rgb(120, 120, 120);

/// Group colours, cycled: light enough for dark text, distinct side by side.
pub const PALETTE: [Rgb; 12] = [
    Rgb(141, 211, 199),
    Rgb(255, 237, 111),
    Rgb(190, 186, 218),
    Rgb(251, 128, 114),
    Rgb(128, 177, 211),
    Rgb(253, 180, 98),
    Rgb(179, 222, 105),
    Rgb(252, 205, 229),
    Rgb(204, 235, 197),
    Rgb(217, 217, 217),
    Rgb(188, 128, 189),
    Rgb(255, 255, 179),
];

/// Where text sits relative to its point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Anchor {
    /// The point is the text's left end.
    Left,
    /// The point is the text's centre.
    Centre,
    /// The point is the text's right end.
    Right,
}

/// A shape to draw.
#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    /// A rectangle; `fill` and `stroke` are optional.
    Rect {
        /// Left.
        x: i32,
        /// Top.
        y: i32,
        /// Width.
        w: i32,
        /// Height.
        h: i32,
        /// Fill colour.
        fill: Option<Rgb>,
        /// Outline colour.
        stroke: Option<Rgb>,
    },
    /// A polyline.
    Line {
        /// The points, in order.
        points: Vec<(i32, i32)>,
        /// Colour.
        color: Rgb,
        /// Stroke width in pixels.
        width: u32,
    },
    /// One line of text, vertically centred on `y`.
    Text {
        /// Anchor point x.
        x: i32,
        /// Anchor point y (the text's vertical centre).
        y: i32,
        /// The text.
        text: String,
        /// Size class: 1 small, 2 normal, 3 title.
        size: u32,
        /// Horizontal anchoring.
        anchor: Anchor,
        /// Colour.
        color: Rgb,
    },
}

/// A picture: its size and shapes, drawn in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Scene {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Shapes, back to front.
    pub shapes: Vec<Shape>,
}

/// One host's row: its label and the layout rank (if any) on each of its devices.
#[derive(Debug, Clone, PartialEq)]
pub struct HostRow {
    /// The label drawn left of the row.
    pub label: String,
    /// The rank on each device, by device index.
    pub ranks: Vec<Option<usize>>,
}

/// The most ranks drawn; larger layouts show their first hosts and say so.
pub const MAX_DRAWN_RANKS: usize = 512;
const COLUMNS: usize = 16;
const CELL_W: i32 = 52;
const CELL_H: i32 = 44;
const GAP: i32 = 4;
const MARGIN: i32 = 16;
const LABEL_W: i32 = 150;

/// The scene for `layout`'s groups of each of `kinds`, ranks placed on `hosts`, under `title` (one entry per line).
pub fn layout_scene(
    title: &[String],
    layout: &ParallelLayout,
    kinds: &[GroupKind],
    hosts: &[HostRow],
) -> Result<Scene, CliError> {
    let offset = layout.ranks().start;
    // Keep whole hosts up to the rank budget; always at least one.
    let mut shown = 0;
    let mut drawn_ranks = 0;
    for host in hosts {
        let n = host.ranks.iter().flatten().count();
        if shown > 0 && drawn_ranks + n > MAX_DRAWN_RANKS {
            break;
        }
        shown += 1;
        drawn_ranks += n;
    }
    let hosts = &hosts[..shown];
    let total_ranks = layout.world();
    let columns = hosts
        .iter()
        .map(|h| h.ranks.len())
        .max()
        .unwrap_or(1)
        .clamp(1, COLUMNS);
    let row_h = |h: &HostRow| h.ranks.len().div_ceil(columns).max(1) as i32 * (CELL_H + GAP) + GAP;
    let legend_w = 12 * 66;
    // Titles are at most 12 pixels per character in either format.
    let title_w = title.iter().map(|t| t.chars().count()).max().unwrap_or(0) as i32 * 12;
    let width = (2 * MARGIN + LABEL_W + columns as i32 * (CELL_W + GAP) + GAP)
        .max(2 * MARGIN + legend_w)
        .max(2 * MARGIN + title_w);
    let mut shapes = Vec::new();
    let mut y = MARGIN;
    let text = |x, y, text: String, size, anchor, color| Shape::Text {
        x,
        y,
        text,
        size,
        anchor,
        color,
    };
    for line in title {
        shapes.push(text(MARGIN, y + 10, line.clone(), 2, Anchor::Left, INK));
        y += 24;
    }
    if drawn_ranks < total_ranks {
        shapes.push(text(
            MARGIN,
            y + 6,
            format!(
                "showing the first {shown} hosts: {drawn_ranks} of {total_ranks} ranks (pictures draw at most {MAX_DRAWN_RANKS})"
            ),
            2,
            Anchor::Left,
            GREY,
        ));
        y += 22;
    }
    for &kind in kinds {
        let mut group_of = vec![None; total_ranks];
        let mut groups = 0usize;
        let mut size = 0usize;
        for (index, members) in layout.groups(kind)?.enumerate() {
            size = members.len();
            for r in members {
                group_of[r - offset] = Some(index);
            }
            groups = index + 1;
        }
        y += 8;
        shapes.push(text(
            MARGIN,
            y + 10,
            format!("{kind}: {groups} groups of {size} (colour and gN = group number N)"),
            2,
            Anchor::Left,
            INK,
        ));
        y += 26;
        for host in hosts {
            let h = row_h(host);
            shapes.push(Shape::Rect {
                x: MARGIN,
                y,
                w: width - 2 * MARGIN,
                h,
                fill: None,
                stroke: Some(GREY),
            });
            shapes.push(text(
                MARGIN + 8,
                y + h / 2,
                host.label.clone(),
                2,
                Anchor::Left,
                INK,
            ));
            for (device, rank) in host.ranks.iter().enumerate() {
                let cx = MARGIN + LABEL_W + GAP + (device % columns) as i32 * (CELL_W + GAP);
                let cy = y + GAP + (device / columns) as i32 * (CELL_H + GAP);
                let Some(rank) = *rank else {
                    shapes.push(Shape::Rect {
                        x: cx,
                        y: cy,
                        w: CELL_W,
                        h: CELL_H,
                        fill: None,
                        stroke: Some(GREY),
                    });
                    continue;
                };
                let group = group_of.get(rank - offset).copied().flatten();
                shapes.push(Shape::Rect {
                    x: cx,
                    y: cy,
                    w: CELL_W,
                    h: CELL_H,
                    fill: Some(group.map_or(WHITE, |g| PALETTE[g % PALETTE.len()])),
                    stroke: Some(INK),
                });
                shapes.push(text(
                    cx + CELL_W / 2,
                    cy + 12,
                    rank.to_string(),
                    2,
                    Anchor::Centre,
                    INK,
                ));
                let label = group.map_or_else(|| "-".to_owned(), |g| format!("g{g}"));
                shapes.push(text(
                    cx + CELL_W / 2,
                    cy + 31,
                    label,
                    1,
                    Anchor::Centre,
                    INK,
                ));
            }
            y += h + GAP;
        }
        // Legend: one swatch per colour in use.
        y += 4;
        for (g, &swatch) in PALETTE.iter().enumerate().take(groups) {
            let x = MARGIN + g as i32 * 66;
            shapes.push(Shape::Rect {
                x,
                y,
                w: 20,
                h: 16,
                fill: Some(swatch),
                stroke: Some(INK),
            });
            shapes.push(text(x + 25, y + 8, format!("g{g}"), 1, Anchor::Left, INK));
        }
        y += 22;
        if groups > PALETTE.len() {
            shapes.push(text(
                MARGIN,
                y + 8,
                format!(
                    "colours repeat every {} groups; gN names the group",
                    PALETTE.len()
                ),
                1,
                Anchor::Left,
                GREY,
            ));
            y += 18;
        }
        y += 8;
    }
    Ok(Scene {
        width: width as u32,
        height: (y + MARGIN) as u32,
        shapes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use hypercomm_grid::layout::LayoutConfig;

    fn rows(world: usize, per_host: usize) -> Vec<HostRow> {
        (0..world.div_ceil(per_host))
            .map(|h| HostRow {
                label: format!("host{h}"),
                ranks: (0..per_host)
                    .map(|d| Some(h * per_host + d))
                    .filter(|r| r.unwrap() < world)
                    .collect(),
            })
            .collect()
    }

    fn cells(scene: &Scene) -> Vec<(String, String)> {
        // (rank label, group label) pairs, in drawing order.
        let texts: Vec<&str> = scene
            .shapes
            .iter()
            .filter_map(|s| match s {
                Shape::Text {
                    text,
                    anchor: Anchor::Centre,
                    ..
                } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        texts
            .chunks(2)
            .map(|c| (c[0].to_owned(), c[1].to_owned()))
            .collect()
    }

    #[test]
    fn every_rank_is_drawn_once_per_kind_with_its_group() {
        let layout = LayoutConfig::new(16).tp(2).pp(4).build().unwrap();
        let scene = layout_scene(
            &["t".to_owned()],
            &layout,
            &[GroupKind::Tp, GroupKind::Pp],
            &rows(16, 8),
        )
        .unwrap();
        let cells = cells(&scene);
        assert_eq!(cells.len(), 32);
        // tp groups are [0,1], [2,3], ...: rank 5 is in tp group 2. pp groups are [0,4,8,12], [1,5,9,13], ...
        assert_eq!(cells[5], ("5".to_owned(), "g2".to_owned()));
        assert_eq!(cells[16 + 5], ("5".to_owned(), "g1".to_owned()));
        assert_eq!(cells[16 + 12], ("12".to_owned(), "g0".to_owned()));
    }

    #[test]
    fn large_worlds_are_summarised() {
        let layout = LayoutConfig::new(2048).tp(8).build().unwrap();
        let scene =
            layout_scene(&["t".to_owned()], &layout, &[GroupKind::Tp], &rows(2048, 8)).unwrap();
        assert_eq!(cells(&scene).len(), MAX_DRAWN_RANKS);
        let note = scene.shapes.iter().any(|s| {
            matches!(s, Shape::Text { text, .. } if text.starts_with("showing the first 64 hosts: 512 of 2048 ranks"))
        });
        assert!(note);
    }
}
