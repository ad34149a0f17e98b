//! Collectives and point-to-point calls: checked when issued, given their place in the order then, and run
//! when the stream reaches them, exchanging real data with the other ranks.
//!
//! A collective's ranks each publish a record (what they called, and their data) and read everyone's; a rank
//! whose record differs (another operation, count, type, reduction or root) fails the communicator, where a
//! real NCCL would hang or corrupt memory. A created premulsum is one reduction whatever its scalar: each rank
//! multiplies its own data by its own scalar before publishing it, as NCCL's pre-op runs on each rank's input. A send publishes its data and waits for the receiver's
//! acknowledgement, so an unmatched send or receive blocks as in NCCL, until the fake's peer timeout reports it.

use std::sync::Arc;

use nccl_sys::sys::ncclResult_t;
use std::sync::atomic::Ordering;

use super::comm::Comm;
use super::exchange::{await_file, publish};
use super::red_ops::{NUM_OPS, PreMulSum};
use super::reduce::{op_name, pre_multiply, reduce, type_name, width};
use super::result_codes::{INVALID_ARGUMENT, INVALID_USAGE, SYSTEM_ERROR, UNHANDLED_CUDA_ERROR};
use crate::{knobs, memory, stream};

/// One call, with device addresses. Counts are in elements, as NCCL takes them.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Call {
    AllReduce {
        send: u64,
        recv: u64,
        count: usize,
        dtype: i32,
        op: i32,
    },
    Broadcast {
        send: u64,
        recv: u64,
        count: usize,
        dtype: i32,
        root: usize,
    },
    Reduce {
        send: u64,
        recv: u64,
        count: usize,
        dtype: i32,
        op: i32,
        root: usize,
    },
    AllGather {
        send: u64,
        recv: u64,
        count: usize,
        dtype: i32,
    },
    ReduceScatter {
        send: u64,
        recv: u64,
        count: usize,
        dtype: i32,
        op: i32,
    },
    Send {
        buf: u64,
        count: usize,
        dtype: i32,
        peer: usize,
    },
    Recv {
        buf: u64,
        count: usize,
        dtype: i32,
        peer: usize,
    },
}

impl Call {
    fn dtype(&self) -> i32 {
        match *self {
            Call::AllReduce { dtype, .. }
            | Call::Broadcast { dtype, .. }
            | Call::Reduce { dtype, .. }
            | Call::AllGather { dtype, .. }
            | Call::ReduceScatter { dtype, .. }
            | Call::Send { dtype, .. }
            | Call::Recv { dtype, .. } => dtype,
        }
    }

    /// The record every rank of a collective must agree on: kind, type, count, reduction, root.
    fn signature(&self) -> [i64; 5] {
        match *self {
            Call::AllReduce {
                count, dtype, op, ..
            } => [0, dtype.into(), count as i64, op.into(), -1],
            Call::Broadcast {
                count, dtype, root, ..
            } => [1, dtype.into(), count as i64, -1, root as i64],
            Call::Reduce {
                count,
                dtype,
                op,
                root,
                ..
            } => [2, dtype.into(), count as i64, op.into(), root as i64],
            Call::AllGather { count, dtype, .. } => [3, dtype.into(), count as i64, -1, -1],
            Call::ReduceScatter {
                count, dtype, op, ..
            } => [4, dtype.into(), count as i64, op.into(), -1],
            Call::Send { .. } | Call::Recv { .. } => [5, -1, -1, -1, -1],
        }
    }
}

fn describe(sig: &[i64; 5]) -> String {
    let kind = [
        "all_reduce",
        "broadcast",
        "reduce",
        "all_gather",
        "reduce_scatter",
        "p2p",
    ]
    .get(sig[0] as usize)
    .copied()
    .unwrap_or("?");
    let mut s = format!("{kind} of {} {}", sig[2], type_name(sig[1] as i32));
    if sig[3] >= 0 {
        s += &format!(" ({})", op_name(sig[3] as i32));
    }
    if sig[4] >= 0 {
        s += &format!(" root {}", sig[4]);
    }
    s
}

/// A call issued on a communicator, with its place in the order.
pub(crate) struct Issued {
    pub comm: Arc<Comm>,
    /// The call; a created reduction's handle is replaced by `NUM_OPS`, the code all ranks' records agree on.
    pub call: Call,
    /// The collective's number, or the send's or receive's number within its pair of ranks.
    pub seq: u64,
    /// The created reduction the call was given, copied when issued (NCCL copies it too, so the operator may be
    /// destroyed before the call runs).
    pub pre_mul: Option<PreMulSum>,
}

/// Checks `call` against `comm` and gives it its place; `Err` with NCCL's answer for bad arguments.
pub(crate) fn issue(comm: &Arc<Comm>, call: Call) -> Result<Issued, (ncclResult_t, String)> {
    let bad = |why: String| Err((INVALID_ARGUMENT, why));
    let Some(w) = width(call.dtype()) else {
        return bad(format!(
            "{} is not a type the fake moves",
            type_name(call.dtype())
        ));
    };
    let n = comm.nranks;
    let mut call = call;
    let mut pre_mul = None;
    if let Call::AllReduce { op, dtype, .. }
    | Call::ReduceScatter { op, dtype, .. }
    | Call::Reduce { op, dtype, .. } = &mut call
    {
        if *op < 0 {
            return bad(format!("reduction {} is not an nccl reduction", *op as u32));
        }
        if *op >= NUM_OPS {
            pre_mul = Some(
                comm.ops
                    .resolve(*op, *dtype)
                    .map_err(|e| (INVALID_ARGUMENT, e))?,
            );
            *op = NUM_OPS;
        }
    }
    let (addresses, elements, rank_arg): (Vec<u64>, usize, Option<usize>) = match call {
        Call::AllReduce {
            send, recv, count, ..
        }
        | Call::ReduceScatter {
            send, recv, count, ..
        } => (vec![send, recv], count, None),
        Call::Reduce {
            send,
            recv,
            count,
            root,
            ..
        } => (vec![send, recv], count, Some(root)),
        Call::Broadcast {
            send,
            recv,
            count,
            root,
            ..
        } => (vec![send, recv], count, Some(root)),
        Call::AllGather {
            send, recv, count, ..
        } => (vec![send, recv], count, None),
        Call::Send {
            buf, count, peer, ..
        }
        | Call::Recv {
            buf, count, peer, ..
        } => (vec![buf], count, Some(peer)),
    };
    if let Some(r) = rank_arg
        && r >= n
    {
        return bad(format!("rank {r} is not a rank of a {n}-rank communicator"));
    }
    if elements
        .checked_mul(w)
        .and_then(|b| b.checked_mul(n))
        .is_none()
    {
        return bad(format!("{elements} elements overflow"));
    }
    if elements > 0 && addresses.contains(&0) {
        return bad("a null buffer".into());
    }
    let seq = match call {
        Call::Send { peer, .. } => comm.next_p2p(peer, true),
        Call::Recv { peer, .. } => comm.next_p2p(peer, false),
        _ => comm.next_collective(),
    };
    Ok(Issued {
        comm: Arc::clone(comm),
        call,
        seq,
        pre_mul,
    })
}

/// Reads `n` bytes of "device" memory; an error (CUDA's, as NCCL reports a faulting kernel) unless they lie in a
/// live allocation.
///
/// # Safety
///
/// Nothing writes the bytes meanwhile.
unsafe fn read(addr: u64, n: usize) -> Result<Vec<u8>, (ncclResult_t, String)> {
    if n == 0 {
        return Ok(Vec::new());
    }
    memory::check(addr, n, "a collective's read").map_err(|e| (UNHANDLED_CUDA_ERROR, e))?;
    // SAFETY: a live allocation holds the bytes (checked); the contract.
    Ok(unsafe { std::slice::from_raw_parts(addr as usize as *const u8, n) }.to_vec())
}

/// Writes `bytes` to "device" memory; an error unless they land in a live allocation.
///
/// # Safety
///
/// Nothing else reads or writes the bytes meanwhile.
unsafe fn write(addr: u64, bytes: &[u8]) -> Result<(), (ncclResult_t, String)> {
    if !bytes.is_empty() {
        memory::check(addr, bytes.len(), "a collective's write")
            .map_err(|e| (UNHANDLED_CUDA_ERROR, e))?;
        // SAFETY: a live allocation holds the bytes (checked); `copy` allows overlap with nothing here (bytes is
        // a separate Vec).
        unsafe { std::ptr::copy(bytes.as_ptr(), addr as usize as *mut u8, bytes.len()) };
    }
    Ok(())
}

/// Runs a batch (one call, or a group's calls on one communicator) when its stream reaches it. A failure goes
/// to the communicator's asynchronous error, as in NCCL; the stream itself goes on.
///
/// # Safety
///
/// Every address of every call holds what the call reads or writes until this returns (the C API's contract:
/// buffers stay allocated until the work completes on the stream).
pub(crate) unsafe fn run(batch: Vec<Issued>) -> Result<(), String> {
    let Some(first) = batch.first() else {
        return Ok(());
    };
    let comm = Arc::clone(&first.comm);
    let count = batch.len() as u64;
    // A stopped or failed communicator runs nothing more, and neither does one failing on demand.
    let skip = comm.stop.load(Ordering::Acquire)
        || comm.has_error()
        || batch.iter().any(|_| comm.injected_failure());
    let outcome = if skip {
        Ok(())
    } else {
        // SAFETY: the caller's contract, passed on.
        unsafe { run_batch(&comm, &batch) }
    };
    // A revoke stops in-flight work without an error (see `Comm::fail`).
    if let Err((code, why)) = outcome {
        comm.fail(code, &why);
    }
    comm.in_flight.fetch_sub(count, Ordering::AcqRel);
    Ok(())
}

/// # Safety
///
/// As [`run`].
unsafe fn run_batch(comm: &Comm, batch: &[Issued]) -> Result<(), (ncclResult_t, String)> {
    let missing = |what: String| (SYSTEM_ERROR, what);
    // Sends first, so a group's sends and receives to each other cannot wait on one another.
    for i in batch {
        if let Call::Send {
            buf,
            count,
            dtype,
            peer,
        } = i.call
        {
            let w = width(dtype).unwrap_or(1);
            // SAFETY: the contract: `buf` holds `count` elements.
            let mut data = unsafe { read(buf, count * w) }?;
            data.extend_from_slice(&(count as u64).to_le_bytes());
            data.extend_from_slice(&dtype.to_le_bytes());
            publish(
                &comm.dir,
                &format!("p{}-{peer}.{}", comm.rank, i.seq),
                &data,
            )
            .map_err(missing)?;
        }
    }
    for i in batch {
        match i.call {
            Call::Send { .. } => {}
            Call::Recv {
                buf,
                count,
                dtype,
                peer,
            } => {
                let name = format!("p{peer}-{}.{}", comm.rank, i.seq);
                let mut data = await_file(&comm.dir, &name, &comm.stop).map_err(|e| {
                    missing(format!(
                        "receive #{} from rank {peer} of {count} {}: {e}",
                        i.seq,
                        type_name(dtype)
                    ))
                })?;
                let tail = data.split_off(data.len().saturating_sub(12));
                let sent = u64::from_le_bytes(tail[..8].try_into().unwrap_or([0; 8])) as usize;
                let sent_type = i32::from_le_bytes(tail[8..].try_into().unwrap_or([0; 4]));
                if sent != count || sent_type != dtype {
                    return Err((
                        INVALID_USAGE,
                        format!(
                            "rank {peer} sent {sent} {} but this rank receives {count} {}",
                            type_name(sent_type),
                            type_name(dtype)
                        ),
                    ));
                }
                // SAFETY: the contract: `buf` holds `count` elements of this width.
                unsafe { write(buf, &data) }?;
                publish(&comm.dir, &format!("{name}.ack"), &[]).map_err(missing)?;
            }
            // SAFETY: the contract, passed on.
            call => unsafe { collective(comm, i.seq, call, i.pre_mul) }?,
        }
    }
    for i in batch {
        if let Call::Send {
            peer, count, dtype, ..
        } = i.call
        {
            let name = format!("p{}-{peer}.{}.ack", comm.rank, i.seq);
            await_file(&comm.dir, &name, &comm.stop).map_err(|e| {
                missing(format!(
                    "send #{} to rank {peer} of {count} {} was never received: {e}",
                    i.seq,
                    type_name(dtype)
                ))
            })?;
        }
    }
    Ok(())
}

/// # Safety
///
/// As [`run`].
unsafe fn collective(
    comm: &Comm,
    seq: u64,
    call: Call,
    pre_mul: Option<PreMulSum>,
) -> Result<(), (ncclResult_t, String)> {
    let (n, me) = (comm.nranks, comm.rank);
    let w = width(call.dtype()).unwrap_or(1);
    let (send, count) = match call {
        Call::AllReduce { send, count, .. }
        | Call::Reduce { send, count, .. }
        | Call::AllGather { send, count, .. } => (send, count),
        Call::ReduceScatter { send, count, .. } => (send, count * n),
        Call::Broadcast {
            send, count, root, ..
        } => (send, if root == me { count } else { 0 }),
        Call::Send { .. } | Call::Recv { .. } => return Ok(()),
    };
    // SAFETY: the contract: the send buffer holds what the call reads.
    let mut payload = unsafe { read(send, count * w) }?;
    // A premulsum scales this rank's input here, and the ranks then sum.
    if let Some(p) = pre_mul {
        payload = pre_multiply(p.dtype, p.scalar, &payload)
            .map_err(|e| (INVALID_USAGE, format!("collective #{seq}: {e}")))?;
    }
    let sum_or = |op: i32| if pre_mul.is_some() { 0 } else { op };
    let sig = call.signature();
    let records: Vec<Vec<u8>> = if n == 1 {
        vec![payload]
    } else {
        let mut mine: Vec<u8> = sig.iter().flat_map(|v| v.to_le_bytes()).collect();
        mine.extend_from_slice(&payload);
        let all: Vec<usize> = (0..n).collect();
        let records = comm
            .gather("c", seq, &mine, &all, &comm.stop)
            .map_err(|e| {
                (
                    SYSTEM_ERROR,
                    format!("collective #{seq} ({}): {e}", describe(&sig)),
                )
            })?;
        let mut out = Vec::with_capacity(n);
        for (r, mut rec) in records.into_iter().enumerate() {
            let body = rec.split_off(40.min(rec.len()));
            let theirs: Vec<i64> = rec
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect();
            if theirs != sig {
                let theirs: [i64; 5] = theirs.try_into().unwrap_or([-1; 5]);
                if knobs::mismatch_hangs() {
                    // As NCCL's kernels would: no progress until the communicator is stopped.
                    stream::poll_until(knobs::peer_timeout(), || comm.stop.load(Ordering::Acquire));
                }
                return Err((
                    INVALID_USAGE,
                    format!(
                        "collective #{seq}: rank {r} called {} but rank {me} called {}",
                        describe(&theirs),
                        describe(&sig)
                    ),
                ));
            }
            out.push(body);
        }
        out
    };
    let inputs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
    let fail = |e: String| (INVALID_USAGE, format!("collective #{seq}: {e}"));
    match call {
        Call::AllReduce {
            recv, dtype, op, ..
        } => {
            let out = reduce(dtype, sum_or(op), &inputs).map_err(fail)?;
            // SAFETY: the contract: `recv` holds `count` elements.
            unsafe { write(recv, &out) }?;
        }
        Call::Reduce {
            recv,
            dtype,
            op,
            root,
            ..
        } => {
            if me == root {
                let out = reduce(dtype, sum_or(op), &inputs).map_err(fail)?;
                // SAFETY: as above.
                unsafe { write(recv, &out) }?;
            }
        }
        Call::Broadcast { recv, root, .. } => {
            // SAFETY: as above.
            unsafe { write(recv, inputs[root]) }?;
        }
        Call::AllGather { recv, .. } => {
            // SAFETY: the contract: `recv` holds `n * count` elements.
            unsafe { write(recv, &inputs.concat()) }?;
        }
        Call::ReduceScatter {
            recv,
            count,
            dtype,
            op,
            ..
        } => {
            let block = count * w;
            let mine: Vec<&[u8]> = inputs
                .iter()
                .map(|i| &i[me * block..(me + 1) * block])
                .collect();
            let out = reduce(dtype, sum_or(op), &mine).map_err(fail)?;
            // SAFETY: the contract: `recv` holds `count` elements.
            unsafe { write(recv, &out) }?;
        }
        Call::Send { .. } | Call::Recv { .. } => {}
    }
    Ok(())
}
