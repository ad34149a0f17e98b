//! [`RefitError`]: why a sharding does not fit a layout, why two shardings cannot be refit one into the other, or
//! why a description does not parse.

use hypercomm_grid::GridError;
use hypercomm_grid::layout::LayoutError;

/// Why a sharding, a layout or a plan's options were refused. Each variant names the offending value and the rule
/// it broke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RefitError {
    /// Two parameters of one sharding share a name.
    #[error("parameter {name:?} is described more than once")]
    DuplicateParam {
        /// The repeated name.
        name: String,
    },
    /// A parameter without a name.
    #[error("parameter #{index} has an empty name")]
    EmptyName {
        /// The parameter's position in the sharding.
        index: usize,
    },
    /// A dimension of size zero.
    #[error("parameter {name:?} has shape {shape:?}: every dimension must be at least 1")]
    ZeroDim {
        /// The parameter.
        name: String,
        /// Its shape.
        shape: Vec<u64>,
    },
    /// A parameter whose size in bytes does not fit in 64 bits.
    #[error("parameter {name:?} of shape {shape:?} has more bytes than fit in 64 bits")]
    TooLarge {
        /// The parameter.
        name: String,
        /// Its shape.
        shape: Vec<u64>,
    },
    /// A split along a dimension the parameter does not have, or into zero blocks.
    #[error("parameter {name:?} of shape {shape:?} cannot split dim {dim} into {blocks} block(s)")]
    BadSplit {
        /// The parameter.
        name: String,
        /// Its shape.
        shape: Vec<u64>,
        /// The split dimension.
        dim: usize,
        /// The number of blocks.
        blocks: u64,
    },
    /// A split dimension that the layout's tensor-parallel size (times the blocks) does not divide.
    #[error(
        "parameter {name:?}: dim {dim} of size {size} does not split into {tp} tensor-parallel shard(s) of {blocks} block(s) each"
    )]
    NotDivisible {
        /// The parameter.
        name: String,
        /// The split dimension.
        dim: usize,
        /// Its size.
        size: u64,
        /// The tensor-parallel size (`etp` for an expert's parameter).
        tp: usize,
        /// The number of blocks.
        blocks: u64,
    },
    /// A parameter placed on a pipeline stage the layout does not have.
    #[error("parameter {name:?} is placed on stage {stage}, but the layout has pp {pp}")]
    StageOutOfRange {
        /// The parameter.
        name: String,
        /// The stage.
        stage: usize,
        /// The layout's pipeline-parallel size.
        pp: usize,
    },
    /// A parameter placed by a layer the sharding does not have.
    #[error("parameter {name:?} belongs to layer {layer}, but the sharding has {layers} layers")]
    LayerOutOfRange {
        /// The parameter.
        name: String,
        /// The layer.
        layer: usize,
        /// The sharding's layer count.
        layers: usize,
    },
    /// Layers that do not split evenly over the pipeline stages.
    #[error(
        "{layers} layers do not split evenly over pp {pp} (parameter {name:?} is placed by layer)"
    )]
    LayersNotDivisible {
        /// A parameter placed by layer.
        name: String,
        /// The sharding's layer count.
        layers: usize,
        /// The layout's pipeline-parallel size.
        pp: usize,
    },
    /// A parameter of an expert the sharding does not have.
    #[error(
        "parameter {name:?} belongs to expert {expert}, but the sharding has {experts} experts"
    )]
    ExpertOutOfRange {
        /// The parameter.
        name: String,
        /// The expert.
        expert: usize,
        /// The sharding's expert count.
        experts: usize,
    },
    /// Experts that do not split evenly over the expert-parallel ranks.
    #[error("{experts} experts do not split evenly over ep {ep} (parameter {name:?})")]
    ExpertsNotDivisible {
        /// An expert's parameter.
        name: String,
        /// The sharding's expert count.
        experts: usize,
        /// The layout's expert-parallel size.
        ep: usize,
    },
    /// A destination parameter that the source sharding does not describe.
    #[error("destination parameter {name:?} is not in the source sharding")]
    MissingInSource {
        /// The parameter.
        name: String,
    },
    /// A parameter whose shape or element type differs between the two shardings.
    #[error(
        "parameter {name:?} has {what} {on_destination} on the destination but {on_source} on the source"
    )]
    Mismatch {
        /// The parameter.
        name: String,
        /// `shape` or `element type`.
        what: &'static str,
        /// The source's value.
        on_source: String,
        /// The destination's value.
        on_destination: String,
    },
    /// A bucket too small to plan with.
    #[error("bucket of {bytes} bytes is below the minimum of {min} bytes")]
    BucketTooSmall {
        /// The bucket size given.
        bytes: u64,
        /// The minimum.
        min: u64,
    },
    /// A layout with more ranks than a plan lists.
    #[error(
        "the {side} layout has {world} ranks; a plan lists every rank's transfers and takes at most {max}"
    )]
    TooManyRanks {
        /// `source` or `destination`.
        side: &'static str,
        /// The layout's world size.
        world: usize,
        /// The limit.
        max: usize,
    },
    /// A refit whose byte counts do not fit in 64 bits.
    #[error(
        "{bytes} bytes of parameters to each of {ranks} destination ranks overflow 64-bit byte counts"
    )]
    TooManyBytes {
        /// The destination parameters' bytes.
        bytes: u64,
        /// The destination ranks.
        ranks: usize,
    },
    /// A buffer whose size is not the size the parameter needs.
    #[error("{what} of parameter {name:?} has {have} bytes, but it needs {want}")]
    WrongSize {
        /// The parameter.
        name: String,
        /// What the buffer is (`the full tensor`).
        what: &'static str,
        /// Its size.
        have: u64,
        /// The size it needs.
        want: u64,
    },
    /// Text that does not parse.
    #[error("{what} {text:?}: {why}")]
    Parse {
        /// What the text was meant to be.
        what: &'static str,
        /// The text.
        text: String,
        /// What is wrong with it.
        why: String,
    },
    /// A model description whose values do not make a model.
    #[error("model {field}={value}: {why}")]
    BadModel {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
        /// The rule it breaks.
        why: String,
    },
    /// The layout is invalid.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// A grid query failed.
    #[error(transparent)]
    Grid(#[from] GridError),
}
