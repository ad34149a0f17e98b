//! Device operations that launch hypercomm's NVRTC kernels: the strided all-reduce (pack, reduce, unpack) and
//! the fill/verify patterns the GPU tests and the bench check results with.

use cudarc::driver::{DevicePtr, LaunchConfig, PushKernelArg};

use super::super::flight::Partners;
use super::super::gpu::{DeviceBuffer, cuda_err};
use super::super::raw::Call;
use super::DeviceCommunicator;
use crate::element::{Element, ReduceOp};
use crate::strided::StridedLayout;
use crate::{CommError, Work};

impl DeviceCommunicator {
    /// All-reduce in place over the elements of `view` in `buf`. A contiguous view runs directly on its part of
    /// the buffer; any other is packed into a staging buffer, reduced there, and unpacked back into the view, so
    /// the result always lands in the caller's elements. Inside an open [`OpGroup`](crate::OpGroup) only a
    /// contiguous view is taken: the kernels around the reduction of any other would run before the group issues
    /// it.
    pub fn all_reduce_strided<T: Element>(
        &self,
        buf: DeviceBuffer<T>,
        view: StridedLayout,
        op: ReduceOp,
    ) -> Result<Work<DeviceBuffer<T>>, CommError> {
        self.recorded(
            "all_reduce_strided",
            Partners::default(),
            T::DTYPE,
            view.len(),
            || self.strided(buf, view, op),
        )
    }

    /// [`all_reduce_strided`](Self::all_reduce_strided), once numbered.
    fn strided<T: Element>(
        &self,
        mut buf: DeviceBuffer<T>,
        view: StridedLayout,
        op: ReduceOp,
    ) -> Result<Work<DeviceBuffer<T>>, CommError> {
        self.check_device("buffer", &buf)?;
        view.check_fits(buf.len())
            .map_err(|what| self.invalid(what))?;
        let width = T::DTYPE.size();
        crate::checks::reduction(self.name(), "all_reduce_strided", op, T::DTYPE)?;
        let op = self.comm.reduction(op, T::DTYPE)?;
        let reduce = |at: u64| Call::AllReduce {
            send: at,
            recv: at,
            count: view.len(),
            dtype: T::DTYPE,
            op,
        };
        if view.is_contiguous() {
            let offset = (view.offset() * width) as u64;
            return self
                .one_buffer(buf, |p, _| Ok([reduce(p + offset)]))
                .map(Work::from);
        }
        // The pack and unpack kernels run when they are launched, so the reduction between them cannot wait for a
        // group's end.
        self.refuse_in_group("all_reduce_strided of a view that is not contiguous")?;
        let kernels = self.gpu.kernels()?;
        let mut staging = self.gpu.alloc_zeros::<u8>(view.len() * width)?;
        let (pack, unpack) = match (kernels.pack(width), kernels.unpack(width)) {
            (Some(p), Some(u)) => (p, u),
            _ => return Err(self.invalid(format!("no pack kernel for {width}-byte elements"))),
        };
        let dims = [
            view.offset() as u64,
            view.rows() as u64,
            view.cols() as u64,
            view.row_stride() as u64,
        ];
        let cfg = launch_config(view.len());
        {
            let mut launch = self.stream.launch_builder(pack);
            launch
                .arg(staging.slice_mut())
                .arg(buf.slice_after(&self.stream)?);
            for d in &dims {
                launch.arg(d);
            }
            // SAFETY: hypercomm_pack_<width>(dst, src, offset, rows, cols, row_stride) reads view.end() <=
            // buf.len() elements of `width` bytes from `buf` and writes view.len() to `staging`, sized for that.
            unsafe { launch.launch(cfg) }
                .map_err(cuda_err(&self.options.name, "launching pack"))?;
        }
        // Reduce the staging buffer, then unpack; the handle's event comes after the unpack, so waiting on it
        // sees the caller's view updated.
        {
            let p = staging.address_on(&self.stream);
            self.enqueue(&[reduce(p)])?;
        }
        {
            let mut launch = self.stream.launch_builder(unpack);
            launch
                .arg(buf.slice_mut())
                .arg(staging.slice_after(&self.stream)?);
            for d in &dims {
                launch.arg(d);
            }
            // SAFETY: hypercomm_unpack_<width> reads view.len() elements from `staging` and writes the view's
            // elements of `buf`, all below view.end() <= buf.len() (checked above); rows do not overlap.
            unsafe { launch.launch(cfg) }
                .map_err(cuda_err(&self.options.name, "launching unpack"))?;
        }
        self.finish(buf, vec![staging]).map(Work::from)
    }

    /// Fills `buf` with the pattern `a * (i % 61) + b` on this communicator's stream (NVRTC kernel).
    pub fn fill_pattern<T: Element>(
        &self,
        buf: &mut DeviceBuffer<T>,
        a: i64,
        b: i64,
    ) -> Result<(), CommError> {
        let kernels = self.gpu.kernels()?;
        let f = kernels
            .fill(T::DTYPE)
            .ok_or_else(|| self.invalid(format!("no fill kernel for {}", T::DTYPE)))?;
        let n = buf.len() as u64;
        let cfg = launch_config(buf.len());
        let mut launch = self.stream.launch_builder(f);
        launch.arg(buf.slice_mut()).arg(&n).arg(&a).arg(&b);
        // SAFETY: hypercomm_fill_<dtype>(data, n, a, b) writes n elements of T; the buffer holds n.
        unsafe { launch.launch(cfg) }.map_err(cuda_err(&self.options.name, "launching fill"))?;
        Ok(())
    }

    /// Counts the elements of `buf` that differ from the pattern `a * (i % 61) + b`, and the first such index
    /// (after the work enqueued on this communicator's stream; blocks the CPU).
    pub fn verify_pattern<T: Element>(
        &self,
        buf: &DeviceBuffer<T>,
        a: i64,
        b: i64,
    ) -> Result<(u64, Option<u64>), CommError> {
        let kernels = self.gpu.kernels()?;
        let f = kernels
            .verify(T::DTYPE)
            .ok_or_else(|| self.invalid(format!("no verify kernel for {}", T::DTYPE)))?;
        let counters = self.gpu.upload(&[0u64, u64::MAX])?;
        let n = buf.len() as u64;
        {
            let mut launch = self.stream.launch_builder(f);
            // The kernel takes two counter pointers; both point into one two-element buffer.
            let (base, _g) = counters.slice_after(&self.stream)?.device_ptr(&self.stream);
            let (mismatches, first_bad) = (base, base + 8);
            launch
                .arg(buf.slice_after(&self.stream)?)
                .arg(&n)
                .arg(&a)
                .arg(&b)
                .arg(&mismatches)
                .arg(&first_bad);
            // SAFETY: hypercomm_verify_<dtype>(data, n, a, b, mismatches, first_bad) reads n elements of `buf`
            // and updates two u64 counters at `base` and `base + 8`, which `counters` holds.
            unsafe { launch.launch(launch_config(buf.len())) }
                .map_err(cuda_err(&self.options.name, "launching verify"))?;
        }
        self.stream
            .synchronize()
            .map_err(cuda_err(&self.options.name, "synchronizing verify"))?;
        let host = counters.download()?;
        Ok((host[0], (host[1] != u64::MAX).then_some(host[1])))
    }
}

/// Grid for `n` elements: 256 threads per block, at most 1024 blocks (the kernels loop over the rest).
fn launch_config(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(256).clamp(1, 1024) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_grid_covers_small_sizes_and_caps_large_ones() {
        assert_eq!(launch_config(0).grid_dim.0, 1);
        assert_eq!(launch_config(257).grid_dim.0, 2);
        assert_eq!(launch_config(1 << 30).grid_dim.0, 1024);
    }
}
