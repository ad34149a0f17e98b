//! [`StridedLayout`]: which elements of a device buffer a collective uses, when they are not contiguous.
//!
//! A layout is `rows` rows of `cols` elements; row `r` starts `offset + r * row_stride` elements into the buffer.
//! A column slice of a row-major matrix is the usual case: columns 2..6 of an 8-column matrix are
//! `StridedLayout::new(2, rows, 4, 8)`. Collectives on a layout that is not contiguous pack it into a staging
//! buffer, run there, and unpack the result back into these elements ([`pack`](StridedLayout::pack_host) and
//! [`unpack`](StridedLayout::unpack_host) are the host reference of what the kernels do).

/// A 2-D strided view of a buffer, in elements. Invariant: `row_stride >= cols` when there is more than one row,
/// so rows never overlap and unpacking writes each element once.
///
/// ```
/// use hypercomm_comm::device::StridedLayout;
///
/// // Columns 1..3 of a 3 x 4 row-major matrix.
/// let view = StridedLayout::new(1, 3, 2, 4).unwrap();
/// assert!(!view.is_contiguous());
/// assert_eq!(view.len(), 6);
/// assert_eq!(view.end(), 11);
/// let matrix: Vec<u32> = (0..12).collect();
/// let mut packed = vec![0; 6];
/// view.pack_host(&matrix, &mut packed);
/// assert_eq!(packed, [1, 2, 5, 6, 9, 10]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StridedLayout {
    offset: usize,
    rows: usize,
    cols: usize,
    row_stride: usize,
}

impl StridedLayout {
    /// `len` contiguous elements from `offset`.
    pub fn contiguous(offset: usize, len: usize) -> StridedLayout {
        StridedLayout {
            offset,
            rows: 1,
            cols: len,
            row_stride: len,
        }
    }

    /// `rows` rows of `cols` elements, row `r` at `offset + r * row_stride`. Errors name the value and the rule:
    /// overlapping rows (`row_stride < cols` with several rows) and sizes that overflow `usize`.
    pub fn new(
        offset: usize,
        rows: usize,
        cols: usize,
        row_stride: usize,
    ) -> Result<StridedLayout, String> {
        if rows > 1 && row_stride < cols {
            return Err(format!(
                "row_stride={row_stride} is less than cols={cols}: rows would overlap"
            ));
        }
        let layout = StridedLayout {
            offset,
            rows,
            cols,
            row_stride,
        };
        rows.checked_mul(cols)
            .and_then(|_| layout.checked_end())
            .ok_or_else(|| {
                format!(
                    "layout offset={offset} rows={rows} cols={cols} row_stride={row_stride} overflows usize"
                )
            })?;
        Ok(layout)
    }

    fn checked_end(&self) -> Option<usize> {
        if self.rows == 0 || self.cols == 0 {
            return Some(self.offset);
        }
        (self.rows - 1)
            .checked_mul(self.row_stride)?
            .checked_add(self.cols)?
            .checked_add(self.offset)
    }

    /// Elements in the view (`rows * cols`).
    pub fn len(&self) -> usize {
        self.rows * self.cols
    }

    /// Whether the view has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// One past the last buffer element the view touches; the buffer must hold at least this many.
    pub fn end(&self) -> usize {
        // `new` checked that this does not overflow; `contiguous` cannot overflow it beyond offset + len.
        self.checked_end().unwrap_or(usize::MAX)
    }

    /// Whether the elements are one contiguous run (then collectives use the buffer directly, no staging).
    pub fn is_contiguous(&self) -> bool {
        self.rows <= 1 || self.row_stride == self.cols
    }

    /// The first element.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Elements per row.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Elements from one row's start to the next's.
    pub fn row_stride(&self) -> usize {
        self.row_stride
    }

    /// Checks that a buffer of `buffer_len` elements holds the view.
    pub fn check_fits(&self, buffer_len: usize) -> Result<(), String> {
        if self.end() > buffer_len {
            return Err(format!(
                "strided view ending at element {} does not fit a buffer of {buffer_len} elements",
                self.end()
            ));
        }
        Ok(())
    }

    /// Host reference of the pack kernel: `dst[r * cols + c] = src[offset + r * row_stride + c]`.
    /// `dst` must hold `len()` elements and `src` at least `end()`; shorter slices panic (test helper).
    pub fn pack_host<T: Copy>(&self, src: &[T], dst: &mut [T]) {
        for r in 0..self.rows {
            let from = self.offset + r * self.row_stride;
            dst[r * self.cols..(r + 1) * self.cols].copy_from_slice(&src[from..from + self.cols]);
        }
    }

    /// Host reference of the unpack kernel, the inverse of [`pack_host`](Self::pack_host); elements of `dst`
    /// outside the view are left unchanged.
    pub fn unpack_host<T: Copy>(&self, src: &[T], dst: &mut [T]) {
        for r in 0..self.rows {
            let to = self.offset + r * self.row_stride;
            dst[to..to + self.cols].copy_from_slice(&src[r * self.cols..(r + 1) * self.cols]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguity() {
        assert!(StridedLayout::contiguous(3, 10).is_contiguous());
        assert!(StridedLayout::new(0, 4, 8, 8).unwrap().is_contiguous());
        assert!(StridedLayout::new(5, 1, 8, 100).unwrap().is_contiguous());
        assert!(!StridedLayout::new(0, 2, 8, 9).unwrap().is_contiguous());
    }

    #[test]
    fn overlapping_and_overflowing_layouts_are_refused() {
        let e = StridedLayout::new(0, 2, 8, 7).unwrap_err();
        assert!(e.contains("row_stride=7 is less than cols=8"), "{e}");
        assert!(StridedLayout::new(0, usize::MAX, 2, 2).is_err());
        assert!(StridedLayout::new(usize::MAX, 1, 2, 2).is_err());
        // One row may have any stride: it is never used.
        assert!(StridedLayout::new(0, 1, 8, 0).is_ok());
    }

    #[test]
    fn fits_checks_the_last_touched_element() {
        let v = StridedLayout::new(2, 3, 2, 5).unwrap();
        assert_eq!(v.end(), 2 + 2 * 5 + 2);
        assert!(v.check_fits(14).is_ok());
        let e = v.check_fits(13).unwrap_err();
        assert!(
            e.contains("ending at element 14") && e.contains("13 elements"),
            "{e}"
        );
        assert_eq!(StridedLayout::new(7, 0, 4, 4).unwrap().end(), 7);
    }

    #[test]
    fn unpack_inverts_pack_and_touches_only_the_view() {
        let v = StridedLayout::new(1, 4, 3, 5).unwrap();
        let src: Vec<i32> = (0..25).collect();
        let mut packed = vec![0; v.len()];
        v.pack_host(&src, &mut packed);
        assert_eq!(packed, [1, 2, 3, 6, 7, 8, 11, 12, 13, 16, 17, 18]);
        let doubled: Vec<i32> = packed.iter().map(|x| x * 2).collect();
        let mut dst = vec![-1; 25];
        v.unpack_host(&doubled, &mut dst);
        for (i, &x) in dst.iter().enumerate() {
            let in_view = i >= 1 && (i - 1) % 5 < 3 && i < v.end();
            assert_eq!(x, if in_view { 2 * i as i32 } else { -1 }, "element {i}");
        }
    }
}
