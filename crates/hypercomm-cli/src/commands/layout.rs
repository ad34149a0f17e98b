//! `hypercomm layout`: every group of a Megatron-Core layout, or one rank's groups.

use std::io::Write;
use std::path::PathBuf;

use hypercomm_grid::CompactMembership;
use hypercomm_grid::layout::{GroupKind, ParallelLayout};
use hypercomm_plan::Placement;
use serde::Serialize;

use crate::error::CliError;
use crate::numbers::non_negative;
use crate::output::{JsonStream, OrderedMap, format_group_ranks, print_json, write_groups};
use crate::render::scene::{HostRow, layout_scene};

/// Arguments of `hypercomm layout`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    sizes: super::sizes::SizeArgs,
    /// Order of the dimensions, fastest first.
    #[arg(long, default_value = "tp-cp-ep-dp-pp")]
    order: String,
    /// The first rank of the layout.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = non_negative::<usize>)]
    offset: usize,
    /// Hierarchical context-parallel sizes, innermost first: `2,4`.
    #[arg(long, value_delimiter = ',', allow_hyphen_values = true, value_parser = non_negative::<usize>)]
    hcp: Option<Vec<usize>>,
    /// Print only this rank's groups, each computed directly for the rank.
    #[arg(long, allow_negative_numbers = true, value_parser = non_negative::<usize>)]
    rank: Option<usize>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// With --rank and --json: each group as `{"base","axes","start","len"}` instead of its member list, so the
    /// output stays the same size at any world size (member i is base + Σ digit_k(start + i) · stride_k over the
    /// axes' sizes, the first axis fastest).
    #[arg(long, requires_all = ["rank", "json"])]
    compact: bool,
    /// Draw the layout to this file instead of printing it: `.svg` or `.png`.
    #[arg(long, value_name = "FILE")]
    render: Option<PathBuf>,
    /// With --render: the group kinds to draw, one panel each (default: tp, cp, ep, dp, pp where their groups have
    /// more than one rank).
    #[arg(long, value_delimiter = ',', requires = "render")]
    kinds: Option<Vec<String>>,
    /// With --render: the cluster description (JSON) whose hosts and devices the ranks are drawn on.
    #[arg(long, requires = "render")]
    cluster: Option<PathBuf>,
    /// With --render and no --cluster: GPUs per host.
    #[arg(long, default_value_t = 8, requires = "render", allow_negative_numbers = true, value_parser = non_negative::<usize>)]
    gpus_per_host: usize,
}

impl Args {
    fn layout(&self) -> Result<ParallelLayout, CliError> {
        let mut config = self
            .sizes
            .config()
            .order(&self.order)
            .rank_offset(self.offset);
        if let Some(hcp) = &self.hcp {
            config = config.hcp_sizes(hcp.clone());
        }
        Ok(config.build()?)
    }
}

#[derive(Serialize)]
struct AllGroups {
    dp: usize,
    expert_dp: usize,
    groups: OrderedMap<Vec<Vec<usize>>>,
}

/// Runs `hypercomm layout`.
pub fn run(args: Args) -> Result<(), CliError> {
    let layout = args.layout()?;
    if let Some(path) = &args.render {
        return render(&args, &layout, path);
    }
    match args.rank {
        Some(rank) => print_rank(&layout, rank, args.json, args.compact),
        None => print_all(&layout, args.json),
    }
}

fn print_all(layout: &ParallelLayout, json: bool) -> Result<(), CliError> {
    let mut groups = OrderedMap::default();
    for kind in layout.kinds() {
        groups
            .0
            .push((kind.name().to_owned(), layout.groups(kind)?.collect()));
    }
    if json {
        return print_json(&AllGroups {
            dp: layout.dp(),
            expert_dp: layout.expert_dp(),
            groups,
        });
    }
    let mut out = std::io::stdout().lock();
    write_summary(&mut out, layout)?;
    for (name, list) in &groups.0 {
        write_groups(&mut out, name, list)?;
    }
    Ok(())
}

/// Prints one rank's groups. Each group is computed in compact form ([`CompactMembership`]) and its members are
/// streamed straight to the output, so memory stays flat at any world size; the table shows long groups elided,
/// so its time is flat too, while the JSON lists every member and takes time in proportion to what it prints.
fn print_rank(
    layout: &ParallelLayout,
    rank: usize,
    json: bool,
    compact: bool,
) -> Result<(), CliError> {
    if !layout.ranks().contains(&rank) {
        return Err(CliError::Usage(format!(
            "--rank {rank} is outside the layout's ranks {}..{}",
            layout.ranks().start,
            layout.ranks().end
        )));
    }
    let mut groups: Vec<(GroupKind, Vec<CompactMembership>)> = Vec::new();
    for kind in layout.kinds() {
        let memberships = layout.compact_memberships(rank, kind)?;
        if !memberships.is_empty() {
            groups.push((kind, memberships));
        }
    }
    if json {
        return write_rank_json(rank, &groups, compact).map_err(CliError::from);
    }
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    write_summary(&mut out, layout)?;
    writeln!(out, "rank {rank}:")?;
    writeln!(
        out,
        "  {:<15} {:>11} {:>7}  members",
        "group", "rank/size", "group#"
    )?;
    for (kind, memberships) in &groups {
        for (level, m) in memberships.iter().enumerate() {
            let label = if *kind == GroupKind::Hcp {
                format!("{kind}[{level}]")
            } else {
                kind.name().to_owned()
            };
            writeln!(
                out,
                "  {label:<15} {:>11} {:>7}  {}",
                format!("{}/{}", m.index, m.ranks.len()),
                m.group,
                format_group_ranks(&m.ranks)
            )?;
        }
    }
    out.flush()?;
    Ok(())
}

/// `{"rank":R,"groups":{"tp":[...],...,"hcp":[[...],...]}}`, as serde_json would print it, streamed; with
/// `compact`, each member list is the group's [`GroupRanks`](hypercomm_grid::GroupRanks) object instead.
fn write_rank_json(
    rank: usize,
    groups: &[(GroupKind, Vec<CompactMembership>)],
    compact: bool,
) -> std::io::Result<()> {
    let mut out = JsonStream::new(std::io::stdout().lock());
    let members = |out: &mut JsonStream<_>, ranks: &hypercomm_grid::GroupRanks| {
        if compact {
            // A handful of numbers: serde_json cannot fail on a struct of integers.
            out.raw(&serde_json::to_string(ranks).unwrap_or_default());
        } else {
            out.ranks(ranks);
        }
    };
    out.raw("{\"rank\":");
    out.number(rank);
    out.raw(",\"groups\":{");
    for (i, (kind, memberships)) in groups.iter().enumerate() {
        out.raw(if i == 0 { "\"" } else { ",\"" });
        // Kind names are lowercase ASCII words with `_`: nothing to escape.
        out.raw(kind.name());
        out.raw("\":");
        if *kind == GroupKind::Hcp {
            out.raw("[");
            for (level, m) in memberships.iter().enumerate() {
                if level > 0 {
                    out.raw(",");
                }
                members(&mut out, &m.ranks);
            }
            out.raw("]");
        } else if let Some(m) = memberships.first() {
            members(&mut out, &m.ranks);
        }
    }
    out.raw("}}\n");
    out.finish()
}

fn write_summary(out: &mut impl Write, layout: &ParallelLayout) -> std::io::Result<()> {
    let c = layout.config();
    writeln!(
        out,
        "layout: world {} (ranks {}..{}), tp {} pp {} cp {} ep {} etp {}, dp {}, expert dp {}, order {}",
        c.world,
        layout.ranks().start,
        layout.ranks().end,
        c.tp,
        c.pp,
        c.cp,
        c.ep,
        layout.etp(),
        layout.dp(),
        layout.expert_dp(),
        layout.order()
    )
}

fn render(args: &Args, layout: &ParallelLayout, path: &std::path::Path) -> Result<(), CliError> {
    let kinds: Vec<GroupKind> = match &args.kinds {
        Some(names) => names
            .iter()
            .map(|n| n.trim().parse::<GroupKind>())
            .collect::<Result<_, _>>()?,
        None => [
            GroupKind::Tp,
            GroupKind::Cp,
            GroupKind::Ep,
            GroupKind::Dp,
            GroupKind::Pp,
        ]
        .into_iter()
        .filter(|&k| {
            layout
                .groups(k)
                .is_ok_and(|mut g| g.next().is_some_and(|g| g.len() > 1))
        })
        .collect(),
    };
    if let Some(kind) = kinds.iter().find(|&&k| !layout.has(k)) {
        return Err(CliError::Usage(format!(
            "--kinds: this layout has no {kind} groups"
        )));
    }
    let kinds = if kinds.is_empty() {
        vec![GroupKind::Tp]
    } else {
        kinds
    };
    let offset = layout.ranks().start;
    let (hosts, on) = match &args.cluster {
        Some(file) => {
            let cluster = crate::commands::plan::read_cluster(file)?;
            let placement = match cluster.explicit_placement() {
                Some(_) => Placement::Explicit,
                None => Placement::Launcher,
            };
            let devices = placement.devices(&cluster, layout.world())?;
            let mut rows: Vec<HostRow> = cluster
                .hosts()
                .iter()
                .map(|h| HostRow {
                    label: h.name.clone(),
                    ranks: vec![None; h.gpus],
                })
                .collect();
            for (local, &device) in devices.iter().enumerate() {
                let host = cluster.host_of(device);
                let index = device - cluster.hosts()[host].first_device;
                rows[host].ranks[index] = Some(offset + local);
            }
            rows.retain(|r| r.ranks.iter().any(Option::is_some));
            let name = if cluster.name().is_empty() {
                "the cluster"
            } else {
                cluster.name()
            };
            (rows, format!("on {name}"))
        }
        None => {
            if args.gpus_per_host == 0 {
                return Err(CliError::Usage("--gpus-per-host must be at least 1".into()));
            }
            let per = args.gpus_per_host;
            let rows = (0..layout.world().div_ceil(per))
                .map(|h| HostRow {
                    label: format!("host{h}"),
                    ranks: (h * per..((h + 1) * per).min(layout.world()))
                        .map(|l| Some(offset + l))
                        .collect(),
                })
                .collect();
            (
                rows,
                format!("{per} GPUs per host, ranks placed host by host"),
            )
        }
    };
    let c = layout.config();
    let title = [
        format!(
            "world {}: tp {} pp {} cp {} ep {}, dp {}, order {}",
            c.world,
            c.tp,
            c.pp,
            c.cp,
            c.ep,
            layout.dp(),
            layout.order()
        ),
        on,
    ];
    let scene = layout_scene(&title, layout, &kinds, &hosts)?;
    crate::render::write(&scene, path)?;
    println!(
        "wrote {} ({} ranks; {})",
        path.display(),
        layout.world(),
        kinds
            .iter()
            .map(|k| k.name())
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}
