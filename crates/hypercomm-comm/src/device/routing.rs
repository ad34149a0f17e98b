//! [`ProcessGroup`]: one host communicator and, when a GPU is present, one device communicator over the same
//! ranks; each collective runs where its buffer lives (PyTorch's `cpu:gloo,cuda:nccl`).
//!
//! The device side is a trait, [`DeviceSide`], so the routing is tested with a fake device on machines without a
//! GPU; [`DeviceCommunicator`] is the real one.

use std::sync::Arc;

use hypercomm_store::Store;

use crate::backends::nccl::communicator::{DeviceCommunicator, DeviceWork};
use crate::backends::nccl::gpu::{DeviceBuffer, Gpu};
use crate::{BackendKind, CommError, CommOptions, Communicator, Element, ReduceOp, Work};

/// Where a buffer lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Location {
    /// CPU memory.
    Host,
    /// Memory of the CUDA device with this ordinal.
    Device(usize),
}

/// Which communicator runs a collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The host communicator.
    Host,
    /// The device communicator.
    Device,
}

/// Decides where a collective on a buffer at `location` runs, given the device of the group's device
/// communicator (`None` when the group has none). Pure; the error says what is wrong.
///
/// ```
/// use hypercomm_comm::device::{route, Location, Route};
///
/// assert_eq!(route(Location::Host, Some(0)), Ok(Route::Host));
/// assert_eq!(route(Location::Device(0), Some(0)), Ok(Route::Device));
/// assert!(route(Location::Device(1), Some(0)).is_err()); // wrong device
/// assert!(route(Location::Device(0), None).is_err()); // no device communicator
/// ```
pub fn route(location: Location, device: Option<usize>) -> Result<Route, String> {
    match (location, device) {
        (Location::Host, _) => Ok(Route::Host),
        (Location::Device(d), Some(mine)) if d == mine => Ok(Route::Device),
        (Location::Device(d), Some(mine)) => Err(format!(
            "buffer is on device {d} but the group's device communicator is on device {mine}"
        )),
        (Location::Device(d), None) => Err(format!(
            "buffer is on device {d} but the group has no device communicator (no gpu or no nccl when it was made)"
        )),
    }
}

/// The device half of a [`ProcessGroup`]: collectives on the side's own buffer type.
pub trait DeviceSide: Send + Sync {
    /// A buffer of `T` on a device.
    type Buffer<T: Element>: Send + 'static;
    /// A pending operation giving back `R`.
    type Work<R>;
    /// The device the communicator runs on.
    fn device(&self) -> usize;
    /// The member list (must equal the host communicator's).
    fn members(&self) -> &[usize];
    /// The device a buffer lives on.
    fn buffer_device<T: Element>(buf: &Self::Buffer<T>) -> usize;
    /// In-place all-reduce.
    fn all_reduce<T: Element>(
        &self,
        buf: Self::Buffer<T>,
        op: ReduceOp,
    ) -> Result<Self::Work<Self::Buffer<T>>, CommError>;
    /// In-place broadcast.
    fn broadcast<T: Element>(
        &self,
        buf: Self::Buffer<T>,
        root: usize,
    ) -> Result<Self::Work<Self::Buffer<T>>, CommError>;
    /// In-place reduce to `root`.
    fn reduce<T: Element>(
        &self,
        buf: Self::Buffer<T>,
        op: ReduceOp,
        root: usize,
    ) -> Result<Self::Work<Self::Buffer<T>>, CommError>;
    /// Sends the buffer to `peer`.
    fn send<T: Element>(
        &self,
        buf: Self::Buffer<T>,
        peer: usize,
    ) -> Result<Self::Work<Self::Buffer<T>>, CommError>;
    /// Receives into the buffer from `peer`.
    fn recv<T: Element>(
        &self,
        buf: Self::Buffer<T>,
        peer: usize,
    ) -> Result<Self::Work<Self::Buffer<T>>, CommError>;
    /// Out-of-place all-to-all with equal blocks.
    #[allow(clippy::type_complexity)]
    fn all_to_all_into<T: Element>(
        &self,
        input: Self::Buffer<T>,
        output: Self::Buffer<T>,
    ) -> Result<Self::Work<(Self::Buffer<T>, Self::Buffer<T>)>, CommError>;
    /// Out-of-place all-gather.
    #[allow(clippy::type_complexity)]
    fn all_gather_into<T: Element>(
        &self,
        input: Self::Buffer<T>,
        output: Self::Buffer<T>,
    ) -> Result<Self::Work<(Self::Buffer<T>, Self::Buffer<T>)>, CommError>;
    /// Out-of-place reduce-scatter.
    #[allow(clippy::type_complexity)]
    fn reduce_scatter_into<T: Element>(
        &self,
        input: Self::Buffer<T>,
        output: Self::Buffer<T>,
        op: ReduceOp,
    ) -> Result<Self::Work<(Self::Buffer<T>, Self::Buffer<T>)>, CommError>;
    /// Blocks until `work` completes.
    fn synchronize<R>(work: Self::Work<R>) -> Result<R, CommError>;
}

impl DeviceSide for DeviceCommunicator {
    type Buffer<T: Element> = DeviceBuffer<T>;
    type Work<R> = DeviceWork<R>;
    fn device(&self) -> usize {
        self.gpu().ordinal()
    }
    fn members(&self) -> &[usize] {
        self.ranks()
    }
    fn buffer_device<T: Element>(buf: &DeviceBuffer<T>) -> usize {
        buf.device()
    }
    fn all_reduce<T: Element>(
        &self,
        buf: DeviceBuffer<T>,
        op: ReduceOp,
    ) -> Result<DeviceWork<DeviceBuffer<T>>, CommError> {
        DeviceCommunicator::all_reduce(self, buf, op)
    }
    fn broadcast<T: Element>(
        &self,
        buf: DeviceBuffer<T>,
        root: usize,
    ) -> Result<DeviceWork<DeviceBuffer<T>>, CommError> {
        DeviceCommunicator::broadcast(self, buf, root)
    }
    fn reduce<T: Element>(
        &self,
        buf: DeviceBuffer<T>,
        op: ReduceOp,
        root: usize,
    ) -> Result<DeviceWork<DeviceBuffer<T>>, CommError> {
        DeviceCommunicator::reduce(self, buf, op, root)
    }
    fn send<T: Element>(
        &self,
        buf: DeviceBuffer<T>,
        peer: usize,
    ) -> Result<DeviceWork<DeviceBuffer<T>>, CommError> {
        DeviceCommunicator::send(self, buf, peer)
    }
    fn recv<T: Element>(
        &self,
        buf: DeviceBuffer<T>,
        peer: usize,
    ) -> Result<DeviceWork<DeviceBuffer<T>>, CommError> {
        DeviceCommunicator::recv(self, buf, peer)
    }
    fn all_to_all_into<T: Element>(
        &self,
        input: DeviceBuffer<T>,
        output: DeviceBuffer<T>,
    ) -> Result<DeviceWork<(DeviceBuffer<T>, DeviceBuffer<T>)>, CommError> {
        DeviceCommunicator::all_to_all_into(self, input, output)
    }
    fn all_gather_into<T: Element>(
        &self,
        input: DeviceBuffer<T>,
        output: DeviceBuffer<T>,
    ) -> Result<DeviceWork<(DeviceBuffer<T>, DeviceBuffer<T>)>, CommError> {
        DeviceCommunicator::all_gather_into(self, input, output)
    }
    fn reduce_scatter_into<T: Element>(
        &self,
        input: DeviceBuffer<T>,
        output: DeviceBuffer<T>,
        op: ReduceOp,
    ) -> Result<DeviceWork<(DeviceBuffer<T>, DeviceBuffer<T>)>, CommError> {
        DeviceCommunicator::reduce_scatter_into(self, input, output, op)
    }
    fn synchronize<R>(work: DeviceWork<R>) -> Result<R, CommError> {
        work.synchronize()
    }
}

/// A buffer on the host or on a device.
#[derive(Debug)]
pub enum Placed<H, D> {
    /// CPU memory.
    Host(H),
    /// Device memory.
    Device(D),
}

/// A pending collective of a [`ProcessGroup`], on whichever communicator ran it.
#[must_use = "an operation's buffers come back only through synchronize()"]
pub enum GroupWork<H, D: DeviceSide, R> {
    /// On the host communicator.
    Host(Work<H>),
    /// On the device communicator.
    Device(D::Work<R>),
}

impl<H, D: DeviceSide, R> GroupWork<H, D, R> {
    /// Blocks until the operation completes and gives its buffers back, where they were.
    pub fn synchronize(self) -> Result<Placed<H, R>, CommError> {
        match self {
            GroupWork::Host(w) => w.wait().map(Placed::Host),
            GroupWork::Device(w) => D::synchronize(w).map(Placed::Device),
        }
    }
}

/// A host communicator and, optionally, a device communicator over the same ranks.
pub struct ProcessGroup<D: DeviceSide = DeviceCommunicator> {
    host: Communicator,
    device: Option<D>,
}

impl<D: DeviceSide> std::fmt::Debug for ProcessGroup<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessGroup")
            .field("host", &self.host)
            .field("device", &self.device.as_ref().map(|d| d.device()))
            .finish()
    }
}

/// The options without the host-only knobs, named `<name>/device` (for the device half).
type SideBuf<D, T> = <D as DeviceSide>::Buffer<T>;
/// A buffer of `T` on the host or on `D`'s device.
pub type PlacedBuf<D, T> = Placed<Vec<T>, SideBuf<D, T>>;
/// The pending result of a one-buffer collective of a [`ProcessGroup`].
pub type OneBufWork<D, T> = GroupWork<Vec<T>, D, SideBuf<D, T>>;
/// The pending result of a two-buffer collective: `(input, output)`.
pub type TwoBufWork<D, T> = GroupWork<(Vec<T>, Vec<T>), D, (SideBuf<D, T>, SideBuf<D, T>)>;

impl ProcessGroup<DeviceCommunicator> {
    /// Creates both halves collectively: the host communicator from `options` without its NCCL knobs, and, when
    /// `gpu` is given, a device communicator named `<name>/device` from `options` without its host knobs.
    pub fn connect(
        gpu: Option<Arc<Gpu>>,
        store: Arc<dyn Store>,
        ranks: Vec<usize>,
        me: usize,
        options: CommOptions,
    ) -> Result<Self, CommError> {
        let host = Communicator::new(
            BackendKind::Host,
            Arc::clone(&store),
            ranks.clone(),
            me,
            options.without_nccl_knobs(),
        )?;
        let device = match gpu {
            Some(gpu) => Some(DeviceCommunicator::new(
                gpu,
                store,
                ranks,
                me,
                options.for_device(),
            )?),
            None => None,
        };
        ProcessGroup::new(host, device)
    }
}

impl<D: DeviceSide> ProcessGroup<D> {
    /// Pairs existing communicators; they must have the same member list.
    pub fn new(host: Communicator, device: Option<D>) -> Result<Self, CommError> {
        if let Some(d) = &device
            && d.members() != host.ranks()
        {
            return Err(CommError::InvalidArgument {
                comm: host.name().to_owned(),
                what: format!(
                    "the device communicator's members {:?} differ from the host communicator's {:?}",
                    d.members(),
                    host.ranks()
                ),
            });
        }
        Ok(ProcessGroup { host, device })
    }

    /// The host communicator.
    pub fn host(&self) -> &Communicator {
        &self.host
    }

    /// The device communicator, if any.
    pub fn device(&self) -> Option<&D> {
        self.device.as_ref()
    }

    fn location<T: Element>(buf: &PlacedBuf<D, T>) -> Location {
        match buf {
            Placed::Host(_) => Location::Host,
            Placed::Device(b) => Location::Device(D::buffer_device(b)),
        }
    }

    /// The device communicator for a device buffer at `location`, or the reason there is none.
    fn device_for(&self, location: Location) -> Result<&D, CommError> {
        let invalid = |what| CommError::InvalidArgument {
            comm: self.host.name().to_owned(),
            what,
        };
        route(location, self.device.as_ref().map(|d| d.device())).map_err(invalid)?;
        self.device
            .as_ref()
            .ok_or_else(|| invalid("no device communicator".into()))
    }

    fn check<T: Element>(&self, bufs: &[&PlacedBuf<D, T>]) -> Result<Route, CommError> {
        let locations: Vec<Location> = bufs.iter().map(|b| Self::location(b)).collect();
        if locations.windows(2).any(|w| w[0] != w[1]) {
            return Err(CommError::InvalidArgument {
                comm: self.host.name().to_owned(),
                what: format!("buffers of one collective live in different places: {locations:?}"),
            });
        }
        route(locations[0], self.device.as_ref().map(|d| d.device())).map_err(|what| {
            CommError::InvalidArgument {
                comm: self.host.name().to_owned(),
                what,
            }
        })
    }

    /// Runs a one-buffer collective where `buf` lives: `host` on the host communicator, `device` on the device
    /// communicator of the buffer's device.
    fn one<T: Element>(
        &self,
        buf: PlacedBuf<D, T>,
        host: impl FnOnce(&Communicator, Vec<T>) -> Result<Work<Vec<T>>, CommError>,
        device: impl FnOnce(&D, SideBuf<D, T>) -> Result<D::Work<SideBuf<D, T>>, CommError>,
    ) -> Result<OneBufWork<D, T>, CommError> {
        self.check(&[&buf])?;
        match buf {
            Placed::Host(v) => host(&self.host, v).map(GroupWork::Host),
            Placed::Device(b) => {
                let d = self.device_for(Location::Device(D::buffer_device(&b)))?;
                device(d, b).map(GroupWork::Device)
            }
        }
    }

    /// Runs a two-buffer collective where both buffers live (they must live in the same place).
    fn two<T: Element>(
        &self,
        input: PlacedBuf<D, T>,
        output: PlacedBuf<D, T>,
        host: impl FnOnce(&Communicator, Vec<T>, Vec<T>) -> Result<Work<(Vec<T>, Vec<T>)>, CommError>,
        device: impl FnOnce(
            &D,
            SideBuf<D, T>,
            SideBuf<D, T>,
        ) -> Result<D::Work<(SideBuf<D, T>, SideBuf<D, T>)>, CommError>,
    ) -> Result<TwoBufWork<D, T>, CommError> {
        self.check(&[&input, &output])?;
        match (input, output) {
            (Placed::Host(i), Placed::Host(o)) => host(&self.host, i, o).map(GroupWork::Host),
            (Placed::Device(i), Placed::Device(o)) => {
                let d = self.device_for(Location::Device(D::buffer_device(&i)))?;
                device(d, i, o).map(GroupWork::Device)
            }
            _ => unreachable_mixed(self.host.name()),
        }
    }

    /// NCCL matches point-to-point messages by order, not by tag: a device send or receive takes tag 0 only, so
    /// that a tag is never silently ignored.
    fn check_device_tag<T: Element>(
        &self,
        buf: &PlacedBuf<D, T>,
        tag: u64,
    ) -> Result<(), CommError> {
        if matches!(buf, Placed::Device(_)) && tag != 0 {
            return Err(CommError::InvalidArgument {
                comm: self.host.name().to_owned(),
                what: format!(
                    "tag {tag} on a device buffer: nccl matches sends and receives by order, so device \
                     messages take tag 0"
                ),
            });
        }
        Ok(())
    }

    /// A barrier over the group's ranks, on the host communicator (it moves no buffer, so it runs where the CPU
    /// waits). Device work already issued is not waited for: synchronize its handles first.
    pub fn barrier(&self) -> Result<Work<()>, CommError> {
        self.host.barrier()
    }

    /// In-place all-reduce where `buf` lives.
    pub fn all_reduce<T: Element>(
        &self,
        buf: PlacedBuf<D, T>,
        op: ReduceOp,
    ) -> Result<OneBufWork<D, T>, CommError> {
        self.one(buf, |h, v| h.all_reduce(v, op), |d, b| d.all_reduce(b, op))
    }

    /// In-place broadcast from `root` where `buf` lives.
    pub fn broadcast<T: Element>(
        &self,
        buf: PlacedBuf<D, T>,
        root: usize,
    ) -> Result<OneBufWork<D, T>, CommError> {
        self.one(
            buf,
            |h, v| h.broadcast(v, root),
            |d, b| d.broadcast(b, root),
        )
    }

    /// In-place reduce to `root` where `buf` lives.
    pub fn reduce<T: Element>(
        &self,
        buf: PlacedBuf<D, T>,
        op: ReduceOp,
        root: usize,
    ) -> Result<OneBufWork<D, T>, CommError> {
        self.one(
            buf,
            |h, v| h.reduce(v, op, root),
            |d, b| d.reduce(b, op, root),
        )
    }

    /// All-gather into `output` where both buffers live (they must live in the same place).
    pub fn all_gather_into<T: Element>(
        &self,
        input: PlacedBuf<D, T>,
        output: PlacedBuf<D, T>,
    ) -> Result<TwoBufWork<D, T>, CommError> {
        self.two(
            input,
            output,
            |h, i, o| h.all_gather_into(i, o),
            |d, i, o| d.all_gather_into(i, o),
        )
    }

    /// Reduce-scatter from `input` into `output` where both buffers live.
    pub fn reduce_scatter_into<T: Element>(
        &self,
        input: PlacedBuf<D, T>,
        output: PlacedBuf<D, T>,
        op: ReduceOp,
    ) -> Result<TwoBufWork<D, T>, CommError> {
        self.two(
            input,
            output,
            |h, i, o| h.reduce_scatter_into(i, o, op),
            |d, i, o| d.reduce_scatter_into(i, o, op),
        )
    }

    /// All-to-all with equal blocks from `input` into `output` where both buffers live.
    pub fn all_to_all_into<T: Element>(
        &self,
        input: PlacedBuf<D, T>,
        output: PlacedBuf<D, T>,
    ) -> Result<TwoBufWork<D, T>, CommError> {
        self.two(
            input,
            output,
            |h, i, o| h.all_to_all_into(i, o),
            |d, i, o| d.all_to_all_into(i, o),
        )
    }

    /// Sends `buf` to `peer` where it lives. `tag` matches host messages; device messages take tag 0 (NCCL
    /// matches them by order).
    pub fn send<T: Element>(
        &self,
        buf: PlacedBuf<D, T>,
        peer: usize,
        tag: u64,
    ) -> Result<OneBufWork<D, T>, CommError> {
        self.check_device_tag(&buf, tag)?;
        self.one(buf, |h, v| h.send(v, peer, tag), |d, b| d.send(b, peer))
    }

    /// Receives from `peer` into `buf` where it lives; `tag` as for [`send`](Self::send).
    pub fn recv<T: Element>(
        &self,
        buf: PlacedBuf<D, T>,
        peer: usize,
        tag: u64,
    ) -> Result<OneBufWork<D, T>, CommError> {
        self.check_device_tag(&buf, tag)?;
        self.one(buf, |h, v| h.recv(v, peer, tag), |d, b| d.recv(b, peer))
    }
}

/// `check` refused mixed placements already; kept as an error rather than a panic.
fn unreachable_mixed<R>(comm: &str) -> Result<R, CommError> {
    Err(CommError::InvalidArgument {
        comm: comm.to_owned(),
        what: "buffers of one collective live in different places".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use hypercomm_store::MemoryStore;
    use std::sync::Mutex;

    /// A device side that runs "collectives" as a single rank would, on host vectors tagged with a device, and
    /// records what it was asked.
    struct FakeDevice {
        device: usize,
        members: Vec<usize>,
        calls: Mutex<Vec<String>>,
    }

    struct FakeBuf<T> {
        device: usize,
        data: Vec<T>,
    }

    impl DeviceSide for FakeDevice {
        type Buffer<T: Element> = FakeBuf<T>;
        type Work<R> = R;
        fn device(&self) -> usize {
            self.device
        }
        fn members(&self) -> &[usize] {
            &self.members
        }
        fn buffer_device<T: Element>(buf: &FakeBuf<T>) -> usize {
            buf.device
        }
        fn all_reduce<T: Element>(
            &self,
            buf: FakeBuf<T>,
            op: ReduceOp,
        ) -> Result<FakeBuf<T>, CommError> {
            self.calls.lock().unwrap().push(format!("all_reduce {op}"));
            Ok(buf)
        }
        fn broadcast<T: Element>(
            &self,
            buf: FakeBuf<T>,
            root: usize,
        ) -> Result<FakeBuf<T>, CommError> {
            self.calls.lock().unwrap().push(format!("broadcast {root}"));
            Ok(buf)
        }
        fn reduce<T: Element>(
            &self,
            buf: FakeBuf<T>,
            op: ReduceOp,
            root: usize,
        ) -> Result<FakeBuf<T>, CommError> {
            self.calls
                .lock()
                .unwrap()
                .push(format!("reduce {op} {root}"));
            Ok(buf)
        }
        fn send<T: Element>(&self, buf: FakeBuf<T>, peer: usize) -> Result<FakeBuf<T>, CommError> {
            self.calls.lock().unwrap().push(format!("send {peer}"));
            Ok(buf)
        }
        fn recv<T: Element>(&self, buf: FakeBuf<T>, peer: usize) -> Result<FakeBuf<T>, CommError> {
            self.calls.lock().unwrap().push(format!("recv {peer}"));
            Ok(buf)
        }
        fn all_to_all_into<T: Element>(
            &self,
            input: FakeBuf<T>,
            mut output: FakeBuf<T>,
        ) -> Result<(FakeBuf<T>, FakeBuf<T>), CommError> {
            self.calls.lock().unwrap().push("all_to_all".into());
            output.data.copy_from_slice(&input.data);
            Ok((input, output))
        }
        fn all_gather_into<T: Element>(
            &self,
            input: FakeBuf<T>,
            mut output: FakeBuf<T>,
        ) -> Result<(FakeBuf<T>, FakeBuf<T>), CommError> {
            self.calls.lock().unwrap().push("all_gather".into());
            output.data.copy_from_slice(&input.data);
            Ok((input, output))
        }
        fn reduce_scatter_into<T: Element>(
            &self,
            input: FakeBuf<T>,
            mut output: FakeBuf<T>,
            op: ReduceOp,
        ) -> Result<(FakeBuf<T>, FakeBuf<T>), CommError> {
            self.calls
                .lock()
                .unwrap()
                .push(format!("reduce_scatter {op}"));
            output.data.copy_from_slice(&input.data);
            Ok((input, output))
        }
        fn synchronize<R>(work: R) -> Result<R, CommError> {
            Ok(work)
        }
    }

    fn group(device: Option<usize>) -> ProcessGroup<FakeDevice> {
        let host = Communicator::world(
            BackendKind::Host,
            Arc::new(MemoryStore::new()),
            1,
            0,
            CommOptions::named("pg"),
        )
        .unwrap();
        let device = device.map(|d| FakeDevice {
            device: d,
            members: vec![0],
            calls: Mutex::new(Vec::new()),
        });
        ProcessGroup::new(host, device).unwrap()
    }

    fn calls(pg: &ProcessGroup<FakeDevice>) -> Vec<String> {
        pg.device()
            .map_or(Vec::new(), |d| d.calls.lock().unwrap().clone())
    }

    #[test]
    fn route_table() {
        assert_eq!(route(Location::Host, None), Ok(Route::Host));
        assert_eq!(route(Location::Host, Some(3)), Ok(Route::Host));
        assert_eq!(route(Location::Device(3), Some(3)), Ok(Route::Device));
        let e = route(Location::Device(1), Some(0)).unwrap_err();
        assert!(e.contains("device 1") && e.contains("device 0"), "{e}");
        let e = route(Location::Device(2), None).unwrap_err();
        assert!(e.contains("no device communicator"), "{e}");
    }

    #[test]
    fn host_buffers_go_to_the_host_communicator_and_device_buffers_to_the_device() {
        let pg = group(Some(0));
        let out = pg
            .all_reduce(Placed::Host(vec![2.5f32; 3]), ReduceOp::Sum)
            .unwrap()
            .synchronize()
            .unwrap();
        assert!(matches!(out, Placed::Host(v) if v == vec![2.5; 3]));
        assert!(
            calls(&pg).is_empty(),
            "the device side must not see host buffers"
        );

        let out = pg
            .all_reduce(
                Placed::Device(FakeBuf {
                    device: 0,
                    data: vec![1i32, 2],
                }),
                ReduceOp::Max,
            )
            .unwrap()
            .synchronize()
            .unwrap();
        assert!(matches!(out, Placed::Device(b) if b.data == vec![1, 2]));
        pg.broadcast(
            Placed::Device(FakeBuf {
                device: 0,
                data: vec![0u8],
            }),
            0,
        )
        .unwrap()
        .synchronize()
        .unwrap();
        let out = pg
            .all_gather_into(
                Placed::Device(FakeBuf {
                    device: 0,
                    data: vec![7u64],
                }),
                Placed::Device(FakeBuf {
                    device: 0,
                    data: vec![0u64],
                }),
            )
            .unwrap()
            .synchronize()
            .unwrap();
        assert!(matches!(out, Placed::Device((_, o)) if o.data == vec![7]));
        pg.reduce_scatter_into(
            Placed::Device(FakeBuf {
                device: 0,
                data: vec![1.0f64],
            }),
            Placed::Device(FakeBuf {
                device: 0,
                data: vec![0.0f64],
            }),
            ReduceOp::Sum,
        )
        .unwrap()
        .synchronize()
        .unwrap();
        assert_eq!(
            calls(&pg),
            [
                "all_reduce max",
                "broadcast 0",
                "all_gather",
                "reduce_scatter sum"
            ]
        );

        // And host all-gather still goes to the host.
        let out = pg
            .all_gather_into(Placed::Host(vec![4u32]), Placed::Host(vec![0u32]))
            .unwrap()
            .synchronize()
            .unwrap();
        assert!(matches!(out, Placed::Host((_, o)) if o == vec![4]));
        assert_eq!(calls(&pg).len(), 4);
    }

    fn dev<T>(data: Vec<T>) -> Placed<Vec<T>, FakeBuf<T>> {
        Placed::Device(FakeBuf { device: 0, data })
    }

    #[test]
    fn reduce_all_to_all_and_point_to_point_follow_the_buffer() {
        let pg = group(Some(0));
        let out = pg
            .reduce(Placed::Host(vec![3i64, 4]), ReduceOp::Min, 0)
            .unwrap()
            .synchronize()
            .unwrap();
        assert!(matches!(out, Placed::Host(v) if v == vec![3, 4]));
        let out = pg
            .all_to_all_into(Placed::Host(vec![5u8, 6]), Placed::Host(vec![0u8, 0]))
            .unwrap()
            .synchronize()
            .unwrap();
        assert!(matches!(out, Placed::Host((_, o)) if o == vec![5, 6]));
        assert!(calls(&pg).is_empty(), "host buffers stay on the host");
        pg.barrier().unwrap().wait().unwrap();

        pg.reduce(dev(vec![1.0f32]), ReduceOp::Prod, 0)
            .unwrap()
            .synchronize()
            .unwrap();
        let out = pg
            .all_to_all_into(dev(vec![9u32]), dev(vec![0u32]))
            .unwrap()
            .synchronize()
            .unwrap();
        assert!(matches!(out, Placed::Device((_, o)) if o.data == vec![9]));
        pg.send(dev(vec![1i32]), 0, 0)
            .unwrap()
            .synchronize()
            .unwrap();
        pg.recv(dev(vec![0i32]), 0, 0)
            .unwrap()
            .synchronize()
            .unwrap();
        assert_eq!(
            calls(&pg),
            ["reduce prod 0", "all_to_all", "send 0", "recv 0"]
        );
    }

    #[test]
    fn device_messages_refuse_a_tag_instead_of_ignoring_it() {
        let pg = group(Some(0));
        for result in [
            pg.send(dev(vec![1i32]), 0, 7).map(|_| ()),
            pg.recv(dev(vec![1i32]), 0, 7).map(|_| ()),
        ] {
            let e = result.unwrap_err().to_string();
            assert!(e.contains("tag 7 on a device buffer"), "{e}");
        }
        assert!(calls(&pg).is_empty());
    }

    #[test]
    fn misplaced_buffers_are_refused_before_anything_runs() {
        let pg = group(Some(0));
        let e = pg
            .all_reduce(
                Placed::Device(FakeBuf {
                    device: 1,
                    data: vec![1f32],
                }),
                ReduceOp::Sum,
            )
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("buffer is on device 1"), "{e}");
        let e = pg
            .all_gather_into(
                Placed::Host(vec![1f32]),
                Placed::Device(FakeBuf {
                    device: 0,
                    data: vec![0f32],
                }),
            )
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("different places"), "{e}");
        assert!(calls(&pg).is_empty());

        let host_only = group(None);
        let e = host_only
            .broadcast(
                Placed::Device(FakeBuf {
                    device: 0,
                    data: vec![1i8],
                }),
                0,
            )
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("no device communicator"), "{e}");
        // Host collectives work without a device.
        host_only
            .broadcast(Placed::Host(vec![1i8]), 0)
            .unwrap()
            .synchronize()
            .unwrap();
    }

    #[test]
    fn halves_must_have_the_same_members() {
        let host = Communicator::world(
            BackendKind::Host,
            Arc::new(MemoryStore::new()),
            1,
            0,
            CommOptions::named("pg"),
        )
        .unwrap();
        let device = FakeDevice {
            device: 0,
            members: vec![0, 1],
            calls: Mutex::new(Vec::new()),
        };
        let e = ProcessGroup::new(host, Some(device))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("[0, 1]") && e.contains("[0]"), "{e}");
    }

    #[test]
    fn options_split_between_the_halves() {
        let opts = CommOptions {
            force_tcp: true,
            blocking: Some(false),
            min_ctas: Some(2),
            ..CommOptions::named("g")
        };
        let h = opts.without_nccl_knobs();
        assert!(h.nccl_knobs_set().is_empty());
        assert!(h.force_tcp);
        assert!(h.validate_for(BackendKind::Host).is_ok());
        let d = opts.for_device();
        assert_eq!(d.name, "g/device");
        assert!(!d.force_tcp);
        assert_eq!(d.nccl_knobs_set(), ["min_ctas", "blocking"]);
        assert!(
            crate::backends::nccl::config::translate(&d, nccl_sys::Version::new(2, 28, 9)).is_ok()
        );
    }
}
