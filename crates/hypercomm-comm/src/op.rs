//! [`Op`]: the one description of every operation a [`Communicator`](crate::Communicator) runs, and the checks
//! every operation passes before any flavor sees it.
//!
//! The face turns each call into an `Op` and the buffers' lengths into a [`Shape`]; [`Op::check`] validates
//! roots, peers, counts and lengths once, above the flavors; then the buffer's flavor executes the description:
//! the host flavor on its progress lane, the NCCL flavor as NCCL calls on its stream. Adding an operation means a
//! variant here, a face method, and an arm in each flavor's executor.

use crate::CommError;
use crate::checks;
use crate::element::{DType, ReduceOp};

/// One operation, with everything but its buffers and element type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Every rank ends with the reduction of all ranks' buffers.
    AllReduce(ReduceOp),
    /// Every rank's buffer becomes `root`'s.
    Broadcast {
        /// The rank whose buffer is sent.
        root: usize,
    },
    /// `root`'s buffer becomes the reduction of all ranks' buffers.
    Reduce {
        /// How elements combine.
        op: ReduceOp,
        /// The rank that receives the result.
        root: usize,
    },
    /// Every rank ends with every rank's block, in rank order.
    AllGather,
    /// Each rank ends with the reduction of every rank's block at its own index.
    ReduceScatter(ReduceOp),
    /// Block `d` of every rank goes to rank `d`; equal blocks.
    AllToAll,
    /// Every rank ends with every rank's block in rank order, rank `r`'s block holding `counts[r]` elements.
    AllGatherV {
        /// Elements each rank contributes, in rank order.
        counts: Vec<usize>,
    },
    /// Rank `r` ends with the reduction of every rank's block `r`, block `r` holding `counts[r]` elements.
    ReduceScatterV {
        /// How elements combine.
        op: ReduceOp,
        /// Elements of each rank's result, in rank order.
        counts: Vec<usize>,
    },
    /// Block `d` of every rank goes to rank `d`, with per-peer element counts.
    AllToAllV {
        /// Elements this rank sends to each rank, in rank order.
        send_counts: Vec<usize>,
        /// Elements this rank receives from each rank, in rank order.
        recv_counts: Vec<usize>,
    },
    /// `root` receives every rank's buffer, in rank order.
    Gather {
        /// The rank that receives.
        root: usize,
    },
    /// Rank `d` receives block `d` of `root`'s buffer.
    Scatter {
        /// The rank that sends.
        root: usize,
    },
    /// The buffer goes to `peer`.
    Send {
        /// The receiving rank.
        peer: usize,
        /// Matches the receive's tag (host flavor; NCCL has no tags and refuses any but 0).
        tag: u64,
    },
    /// The buffer is filled from `peer`.
    Recv {
        /// The sending rank.
        peer: usize,
        /// Must equal the send's tag.
        tag: u64,
    },
    /// Several sends and receives, one buffer each, that progress together and complete as a whole: no order of
    /// the parts, on this rank or its peers, makes them wait on each other.
    Batch(Vec<Message>),
}

/// One part of an [`Op::Batch`]: a send or a receive of `count` elements to or from `peer`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// Send (`true`) or receive.
    pub send: bool,
    /// The other rank.
    pub peer: usize,
    /// Matches a send to its receive (host flavor; NCCL has no tags and refuses any but 0).
    pub tag: u64,
    /// Elements of the part's buffer.
    pub count: usize,
}

/// The lengths, in elements, of an operation's buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// One buffer, read and overwritten.
    InPlace(usize),
    /// A buffer read and a buffer written.
    OutOfPlace {
        /// Elements of the input.
        input: usize,
        /// Elements of the output.
        output: usize,
    },
    /// One buffer per part of a batch, whose lengths the operation carries ([`Message::count`]).
    Parts(usize),
}

/// What the checks need to know of the communicator: its name (for errors), its size and this rank.
#[derive(Clone, Copy, Debug)]
pub struct Group<'a> {
    /// The communicator's name.
    pub comm: &'a str,
    /// Number of ranks.
    pub size: usize,
    /// This rank's rank.
    pub rank: usize,
}

impl Op {
    /// A send or a receive of `count` elements as one part of a batch (`None` for any other operation): the
    /// host flavor runs point-to-point operations as parts of one exchange.
    pub(crate) fn as_message(&self, count: usize) -> Option<Message> {
        match *self {
            Op::Send { peer, tag } => Some(Message {
                send: true,
                peer,
                tag,
                count,
            }),
            Op::Recv { peer, tag } => Some(Message {
                send: false,
                peer,
                tag,
                count,
            }),
            _ => None,
        }
    }

    /// For a point-to-point operation (a send, a receive, a batch): the ranks it sends to and receives from,
    /// each in the order of its parts; `None` for a collective, which every rank of the communicator joins.
    pub(crate) fn point_to_point(&self) -> Option<(Vec<usize>, Vec<usize>)> {
        match self {
            Op::Send { peer, .. } => Some((vec![*peer], Vec::new())),
            Op::Recv { peer, .. } => Some((Vec::new(), vec![*peer])),
            Op::Batch(parts) => Some((
                parts.iter().filter(|m| m.send).map(|m| m.peer).collect(),
                parts.iter().filter(|m| !m.send).map(|m| m.peer).collect(),
            )),
            _ => None,
        }
    }

    /// The operation's name in errors and records (`"all_reduce"`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            Op::AllReduce(_) => "all_reduce",
            Op::Broadcast { .. } => "broadcast",
            Op::Reduce { .. } => "reduce",
            Op::AllGather => "all_gather",
            Op::ReduceScatter(_) => "reduce_scatter",
            Op::AllToAll => "all_to_all",
            Op::AllGatherV { .. } => "all_gather_v",
            Op::ReduceScatterV { .. } => "reduce_scatter_v",
            Op::AllToAllV { .. } => "all_to_all_v",
            Op::Gather { .. } => "gather",
            Op::Scatter { .. } => "scatter",
            Op::Send { .. } => "send",
            Op::Recv { .. } => "recv",
            Op::Batch(_) => "batch",
        }
    }

    /// Whether the operation combines the ranks' values (rather than only moving them).
    pub fn reduces(&self) -> bool {
        self.reduction().is_some()
    }

    /// How the operation combines the ranks' values, when it does.
    pub fn reduction(&self) -> Option<ReduceOp> {
        match self {
            Op::AllReduce(op)
            | Op::Reduce { op, .. }
            | Op::ReduceScatter(op)
            | Op::ReduceScatterV { op, .. } => Some(*op),
            _ => None,
        }
    }

    /// Checks that the operation's reduction, if any, has a meaning for elements of `dtype` (a premulsum's factor
    /// must be a value of the type). Runs once with [`check`](Self::check), before any flavor.
    pub fn check_elements(&self, comm: &str, dtype: DType) -> Result<(), CommError> {
        match self.reduction() {
            Some(op) => checks::reduction(comm, self.name(), op, dtype),
            None => Ok(()),
        }
    }

    /// Checks the operation's local arguments on `group` with buffers of `shape`: roots and peers are ranks,
    /// counts have one entry per rank, and lengths fit the operation. Runs once, before any flavor; an error
    /// names the communicator and the offending value.
    pub fn check(&self, group: Group<'_>, shape: Shape) -> Result<(), CommError> {
        let Group { comm, size, rank } = group;
        let len = |what: &str, got: usize, expected: usize| checks::len(comm, what, got, expected);
        let multiple = |what: &str, got: usize| {
            if got % size != 0 {
                return Err(checks::invalid(
                    comm,
                    format!("{what} has {got} elements, not a multiple of {size} ranks"),
                ));
            }
            Ok(())
        };
        let root = |root: usize| checks::root(comm, size, root);
        let at_root = |r: usize| rank == r;
        match (self, shape) {
            (Op::AllReduce(_), Shape::InPlace(_)) => Ok(()),
            (Op::AllReduce(_), Shape::OutOfPlace { input, output }) => {
                len("all_reduce output", output, input)
            }
            (Op::Broadcast { root: r }, Shape::InPlace(_)) => root(*r),
            (Op::Broadcast { root: r }, Shape::OutOfPlace { input, output }) => {
                root(*r)?;
                if at_root(*r) {
                    len("broadcast input at the root", input, output)?;
                }
                Ok(())
            }
            (Op::Reduce { root: r, .. }, Shape::InPlace(_)) => root(*r),
            (Op::Reduce { root: r, .. }, Shape::OutOfPlace { input, output }) => {
                root(*r)?;
                if at_root(*r) {
                    len("reduce output at the root", output, input)?;
                }
                Ok(())
            }
            (Op::AllGather, Shape::InPlace(n)) => multiple("all_gather buffer", n),
            (Op::AllGather, Shape::OutOfPlace { input, output }) => {
                len("all_gather output", output, input.saturating_mul(size))
            }
            (Op::ReduceScatter(_), Shape::InPlace(n)) => multiple("reduce_scatter buffer", n),
            (Op::ReduceScatter(_), Shape::OutOfPlace { input, output }) => {
                len("reduce_scatter input", input, output.saturating_mul(size))
            }
            (Op::AllToAll, Shape::InPlace(n)) => multiple("all_to_all buffer", n),
            (Op::AllToAll, Shape::OutOfPlace { input, output }) => {
                multiple("all_to_all input", input)?;
                len("all_to_all output", output, input)
            }
            (
                Op::AllToAllV {
                    send_counts,
                    recv_counts,
                },
                Shape::OutOfPlace { input, output },
            ) => {
                len("all_to_all_v send_counts", send_counts.len(), size)?;
                len("all_to_all_v recv_counts", recv_counts.len(), size)?;
                len("all_to_all_v input", input, send_counts.iter().sum())?;
                len("all_to_all_v output", output, recv_counts.iter().sum())
            }
            (Op::AllGatherV { counts }, Shape::OutOfPlace { input, output }) => {
                len("all_gather_v counts", counts.len(), size)?;
                len("all_gather_v input", input, counts[rank])?;
                len("all_gather_v output", output, counts.iter().sum())
            }
            (Op::ReduceScatterV { counts, .. }, Shape::OutOfPlace { input, output }) => {
                len("reduce_scatter_v counts", counts.len(), size)?;
                len("reduce_scatter_v input", input, counts.iter().sum())?;
                len("reduce_scatter_v output", output, counts[rank])
            }
            (Op::Gather { root: r }, Shape::OutOfPlace { input, output }) => {
                root(*r)?;
                if at_root(*r) {
                    len(
                        "gather output at the root",
                        output,
                        input.saturating_mul(size),
                    )?;
                }
                Ok(())
            }
            (Op::Scatter { root: r }, Shape::OutOfPlace { input, output }) => {
                root(*r)?;
                if at_root(*r) {
                    len(
                        "scatter input at the root",
                        input,
                        output.saturating_mul(size),
                    )?;
                }
                Ok(())
            }
            (Op::Send { peer, .. } | Op::Recv { peer, .. }, Shape::InPlace(_)) => {
                checks::peer(comm, size, rank, *peer)
            }
            (Op::Batch(messages), Shape::Parts(buffers)) => {
                len("batch buffers", buffers, messages.len())?;
                messages
                    .iter()
                    .try_for_each(|m| checks::peer(comm, size, rank, m.peer))
            }
            (op, shape) => Err(checks::invalid(
                comm,
                format!(
                    "{} does not take {}",
                    op.name(),
                    match shape {
                        Shape::InPlace(_) => "one buffer in place",
                        Shape::OutOfPlace { .. } => "separate input and output buffers",
                        Shape::Parts(_) => "a buffer per part",
                    }
                ),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: Group<'static> = Group {
        comm: "g",
        size: 4,
        rank: 1,
    };

    fn err(op: Op, shape: Shape) -> String {
        op.check(G, shape).expect_err("must be refused").to_string()
    }

    #[test]
    fn lengths_roots_and_peers_are_checked_once_for_every_flavor() {
        let oop = |input, output| Shape::OutOfPlace { input, output };
        assert!(Op::AllReduce(ReduceOp::Sum).check(G, oop(3, 3)).is_ok());
        assert!(err(Op::AllReduce(ReduceOp::Sum), oop(3, 2)).contains("all_reduce output has 2"));
        assert!(err(Op::Broadcast { root: 4 }, Shape::InPlace(1)).contains("root 4"));
        // Only the root's buffers must agree.
        assert!(Op::Broadcast { root: 0 }.check(G, oop(0, 5)).is_ok());
        assert!(err(Op::Broadcast { root: 1 }, oop(0, 5)).contains("broadcast input at the root"));
        assert!(err(Op::AllGather, Shape::InPlace(6)).contains("not a multiple of 4 ranks"));
        assert!(Op::AllGather.check(G, oop(2, 8)).is_ok());
        assert!(err(Op::ReduceScatter(ReduceOp::Max), oop(7, 2)).contains("reduce_scatter input"));
        assert!(err(Op::AllToAll, oop(6, 6)).contains("all_to_all input"));
        let v = Op::AllToAllV {
            send_counts: vec![1, 0, 2, 0],
            recv_counts: vec![0, 0, 0, 5],
        };
        assert!(v.check(G, oop(3, 5)).is_ok());
        assert!(err(v.clone(), oop(4, 5)).contains("all_to_all_v input has 4"));
        let short = Op::AllToAllV {
            send_counts: vec![1],
            recv_counts: vec![0, 0, 0, 5],
        };
        assert!(err(short, oop(1, 5)).contains("send_counts has 1 elements, expected 4"));
        let agv = Op::AllGatherV {
            counts: vec![1, 0, 3, 2],
        };
        assert!(agv.check(G, oop(0, 6)).is_ok());
        assert!(err(agv.clone(), oop(1, 6)).contains("all_gather_v input has 1"));
        assert!(err(agv, oop(0, 5)).contains("all_gather_v output has 5"));
        let rsv = Op::ReduceScatterV {
            op: ReduceOp::Sum,
            counts: vec![2, 3],
        };
        assert!(err(rsv, oop(5, 3)).contains("reduce_scatter_v counts has 2 elements, expected 4"));
        assert!(Op::Gather { root: 0 }.check(G, oop(2, 0)).is_ok());
        assert!(err(Op::Gather { root: 1 }, oop(2, 7)).contains("gather output at the root"));
        assert!(err(Op::Scatter { root: 1 }, oop(7, 2)).contains("scatter input at the root"));
        assert!(err(Op::Send { peer: 1, tag: 0 }, Shape::InPlace(1)).contains("peer 1"));
        assert!(err(Op::Recv { peer: 9, tag: 0 }, Shape::InPlace(1)).contains("peer 9"));
        assert!(
            err(Op::Gather { root: 0 }, Shape::InPlace(1)).contains("gather does not take one")
        );
    }

    #[test]
    fn a_premulsum_factor_must_be_a_value_of_the_element_type() {
        let op = |f| Op::ReduceScatter(ReduceOp::pre_mul_sum(f));
        assert!(op(0.25).check_elements("g", DType::BF16).is_ok());
        assert!(op(3.0).check_elements("g", DType::U8).is_ok());
        let refused = |op: Op, dtype| {
            op.check_elements("g", dtype)
                .expect_err("must be refused")
                .to_string()
        };
        let e = refused(op(0.25), DType::I32);
        assert!(
            e.contains("reduce_scatter of i32: premulsum factor 0.25 is not a whole number"),
            "{e}"
        );
        assert!(refused(op(-1.0), DType::U32).contains("factor -1 is outside u32's range"));
        assert!(refused(op(300.0), DType::I8).contains("outside i8's range"));
        assert!(refused(op(1e6), DType::F16).contains("factor 1000000 overflows f16"));
        assert!(refused(op(f64::NAN), DType::F64).contains("factor NaN is not a number"));
        assert!(refused(op(500.0), DType::F8E4M3).contains("overflows f8e4m3"));
        // Operations that do not reduce, and reductions without a factor, have nothing to check.
        assert!(Op::AllGather.check_elements("g", DType::I8).is_ok());
        assert!(
            Op::AllReduce(ReduceOp::Avg)
                .check_elements("g", DType::I8)
                .is_ok()
        );
    }
}
