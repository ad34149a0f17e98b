//! Routing with a fake device side: every collective goes where its buffers live, and mixed or misplaced
//! buffers are refused.

use std::sync::Arc;

use super::*;
use crate::{BackendKind, CommError, CommOptions, Communicator, Element, NcclOptions, ReduceOp};
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
    fn abort(&self) {
        self.calls.lock().unwrap().push("abort".into());
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
    fn broadcast<T: Element>(&self, buf: FakeBuf<T>, root: usize) -> Result<FakeBuf<T>, CommError> {
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
        nccl: NcclOptions {
            blocking: Some(false),
            min_ctas: Some(2),
            ..NcclOptions::default()
        },
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
    assert!(crate::backends::nccl::config::translate(&d, nccl_sys::Version::new(2, 28, 9)).is_ok());
}
