//! The parallel sizes `hypercomm layout` and `hypercomm plan` share: world, tp, pp, cp, ep, etp and the number
//! of distributed-optimizer instances.

use hypercomm_grid::layout::LayoutConfig;

use crate::numbers::non_negative;

/// Parallel sizes of a Megatron-Core layout; every size defaults to 1 except `--etp`, which defaults to tp.
#[derive(clap::Args, Debug)]
pub struct SizeArgs {
    /// The number of ranks.
    #[arg(long, allow_negative_numbers = true, value_parser = non_negative::<usize>)]
    pub world: usize,
    /// Tensor-parallel size.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = non_negative::<usize>)]
    pub tp: usize,
    /// Pipeline-parallel size.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = non_negative::<usize>)]
    pub pp: usize,
    /// Context-parallel size.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = non_negative::<usize>)]
    pub cp: usize,
    /// Expert-parallel size.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = non_negative::<usize>)]
    pub ep: usize,
    /// Expert tensor-parallel size (default: tp, as in Megatron-Core).
    #[arg(long, allow_negative_numbers = true, value_parser = non_negative::<usize>)]
    pub etp: Option<usize>,
    /// Number of distributed-optimizer instances.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = non_negative::<usize>)]
    pub dist_opt_instances: usize,
}

impl SizeArgs {
    /// The layout configuration with these sizes (order, offset and hierarchical cp at their defaults).
    pub fn config(&self) -> LayoutConfig {
        let config = LayoutConfig::new(self.world)
            .tp(self.tp)
            .pp(self.pp)
            .cp(self.cp)
            .ep(self.ep)
            .dist_opt_instances(self.dist_opt_instances);
        match self.etp {
            Some(etp) => config.etp(etp),
            None => config,
        }
    }
}
