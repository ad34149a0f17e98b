//! NCCL bindings loaded at run time: nothing about CUDA or NCCL is needed to build.
//!
//! [`sys`] is bindgen's translation of `nccl.h` from NCCL 2.28.9 (the header in the PyPI wheel
//! `nvidia-nccl-cu13==2.28.9`) in dynamic-loading mode: instead of linking against `libnccl`, it defines
//! [`sys::NcclLib`], a table of function pointers filled in from a library opened with `dlopen`, each one a
//! `Result` so a symbol the library lacks is an error value, not a load failure. The file is checked in and never
//! edited by hand; `regenerate.sh` beside this crate rebuilds it on a fresh machine and `check-regenerate.sh`
//! checks it is reproducible (CI runs that only with `HYPERCOMM_CHECK_BINDINGS=1`).
//!
//! The rest is hand-written and small: finding the library, knowing its version, gating newer entry points, the
//! config initializer the header provides only as a macro, and return codes as `Result`s. Ownership of
//! communicators, streams and buffers belongs to the NCCL backend of `hypercomm-comm`, not here.
//!
//! # Using it
//!
//! 1. Describe where to look with [`SearchConfig::from_env`] (reads `$NCCL_LIBRARY` and the Python folders; see
//!    [`loader`] for the order), or build a [`SearchConfig`] by hand.
//! 2. Open the library with [`Nccl::load`]. No NCCL on the machine is an ordinary [`LoadError`] that lists every
//!    place tried; nothing panics.
//! 3. Ask what it can do: [`Nccl::version`], [`Nccl::has`] / [`Nccl::require`] for an entry point ([`Function`]
//!    lists them with the release that introduced each), [`Nccl::supports_config_field`] for a config knob.
//! 4. Start configs from [`config::config_initializer`] (the `NCCL_CONFIG_INITIALIZER` equivalent) and set only
//!    knobs the loaded release honours.
//! 5. Call through [`Nccl::api`], which checks availability first, and turn each return code into a `Result` with
//!    [`Nccl::check`], which attaches NCCL's own error text.
//!
//! ```no_run
//! use nccl_sys::{Function, Nccl, SearchConfig};
//!
//! let nccl = match Nccl::load(&SearchConfig::from_env(|name| std::env::var_os(name))) {
//!     Ok(nccl) => nccl,
//!     Err(e) => {
//!         eprintln!("running without NCCL: {e}");
//!         return;
//!     }
//! };
//! println!("nccl {} from {}", nccl.version(), nccl.origin());
//! if let Err(e) = nccl.require(Function::CommShrink) {
//!     println!("no shrink: {e}"); // e.g. "ncclCommShrink needs nccl 2.27.0 or newer, but ..."
//! }
//! ```

pub mod config;
pub mod function;
pub mod loader;
pub mod result;
pub mod version;

/// bindgen's output for `nccl.h` 2.28.9, dynamic-loading mode; see `regenerate.sh`. Not edited by hand.
#[allow(
    warnings,
    missing_docs,
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    unsafe_op_in_unsafe_fn,
    clippy::all,
    clippy::pedantic,
    clippy::undocumented_unsafe_blocks
)]
pub mod sys;

pub use function::Function;
pub use loader::{LoadError, Nccl, SearchConfig};
pub use result::{NcclError, ResultCode};
pub use version::Version;
