//! `hypercomm grid`: the groups of a grid over named dimensions.

use std::io::Write;

use hypercomm_grid::{Grid, parse_dims};
use serde::Serialize;

use crate::error::CliError;
use crate::numbers::non_negative;
use crate::output::{OrderedMap, print_json, write_groups};

/// Arguments of `hypercomm grid`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The dimensions, fastest-varying first: `tp=2,cp=2,dp=4,pp=2`.
    #[arg(long)]
    dims: String,
    /// The first rank of the grid.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = non_negative::<usize>)]
    offset: usize,
    /// A set of dimensions joined by '-' (`dp-cp`); print its groups. Repeat for several sets.
    #[arg(long = "groups", value_name = "DIMS")]
    groups: Vec<String>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct GridJson<'a> {
    dims: &'a [hypercomm_grid::Dim],
    offset: usize,
    groups: OrderedMap<Vec<Vec<usize>>>,
}

/// Runs `hypercomm grid`.
pub fn run(args: Args) -> Result<(), CliError> {
    let grid = Grid::with_offset(parse_dims(&args.dims)?, args.offset)?;
    let mut groups = OrderedMap::default();
    for key in &args.groups {
        if groups.0.iter().any(|(k, _)| k == key) {
            return Err(CliError::Usage(format!("--groups {key} is given twice")));
        }
        let set = grid.select_joined(key)?;
        groups.0.push((key.clone(), grid.groups_in(set).collect()));
    }
    if args.json {
        return print_json(&GridJson {
            dims: grid.dims(),
            offset: grid.offset(),
            groups,
        });
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "grid {grid}: {} ranks ({}..{})",
        grid.size(),
        grid.ranks().start,
        grid.ranks().end
    )?;
    for (key, list) in &groups.0 {
        write_groups(&mut out, key, list)?;
    }
    Ok(())
}
