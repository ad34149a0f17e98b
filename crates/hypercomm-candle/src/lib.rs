//! Data-, tensor-, pipeline- and expert-parallel training of [candle](https://github.com/huggingface/candle)
//! models over hypercomm's process groups.
//!
//! 1. Build a [`ProcessGroupCollection`](process_group_collection::ProcessGroupCollection) for your layout, put it
//!    in an `Arc`, and take the groups you train over as [`TensorGroup`]s (`TensorGroup::kind(&pgc, "tp")`).
//! 2. Move tensors with the collectives on [`TensorGroup`]: [`all_reduce`](TensorGroup::all_reduce) (and
//!    [`all_reduce_async`](TensorGroup::all_reduce_async)), [`all_gather`](TensorGroup::all_gather) and
//!    [`reduce_scatter`](TensorGroup::reduce_scatter) along a dimension, [`broadcast`](TensorGroup::broadcast).
//!    candle tensors are immutable: each returns its result as a new tensor.
//! 3. Move tensors between stages and experts: [`send`](TensorGroup::send), [`recv`](TensorGroup::recv), and
//!    [`exchange`](TensorGroup::exchange), a batch of sends and receives ([`TensorP2p`]) that progress together
//!    (pipeline parallelism); [`all_to_all_v`](TensorGroup::all_to_all_v), an all-to-all of rows with split sizes
//!    (expert parallelism's token dispatch and combine), differentiable.
//! 4. Split layers over the tensor-parallel group with [`tp::ColumnParallelLinear`], [`tp::RowParallelLinear`]
//!    and [`tp::ParallelMlp`], built from the full weights so they compute what a single-rank model computes.
//! 5. After `loss.backward()`, average the gradients over the data-parallel group with [`GradSync`] (bucketed,
//!    overlapping communication with flattening), then step any candle optimizer.
//!
//! Tensors on the CPU go through the host backend (shared memory or TCP). Element types: u8, u32, i32, i64, f16,
//! bf16, f8e4m3, f32, f64; others (i16, f8e8m0, the f6/f4 formats) and tensors on other devices are an [`Error`]
//! naming them. f8e4m3 tensors move bit for bit everywhere, but only CUDA tensors reduce (on NCCL 2.24 or newer):
//! a reduction of CPU f8e4m3 tensors is the communicator's error naming the type and the way out (reduce in f32
//! or bf16).
//!
//! ```
//! use std::sync::Arc;
//! use candle_core::{Device, Tensor};
//! use hypercomm_candle::{ReduceOp, TensorGroup};
//! use hypercomm_comm::{CommOptions, Communicator};
//! use hypercomm_store::MemoryStore;
//!
//! // Two ranks as two threads sharing a store; a collection's groups work the same way.
//! let store = Arc::new(MemoryStore::new());
//! let ranks: Vec<_> = (0..2)
//!     .map(|me| {
//!         let store = Arc::clone(&store);
//!         std::thread::spawn(move || -> Result<Vec<f32>, Box<dyn std::error::Error + Send + Sync>> {
//!             let comm = Communicator::new(store, vec![0, 1], me, CommOptions::named("doc"))?;
//!             let group = TensorGroup::from_communicator(Arc::new(comm));
//!             let t = Tensor::new(&[1f32, 2.0], &Device::Cpu)?.affine(me as f64 + 1.0, 0.0)?;
//!             Ok(group.all_reduce(&t, ReduceOp::Sum)?.to_vec1()?)
//!         })
//!     })
//!     .collect();
//! for r in ranks {
//!     assert_eq!(r.join().unwrap().unwrap(), [3.0, 6.0]);
//! }
//! ```
//!
//! CUDA tensors go through the group's communicator as device buffers (a collection built with a GPU) with the feature `cuda`,
//! stream-ordered on candle's stream with no trip through host memory. The feature builds candle's CUDA backend,
//! which needs `nvcc` at build time, so it is never a default; without it a CUDA tensor is an error saying so.

mod all_to_all;
mod bucket;
mod collectives;
pub mod ddp;
#[cfg(feature = "cuda")]
mod device;
mod error;
mod group;
mod host;
mod kind;
mod p2p;
pub mod refit;
mod symmetric;
pub mod tp;

#[cfg(test)]
mod testing;

/// The candle this crate is built against, so that users name one version.
pub use candle_core;
/// The candle-nn this crate is built against.
pub use candle_nn;
pub use collectives::TensorWork;
pub use ddp::{DEFAULT_BUCKET_BYTES, GradSync, SyncStats};
pub use error::{Error, Result};
pub use group::TensorGroup;
pub use hypercomm_comm::ReduceOp;
pub use p2p::TensorP2p;
