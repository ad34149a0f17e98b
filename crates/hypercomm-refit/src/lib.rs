//! Weight refit between layouts, the pure half: how a model's parameters are laid out on a layout ([`Sharding`]).
//!
//! A [`Sharding`] lists each parameter (name, full shape, [`DType`]) with its tensor-parallel [`Split`] (column,
//! row, vocab-parallel, replicated), its pipeline [`Place`] and its expert; [`Sharding::placement`] says which
//! ranks of a layout hold which shard. [`GptConfig`] describes Megatron-Core's GPT; [`parse_layout`] reads a
//! layout written as `tp=2,pp=2,dp=2`.

mod dtype;
mod error;
mod gpt;
mod layout_spec;
mod placement;
mod sharding;

pub use dtype::DType;
pub use error::RefitError;
pub use gpt::GptConfig;
pub use layout_spec::{describe_layout, parse_layout};
pub use placement::Placement;
pub use sharding::{ParamSharding, Place, Sharding, Split};
