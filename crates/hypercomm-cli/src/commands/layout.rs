//! `hypercomm layout`: every group of a Megatron-Core layout, or one rank's groups.

use std::io::Write;

use hypercomm_grid::layout::{GroupKind, LayoutConfig, ParallelLayout};
use serde::Serialize;
use serde_json::Value;

use crate::error::CliError;
use crate::output::{OrderedMap, format_ranks, print_json, write_groups};

/// Arguments of `hypercomm layout`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The number of ranks.
    #[arg(long)]
    world: usize,
    /// Tensor-parallel size.
    #[arg(long, default_value_t = 1)]
    tp: usize,
    /// Pipeline-parallel size.
    #[arg(long, default_value_t = 1)]
    pp: usize,
    /// Context-parallel size.
    #[arg(long, default_value_t = 1)]
    cp: usize,
    /// Expert-parallel size.
    #[arg(long, default_value_t = 1)]
    ep: usize,
    /// Expert tensor-parallel size (default: tp, as in Megatron-Core).
    #[arg(long)]
    etp: Option<usize>,
    /// Order of the dimensions, fastest first.
    #[arg(long, default_value = "tp-cp-ep-dp-pp")]
    order: String,
    /// The first rank of the layout.
    #[arg(long, default_value_t = 0)]
    offset: usize,
    /// Number of distributed-optimizer instances.
    #[arg(long, default_value_t = 1)]
    dist_opt_instances: usize,
    /// Hierarchical context-parallel sizes, innermost first: `2,4`.
    #[arg(long, value_delimiter = ',')]
    hcp: Option<Vec<usize>>,
    /// Print only this rank's groups, each computed directly for the rank.
    #[arg(long)]
    rank: Option<usize>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

impl Args {
    fn layout(&self) -> Result<ParallelLayout, CliError> {
        let mut config = LayoutConfig::new(self.world)
            .tp(self.tp)
            .pp(self.pp)
            .cp(self.cp)
            .ep(self.ep)
            .order(&self.order)
            .rank_offset(self.offset)
            .dist_opt_instances(self.dist_opt_instances);
        if let Some(etp) = self.etp {
            config = config.etp(etp);
        }
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

#[derive(Serialize)]
struct RankGroups {
    rank: usize,
    groups: OrderedMap<Value>,
}

/// Runs `hypercomm layout`.
pub fn run(args: Args) -> Result<(), CliError> {
    let layout = args.layout()?;
    match args.rank {
        Some(rank) => print_rank(&layout, rank, args.json),
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

fn print_rank(layout: &ParallelLayout, rank: usize, json: bool) -> Result<(), CliError> {
    if !layout.ranks().contains(&rank) {
        return Err(CliError::Usage(format!(
            "--rank {rank} is outside the layout's ranks {}..{}",
            layout.ranks().start,
            layout.ranks().end
        )));
    }
    let mut groups: OrderedMap<Value> = OrderedMap::default();
    let mut rows = Vec::new();
    for kind in layout.kinds() {
        let memberships = layout.memberships(rank, kind)?;
        let value = match (kind, memberships.as_slice()) {
            (_, []) => continue,
            (GroupKind::Hcp, levels) => {
                Value::from(levels.iter().map(|m| m.members.clone()).collect::<Vec<_>>())
            }
            (_, [m, ..]) => Value::from(m.members.clone()),
        };
        for (level, m) in memberships.iter().enumerate() {
            let label = if kind == GroupKind::Hcp {
                format!("{kind}[{level}]")
            } else {
                kind.name().to_owned()
            };
            rows.push((
                label,
                m.index,
                m.members.len(),
                m.group,
                format_ranks(&m.members),
            ));
        }
        groups.0.push((kind.name().to_owned(), value));
    }
    if json {
        return print_json(&RankGroups { rank, groups });
    }
    let mut out = std::io::stdout().lock();
    write_summary(&mut out, layout)?;
    writeln!(out, "rank {rank}:")?;
    writeln!(
        out,
        "  {:<15} {:>11} {:>7}  members",
        "group", "rank/size", "group#"
    )?;
    for (label, index, size, group, members) in rows {
        writeln!(
            out,
            "  {label:<15} {:>11} {group:>7}  {members}",
            format!("{index}/{size}")
        )?;
    }
    Ok(())
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
