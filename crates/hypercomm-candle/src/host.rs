//! [`HostBuf`]: a tensor's elements as a typed host vector, the form the host [`Communicator`] moves.
//!
//! candle tensors and hypercomm buffers share these element types: u8, u32, i32, i64, f16, bf16, f8e4m3, f32,
//! f64. The conversion both ways, and the dispatch from a runtime dtype to a typed collective, live here only.
//!
//! f8e4m3 (`float8::F8E4M3`, the type of candle's storage and of hypercomm's buffers alike) moves bit for bit
//! through every operation; a reduction of it is refused by the communicator, which reduces 8-bit floats only on a
//! device, with the error that says so and names the way out.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, DType, Device, Layout, Shape, Tensor};
use float8::F8E4M3;
use half::{bf16, f16};
use hypercomm_comm::{CommError, Communicator, Element, P2p, ReduceOp};

use crate::{Error, Result};

/// The candle element types a host communicator can carry.
pub(crate) const SUPPORTED: &str = "u8, u32, i32, i64, f16, bf16, f8e4m3, f32, f64";

/// A tensor's elements, flattened in row-major order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum HostBuf {
    U8(Vec<u8>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    F8E4M3(Vec<F8E4M3>),
    F32(Vec<f32>),
    F64(Vec<f64>),
}

/// Runs `$body` with `$v` bound to the vector of whichever variant `$buf` is, and `$wrap` to that variant's
/// constructor, so one expression serves every element type.
macro_rules! each {
    ($buf:expr, $v:ident, $wrap:ident => $body:expr) => {
        match $buf {
            HostBuf::U8($v) => {
                let $wrap = HostBuf::U8;
                $body
            }
            HostBuf::U32($v) => {
                let $wrap = HostBuf::U32;
                $body
            }
            HostBuf::I32($v) => {
                let $wrap = HostBuf::I32;
                $body
            }
            HostBuf::I64($v) => {
                let $wrap = HostBuf::I64;
                $body
            }
            HostBuf::F16($v) => {
                let $wrap = HostBuf::F16;
                $body
            }
            HostBuf::BF16($v) => {
                let $wrap = HostBuf::BF16;
                $body
            }
            HostBuf::F8E4M3($v) => {
                let $wrap = HostBuf::F8E4M3;
                $body
            }
            HostBuf::F32($v) => {
                let $wrap = HostBuf::F32;
                $body
            }
            HostBuf::F64($v) => {
                let $wrap = HostBuf::F64;
                $body
            }
        }
    };
}

/// An empty slice of `buf`'s element type that borrows nothing: names the type for [`with_elements`] while `buf`
/// stays free to be written.
pub(crate) fn no_elements<T, B: std::ops::Deref<Target = [T]>>(_buf: &B) -> &'static [T] {
    &[]
}

/// Calls `f` with a CPU tensor's elements in row-major order, as a slice of `like`'s element type (which names
/// the type; it must be `t`'s): borrowed straight from candle's storage when `t` is contiguous, else from a
/// contiguous copy. Borrowing saves a copy of every gradient on its way into a bucket.
pub(crate) fn with_elements<T: candle_core::WithDType, R>(
    t: &Tensor,
    _like: &[T],
    f: impl FnOnce(&[T]) -> R,
) -> Result<R> {
    {
        let (storage, layout) = t.storage_and_layout();
        if let (candle_core::Storage::Cpu(cpu), Some((start, end))) =
            (&*storage, layout.contiguous_offsets())
        {
            return Ok(f(&cpu.as_slice::<T>()?[start..end]));
        }
    }
    let copy = t.flatten_all()?.to_vec1::<T>()?;
    Ok(f(&copy))
}

/// The elements of CPU storage, as a slice of `like`'s element type (which names the type; it must be the
/// storage's).
fn elements_of<'s, T: candle_core::WithDType>(
    storage: &'s CpuStorage,
    _like: &[T],
) -> candle_core::Result<&'s [T]> {
    T::cpu_storage_as_slice(storage)
}

/// A collective in flight; [`Pending::wait`] gives back the resulting buffer (a [`HostBuf`], or the symmetric
/// buffer of [`crate::symmetric`]).
pub(crate) struct Pending<B = HostBuf>(Box<dyn FnOnce() -> Result<B, CommError> + Send>);

impl<B> Pending<B> {
    /// The collective whose result `wait` blocks for.
    pub(crate) fn new(wait: impl FnOnce() -> Result<B, CommError> + Send + 'static) -> Pending<B> {
        Pending(Box::new(wait))
    }

    /// Blocks until the collective completes (bounded by the communicator's timeout).
    pub(crate) fn wait(self) -> Result<B, CommError> {
        (self.0)()
    }
}

impl<B> std::fmt::Debug for Pending<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pending")
    }
}

/// Why a tensor cannot be moved by a host communicator, if it cannot.
pub(crate) fn check_tensor(t: &Tensor, op: &'static str, group: &str) -> Result<()> {
    check_device(t.device(), op, group)?;
    HostBuf::empty(t.dtype(), op, group).map(|_| ())
}

/// Why tensors on `device` cannot be moved by a host communicator, if they cannot.
pub(crate) fn check_device(device: &Device, op: &'static str, group: &str) -> Result<()> {
    if !device.is_cpu() {
        let why = if cfg!(feature = "cuda") {
            "the host backend serves only cpu tensors (cuda tensors go through the group's nccl communicator)"
        } else {
            "this build serves only cpu tensors: cuda tensors need hypercomm-candle's feature `cuda` \
             (hypercomm's `cuda`), which builds candle's CUDA backend and needs nvcc"
        };
        return Err(Error::UnsupportedDevice {
            op,
            group: group.to_owned(),
            device: format!("{:?}", device.location()),
            why: why.into(),
        });
    }
    Ok(())
}

/// An element type of [`HostBuf`], with its variant: an operation on several buffers at once (a batch) takes
/// every one as the same typed vector.
pub(crate) trait HostElement: Element {
    /// The vector as its variant.
    fn wrap(v: Vec<Self>) -> HostBuf;
    /// The vector of `buf`, or `buf` back when it holds another type.
    fn take(buf: HostBuf) -> Result<Vec<Self>, HostBuf>;
}

macro_rules! host_element {
    ($($t:ty => $variant:ident),* $(,)?) => {$(
        impl HostElement for $t {
            fn wrap(v: Vec<Self>) -> HostBuf {
                HostBuf::$variant(v)
            }

            fn take(buf: HostBuf) -> Result<Vec<Self>, HostBuf> {
                match buf {
                    HostBuf::$variant(v) => Ok(v),
                    other => Err(other),
                }
            }
        }
    )*};
}

host_element!(
    u8 => U8, u32 => U32, i32 => I32, i64 => I64, f16 => F16, bf16 => BF16, F8E4M3 => F8E4M3, f32 => F32,
    f64 => F64,
);

/// Issues `parts` as one batch of vectors of `like`'s element type (which names the type) on `comm`; a part of
/// another type is refused before anything is sent.
fn batch_of<T: HostElement>(
    comm: &Communicator,
    parts: Vec<P2p<HostBuf>>,
    _like: &[T],
) -> Result<Pending<Vec<HostBuf>>, CommError> {
    let typed = parts
        .into_iter()
        .enumerate()
        .map(|(i, part)| {
            let retype = |buf: HostBuf| {
                T::take(buf).map_err(|other| CommError::InvalidArgument {
                    comm: comm.name().to_owned(),
                    what: format!(
                        "batch part {i} holds {} elements, not {} like part 0",
                        other.dtype_name(),
                        T::DTYPE
                    ),
                })
            };
            Ok(match part {
                P2p::Send { buf, peer, tag } => P2p::Send {
                    buf: retype(buf)?,
                    peer,
                    tag,
                },
                P2p::Recv { buf, peer, tag } => P2p::Recv {
                    buf: retype(buf)?,
                    peer,
                    tag,
                },
            })
        })
        .collect::<Result<Vec<_>, CommError>>()?;
    let work = comm.batch(typed)?;
    Ok(Pending::new(move || {
        work.wait()
            .map(|bufs| bufs.into_iter().map(T::wrap).collect())
    }))
}

impl HostBuf {
    /// An empty buffer of `dtype`, or the error naming an unsupported dtype.
    pub(crate) fn empty(dtype: DType, op: &'static str, group: &str) -> Result<HostBuf> {
        HostBuf::of_dtype(dtype).ok_or_else(|| Error::UnsupportedDType {
            op,
            group: group.to_owned(),
            dtype,
            supported: SUPPORTED,
        })
    }

    /// An empty buffer of `dtype`, if the host communicator carries it: the one map from candle's dtypes to
    /// [`HostBuf`]'s variants.
    fn of_dtype(dtype: DType) -> Option<HostBuf> {
        Some(match dtype {
            DType::U8 => HostBuf::U8(Vec::new()),
            DType::U32 => HostBuf::U32(Vec::new()),
            DType::I32 => HostBuf::I32(Vec::new()),
            DType::I64 => HostBuf::I64(Vec::new()),
            DType::F16 => HostBuf::F16(Vec::new()),
            DType::BF16 => HostBuf::BF16(Vec::new()),
            DType::F8E4M3 => HostBuf::F8E4M3(Vec::new()),
            DType::F32 => HostBuf::F32(Vec::new()),
            DType::F64 => HostBuf::F64(Vec::new()),
            _ => return None,
        })
    }

    /// `n` zeros of `dtype`, or the error naming an unsupported dtype.
    pub(crate) fn zeros(dtype: DType, n: usize, op: &'static str, group: &str) -> Result<HostBuf> {
        let mut buf = HostBuf::empty(dtype, op, group)?;
        each!(&mut buf, v, _wrap => v.resize(n, Default::default()));
        Ok(buf)
    }

    /// The element type's name, as the communicator names it (`f32`).
    pub(crate) fn dtype_name(&self) -> hypercomm_comm::DType {
        fn name<T: Element>(_: &[T]) -> hypercomm_comm::DType {
            T::DTYPE
        }
        each!(self, v, _wrap => name(v))
    }

    /// The elements of a CPU tensor in row-major order (a non-contiguous tensor is read through its layout).
    pub(crate) fn from_tensor(t: &Tensor, op: &'static str, group: &str) -> Result<HostBuf> {
        check_tensor(t, op, group)?;
        let mut buf = HostBuf::empty(t.dtype(), op, group)?;
        buf.append(t)?;
        Ok(buf)
    }

    /// Appends the elements of `t`, which must have this buffer's dtype.
    pub(crate) fn append(&mut self, t: &Tensor) -> Result<()> {
        each!(self, v, _wrap => with_elements(t, no_elements(v), |e| v.extend_from_slice(e)))
    }

    /// The elements of a custom op's input: `storage` read through `layout`, which must be contiguous (the
    /// callers make it so before applying the op).
    pub(crate) fn from_storage(
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<HostBuf> {
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!(
                "hypercomm: a custom op got a non-contiguous input (layout {layout:?})"
            )
        };
        let Some(mut buf) = HostBuf::of_dtype(storage.dtype()) else {
            candle_core::bail!(
                "hypercomm: tensors of dtype {:?} cannot be communicated (supported: {SUPPORTED})",
                storage.dtype()
            )
        };
        each!(&mut buf, v, _wrap => v.extend_from_slice(&elements_of(storage, no_elements(v))?[start..end]));
        Ok(buf)
    }

    /// The buffer as candle CPU storage.
    pub(crate) fn into_storage(self) -> CpuStorage {
        each!(self, v, _wrap => candle_core::WithDType::to_cpu_storage_owned(v))
    }

    /// Makes room for `additional` more elements at once (a bucket whose size is planned grows once).
    pub(crate) fn reserve(&mut self, additional: usize) {
        each!(self, v, _wrap => v.reserve_exact(additional));
    }

    /// Number of elements.
    pub(crate) fn len(&self) -> usize {
        each!(self, v, _wrap => v.len())
    }

    /// The whole buffer as a tensor of `shape` on `device`.
    pub(crate) fn into_tensor(self, shape: impl Into<Shape>, device: &Device) -> Result<Tensor> {
        Ok(each!(self, v, _wrap => Tensor::from_vec(v, shape, device)?))
    }

    /// Issues an in-place all-reduce.
    pub(crate) fn all_reduce(
        self,
        comm: &Communicator,
        op: ReduceOp,
    ) -> Result<Pending, CommError> {
        each!(self, v, wrap => {
            let work = comm.all_reduce(v, op)?;
            Ok(Pending(Box::new(move || work.wait().map(wrap))))
        })
    }

    /// Issues an in-place broadcast from group rank `root`.
    pub(crate) fn broadcast(self, comm: &Communicator, root: usize) -> Result<Pending, CommError> {
        each!(self, v, wrap => {
            let work = comm.broadcast(v, root)?;
            Ok(Pending(Box::new(move || work.wait().map(wrap))))
        })
    }

    /// Issues an all-gather: the result holds every rank's buffer in rank order.
    pub(crate) fn all_gather(self, comm: &Communicator) -> Result<Pending, CommError> {
        let n = comm.size();
        each!(self, v, wrap => {
            let out = vec![Default::default(); v.len() * n];
            let work = comm.all_gather_into(v, out)?;
            Ok(Pending(Box::new(move || work.wait().map(|(_, out)| wrap(out)))))
        })
    }

    /// Issues an all-to-all with per-rank element counts: the buffer holds `send_counts[d]` elements for each
    /// rank `d` back to back; the result holds `recv_counts[s]` elements from each rank `s` back to back.
    pub(crate) fn all_to_all_v(
        self,
        comm: &Communicator,
        send_counts: Vec<usize>,
        recv_counts: Vec<usize>,
    ) -> Result<Pending, CommError> {
        let total = recv_counts.iter().sum();
        each!(self, v, wrap => {
            let out = vec![Default::default(); total];
            let work = comm.all_to_all_v(v, send_counts, out, recv_counts)?;
            Ok(Pending(Box::new(move || work.wait().map(|(_, out)| wrap(out)))))
        })
    }

    /// Issues `parts` as one batch (every part progresses at once; see `Communicator::batch`): the buffers come
    /// back in the parts' order, the receives filled. Every part holds the element type of the first.
    pub(crate) fn batch(
        comm: &Communicator,
        parts: Vec<P2p<HostBuf>>,
    ) -> Result<Pending<Vec<HostBuf>>, CommError> {
        let Some(first) = parts.first() else {
            return Ok(Pending::new(|| Ok(Vec::new())));
        };
        each!(first.buf(), v, _wrap => {
            let like = no_elements(v);
            batch_of(comm, parts, like)
        })
    }

    /// Issues a reduce-scatter: the buffer holds one block per rank; the result is the reduction of every rank's
    /// block at this rank's position.
    pub(crate) fn reduce_scatter(
        self,
        comm: &Communicator,
        op: ReduceOp,
    ) -> Result<Pending, CommError> {
        let n = comm.size();
        each!(self, v, wrap => {
            let out = vec![Default::default(); v.len() / n];
            let work = comm.reduce_scatter_into(v, out, op)?;
            Ok(Pending(Box::new(move || work.wait().map(|(_, out)| wrap(out)))))
        })
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Tensor};

    use super::HostBuf;

    /// 0, 1, .., n - 1 as f32, shaped `dims`.
    fn iota(dims: &[usize]) -> Tensor {
        let n: usize = dims.iter().product();
        Tensor::arange(0u32, n as u32, &Device::Cpu)
            .and_then(|t| t.to_dtype(DType::F32))
            .and_then(|t| t.reshape(dims))
            .expect("iota")
    }

    #[test]
    fn appending_reads_views_in_row_major_order() {
        let m = iota(&[3, 4]);
        // A contiguous view that starts inside its storage (rows 1-2), borrowed in place.
        let rows = m.narrow(0, 1, 2).expect("narrow");
        assert!(rows.is_contiguous());
        // A transposed view, which is read through a contiguous copy.
        let cols = m.t().expect("t");
        assert!(!cols.is_contiguous());
        let mut buf = HostBuf::empty(DType::F32, "test", "g").expect("empty");
        buf.append(&rows).expect("rows");
        buf.append(&cols).expect("cols");
        let mut want: Vec<f32> = (4..12).map(|x| x as f32).collect();
        want.extend((0..4).flat_map(|c| (0..3).map(move |r| (r * 4 + c) as f32)));
        assert_eq!(buf, HostBuf::F32(want));
    }
}
