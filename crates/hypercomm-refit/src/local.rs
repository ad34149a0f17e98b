//! [`Sharding::local_shard`]: the bytes one rank of a layout holds of a parameter, cut from the full tensor, and
//! [`Sharding::put_local_shard`], the way back.
//!
//! What a rank's buffers should contain after a refit, what a test or a job starting from a full checkpoint fills
//! its shards with, and how a gather rebuilds the full tensor: the same [`Runs`](crate::Runs) a plan copies
//! between shards, here between the whole tensor and one shard.

use hypercomm_grid::layout::ParallelLayout;

use crate::shard::Shard;
use crate::{ParamSharding, RefitError, Sharding};

impl Sharding {
    /// Rank `rank`'s local shard (row-major bytes) of `param`, one of this sharding's parameters, on `layout`, cut
    /// from `full`, the whole tensor's row-major bytes; `None` when the rank holds none of it. Fails when the
    /// layout does not fit the parameter or `full` is not the tensor's size.
    ///
    /// ```
    /// use hypercomm_refit::{DType, ParamSharding, Place, Sharding, Split, parse_layout};
    ///
    /// // A [2, 4] u8 weight split by rows (dim 1) over tp 2: rank 1 holds columns 2 and 3 of both rows.
    /// let mut sharding = Sharding::new(1, 0);
    /// sharding.push(ParamSharding::new("w", [2, 4], DType::U8, Split::ROW, Place::First));
    /// let layout = parse_layout("tp=2")?;
    /// let full = [0u8, 1, 2, 3, 4, 5, 6, 7];
    /// assert_eq!(sharding.local_shard(&sharding.params[0], &layout, 1, &full)?, Some(vec![2, 3, 6, 7]));
    /// # Ok::<(), hypercomm_refit::RefitError>(())
    /// ```
    pub fn local_shard(
        &self,
        param: &ParamSharding,
        layout: &ParallelLayout,
        rank: usize,
        full: &[u8],
    ) -> Result<Option<Vec<u8>>, RefitError> {
        let bytes = param.bytes()?;
        if full.len() as u64 != bytes {
            return Err(RefitError::WrongSize {
                name: param.name.clone(),
                what: "the full tensor",
                have: full.len() as u64,
                want: bytes,
            });
        }
        let Some((whole, mine, shard_bytes)) = self.shard_pair(param, layout, rank)? else {
            return Ok(None);
        };
        let mut out = vec![0u8; shard_bytes as usize];
        // The runs lie inside both: `overlap` intersects the whole tensor's box with the shard's boxes, and `full`
        // has the whole tensor's size (checked above), `out` the shard's.
        for runs in whole.overlap(&mine) {
            for (src, dst, len) in runs.iter() {
                let (src, dst, len) = (src as usize, dst as usize, len as usize);
                out[dst..dst + len].copy_from_slice(&full[src..src + len]);
            }
        }
        Ok(Some(out))
    }

    /// Writes `shard`, rank `rank`'s local shard of `param` on `layout`, where it belongs in `full`, the whole
    /// tensor's row-major bytes (what gathering the shards of a parameter into one rank does). Returns whether the
    /// rank holds a shard of it (when not, nothing is written). Fails when the layout does not fit the parameter,
    /// or `full` or `shard` is not of its size.
    ///
    /// ```
    /// use hypercomm_refit::{DType, ParamSharding, Place, Sharding, Split, parse_layout};
    ///
    /// let mut sharding = Sharding::new(1, 0);
    /// sharding.push(ParamSharding::new("w", [2, 4], DType::U8, Split::ROW, Place::First));
    /// let (layout, param) = (parse_layout("tp=2")?, &sharding.params[0]);
    /// let mut full = [0u8; 8];
    /// assert!(sharding.put_local_shard(param, &layout, 0, &[1, 2, 5, 6], &mut full)?);
    /// assert!(sharding.put_local_shard(param, &layout, 1, &[3, 4, 7, 8], &mut full)?);
    /// assert_eq!(full, [1, 2, 3, 4, 5, 6, 7, 8]);
    /// # Ok::<(), hypercomm_refit::RefitError>(())
    /// ```
    pub fn put_local_shard(
        &self,
        param: &ParamSharding,
        layout: &ParallelLayout,
        rank: usize,
        shard: &[u8],
        full: &mut [u8],
    ) -> Result<bool, RefitError> {
        let bytes = param.bytes()?;
        let wrong = |what, have: usize, want| RefitError::WrongSize {
            name: param.name.clone(),
            what,
            have: have as u64,
            want,
        };
        if full.len() as u64 != bytes {
            return Err(wrong("the full tensor", full.len(), bytes));
        }
        let Some((whole, mine, shard_bytes)) = self.shard_pair(param, layout, rank)? else {
            return Ok(false);
        };
        if shard.len() as u64 != shard_bytes {
            return Err(wrong("the shard", shard.len(), shard_bytes));
        }
        // As in `local_shard`, the other way: both sizes are checked above.
        for runs in mine.overlap(&whole) {
            for (src, dst, len) in runs.iter() {
                let (src, dst, len) = (src as usize, dst as usize, len as usize);
                full[dst..dst + len].copy_from_slice(&shard[src..src + len]);
            }
        }
        Ok(true)
    }

    /// The whole tensor of `param`, rank `rank`'s shard of it on `layout` and that shard's bytes; `None` when
    /// the rank holds none.
    fn shard_pair(
        &self,
        param: &ParamSharding,
        layout: &ParallelLayout,
        rank: usize,
    ) -> Result<Option<(Shard, Shard, u64)>, RefitError> {
        let placement = self.placement(param, layout)?;
        let Some(index) = placement.shard_of(rank) else {
            return Ok(None);
        };
        let elem = param.dtype.size();
        let whole = Shard::new(&param.shape, elem, None, 1, 0);
        let mine = Shard::new(
            &param.shape,
            elem,
            param.split.dim_blocks(),
            placement.parts,
            index,
        );
        Ok(Some((whole, mine, param.bytes()? / placement.parts)))
    }
}
