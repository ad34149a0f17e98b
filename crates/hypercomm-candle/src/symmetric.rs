//! [`SymBuf`]: a tensor-typed buffer in a host communicator's symmetric window, so that
//! [`GradSync`](crate::GradSync) can flatten a bucket straight into memory the peers on this host reduce in place
//! (see [`hypercomm_comm::symmetric`]) instead of into a vector the collective stages through its slots.
//!
//! The element types are [`HostBuf`](crate::host::HostBuf)'s that the host reduces; which of them a dtype maps to
//! is decided there (an unsupported dtype never reaches this module). f8e4m3, which the host moves but does not
//! reduce, gets no symmetric buffer: its bucket takes the vector path, whose all-reduce the communicator refuses
//! with the error naming the type.

use candle_core::{DType, Device, Shape, Tensor};
use half::{bf16, f16};
use hypercomm_comm::{CommError, Communicator, ReduceOp, SymmetricBuffer};

use crate::Result;
use crate::host::{Pending, no_elements, with_elements};

/// A symmetric buffer of one of the element types candle and hypercomm share.
#[derive(Debug)]
pub(crate) enum SymBuf {
    U8(SymmetricBuffer<u8>),
    U32(SymmetricBuffer<u32>),
    I32(SymmetricBuffer<i32>),
    I64(SymmetricBuffer<i64>),
    F16(SymmetricBuffer<f16>),
    BF16(SymmetricBuffer<bf16>),
    F32(SymmetricBuffer<f32>),
    F64(SymmetricBuffer<f64>),
}

/// Runs `$body` with `$b` bound to the buffer of whichever variant `$buf` is, and `$wrap` to that variant's
/// constructor.
macro_rules! each {
    ($buf:expr, $b:ident, $wrap:ident => $body:expr) => {
        match $buf {
            SymBuf::U8($b) => {
                let $wrap = SymBuf::U8;
                $body
            }
            SymBuf::U32($b) => {
                let $wrap = SymBuf::U32;
                $body
            }
            SymBuf::I32($b) => {
                let $wrap = SymBuf::I32;
                $body
            }
            SymBuf::I64($b) => {
                let $wrap = SymBuf::I64;
                $body
            }
            SymBuf::F16($b) => {
                let $wrap = SymBuf::F16;
                $body
            }
            SymBuf::BF16($b) => {
                let $wrap = SymBuf::BF16;
                $body
            }
            SymBuf::F32($b) => {
                let $wrap = SymBuf::F32;
                $body
            }
            SymBuf::F64($b) => {
                let $wrap = SymBuf::F64;
                $body
            }
        }
    };
}

/// Whether `comm` has a symmetric window to put buckets in.
pub(crate) fn has_window(comm: &Communicator) -> bool {
    comm.options().symmetric_bytes > 0
}

impl SymBuf {
    /// `len` zeros of `dtype` in `comm`'s window. `Err` when the window cannot hold them (every rank that
    /// allocated alike gets the same answer, so the ranks stay in step) or `dtype` is not one this module serves.
    pub(crate) fn zeros(
        comm: &Communicator,
        dtype: DType,
        len: usize,
    ) -> std::result::Result<SymBuf, CommError> {
        Ok(match dtype {
            DType::U8 => SymBuf::U8(comm.symmetric_buffer(len, 0)?),
            DType::U32 => SymBuf::U32(comm.symmetric_buffer(len, 0)?),
            DType::I32 => SymBuf::I32(comm.symmetric_buffer(len, 0)?),
            DType::I64 => SymBuf::I64(comm.symmetric_buffer(len, 0)?),
            DType::F16 => SymBuf::F16(comm.symmetric_buffer(len, f16::ZERO)?),
            DType::BF16 => SymBuf::BF16(comm.symmetric_buffer(len, bf16::ZERO)?),
            DType::F32 => SymBuf::F32(comm.symmetric_buffer(len, 0.0)?),
            DType::F64 => SymBuf::F64(comm.symmetric_buffer(len, 0.0)?),
            other => {
                return Err(CommError::InvalidArgument {
                    comm: comm.name().to_owned(),
                    what: format!("no symmetric buffer for tensors of dtype {other:?}"),
                });
            }
        })
    }

    /// Writes `t`'s elements (row-major, `t` of this buffer's dtype) at elements `start..`.
    pub(crate) fn write_at(&mut self, start: usize, t: &Tensor) -> Result<()> {
        each!(self, b, _wrap => with_elements(t, no_elements(b), |e| {
            b[start..start + e.len()].copy_from_slice(e)
        }))
    }

    /// Elements `start..start + shape.elem_count()` as a tensor of `shape` on `device`.
    pub(crate) fn tensor_at(&self, start: usize, shape: &Shape, device: &Device) -> Result<Tensor> {
        let end = start + shape.elem_count();
        Ok(each!(self, b, _wrap => Tensor::from_slice(&b[start..end], shape, device)?))
    }

    /// Issues an in-place all-reduce over the ranks' buffers.
    pub(crate) fn all_reduce(
        self,
        comm: &Communicator,
        op: ReduceOp,
    ) -> std::result::Result<Pending<SymBuf>, CommError> {
        each!(self, b, wrap => {
            let work = comm.all_reduce_symmetric(b, op)?;
            Ok(Pending::new(move || work.wait().map(wrap)))
        })
    }
}
