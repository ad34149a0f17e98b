//! [`ProcessGroup`]: a host communicator and, when a GPU is present, a device communicator over the same ranks;
//! each collective runs where its buffer lives.

use std::sync::Arc;

use hypercomm_store::Store;

use super::location::{Location, Route, route};
use super::side::DeviceSide;
use crate::backends::nccl::communicator::DeviceCommunicator;
use crate::backends::nccl::gpu::Gpu;
use crate::{BackendKind, CommError, CommOptions, Communicator, Element, ReduceOp, Work};

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

type SideBuf<D, T> = <D as DeviceSide>::Buffer<T>;
/// A buffer of `T` on the host or on `D`'s device.
pub type PlacedBuf<D, T> = Placed<Vec<T>, SideBuf<D, T>>;
/// The pending result of a one-buffer collective of a [`ProcessGroup`].
pub type OneBufWork<D, T> = GroupWork<Vec<T>, D, SideBuf<D, T>>;
/// The pending result of a two-buffer collective: `(input, output)`.
pub type TwoBufWork<D, T> = GroupWork<(Vec<T>, Vec<T>), D, (SideBuf<D, T>, SideBuf<D, T>)>;

impl ProcessGroup<DeviceCommunicator> {
    /// Creates both halves collectively: the host communicator from `options` without its NCCL knobs, and, when
    /// `gpu` is given, a device communicator named `<name>/device` from `options` without its host knobs. The
    /// device half joins the host half's failure domain: a failure of either aborts both.
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
                CommOptions {
                    failure_domain: Some(Arc::clone(host.failure_domain())),
                    ..options.for_device()
                },
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

    /// Aborts both halves: the host communicator tells its peers, the NCCL one is `ncclCommAbort`ed; pending and
    /// later operations on either fail with [`CommError::Broken`].
    pub fn abort(&self) {
        self.host.abort();
        if let Some(d) = &self.device {
            d.abort();
        }
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
