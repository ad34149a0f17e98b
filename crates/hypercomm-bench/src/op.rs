//! What is measured, counted as nccl-tests counts it: the collectives ([`BenchOp`]), their buffer sizes and
//! bus-bandwidth factors, one size's result ([`BenchResult`]), and how many iterations a size gets
//! ([`iterations`]).
//!
//! `bytes` is the whole buffer as nccl-tests counts it: the all-reduce/broadcast/reduce buffer, the all-gather
//! output, the reduce-scatter input, the all-to-all buffer. `algbw = bytes / time`; `busbw = algbw * factor` with
//! nccl-tests' factors (see [`BenchOp::bus_factor`]), which make the figures of different collectives and rank
//! counts comparable on one network.

/// A benchmarked collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchOp {
    /// In-place sum all-reduce.
    AllReduce,
    /// Out-of-place all-gather into one buffer.
    AllGather,
    /// Out-of-place sum reduce-scatter from one buffer.
    ReduceScatter,
    /// In-place broadcast from rank 0.
    Broadcast,
    /// In-place sum reduce to rank 0.
    Reduce,
    /// Out-of-place all-to-all with equal blocks.
    AllToAll,
}

impl BenchOp {
    /// Every benchmarked collective.
    pub const ALL: [BenchOp; 6] = [
        BenchOp::AllReduce,
        BenchOp::AllGather,
        BenchOp::ReduceScatter,
        BenchOp::Broadcast,
        BenchOp::Reduce,
        BenchOp::AllToAll,
    ];

    /// The snake-case name (`"all_reduce"`).
    pub fn name(self) -> &'static str {
        match self {
            BenchOp::AllReduce => "all_reduce",
            BenchOp::AllGather => "all_gather",
            BenchOp::ReduceScatter => "reduce_scatter",
            BenchOp::Broadcast => "broadcast",
            BenchOp::Reduce => "reduce",
            BenchOp::AllToAll => "all_to_all",
        }
    }

    /// The operation named `name`, if any.
    pub fn from_name(name: &str) -> Option<BenchOp> {
        BenchOp::ALL.into_iter().find(|o| o.name() == name)
    }

    /// Per-rank `f32` element counts `(input, output)` such that the buffer nccl-tests counts holds `bytes`
    /// (rounded down to whole elements per rank) on `n` ranks; in-place operations have no output (0).
    ///
    /// ```
    /// use hypercomm_bench::BenchOp;
    ///
    /// assert_eq!(BenchOp::AllReduce.buffer_lens(4096, 4), (1024, 0));
    /// assert_eq!(BenchOp::AllGather.buffer_lens(4096, 4), (256, 1024));
    /// assert_eq!(BenchOp::ReduceScatter.buffer_lens(4096, 4), (1024, 256));
    /// ```
    pub fn buffer_lens(self, bytes: usize, n: usize) -> (usize, usize) {
        let total = bytes / 4;
        let n = n.max(1);
        match self {
            BenchOp::AllReduce | BenchOp::Broadcast | BenchOp::Reduce => (total, 0),
            BenchOp::AllGather => (total / n, total / n * n),
            BenchOp::ReduceScatter => (total / n * n, total / n),
            BenchOp::AllToAll => (total / n * n, total / n * n),
        }
    }

    /// Whether a symmetric-buffer form of the collective exists (all-reduce, all-gather, reduce-scatter), which
    /// [`host::BenchConfig::symmetric`](crate::host::BenchConfig::symmetric) can measure.
    pub fn has_symmetric_form(self) -> bool {
        matches!(
            self,
            BenchOp::AllReduce | BenchOp::AllGather | BenchOp::ReduceScatter
        )
    }

    /// nccl-tests' bus-bandwidth factor for `n` ranks: all-reduce `2(n-1)/n`; all-gather, reduce-scatter and
    /// all-to-all `(n-1)/n`; broadcast and reduce 1.
    pub fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            BenchOp::AllReduce => 2.0 * (n - 1.0) / n,
            BenchOp::AllGather | BenchOp::ReduceScatter | BenchOp::AllToAll => (n - 1.0) / n,
            BenchOp::Broadcast | BenchOp::Reduce => 1.0,
        }
    }
}

/// One measured size.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchResult {
    /// The collective.
    pub op: BenchOp,
    /// Rank count.
    pub ranks: usize,
    /// Whole buffer size in bytes, as nccl-tests counts it.
    pub bytes: usize,
    /// `f32` elements in that buffer.
    pub count: usize,
    /// Median time of one operation, in microseconds.
    pub time_us: f64,
    /// `bytes / time`, in GB/s (10^9 bytes per second).
    pub algbw_gbps: f64,
    /// `algbw * factor`, in GB/s.
    pub busbw_gbps: f64,
    /// The transport used (`"shm"` or `"tcp"` on the host backend, `"nccl"` on the device).
    pub transport: &'static str,
}

impl BenchResult {
    /// The result for `op` on `ranks` ranks moving `elements` `f32`s (the larger of input and output) in
    /// `time_us` per operation.
    ///
    /// ```
    /// use hypercomm_bench::{BenchOp, BenchResult};
    ///
    /// let r = BenchResult::new(BenchOp::AllReduce, 4, 1 << 20, 1000.0, "shm");
    /// assert_eq!(r.bytes, 4 << 20);
    /// assert!((r.algbw_gbps - 4.194304).abs() < 1e-9);
    /// assert!((r.busbw_gbps - 1.5 * r.algbw_gbps).abs() < 1e-9);
    /// ```
    pub fn new(
        op: BenchOp,
        ranks: usize,
        elements: usize,
        time_us: f64,
        transport: &'static str,
    ) -> BenchResult {
        let bytes = 4 * elements;
        let algbw = if time_us > 0.0 {
            bytes as f64 / (time_us * 1e3)
        } else {
            0.0
        };
        BenchResult {
            op,
            ranks,
            bytes,
            count: elements,
            time_us,
            algbw_gbps: algbw,
            busbw_gbps: algbw * op.bus_factor(ranks),
            transport,
        }
    }

    /// The result as one row of a benchmark's JSON: `{"op", "ranks", "bytes", "time_us", "algbw_GBps",
    /// "busbw_GBps"}`.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "op": self.op.name(), "ranks": self.ranks, "bytes": self.bytes, "time_us": self.time_us,
            "algbw_GBps": self.algbw_gbps, "busbw_GBps": self.busbw_gbps,
        })
    }
}

/// Timed iterations for a size of `bytes`: enough to move about 256 MiB, between 5 and `max` (and at least 5
/// whatever `max` says), so that small sizes get many samples and large ones stay short.
///
/// ```
/// use hypercomm_bench::op::iterations;
///
/// assert_eq!(iterations(8, 200), 200);
/// assert_eq!(iterations(16 << 20, 200), 16);
/// assert_eq!(iterations(1 << 30, 200), 5);
/// ```
pub fn iterations(bytes: usize, max: usize) -> usize {
    ((256usize << 20) / bytes.max(1)).clamp(5, max.max(5))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_all_reduce_all_gather_and_reduce_scatter_have_a_symmetric_form() {
        let symmetric: Vec<&str> = BenchOp::ALL
            .iter()
            .filter(|o| o.has_symmetric_form())
            .map(|o| o.name())
            .collect();
        assert_eq!(symmetric, ["all_reduce", "all_gather", "reduce_scatter"]);
    }

    #[test]
    fn factors_match_nccl_tests() {
        assert_eq!(BenchOp::AllReduce.bus_factor(2), 1.0);
        assert_eq!(BenchOp::AllReduce.bus_factor(4), 1.5);
        assert_eq!(BenchOp::AllGather.bus_factor(4), 0.75);
        assert_eq!(BenchOp::Broadcast.bus_factor(8), 1.0);
        assert_eq!(
            BenchOp::from_name("reduce_scatter"),
            Some(BenchOp::ReduceScatter)
        );
        assert_eq!(BenchOp::from_name("all-reduce"), None);
    }

    #[test]
    fn a_result_row_names_the_op_and_its_figures() {
        let row = BenchResult::new(BenchOp::AllGather, 2, 256, 2.0, "shm").json();
        assert_eq!(row["op"], "all_gather");
        assert_eq!(row["bytes"], 1024);
        assert_eq!(row["algbw_GBps"], 0.512);
        assert_eq!(row["busbw_GBps"], 0.256);
    }
}
