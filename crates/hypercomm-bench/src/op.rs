//! What is measured, counted as nccl-tests counts it: the collectives ([`BenchOp`]), their buffer sizes and
//! bus-bandwidth factors, one size's result ([`BenchResult`]), and how many iterations a size gets
//! ([`iterations`]).
//!
//! `bytes` is the whole buffer as nccl-tests counts it: the all-reduce/broadcast/reduce buffer, the all-gather
//! output, the reduce-scatter input, the all-to-all buffer; for the sendrecv ring, the message each rank sends
//! (and receives), as nccl-tests' sendrecv_perf counts it; for the all-to-all-v, everything each rank sends (its
//! whole input, its own block included), as nccl-tests' alltoall counts `count * nranks` elements: the
//! [seeded split sizes](crate::split_sizes) give every rank the same total, so this is the same on every rank.
//! `algbw = bytes / time`; `busbw = algbw * factor` with nccl-tests' factors (see [`BenchOp::bus_factor`]), which
//! make the figures of different collectives and rank counts comparable on one network.

use hypercomm_comm::CommError;

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
    /// A ring of point-to-point messages in one [`Communicator::batch`](hypercomm_comm::Communicator::batch):
    /// each rank sends to the next rank and receives from the previous one, as nccl-tests' sendrecv_perf.
    SendRecv,
    /// Out-of-place all-to-all with per-peer counts, drawn from a seed
    /// ([`SplitSizes`](crate::split_sizes::SplitSizes)).
    AllToAllV,
}

impl BenchOp {
    /// Every benchmarked collective.
    pub const ALL: [BenchOp; 8] = [
        BenchOp::AllReduce,
        BenchOp::AllGather,
        BenchOp::ReduceScatter,
        BenchOp::Broadcast,
        BenchOp::Reduce,
        BenchOp::AllToAll,
        BenchOp::SendRecv,
        BenchOp::AllToAllV,
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
            BenchOp::SendRecv => "sendrecv",
            BenchOp::AllToAllV => "all_to_all_v",
        }
    }

    /// The operation named `name`, if any.
    pub fn from_name(name: &str) -> Option<BenchOp> {
        BenchOp::ALL.into_iter().find(|o| o.name() == name)
    }

    /// Per-rank `f32` element counts `(input, output)` such that the buffer nccl-tests counts holds `bytes`
    /// (rounded down to whole elements per rank) on `n` ranks; in-place operations have no output (0). The
    /// sendrecv's input is the message sent and its output the one received; the all-to-all-v's output is
    /// nominal, the same as its input: each rank's real output is its column of the
    /// [split sizes](crate::split_sizes), which varies from rank to rank.
    ///
    /// ```
    /// use hypercomm_bench::BenchOp;
    ///
    /// assert_eq!(BenchOp::AllReduce.buffer_lens(4096, 4), (1024, 0));
    /// assert_eq!(BenchOp::AllGather.buffer_lens(4096, 4), (256, 1024));
    /// assert_eq!(BenchOp::ReduceScatter.buffer_lens(4096, 4), (1024, 256));
    /// assert_eq!(BenchOp::SendRecv.buffer_lens(4096, 4), (1024, 1024));
    /// assert_eq!(BenchOp::AllToAllV.buffer_lens(4100, 4), (1025, 1025));
    /// ```
    pub fn buffer_lens(self, bytes: usize, n: usize) -> (usize, usize) {
        let total = bytes / 4;
        let n = n.max(1);
        match self {
            BenchOp::AllReduce | BenchOp::Broadcast | BenchOp::Reduce => (total, 0),
            BenchOp::AllGather => (total / n, total / n * n),
            BenchOp::ReduceScatter => (total / n * n, total / n),
            BenchOp::AllToAll => (total / n * n, total / n * n),
            BenchOp::SendRecv | BenchOp::AllToAllV => (total, total),
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
    /// all-to-all `(n-1)/n`; broadcast, reduce and sendrecv 1. The all-to-all-v takes the all-to-all's `(n-1)/n`,
    /// which counts the bytes a rank sends to others as if its own block were `1/n` of its input: with uneven
    /// splits the bytes that really leave a rank differ by its own block's share, so its busbw compares with the
    /// all-to-all's at the same `bytes`, not exactly with the wire.
    pub fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            BenchOp::AllReduce => 2.0 * (n - 1.0) / n,
            BenchOp::AllGather
            | BenchOp::ReduceScatter
            | BenchOp::AllToAll
            | BenchOp::AllToAllV => (n - 1.0) / n,
            BenchOp::Broadcast | BenchOp::Reduce | BenchOp::SendRecv => 1.0,
        }
    }

    /// The fewest ranks the operation runs on: 2 for the sendrecv ring (a rank does not send to itself), 1 for
    /// the others.
    pub fn min_ranks(self) -> usize {
        match self {
            BenchOp::SendRecv => 2,
            _ => 1,
        }
    }
}

/// The sendrecv ring's peers of `rank` among `n` ranks: `(next, previous)`, the rank it sends to and the one it
/// receives from.
///
/// ```
/// use hypercomm_bench::op::ring_peers;
///
/// assert_eq!(ring_peers(0, 3), (1, 2));
/// assert_eq!(ring_peers(2, 3), (0, 1));
/// assert_eq!(ring_peers(1, 2), (0, 0));
/// ```
pub fn ring_peers(rank: usize, n: usize) -> (usize, usize) {
    let n = n.max(1);
    ((rank + 1) % n, (rank + n - 1) % n)
}

/// The two buffers of a sendrecv's [`Communicator::batch`](hypercomm_comm::Communicator::batch) (the send's, then
/// the receive's), or an error on communicator `comm` if it gave back another number.
pub(crate) fn sent_and_received<B>(comm: &str, bufs: Vec<B>) -> Result<(B, B), CommError> {
    let got = bufs.len();
    let mut bufs = bufs.into_iter();
    match (bufs.next(), bufs.next(), bufs.next()) {
        (Some(sent), Some(received), None) => Ok((sent, received)),
        _ => Err(CommError::Protocol {
            comm: comm.to_owned(),
            what: format!("a batch of a send and a receive gave back {got} buffers, not 2"),
        }),
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
    fn sendrecv_and_all_to_all_v_count_what_each_rank_sends() {
        // sendrecv: factor 1 at any rank count, as nccl-tests' sendrecv_perf.
        for n in [2, 3, 8] {
            assert_eq!(BenchOp::SendRecv.bus_factor(n), 1.0);
        }
        // all_to_all_v: the all-to-all's (n-1)/n.
        assert_eq!(BenchOp::AllToAllV.bus_factor(2), 0.5);
        assert_eq!(BenchOp::AllToAllV.bus_factor(8), 0.875);
        assert_eq!(
            BenchOp::AllToAllV.bus_factor(8),
            BenchOp::AllToAll.bus_factor(8)
        );
        // 16 MiB on 2 ranks in 1 ms: algbw 16.78 GB/s; busbw the same for sendrecv, half for all_to_all_v.
        let sr = BenchResult::new(BenchOp::SendRecv, 2, 4 << 20, 1000.0, "shm");
        assert_eq!(sr.bytes, 16 << 20);
        assert!((sr.algbw_gbps - 16.777216).abs() < 1e-9);
        assert_eq!(sr.busbw_gbps, sr.algbw_gbps);
        let v = BenchResult::new(BenchOp::AllToAllV, 2, 4 << 20, 1000.0, "shm");
        assert_eq!(v.busbw_gbps, v.algbw_gbps / 2.0);
        // Both move whole elements of the requested bytes, without rounding to a multiple of the rank count.
        assert_eq!(BenchOp::AllToAllV.buffer_lens(12, 8), (3, 3));
        assert_eq!(BenchOp::AllToAll.buffer_lens(12, 8), (0, 0));
        assert_eq!(BenchOp::from_name("sendrecv"), Some(BenchOp::SendRecv));
        assert_eq!(BenchOp::from_name("all_to_all_v"), Some(BenchOp::AllToAllV));
        assert_eq!(BenchOp::SendRecv.min_ranks(), 2);
        assert_eq!(BenchOp::AllToAllV.min_ranks(), 1);
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
