//! [`Buffer`]: what a [`Communicator`]'s operations take, and how a buffer's type picks the flavor that runs them.
//!
//! A host `Vec<T>` runs on the host flavor; a [`DeviceBuffer<T>`] on the communicator's NCCL flavor. The choice is
//! made by the type, at compile time: there is no wrapper enum to build and unwrap, and a collective gives back
//! the type it was given. A communicator without a GPU refuses a device buffer with an error naming it.

use crate::backend::{Io, execute};
use crate::backends::nccl::gpu::DeviceBuffer;
use crate::communicator::Communicator;
use crate::element::{Element, as_bytes, as_bytes_mut};
use crate::op::Op;
use crate::{CommError, Work};

/// Where a buffer's elements live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Location {
    /// CPU memory.
    Host,
    /// Memory of the GPU with this ordinal.
    Device(usize),
}

/// A buffer a [`Communicator`]'s operations take by value and give back: `Vec<T>` for host memory,
/// [`DeviceBuffer<T>`] for GPU memory. Sealed: the flavors are hypercomm's.
pub trait Buffer: Sized + Send + 'static + sealed::Flavored {
    /// The element type.
    type Elem: Element;

    /// Number of elements.
    fn len(&self) -> usize;

    /// Whether the buffer has no elements.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where the elements live.
    fn location(&self) -> Location;
}

pub(crate) mod sealed {
    use super::*;

    /// How a buffer type runs an operation that the face has checked: on which flavor, through which executor.
    pub trait Flavored: Sized {
        /// Runs `op` in place on `buf`.
        fn run_one(comm: &Communicator, op: Op, buf: Self) -> Result<Work<Self>, CommError>;
        /// Runs `op` from `input` into `output`.
        fn run_two(
            comm: &Communicator,
            op: Op,
            input: Self,
            output: Self,
        ) -> Result<Work<(Self, Self)>, CommError>;
        /// Runs the batch `op` over `bufs`, one buffer per part, in the parts' order.
        fn run_many(
            comm: &Communicator,
            op: Op,
            bufs: Vec<Self>,
        ) -> Result<Work<Vec<Self>>, CommError>;
    }
}

impl<T: Element> Buffer for Vec<T> {
    type Elem = T;

    fn len(&self) -> usize {
        Vec::len(self)
    }

    fn location(&self) -> Location {
        Location::Host
    }
}

/// Refuses a host reduction of a type the host does not reduce (the 8-bit floats), naming the way out.
pub(crate) fn host_reduces<T: Element>(comm: &Communicator, op: &str) -> Result<(), CommError> {
    if T::DTYPE.is_float8() {
        return Err(crate::checks::invalid(
            comm.name(),
            format!(
                "{op} of {} on host buffers is not supported: the host flavor moves 8-bit floats but does not \
                 reduce them; reduce on a device buffer (NCCL 2.24 or newer), or in f32 or bf16",
                T::DTYPE
            ),
        ));
    }
    Ok(())
}

impl<T: Element> sealed::Flavored for Vec<T> {
    fn run_one(comm: &Communicator, op: Op, mut buf: Self) -> Result<Work<Self>, CommError> {
        if op.reduces() {
            host_reduces::<T>(comm, op.name())?;
        }
        // Point-to-point operations progress together with those queued next to them.
        if let Some(message) = op.as_message(buf.len()) {
            // One buffer in, one back: `wrap` gets back the vector it was given.
            let one = |bufs: Vec<Vec<T>>| bufs.into_iter().next().unwrap_or_default();
            return comm
                .submit_p2p(vec![buf], vec![message], one)
                .map(Work::from);
        }
        comm.submit(move |b| {
            execute(b, &op, Io::InPlace(as_bytes_mut(&mut buf)), T::DTYPE)?;
            Ok(buf)
        })
        .map(Work::from)
    }

    fn run_two(
        comm: &Communicator,
        op: Op,
        input: Self,
        mut output: Self,
    ) -> Result<Work<(Self, Self)>, CommError> {
        if op.reduces() {
            host_reduces::<T>(comm, op.name())?;
        }
        comm.submit(move |b| {
            execute(
                b,
                &op,
                Io::OutOfPlace(as_bytes(&input), as_bytes_mut(&mut output)),
                T::DTYPE,
            )?;
            Ok((input, output))
        })
        .map(Work::from)
    }

    fn run_many(
        comm: &Communicator,
        op: Op,
        bufs: Vec<Self>,
    ) -> Result<Work<Vec<Self>>, CommError> {
        let Op::Batch(messages) = op else {
            return Err(crate::checks::invalid(
                comm.name(),
                format!("{} is not a batch", op.name()),
            ));
        };
        comm.submit_p2p(bufs, messages, |bufs| bufs).map(Work::from)
    }
}

impl<T: Element> Buffer for DeviceBuffer<T> {
    type Elem = T;

    fn len(&self) -> usize {
        DeviceBuffer::len(self)
    }

    fn location(&self) -> Location {
        Location::Device(self.device())
    }
}

impl<T: Element> sealed::Flavored for DeviceBuffer<T> {
    fn run_one(comm: &Communicator, op: Op, buf: Self) -> Result<Work<Self>, CommError> {
        comm.nccl_for(&op, buf.device())?.launch_one(&op, buf)
    }

    fn run_two(
        comm: &Communicator,
        op: Op,
        input: Self,
        output: Self,
    ) -> Result<Work<(Self, Self)>, CommError> {
        let nccl = comm.nccl_for(&op, input.device())?;
        if output.device() != input.device() {
            return Err(crate::checks::invalid(
                comm.name(),
                format!(
                    "{}'s input is on device {} but its output on device {}",
                    op.name(),
                    input.device(),
                    output.device()
                ),
            ));
        }
        nccl.launch_two(&op, input, output)
    }

    fn run_many(
        comm: &Communicator,
        op: Op,
        bufs: Vec<Self>,
    ) -> Result<Work<Vec<Self>>, CommError> {
        // An empty batch moves nothing and names no device: done at once (after the host flavor's queue).
        let Some(device) = bufs.first().map(DeviceBuffer::device) else {
            return comm.submit(|_| Ok(Vec::new())).map(Work::from);
        };
        let nccl = comm.nccl_for(&op, device)?;
        if let Some(other) = bufs.iter().find(|b| b.device() != device) {
            return Err(crate::checks::invalid(
                comm.name(),
                format!(
                    "batch parts live on devices {device} and {}: one batch runs on one device",
                    other.device()
                ),
            ));
        }
        nccl.launch_many(&op, bufs)
    }
}

#[cfg(test)]
mod tests {
    //! Routing with a test-only flavor: a buffer type whose executor records the description it is handed, so
    //! that every face method is seen to reach its flavor with the right operation and shape, and an invalid call
    //! never to reach it.

    use std::sync::{Arc, Mutex};

    use hypercomm_store::MemoryStore;

    use super::*;
    use crate::element::ReduceOp;
    use crate::host_work::pair;
    use crate::op::Shape;
    use crate::{CommOptions, Communicator};

    /// A buffer on "device 9" whose flavor records `(operation, shape)` and completes at once.
    struct Recorded {
        len: usize,
        log: Log,
    }

    impl Buffer for Recorded {
        type Elem = f32;

        fn len(&self) -> usize {
            self.len
        }

        fn location(&self) -> Location {
            Location::Device(9)
        }
    }

    impl sealed::Flavored for Recorded {
        fn run_one(comm: &Communicator, op: Op, buf: Self) -> Result<Work<Self>, CommError> {
            buf.log.lock().unwrap().push((op, Shape::InPlace(buf.len)));
            let (work, done) = pair(comm.name());
            done.complete(Ok(buf));
            Ok(work.into())
        }

        fn run_two(
            comm: &Communicator,
            op: Op,
            input: Self,
            output: Self,
        ) -> Result<Work<(Self, Self)>, CommError> {
            let shape = Shape::OutOfPlace {
                input: input.len,
                output: output.len,
            };
            input.log.lock().unwrap().push((op, shape));
            let (work, done) = pair(comm.name());
            done.complete(Ok((input, output)));
            Ok(work.into())
        }

        fn run_many(
            comm: &Communicator,
            op: Op,
            bufs: Vec<Self>,
        ) -> Result<Work<Vec<Self>>, CommError> {
            if let Some(first) = bufs.first() {
                first
                    .log
                    .lock()
                    .unwrap()
                    .push((op, Shape::Parts(bufs.len())));
            }
            let (work, done) = pair(comm.name());
            done.complete(Ok(bufs));
            Ok(work.into())
        }
    }

    /// What the test flavor has been handed, in order.
    type Log = Arc<Mutex<Vec<(Op, Shape)>>>;

    /// A one-rank communicator and a buffer maker sharing one log.
    fn setup() -> (Communicator, impl Fn(usize) -> Recorded, Log) {
        let comm = Communicator::world(
            Arc::new(MemoryStore::new()),
            1,
            0,
            CommOptions::named("probe"),
        )
        .expect("one-rank communicator");
        let log = Arc::new(Mutex::new(Vec::new()));
        let shared = Arc::clone(&log);
        let make = move |len| Recorded {
            len,
            log: Arc::clone(&shared),
        };
        (comm, make, log)
    }

    #[test]
    fn every_face_method_hands_its_flavor_one_description() {
        let (comm, b, log) = setup();
        let sum = ReduceOp::Sum;
        comm.all_reduce(b(3), sum).unwrap().wait().unwrap();
        comm.all_reduce_into(b(3), b(3), ReduceOp::Max)
            .unwrap()
            .wait()
            .unwrap();
        comm.broadcast(b(2), 0).unwrap().wait().unwrap();
        comm.broadcast_into(b(2), b(2), 0).unwrap().wait().unwrap();
        comm.reduce(b(2), sum, 0).unwrap().wait().unwrap();
        comm.reduce_into(b(2), b(2), ReduceOp::Min, 0)
            .unwrap()
            .wait()
            .unwrap();
        comm.all_gather(b(4)).unwrap().wait().unwrap();
        comm.all_gather_into(b(4), b(4)).unwrap().wait().unwrap();
        comm.reduce_scatter(b(4), sum).unwrap().wait().unwrap();
        comm.reduce_scatter_into(b(4), b(4), ReduceOp::Avg)
            .unwrap()
            .wait()
            .unwrap();
        comm.all_to_all(b(5)).unwrap().wait().unwrap();
        comm.all_to_all_into(b(5), b(5)).unwrap().wait().unwrap();
        comm.all_to_all_v(b(0), vec![0], b(0), vec![0])
            .unwrap()
            .wait()
            .unwrap();
        comm.gather(b(1), b(1), 0).unwrap().wait().unwrap();
        comm.scatter(b(1), b(1), 0).unwrap().wait().unwrap();
        comm.all_gather_v(b(2), b(2), vec![2])
            .unwrap()
            .wait()
            .unwrap();
        comm.reduce_scatter_v(b(3), b(3), vec![3], ReduceOp::Prod)
            .unwrap()
            .wait()
            .unwrap();
        let one = Shape::InPlace;
        let two = |input, output| Shape::OutOfPlace { input, output };
        let seen = log.lock().unwrap().clone();
        assert_eq!(
            seen,
            [
                (Op::AllReduce(sum), one(3)),
                (Op::AllReduce(ReduceOp::Max), two(3, 3)),
                (Op::Broadcast { root: 0 }, one(2)),
                (Op::Broadcast { root: 0 }, two(2, 2)),
                (Op::Reduce { op: sum, root: 0 }, one(2)),
                (
                    Op::Reduce {
                        op: ReduceOp::Min,
                        root: 0
                    },
                    two(2, 2)
                ),
                (Op::AllGather, one(4)),
                (Op::AllGather, two(4, 4)),
                (Op::ReduceScatter(sum), one(4)),
                (Op::ReduceScatter(ReduceOp::Avg), two(4, 4)),
                (Op::AllToAll, one(5)),
                (Op::AllToAll, two(5, 5)),
                (
                    Op::AllToAllV {
                        send_counts: vec![0],
                        recv_counts: vec![0]
                    },
                    two(0, 0)
                ),
                (Op::Gather { root: 0 }, two(1, 1)),
                (Op::Scatter { root: 0 }, two(1, 1)),
                (Op::AllGatherV { counts: vec![2] }, two(2, 2)),
                (
                    Op::ReduceScatterV {
                        op: ReduceOp::Prod,
                        counts: vec![3]
                    },
                    two(3, 3)
                ),
            ]
        );
    }

    #[test]
    fn a_batch_hands_its_flavor_every_part_in_order() {
        let store = Arc::new(MemoryStore::new());
        let ranks: Vec<_> = (0..2)
            .map(|me| {
                let store = Arc::clone(&store);
                std::thread::spawn(move || {
                    let comm = Communicator::world(store, 2, me, CommOptions::named("probe2"))
                        .expect("two-rank communicator");
                    let log: Log = Arc::default();
                    let b = |len| Recorded {
                        len,
                        log: Arc::clone(&log),
                    };
                    let peer = 1 - me;
                    let parts = vec![
                        crate::P2p::Send {
                            buf: b(2),
                            peer,
                            tag: 4,
                        },
                        crate::P2p::recv(b(3), peer),
                    ];
                    let back = comm.batch(parts).unwrap().wait().unwrap();
                    assert_eq!(back.iter().map(|r| r.len).collect::<Vec<_>>(), [2, 3]);
                    log.lock().unwrap().clone()
                })
            })
            .collect();
        for (me, rank) in ranks.into_iter().enumerate() {
            let peer = 1 - me;
            let part = |send, tag, count| crate::op::Message {
                send,
                peer,
                tag,
                count,
            };
            assert_eq!(
                rank.join().unwrap(),
                [(
                    Op::Batch(vec![part(true, 4, 2), part(false, 0, 3)]),
                    Shape::Parts(2)
                )]
            );
        }
    }

    #[test]
    fn an_invalid_call_is_refused_above_the_flavors() {
        let (comm, b, log) = setup();
        let refused = [
            comm.broadcast(b(2), 1).map(|_| ()),
            comm.all_reduce_into(b(3), b(2), ReduceOp::Sum).map(|_| ()),
            comm.all_gather_into(b(2), b(3)).map(|_| ()),
            comm.all_to_all_v(b(1), vec![1, 0], b(1), vec![1])
                .map(|_| ()),
            comm.send(b(1), 0, 0).map(|_| ()),
            comm.recv(b(1), 3, 0).map(|_| ()),
        ];
        for result in refused {
            let e = result.expect_err("refused");
            assert!(
                matches!(e, CommError::InvalidArgument { ref comm, .. } if comm == "probe"),
                "{e}"
            );
        }
        assert!(
            log.lock().unwrap().is_empty(),
            "a refused call reached its flavor"
        );
    }
}
