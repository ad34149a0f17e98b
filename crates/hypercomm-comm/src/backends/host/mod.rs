//! The host backend: collectives on CPU memory.
//!
//! Ranks on one machine (same boot id and hostname) move data through one shared-memory segment per communicator
//! (an anonymous memfd handed over a nameless socket, so nothing is left behind however a rank ends);
//! otherwise, or with [`CommOptions::force_tcp`](crate::CommOptions::force_tcp), through a full mesh of TCP
//! connections. Both transports implement the same round primitive ([`transport`]), and every collective is
//! written once against it, staged through the slots ([`staged`], [`staged_all_reduce`]), from what they all
//! share ([`collective`]). On one host the large all-reduce, all-gather and reduce-scatter skip the staging where
//! the ranks may read each other's memory: they read the peers' buffers where they are, one copy by the kernel
//! ([`direct`], [`cross_memory`]). The collectives over symmetric buffers read the peers' windows in place
//! ([`symmetric_algorithms`]).

mod bootstrap;
mod collective;
mod cross_memory;
mod direct;
mod fdpass;
mod header;
mod liveness;
mod mesh;
mod segment;
mod shm;
mod shm_exchange;
mod staged;
mod staged_all_reduce;
mod stream_copy;
mod symmetric_algorithms;
mod tcp;
mod tcp_exchange;
mod transport;

use std::sync::Arc;

use hypercomm_store::Store;

use self::collective::{Ctx, header as op_header};
use self::header::{Header, OpKind};
use self::transport::{Message, Transport};
use crate::CommError;
use crate::backend::{Backend, Io, Part, Payload, Progress, SymmetricOp};
use crate::element::{DType, ReduceOp};
use crate::options::{Algorithm, CommOptions};
use crate::symmetric::Windows;

pub(crate) use segment::{Segment, window_bytes};
pub(crate) use staged_all_reduce::LATENCY_READ_LIMIT;

/// The host backend of one communicator.
pub(crate) struct HostBackend {
    transport: Box<dyn Transport>,
    transport_name: &'static str,
    comm: String,
    algorithm: Algorithm,
    /// Collectives issued so far; the next one's sequence number.
    seq: u64,
    /// The symmetric windows, when the options ask for them.
    windows: Option<Arc<Windows>>,
}

impl HostBackend {
    /// Bootstraps rank `me` of `n` through `store` (collective: every rank must call it).
    pub(crate) fn connect(
        store: &dyn Store,
        n: usize,
        me: usize,
        options: &CommOptions,
    ) -> Result<Self, CommError> {
        let connected = bootstrap::connect(store, n, me, options)?;
        let windows = match (options.symmetric_bytes, connected.segment) {
            (0, _) => None,
            (bytes, Some(seg)) => {
                // Rank 0 sized the windows from its options; ranks that asked for another size disagree.
                if window_bytes(bytes) != Some(seg.window) {
                    return Err(CommError::InvalidArgument {
                        comm: options.name.clone(),
                        what: format!(
                            "this rank asked for symmetric windows of {bytes} bytes, rank 0 made them {} \
                             bytes: every rank must pass the same CommOptions::symmetric_bytes",
                            seg.window
                        ),
                    });
                }
                Some(Windows::shared(&options.name, me, seg))
            }
            (bytes, None) => Some(Windows::private(&options.name, me, bytes)?),
        };
        Ok(HostBackend {
            transport: connected.transport,
            transport_name: connected.name,
            comm: options.name.clone(),
            algorithm: options.algorithm,
            seq: 0,
            windows: windows.map(Arc::new),
        })
    }

    fn ctx(
        &mut self,
        kind: OpKind,
        dtype: Option<DType>,
        op: Option<ReduceOp>,
        root: Option<usize>,
        count: usize,
    ) -> Ctx<'_> {
        self.seq += 1;
        Ctx {
            t: self.transport.as_mut(),
            comm: &self.comm,
            header: op_header(self.seq, kind, dtype, op, root, count),
            algorithm: self.algorithm,
        }
    }

    /// The symmetric windows, or an error saying the communicator has none.
    fn windows(&self) -> Result<Arc<Windows>, CommError> {
        self.windows
            .clone()
            .ok_or_else(|| CommError::InvalidArgument {
                comm: self.comm.clone(),
                what:
                    "this communicator has no symmetric window (CommOptions::symmetric_bytes is 0)"
                        .into(),
            })
    }
}

fn p2p_header(dtype: DType, len: usize, tag: u64, op: Option<ReduceOp>) -> Header {
    op_header(0, OpKind::Send, Some(dtype), op, None, len / dtype.size()).with_extra(tag)
}

impl Header {
    fn with_extra(self, extra: u64) -> Header {
        Header { extra, ..self }
    }
}

impl Backend for HostBackend {
    fn all_reduce(&mut self, io: Io<'_>, dtype: DType, op: ReduceOp) -> Result<(), CommError> {
        let buf = match io {
            Io::InPlace(b) => b,
            Io::OutOfPlace(i, o) => {
                o.copy_from_slice(i);
                o
            }
        };
        let count = buf.len() / dtype.size();
        staged_all_reduce::all_reduce(
            &mut self.ctx(OpKind::AllReduce, Some(dtype), Some(op), None, count),
            buf,
            dtype,
            op,
        )
    }

    fn broadcast(&mut self, io: Io<'_>, dtype: DType, root: usize) -> Result<(), CommError> {
        let me = self.transport.rank();
        let buf = match io {
            Io::InPlace(b) => b,
            Io::OutOfPlace(i, o) => {
                if me == root {
                    o.copy_from_slice(i);
                }
                o
            }
        };
        let count = buf.len() / dtype.size();
        staged::broadcast(
            &mut self.ctx(OpKind::Broadcast, Some(dtype), None, Some(root), count),
            buf,
            dtype,
            root,
        )
    }

    fn reduce(
        &mut self,
        io: Io<'_>,
        dtype: DType,
        op: ReduceOp,
        root: usize,
    ) -> Result<(), CommError> {
        let (input, out): (Option<&[u8]>, &mut [u8]) = match io {
            Io::InPlace(b) => (None, b),
            Io::OutOfPlace(i, o) => (Some(i), o),
        };
        let count = input.map_or(out.len(), <[u8]>::len) / dtype.size();
        let mut cx = self.ctx(OpKind::Reduce, Some(dtype), Some(op), Some(root), count);
        staged::reduce_to_root(&mut cx, input, out, dtype, op, root)
    }

    fn all_gather(&mut self, io: Io<'_>, dtype: DType) -> Result<(), CommError> {
        let n = self.transport.size();
        let (input, out, per_rank) = match io {
            Io::InPlace(b) => {
                let per = b.len() / n;
                (None, b, per)
            }
            Io::OutOfPlace(i, o) => (Some(i), o, i.len()),
        };
        let mut cx = self.ctx(
            OpKind::AllGather,
            Some(dtype),
            None,
            None,
            per_rank / dtype.size(),
        );
        staged::all_gather(&mut cx, input, out, per_rank, dtype)
    }

    fn reduce_scatter(&mut self, io: Io<'_>, dtype: DType, op: ReduceOp) -> Result<(), CommError> {
        let n = self.transport.size();
        let (input, out, block) = match io {
            Io::InPlace(b) => {
                let block = b.len() / n;
                (None, b, block)
            }
            Io::OutOfPlace(i, o) => {
                let block = o.len();
                (Some(i), o, block)
            }
        };
        let mut cx = self.ctx(
            OpKind::ReduceScatter,
            Some(dtype),
            Some(op),
            None,
            block / dtype.size(),
        );
        staged::reduce_scatter(&mut cx, input, out, block, dtype, op)
    }

    fn all_to_all(&mut self, io: Io<'_>, dtype: DType) -> Result<(), CommError> {
        let n = self.transport.size();
        let (input, out): (Option<&[u8]>, &mut [u8]) = match io {
            Io::InPlace(b) => (None, b),
            Io::OutOfPlace(i, o) => (Some(i), o),
        };
        let block = out.len() / n;
        let mut cx = self.ctx(
            OpKind::AllToAll,
            Some(dtype),
            None,
            None,
            block / dtype.size(),
        );
        staged::all_to_all(&mut cx, input, out, block, dtype)
    }

    fn all_to_all_v(
        &mut self,
        input: &[u8],
        send_counts: &[usize],
        output: &mut [u8],
        recv_counts: &[usize],
        dtype: DType,
    ) -> Result<(), CommError> {
        let mut cx = self.ctx(OpKind::AllToAllV, Some(dtype), None, None, 0);
        staged::all_to_all_v(&mut cx, input, send_counts, output, recv_counts, dtype)
    }

    fn gather(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        dtype: DType,
        root: usize,
    ) -> Result<(), CommError> {
        let mut cx = self.ctx(
            OpKind::Gather,
            Some(dtype),
            None,
            Some(root),
            input.len() / dtype.size(),
        );
        staged::gather(&mut cx, input, output, dtype, root)
    }

    fn scatter(
        &mut self,
        input: &[u8],
        output: &mut [u8],
        dtype: DType,
        root: usize,
    ) -> Result<(), CommError> {
        let mut cx = self.ctx(
            OpKind::Scatter,
            Some(dtype),
            None,
            Some(root),
            output.len() / dtype.size(),
        );
        staged::scatter(&mut cx, input, output, dtype, root)
    }

    fn batch(&mut self, parts: &mut [Part<'_>], dtype: DType) -> Result<(), CommError> {
        let mut messages: Vec<Message<'_>> = parts
            .iter_mut()
            .map(|part| {
                let len = match &part.payload {
                    Payload::Out(data) => data.len(),
                    Payload::In(data) => data.len(),
                };
                let payload = match &mut part.payload {
                    Payload::Out(data) => Payload::Out(data),
                    Payload::In(data) => Payload::In(data),
                };
                Message {
                    peer: part.peer,
                    header: p2p_header(dtype, len, part.tag, part.op),
                    payload,
                }
            })
            .collect();
        self.transport.exchange(&mut messages)
    }

    fn p2p_step(
        &mut self,
        parts: &mut [(Part<'_>, DType)],
        progress: &mut Progress,
        pause: &dyn Fn() -> bool,
    ) -> Result<bool, CommError> {
        let mut messages: Vec<Message<'_>> = parts
            .iter_mut()
            .map(|(part, dtype)| {
                let (len, payload) = match &mut part.payload {
                    Payload::Out(data) => (data.len(), Payload::Out(data)),
                    Payload::In(data) => (data.len(), Payload::In(data)),
                };
                Message {
                    peer: part.peer,
                    header: p2p_header(*dtype, len, part.tag, part.op),
                    payload,
                }
            })
            .collect();
        self.transport.exchange_some(&mut messages, progress, pause)
    }

    fn barrier(&mut self) -> Result<(), CommError> {
        staged::barrier(&mut self.ctx(OpKind::Barrier, None, None, None, 0))
    }

    fn symmetric(
        &mut self,
        op: SymmetricOp,
        offset: usize,
        bytes: usize,
        dtype: DType,
    ) -> Result<(), CommError> {
        let windows = self.windows()?;
        let n = self.transport.size();
        let at = offset..offset + bytes;
        let elems = bytes / dtype.size();
        // The header's count is what the ordinary collective's would be: the all-reduce's length, the block of
        // the all-gather and the reduce-scatter.
        let (kind, reduce, count) = match op {
            SymmetricOp::AllReduce(r) => (OpKind::AllReduceSymmetric, Some(r), elems),
            SymmetricOp::AllGather => (OpKind::AllGatherSymmetric, None, elems / n),
            SymmetricOp::ReduceScatter(r) => (OpKind::ReduceScatterSymmetric, Some(r), elems / n),
        };
        let mut cx = self.ctx(kind, Some(dtype), reduce, None, count);
        cx.header.window = Some(offset as u64);
        match op {
            SymmetricOp::AllReduce(r) => {
                symmetric_algorithms::all_reduce_symmetric(&mut cx, &windows, at, dtype, r)
            }
            SymmetricOp::AllGather => {
                symmetric_algorithms::all_gather_symmetric(&mut cx, &windows, at, dtype)
            }
            SymmetricOp::ReduceScatter(r) => {
                symmetric_algorithms::reduce_scatter_symmetric(&mut cx, &windows, at, dtype, r)
            }
        }
    }

    fn symmetric_windows(&self) -> Option<Arc<Windows>> {
        self.windows.clone()
    }

    fn sever(&mut self, peer: usize) -> Result<(), CommError> {
        self.transport.sever(peer)
    }

    fn abort(&mut self) {
        self.transport.abort();
    }

    fn transport_name(&self) -> &'static str {
        self.transport_name
    }

    fn rank(&self) -> usize {
        self.transport.rank()
    }
}
