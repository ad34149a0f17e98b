//! Gradient buckets for [`GradSync`](crate::ddp::GradSync): one open bucket per element type, filled with
//! gradients in variable order and handed back once it holds the bucket size, so its all-reduce can start while
//! the next bucket fills.
//!
//! What a bucket holds is the caller's: flattened host vectors for CPU tensors, flattened device tensors for CUDA
//! ones ([`Fill`]). The bookkeeping — which bucket a gradient joins, at which element offset, and when a bucket is
//! full — is this module's, the same for both.

use candle_core::{DType, Tensor};

use crate::Result;

/// The contents of a bucket: what gradients are appended to.
pub(crate) trait Fill {
    /// Elements held.
    fn elements(&self) -> usize;
    /// Bytes held.
    fn bytes(&self) -> usize;
    /// Appends `grad`'s elements in row-major order (`grad` has the bucket's dtype).
    fn push(&mut self, grad: &Tensor) -> Result<()>;
}

/// Elements and bytes of the gradients appended so far: the size of a bucket whose contents keep no count of
/// their own.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tally {
    pub(crate) elements: usize,
    pub(crate) bytes: usize,
}

impl Tally {
    /// Counts `grad`.
    pub(crate) fn add(&mut self, grad: &Tensor) {
        self.elements += grad.elem_count();
        self.bytes += grad.elem_count() * grad.dtype().size_in_bytes();
    }
}

/// A bucket that only counts: what plans buckets before anything is flattened.
impl Fill for Tally {
    fn elements(&self) -> usize {
        self.elements
    }
    fn bytes(&self) -> usize {
        self.bytes
    }
    fn push(&mut self, grad: &Tensor) -> Result<()> {
        self.add(grad);
        Ok(())
    }
}

/// A bucket: its contents and, per gradient in it, the variable's index and the gradient's first element.
pub(crate) struct Bucket<F> {
    pub(crate) fill: F,
    pub(crate) members: Vec<(usize, usize)>,
}

/// The open buckets, one per dtype, and the size at which one is full.
pub(crate) struct Buckets<F> {
    limit: usize,
    open: Vec<(DType, Bucket<F>)>,
}

impl<F: Fill> Buckets<F> {
    /// No open buckets; a bucket is full at `limit` bytes (0: every gradient is a bucket of its own).
    pub(crate) fn new(limit: usize) -> Buckets<F> {
        Buckets {
            limit,
            open: Vec::new(),
        }
    }

    /// Appends variable `index`'s gradient to the open bucket of its dtype (made with `empty` if there is
    /// none) and returns that bucket if it is now full. A gradient is never split, so a bucket may exceed the
    /// limit by up to one gradient.
    pub(crate) fn add(
        &mut self,
        index: usize,
        grad: &Tensor,
        empty: impl FnOnce(DType) -> Result<F>,
    ) -> Result<Option<Bucket<F>>> {
        let dtype = grad.dtype();
        let slot = match self.open.iter().position(|(d, _)| *d == dtype) {
            Some(slot) => slot,
            None => {
                let bucket = Bucket {
                    fill: empty(dtype)?,
                    members: Vec::new(),
                };
                self.open.push((dtype, bucket));
                self.open.len() - 1
            }
        };
        let bucket = &mut self.open[slot].1;
        bucket.members.push((index, bucket.fill.elements()));
        bucket.fill.push(grad)?;
        if bucket.fill.bytes() >= self.limit {
            return Ok(Some(self.open.remove(slot).1));
        }
        Ok(None)
    }

    /// The partly filled buckets, in the order they were opened.
    pub(crate) fn rest(self) -> impl Iterator<Item = Bucket<F>> {
        self.open.into_iter().map(|(_, bucket)| bucket)
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Tensor};

    use super::{Bucket, Buckets, Tally};
    use crate::Result;

    fn zeros(n: usize, dtype: DType) -> Tensor {
        Tensor::zeros(n, dtype, &Device::Cpu).expect("zeros")
    }

    fn empty(_: DType) -> Result<Tally> {
        Ok(Tally::default())
    }

    fn members(b: &Bucket<Tally>) -> Vec<(usize, usize)> {
        b.members.clone()
    }

    #[test]
    fn one_bucket_per_dtype_with_offsets_and_full_at_the_limit() {
        let mut buckets = Buckets::new(40);
        // f32: 3 elements (12 B), f64: 2 (16 B), f32: 5 more (20 B, 32 in all), f32: 2 more (40 B: full).
        assert!(
            buckets
                .add(0, &zeros(3, DType::F32), empty)
                .unwrap()
                .is_none()
        );
        assert!(
            buckets
                .add(1, &zeros(2, DType::F64), empty)
                .unwrap()
                .is_none()
        );
        assert!(
            buckets
                .add(2, &zeros(5, DType::F32), empty)
                .unwrap()
                .is_none()
        );
        let full = buckets
            .add(3, &zeros(2, DType::F32), empty)
            .unwrap()
            .expect("the f32 bucket reached 40 bytes");
        assert_eq!(members(&full), [(0, 0), (2, 3), (3, 8)]);
        assert_eq!((full.fill.elements, full.fill.bytes), (10, 40));
        // A new f32 bucket opens after the full one left; the f64 one is still open.
        assert!(
            buckets
                .add(4, &zeros(1, DType::F32), empty)
                .unwrap()
                .is_none()
        );
        let rest: Vec<_> = buckets.rest().map(|b| members(&b)).collect();
        assert_eq!(rest, [vec![(1, 0)], vec![(4, 0)]]);
    }

    #[test]
    fn a_zero_limit_makes_every_gradient_its_own_bucket() {
        let mut buckets = Buckets::new(0);
        for i in 0..3 {
            let full = buckets.add(i, &zeros(4, DType::F32), empty).unwrap();
            assert_eq!(full.map(|b| members(&b)), Some(vec![(i, 0)]));
        }
        assert_eq!(buckets.rest().count(), 0);
    }
}
