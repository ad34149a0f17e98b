//! [`LayoutConfig`] and [`ParallelLayout`]: Megatron-Core's parallel sizes, checked, and the grids they define.

use serde::{Deserialize, Serialize};

use crate::layout::{LayoutError, Order, Token};
use crate::{Dim, Grid, GridView};

/// The inputs of a Megatron-Core layout, as `initialize_model_parallel` takes them.
///
/// Every size defaults to 1, `etp` to `tp`, and `order` to `tp-cp-ep-dp-pp`. Build with the setters and
/// [`LayoutConfig::build`], or deserialize from JSON (unknown fields are rejected).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LayoutConfig {
    /// The number of ranks.
    pub world: usize,
    /// Tensor-parallel size.
    pub tp: usize,
    /// Pipeline-parallel size.
    pub pp: usize,
    /// Context-parallel size.
    pub cp: usize,
    /// Expert-parallel size.
    pub ep: usize,
    /// Expert tensor-parallel size; `None` means the same as `tp`.
    pub etp: Option<usize>,
    /// The order string, fastest dimension first.
    pub order: String,
    /// The first rank of the layout.
    pub rank_offset: usize,
    /// The number of distributed-optimizer instances.
    pub dist_opt_instances: usize,
    /// Hierarchical context-parallel sizes (innermost first); their product must be `cp`.
    pub hcp_sizes: Option<Vec<usize>>,
}

impl Default for LayoutConfig {
    fn default() -> Self {
        LayoutConfig {
            world: 1,
            tp: 1,
            pp: 1,
            cp: 1,
            ep: 1,
            etp: None,
            order: Order::DEFAULT.to_string(),
            rank_offset: 0,
            dist_opt_instances: 1,
            hcp_sizes: None,
        }
    }
}

macro_rules! setter {
    ($(#[$doc:meta] $name:ident: $ty:ty => $value:expr),* $(,)?) => {
        $(
            #[$doc]
            #[must_use]
            pub fn $name(mut self, $name: $ty) -> Self {
                self.$name = $value;
                self
            }
        )*
    };
}

impl LayoutConfig {
    /// A layout of `world` ranks with every parallel size 1.
    pub fn new(world: usize) -> Self {
        LayoutConfig {
            world,
            ..Self::default()
        }
    }

    setter! {
        /// Sets the tensor-parallel size.
        tp: usize => tp,
        /// Sets the pipeline-parallel size.
        pp: usize => pp,
        /// Sets the context-parallel size.
        cp: usize => cp,
        /// Sets the expert-parallel size.
        ep: usize => ep,
        /// Sets the expert tensor-parallel size.
        etp: usize => Some(etp),
        /// Sets the order string.
        order: &str => order.to_owned(),
        /// Sets the first rank.
        rank_offset: usize => rank_offset,
        /// Sets the number of distributed-optimizer instances.
        dist_opt_instances: usize => dist_opt_instances,
        /// Sets the hierarchical context-parallel sizes.
        hcp_sizes: Vec<usize> => Some(hcp_sizes),
    }

    /// Checks the configuration with Megatron-Core's rules and builds the layout.
    pub fn build(self) -> Result<ParallelLayout, LayoutError> {
        ParallelLayout::new(self)
    }

    /// The size of each token over both grids of this configuration, unchecked: `tp` counts the larger of tp and
    /// etp, `dp` the larger of dense and expert dp (each quotient rounded down, so a configuration that
    /// [`build`](LayoutConfig::build) rejects still has sizes). A token of size 1 here is size 1 in both grids.
    ///
    /// ```
    /// use hypercomm_grid::layout::{LayoutConfig, TokenSizes};
    ///
    /// // Dense dp is 64 / (tp 2 * pp 2) = 16; expert dp is 64 / (etp 1 * ep 8 * pp 2) = 4.
    /// let sizes = LayoutConfig::new(64).tp(2).pp(2).ep(8).etp(1).token_sizes();
    /// assert_eq!(sizes, TokenSizes { tp: 2, cp: 1, ep: 8, dp: 16, pp: 2 });
    /// ```
    pub fn token_sizes(&self) -> TokenSizes {
        let etp = self.etp.unwrap_or(self.tp);
        let (tp, cp, ep, pp, world) = (self.tp, self.cp, self.ep, self.pp, self.world);
        TokenSizes {
            tp: tp.max(etp),
            cp,
            ep,
            dp: (world / (tp * pp * cp).max(1)).max(world / (etp * ep * pp).max(1)),
            pp,
        }
    }
}

/// Sizes per [`Token`], for [`rank_generator`] and from [`LayoutConfig::token_sizes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenSizes {
    /// Tensor-parallel size.
    pub tp: usize,
    /// Context-parallel size.
    pub cp: usize,
    /// Expert-parallel size.
    pub ep: usize,
    /// Data-parallel size.
    pub dp: usize,
    /// Pipeline-parallel size.
    pub pp: usize,
}

impl TokenSizes {
    /// The size of `token`.
    pub fn of(&self, token: Token) -> usize {
        match token {
            Token::Tp => self.tp,
            Token::Cp => self.cp,
            Token::Ep => self.ep,
            Token::Dp => self.dp,
            Token::Pp => self.pp,
        }
    }
}

/// The grid of Megatron-Core's `RankGenerator(tp, ep, dp, pp, cp, order, rank_offset)`: five dimensions named
/// `tp, cp, ep, dp, pp` laid out in `order`. Like Megatron, it refuses ep > 1 together with cp > 1 in one grid.
///
/// ```
/// use hypercomm_grid::layout::{rank_generator, Order, TokenSizes};
///
/// let sizes = TokenSizes { tp: 2, cp: 1, ep: 1, dp: 3, pp: 4 };
/// let order = Order::parse("tp-dp-pp", |_| 1)?;
/// let grid = rank_generator(order, sizes, 0)?;
/// // generate_masked_orthogonal_rank_groups' docstring: dp groups of [2, 3, 4] end with [19, 21, 23].
/// assert_eq!(grid.groups(["dp"])?.last(), Some(vec![19, 21, 23]));
/// # Ok::<(), hypercomm_grid::layout::LayoutError>(())
/// ```
pub fn rank_generator(order: Order, sizes: TokenSizes, offset: usize) -> Result<Grid, LayoutError> {
    if sizes.ep > 1 && sizes.cp > 1 {
        return Err(LayoutError::EpWithCp {
            ep: sizes.ep,
            cp: sizes.cp,
        });
    }
    let dims = order.tokens().map(|t| Dim::new(t.name(), sizes.of(t)));
    Ok(Grid::with_offset(dims, offset)?)
}

/// A checked Megatron-Core layout: a decoder grid (`ep = 1`) and an expert grid (`cp = 1`, `tp = etp`) over the
/// same ranks, sharing one order string and agreeing on the pipeline groups.
///
/// ```
/// use hypercomm_grid::layout::{GroupKind, LayoutConfig};
///
/// // Megatron-Core's docstring example: 16 GPUs, tp 2, pp 4.
/// let layout = LayoutConfig::new(16).tp(2).pp(4).build()?;
/// assert_eq!(layout.dp(), 2);
/// let tp: Vec<Vec<usize>> = layout.groups(GroupKind::Tp)?.collect();
/// assert_eq!(tp[..2], [vec![0, 1], vec![2, 3]]);
/// let pp: Vec<Vec<usize>> = layout.groups(GroupKind::Pp)?.collect();
/// assert_eq!(pp[0], [0, 4, 8, 12]);
/// let mine = layout.group_of(9, GroupKind::Dp)?.unwrap();
/// assert_eq!(mine.members, [9, 11]);
/// # Ok::<(), hypercomm_grid::layout::LayoutError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "LayoutConfig", into = "LayoutConfig")]
pub struct ParallelLayout {
    pub(crate) config: LayoutConfig,
    pub(crate) order: Order,
    pub(crate) etp: usize,
    pub(crate) dp: usize,
    pub(crate) expert_dp: usize,
    pub(crate) decoder: Grid,
    pub(crate) expert: GridView,
    /// The expert grid with `dp` split into `dp_intra` (one optimizer instance's share, fastest) and `dp_inter`.
    pub(crate) expert_split: Grid,
    /// The decoder grid with `cp` split into `hcp0`, `hcp1`, ... when hierarchical cp sizes are given.
    pub(crate) hcp: Option<Grid>,
}

impl TryFrom<LayoutConfig> for ParallelLayout {
    type Error = LayoutError;
    fn try_from(config: LayoutConfig) -> Result<Self, LayoutError> {
        ParallelLayout::new(config)
    }
}

impl From<ParallelLayout> for LayoutConfig {
    fn from(layout: ParallelLayout) -> Self {
        layout.config
    }
}

impl ParallelLayout {
    /// Checks `config` with Megatron-Core's rules and builds its grids.
    pub fn new(config: LayoutConfig) -> Result<ParallelLayout, LayoutError> {
        let etp = config.etp.unwrap_or(config.tp);
        for (name, value) in [
            ("world", config.world),
            ("tp", config.tp),
            ("pp", config.pp),
            ("cp", config.cp),
            ("ep", config.ep),
            ("etp", etp),
            ("dist_opt_instances", config.dist_opt_instances),
        ] {
            if value == 0 {
                return Err(LayoutError::ZeroSize { name });
            }
        }
        let world = config.world;
        let (dp, expert_dp) = (
            divide(world, [config.tp, config.pp, config.cp], "tp*pp*cp")?,
            divide(world, [etp, config.ep, config.pp], "etp*ep*pp")?,
        );
        let order = Order::parse(&config.order, |token| match token {
            Token::Tp => config.tp.max(etp),
            Token::Cp => config.cp,
            Token::Ep => config.ep,
            Token::Dp => dp.max(expert_dp),
            Token::Pp => config.pp,
        })?;
        // Megatron asks that the order end with pp unless dp equals expert dp; what matters is that no dimension
        // of size > 1 (in either grid) varies slower than pp. Size-1 dims appended after pp change nothing.
        let decoder_sizes = TokenSizes {
            tp: config.tp,
            cp: config.cp,
            ep: 1,
            dp,
            pp: config.pp,
        };
        let expert_sizes = TokenSizes {
            tp: etp,
            cp: 1,
            ep: config.ep,
            dp: expert_dp,
            pp: config.pp,
        };
        let mut after_pp = order
            .tokens()
            .into_iter()
            .skip_while(|&t| t != Token::Pp)
            .skip(1);
        let pp_slowest = after_pp.all(|t| decoder_sizes.of(t) == 1 && expert_sizes.of(t) == 1);
        if !pp_slowest && config.pp > 1 && dp != expert_dp {
            return Err(LayoutError::PpNotLast {
                order: order.to_string(),
                dp,
                expert_dp,
                pp: config.pp,
            });
        }
        let instances = config.dist_opt_instances;
        if (dp * config.cp) % instances != 0 {
            return Err(LayoutError::DistOptInstances {
                instances,
                domain: "dp*cp",
                size: dp * config.cp,
            });
        }
        if expert_dp % instances != 0 {
            return Err(LayoutError::DistOptInstances {
                instances,
                domain: "expert_dp",
                size: expert_dp,
            });
        }
        let offset = config.rank_offset;
        let decoder = rank_generator(order, decoder_sizes, offset)?;
        let expert_grid = rank_generator(order, expert_sizes, offset)?;
        let expert = GridView::new(&decoder, expert_grid, ["pp"])?;
        let expert_split = split_dim(
            &expert,
            "dp",
            &[("dp_intra", expert_dp / instances), ("dp_inter", instances)],
        )?;
        let hcp = match &config.hcp_sizes {
            None => None,
            Some(sizes) => Some(hcp_grid(&decoder, sizes, config.cp)?),
        };
        Ok(ParallelLayout {
            config,
            order,
            etp,
            dp,
            expert_dp,
            decoder,
            expert,
            expert_split,
            hcp,
        })
    }

    /// The configuration this layout was built from.
    pub fn config(&self) -> &LayoutConfig {
        &self.config
    }

    /// The order, with left-out size-1 tokens appended.
    pub fn order(&self) -> Order {
        self.order
    }

    /// The number of ranks.
    pub fn world(&self) -> usize {
        self.config.world
    }

    /// The ranks this layout covers.
    pub fn ranks(&self) -> std::ops::Range<usize> {
        self.decoder.ranks()
    }

    /// The data-parallel size: `world / (tp * pp * cp)`.
    pub fn dp(&self) -> usize {
        self.dp
    }

    /// The expert data-parallel size: `world / (etp * ep * pp)`.
    pub fn expert_dp(&self) -> usize {
        self.expert_dp
    }

    /// The expert tensor-parallel size (`tp` unless set).
    pub fn etp(&self) -> usize {
        self.etp
    }

    /// The decoder grid: dims `tp, cp, ep (= 1), dp, pp` in the layout's order.
    pub fn decoder(&self) -> &Grid {
        &self.decoder
    }

    /// The expert grid: dims `tp (= etp), cp (= 1), ep, dp (= expert dp), pp` in the layout's order; it shares
    /// `pp` with the decoder grid.
    pub fn expert(&self) -> &GridView {
        &self.expert
    }
}

/// `world / Π factors`, or an error naming the product when it does not divide.
fn divide(world: usize, factors: [usize; 3], what: &'static str) -> Result<usize, LayoutError> {
    let product = factors
        .iter()
        .try_fold(1usize, |acc, &f| acc.checked_mul(f))
        .filter(|&p| p <= world && world % p == 0)
        .ok_or(LayoutError::NotDivisible {
            what,
            product: factors.iter().fold(1usize, |a, &f| a.saturating_mul(f)),
            world,
        })?;
    Ok(world / product)
}

/// `grid` with the dimension `name` replaced, in place, by `parts` (fastest first; their sizes multiply to its size).
fn split_dim(grid: &Grid, name: &str, parts: &[(&str, usize)]) -> Result<Grid, LayoutError> {
    let mut dims = Vec::with_capacity(grid.dims().len() + parts.len());
    for dim in grid.dims() {
        if dim.name == name {
            dims.extend(parts.iter().map(|&(n, s)| Dim::new(n, s)));
        } else {
            dims.push(dim.clone());
        }
    }
    Ok(Grid::with_offset(dims, grid.offset())?)
}

fn hcp_grid(decoder: &Grid, sizes: &[usize], cp: usize) -> Result<Grid, LayoutError> {
    if sizes.is_empty() || sizes.contains(&0) {
        return Err(LayoutError::HierarchicalCpSizes {
            sizes: sizes.to_vec(),
        });
    }
    let product = sizes.iter().try_fold(1usize, |a, &s| a.checked_mul(s));
    if product != Some(cp) {
        return Err(LayoutError::HierarchicalCp {
            sizes: sizes.to_vec(),
            product: product.unwrap_or(usize::MAX),
            cp,
        });
    }
    let names: Vec<String> = (0..sizes.len()).map(|i| format!("hcp{i}")).collect();
    let parts: Vec<(&str, usize)> = names
        .iter()
        .map(String::as_str)
        .zip(sizes.iter().copied())
        .collect();
    split_dim(decoder, "cp", &parts)
}
