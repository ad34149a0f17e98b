//! [`Error`]: why a collective on tensors, a gradient synchronisation or a parallel layer failed.
//!
//! Every variant names the group and the value that was wrong. Inside candle's own traits (custom ops, `Module`)
//! these errors travel as `candle_core::Error::Wrapped`, so their text survives; [`Error::into_candle`] does that.

use std::sync::{Arc, Mutex, PoisonError};

use hypercomm_comm::CommError;
use process_group_collection::CollectionError;

/// What went wrong moving tensors through a group.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The group's communicator could not be had from its collection.
    #[error(transparent)]
    Collection(#[from] CollectionError),
    /// The communicator failed.
    #[error("group {group}: {source}")]
    Comm {
        /// The group's name.
        group: String,
        /// The communicator's error.
        source: Box<CommError>,
    },
    /// candle failed (reshaping, copying or building a tensor).
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
    /// The tensor's element type has no counterpart among the communicator's element types.
    #[error(
        "{op} on group {group}: tensors of dtype {dtype:?} cannot be communicated (supported: {supported})"
    )]
    UnsupportedDType {
        /// The operation.
        op: &'static str,
        /// The group's name.
        group: String,
        /// The offending element type.
        dtype: candle_core::DType,
        /// The element types that are supported.
        supported: &'static str,
    },
    /// The tensor lives on a device the group cannot serve.
    #[error("{op} on group {group}: the tensor is on {device}, but {why}")]
    UnsupportedDevice {
        /// The operation.
        op: &'static str,
        /// The group's name.
        group: String,
        /// The offending device, as candle names its location.
        device: String,
        /// Why the group cannot serve it, and what would.
        why: String,
    },
    /// An argument does not fit the group or the operation: a peer outside the group, split sizes of the wrong
    /// length or sum, parts of one exchange with different dtypes or devices.
    #[error("{op} on group {group}: {what}")]
    Argument {
        /// The operation.
        op: &'static str,
        /// The group's name.
        group: String,
        /// What is wrong, with the offending values and the rule they broke.
        what: String,
    },
    /// A shape, dimension or size does not fit the operation.
    #[error("{op} on group {group}: {what}")]
    Shape {
        /// The operation.
        op: &'static str,
        /// The group's name.
        group: String,
        /// What is wrong, with the offending values.
        what: String,
    },
}

impl Error {
    /// This error as a candle error (its text kept), for use inside candle's traits.
    pub fn into_candle(self) -> candle_core::Error {
        match self {
            Error::Candle(e) => e,
            other => candle_core::Error::wrap(other),
        }
    }
}

/// A result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Where a candle custom op leaves the error of a failed forward: candle passes an op's error out only as text, so
/// the op keeps the typed one here ([`keep`](Self::keep)) and the caller of `apply_op` takes it back
/// ([`take_or`](Self::take_or)). Clones share the slot, for ops that candle takes by value.
#[derive(Clone, Default)]
pub(crate) struct OpFailure(Arc<Mutex<Option<Error>>>);

impl OpFailure {
    /// `result` as candle wants it: a failure as its text, the typed error kept.
    pub(crate) fn keep<T>(&self, result: Result<T>) -> candle_core::Result<T> {
        result.map_err(|e| {
            let text = candle_core::Error::msg(&e);
            *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(e);
            text
        })
    }

    /// The error the op kept, or candle's own `e` when the op kept none (the failure was candle's).
    pub(crate) fn take_or(&self, e: candle_core::Error) -> Error {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .unwrap_or(Error::Candle(e))
    }
}
