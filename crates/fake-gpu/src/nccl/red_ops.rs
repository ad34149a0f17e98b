//! The reductions a communicator creates (`ncclRedOpCreatePreMulSum`, `ncclRedOpDestroy`, whose entry points are
//! in the module above), strict as NCCL is.
//!
//! NCCL keeps each communicator's operators in its own table and hands out `ncclNumOps + slot`, mangled with the
//! communicator's address so that one communicator's operator is unknown to another. The fake does the same with
//! a salt per communicator: a handle is `NUM_OPS + salt * SLOTS + slot`. A collective given an operator checks it
//! when issued, as NCCL's `hostToDevRedOp` does: unknown to its communicator (another's, or destroyed) or made for
//! another element type is `ncclInvalidArgument`. The operator's scalar is copied into the call then, so an
//! operator destroyed while its collective is still queued is fine (NCCL allows it once the call has returned).
//!
//! NCCL frees a communicator's operators with it; the fake notes on stderr the ones a destroy (not an abort)
//! finds still alive, so a test can see that its caller released them.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use super::reduce::type_name;
use crate::stream::lock;

/// NCCL's built-in reductions are `0..NUM_OPS` (`ncclNumOps`).
pub(crate) const NUM_OPS: i32 = 5;
/// Operators one communicator may hold at once (NCCL grows its table without bound; tests need far fewer).
const SLOTS: i32 = 1024;
/// Salts that keep a handle within `ncclMaxRedOp` (`i32::MAX`): `NUM_OPS + SALTS * SLOTS + SLOTS - 1` fits.
const SALTS: u32 = ((i32::MAX - NUM_OPS) / SLOTS - 1) as u32;

/// The next communicator's salt. Process-wide as NCCL's mangling by address is: handles of live communicators
/// differ unless more than `SALTS` communicators were made in between.
static NEXT_SALT: AtomicU32 = AtomicU32::new(0);

/// What a collective given a created operator does: multiply each rank's input by `scalar` (one element of
/// `dtype`, its bytes in the low end of the word), then sum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PreMulSum {
    pub dtype: i32,
    pub scalar: [u8; 8],
}

/// One communicator's created operators, by slot.
pub(crate) struct CreatedOps {
    salt: i32,
    slots: Mutex<Vec<Option<PreMulSum>>>,
}

impl CreatedOps {
    pub(crate) fn new() -> CreatedOps {
        let salt = NEXT_SALT.fetch_add(1, Ordering::Relaxed) % SALTS + 1;
        CreatedOps {
            salt: i32::try_from(salt).unwrap_or(1),
            slots: Mutex::new(Vec::new()),
        }
    }

    /// The slot of `op` if it is a handle of this communicator's table (live or not).
    fn slot(&self, op: i32) -> Option<usize> {
        let v = op.checked_sub(NUM_OPS)?;
        (v >= 0 && v / SLOTS == self.salt).then_some((v % SLOTS) as usize)
    }

    pub(crate) fn create(&self, made: PreMulSum) -> Result<i32, String> {
        let mut slots = lock(&self.slots);
        let free = match slots.iter().position(Option::is_none) {
            Some(i) => i,
            None if slots.len() < SLOTS as usize => {
                slots.push(None);
                slots.len() - 1
            }
            None => return Err(format!("{SLOTS} live operators on one communicator")),
        };
        slots[free] = Some(made);
        Ok(NUM_OPS + self.salt * SLOTS + free as i32)
    }

    pub(crate) fn destroy(&self, op: i32) -> Result<(), String> {
        let mut slots = lock(&self.slots);
        match self.slot(op).and_then(|i| slots.get_mut(i)) {
            Some(s @ Some(_)) => {
                *s = None;
                Ok(())
            }
            _ => Err(format!(
                "ncclRedOpDestroy: operator {op} is unknown to this communicator (another's, or destroyed)"
            )),
        }
    }

    /// The operator `op` names on this communicator, for a collective of `dtype`; NCCL's answer otherwise.
    pub(crate) fn resolve(&self, op: i32, dtype: i32) -> Result<PreMulSum, String> {
        let slots = lock(&self.slots);
        let Some(made) = self.slot(op).and_then(|i| slots.get(i).copied().flatten()) else {
            return Err(format!(
                "reduction {op} is neither built in nor an operator created on this communicator (another \
                 communicator's, or destroyed)"
            ));
        };
        if made.dtype != dtype {
            return Err(format!(
                "operator {op} was created for {} but the collective moves {}",
                type_name(made.dtype),
                type_name(dtype)
            ));
        }
        Ok(made)
    }

    /// Operators created and not destroyed.
    pub(crate) fn live(&self) -> usize {
        lock(&self.slots).iter().flatten().count()
    }
}
