//! Copies into large output buffers that bypass the cache.
//!
//! An ordinary store to a line that is not in the cache first reads the line from memory ("read for ownership"),
//! so filling a cold output of `S` bytes moves `2S` through the memory bus. When a collective's whole output is
//! larger than the cache can keep (an all-gather's output, a broadcast's buffer on the receivers), its lines are
//! cold and will be evicted before anyone reads them again, and the read buys nothing. Non-temporal stores
//! (`movntdq`) write whole lines straight to memory without reading them, moving `S` instead of `2S` (about twice
//! `memcpy`'s speed for a cold 16 MiB output; figures in `docs/perf/host-collectives.md`).
//!
//! Non-temporal stores are weakly ordered, so every copy ends with a store fence: once [`copy`] returns, the bytes
//! are ordered before any later store of this thread (the release that hands the buffer to another thread).

/// Outputs of at least this many bytes are written with non-temporal stores: beyond what this rank can expect to
/// keep of the last-level cache, which its peers and their buffers share.
pub(crate) const STREAM_OUTPUT_BYTES: usize = 8 << 20;

/// Whether copies into an output of `len` bytes should bypass the cache.
pub(crate) fn bypass_cache(len: usize) -> bool {
    len >= STREAM_OUTPUT_BYTES
}

/// Copies `src` into `dst` (equal lengths), with non-temporal stores when `stream` is set and the machine has them
/// (x86-64), with `copy_from_slice` otherwise.
pub(crate) fn copy(dst: &mut [u8], src: &[u8], stream: bool) {
    assert_eq!(dst.len(), src.len(), "stream copy of unequal lengths");
    #[cfg(target_arch = "x86_64")]
    if stream {
        return x86::copy(dst, src);
    }
    let _ = stream;
    dst.copy_from_slice(src);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};

    const LANE: usize = 16;

    pub(super) fn copy(dst: &mut [u8], src: &[u8]) {
        // Ordinary copies up to the first 16-byte-aligned byte of `dst` and after the last whole lane.
        let head = dst.as_ptr().align_offset(LANE).min(dst.len());
        let lanes = (dst.len() - head) / LANE;
        let tail = head + lanes * LANE;
        dst[..head].copy_from_slice(&src[..head]);
        let d = dst[head..tail].as_mut_ptr().cast::<__m128i>();
        let s = src[head..tail].as_ptr().cast::<__m128i>();
        for i in 0..lanes {
            // SAFETY: SSE2 is part of x86-64. Lane `i` lies within `dst[head..tail]` and `src[head..tail]`
            // (`lanes` whole lanes fit there); `d` is 16-byte aligned (`head` is the offset that aligns `dst`),
            // as `_mm_stream_si128` requires; the source load has no alignment requirement. The two slices are
            // distinct borrows, so they do not overlap.
            unsafe { _mm_stream_si128(d.add(i), _mm_loadu_si128(s.add(i))) };
        }
        dst[tail..].copy_from_slice(&src[tail..]);
        // SAFETY: SSE is part of x86-64; the fence orders the non-temporal stores above before later stores.
        unsafe { _mm_sfence() };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_alignment_and_length_copies_exactly_the_source() {
        let src: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
        for offset in 0..48 {
            for len in (0..200).chain([1000, 4000 - offset]) {
                let mut dst = vec![0xAAu8; 4096 + 64];
                let from = &src[offset / 2..offset / 2 + len];
                copy(&mut dst[offset..offset + len], from, true);
                assert_eq!(
                    &dst[offset..offset + len],
                    from,
                    "offset {offset}, len {len}"
                );
                assert!(
                    dst[..offset].iter().all(|&b| b == 0xAA),
                    "before, offset {offset}, len {len}"
                );
                assert!(
                    dst[offset + len..].iter().all(|&b| b == 0xAA),
                    "after, offset {offset}, len {len}"
                );
            }
        }
    }

    #[test]
    fn only_outputs_past_the_threshold_bypass_the_cache() {
        assert!(!bypass_cache(STREAM_OUTPUT_BYTES - 1));
        assert!(bypass_cache(STREAM_OUTPUT_BYTES));
    }
}
