//! Creating communicators: `ncclCommInitRank[Config]`, `ncclCommSplit` and `ncclCommShrink`, with NCCL's config
//! checks and its asynchrony (a non-blocking creation runs on a thread of the fake; a split or shrink writes its
//! child through `newcomm` only when it completes).

use std::ffi::c_int;
use std::sync::Arc;
use std::sync::atomic::{AtomicPtr, Ordering};

use nccl_sys::sys::{ncclComm, ncclComm_t, ncclConfig_t, ncclResult_t, ncclUniqueId};

use super::comm::{Comm, from_handle, into_handle, release};
use super::result_codes::{IN_PROGRESS, INVALID_ARGUMENT, INVALID_USAGE, SUCCESS, SYSTEM_ERROR};
use super::{SHRINK_ABORT, SPLIT_NOCOLOR, config, exchange, token};
use crate::knobs;

/// The config behind a pointer, checked as NCCL checks it, and logged.
///
/// # Safety
///
/// `config` is null or valid, its strings null or NUL-terminated.
unsafe fn read_config(
    what: &str,
    config: *const ncclConfig_t,
) -> Result<Option<ncclConfig_t>, ncclResult_t> {
    // SAFETY: the contract.
    let Some(c) = (unsafe { config.as_ref() }) else {
        eprintln!("fake-nccl: {what}: no config");
        return Ok(None);
    };
    eprintln!("fake-nccl: {what}: {}", config::describe(c));
    match config::check(c) {
        Ok(()) => Ok(Some(*c)),
        Err(warn) => {
            eprintln!("fake-nccl: {what}: {warn}");
            Err(INVALID_ARGUMENT)
        }
    }
}

fn comm_name(config: Option<&ncclConfig_t>, fallback: String) -> String {
    match config {
        Some(c) if !c.commName.is_null() => {
            // SAFETY: checked configs' strings are NUL-terminated (read_config's contract).
            unsafe { std::ffi::CStr::from_ptr(c.commName) }
                .to_string_lossy()
                .into_owned()
        }
        _ => fallback,
    }
}

/// Runs `job` as NCCL runs a communicator's creation: on a thread of the fake for a non-blocking communicator
/// (`ncclInProgress` until it finishes, and for `polls` more polls), at once otherwise.
pub(super) fn run_job(
    owner: &Arc<Comm>,
    polls: u32,
    job: impl FnOnce() -> Result<(), (ncclResult_t, String)> + Send + 'static,
) -> ncclResult_t {
    if owner.non_blocking {
        owner.set_job_running(true);
        let comm = Arc::clone(owner);
        let spawned = std::thread::Builder::new()
            .name("fake-nccl-job".into())
            .spawn(move || {
                if let Err((code, why)) = job() {
                    comm.fail(code, &why);
                }
                comm.linger(polls);
                comm.set_job_running(false);
            });
        match spawned {
            Ok(_) => IN_PROGRESS,
            Err(_) => {
                owner.set_job_running(false);
                SYSTEM_ERROR
            }
        }
    } else {
        match job() {
            Ok(()) => SUCCESS,
            Err((code, why)) => {
                owner.fail(code, &why);
                code
            }
        }
    }
}

/// What `ncclCommSplit` and `ncclCommShrink` answer: NCCL passes on the result of setting the child up, not its
/// group end's `ncclInProgress`, so a non-blocking split or shrink answers `ncclSuccess` while its job still
/// runs; only the parent's `ncclCommGetAsyncError` tells when the child has been written (NCCL 2.28 and 2.30,
/// `ncclCommSplit` and `ncclCommShrink` in `src/init.cc`; seen on an H100).
fn child_job_answer(answer: ncclResult_t) -> ncclResult_t {
    if answer == IN_PROGRESS {
        SUCCESS
    } else {
        answer
    }
}

/// `ncclCommInitRankConfig`: the handle is written at once; the ranks meet before (blocking) or after
/// (non-blocking) the call returns.
///
/// # Safety
///
/// `out` is valid for one write; `config` is null or a valid config.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommInitRankConfig(
    out: *mut ncclComm_t,
    nranks: c_int,
    id: ncclUniqueId,
    rank: c_int,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    if out.is_null() {
        return INVALID_ARGUMENT;
    }
    // SAFETY: the contract.
    let config = match unsafe { read_config("ncclCommInitRankConfig", config) } {
        Ok(c) => c,
        Err(e) => return e,
    };
    let (Ok(n), Ok(r)) = (usize::try_from(nranks), usize::try_from(rank)) else {
        return INVALID_ARGUMENT;
    };
    if n == 0 || r >= n {
        eprintln!("fake-nccl: ncclCommInitRankConfig: rank {rank} of {nranks} ranks");
        return INVALID_ARGUMENT;
    }
    let Some(token) = token(&id) else {
        eprintln!(
            "fake-nccl: ncclCommInitRankConfig: the unique id was not made by ncclGetUniqueId"
        );
        return INVALID_ARGUMENT;
    };
    let non_blocking = config.is_some_and(|c| c.blocking == 0);
    let name = comm_name(config.as_ref(), format!("comm-{token}"));
    let device = crate::cuda::current_device();
    let comm = Comm::new(
        exchange::directory(&token),
        r,
        n,
        device,
        name,
        non_blocking,
    );
    // SAFETY: non-null and valid by the contract.
    unsafe { out.write(into_handle(Arc::clone(&comm))) };
    let joining = Arc::clone(&comm);
    let answer = run_job(&comm, knobs::init_polls(), move || joining.join(device));
    if answer != SUCCESS && answer != IN_PROGRESS {
        // A blocking creation that failed leaves no communicator behind.
        // SAFETY: the handle was written just above and nobody else has it yet.
        unsafe {
            release(out.read()).leave();
            out.write(std::ptr::null_mut());
        }
    }
    answer
}

/// `ncclCommInitRank`: blocking, no config.
///
/// # Safety
///
/// As [`ncclCommInitRankConfig`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommInitRank(
    out: *mut ncclComm_t,
    nranks: c_int,
    id: ncclUniqueId,
    rank: c_int,
) -> ncclResult_t {
    // SAFETY: the caller's contract.
    unsafe { ncclCommInitRankConfig(out, nranks, id, rank, std::ptr::null_mut()) }
}

/// Where a split or shrink writes its child: the caller's `newcomm`, kept as an address because NCCL writes it
/// from another thread, later.
#[derive(Clone, Copy)]
struct ChildOut(usize);

impl ChildOut {
    /// Writes the child's handle (atomically, with release ordering, as NCCL does).
    ///
    /// # Safety
    ///
    /// The address is still valid: NCCL's contract for a non-blocking split is that `*newcomm` stays valid until
    /// the parent reports completion, which happens only after this write.
    unsafe fn write(self, child: ncclComm_t) {
        // SAFETY: the contract; `*mut ncclComm` and `AtomicPtr<ncclComm>` share a layout, and the address is
        // aligned for a pointer (it came from a `*mut ncclComm_t`).
        unsafe { AtomicPtr::<ncclComm>::from_ptr(self.0 as *mut ncclComm_t) }
            .store(child, Ordering::Release);
    }
}

/// A child communicator a split or shrink creates, once its members are known.
struct ChildSpec {
    /// Told apart from the parent's directory name by this suffix.
    suffix: String,
    rank: usize,
    nranks: usize,
    name: String,
    blocking: bool,
}

impl ChildSpec {
    /// Creates the child's directory and communicator and writes its handle through `slot`.
    ///
    /// # Safety
    ///
    /// As [`ChildOut::write`].
    unsafe fn create_into(
        self,
        parent: &Comm,
        slot: ChildOut,
    ) -> Result<(), (ncclResult_t, String)> {
        let base = parent
            .dir
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        let dir = parent.dir.with_file_name(format!("{base}-{}", self.suffix));
        std::fs::create_dir_all(&dir)
            .map_err(|e| (SYSTEM_ERROR, format!("creating {}: {e}", dir.display())))?;
        let child = Comm::new(
            dir,
            self.rank,
            self.nranks,
            parent.device,
            self.name,
            !self.blocking,
        );
        child.linger(knobs::init_polls());
        // SAFETY: the caller's contract.
        unsafe { slot.write(into_handle(child)) };
        Ok(())
    }
}

/// `ncclCommSplit`: `*newcomm` is null until the split completes; then the child (none for
/// `NCCL_SPLIT_NOCOLOR`). A non-blocking parent answers `ncclSuccess` at once and `ncclInProgress` from
/// `ncclCommGetAsyncError` until then ([`child_job_answer`]).
///
/// # Safety
///
/// `parent` is live; `out` stays valid until the parent reports completion; `config` is null or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommSplit(
    parent: ncclComm_t,
    color: c_int,
    key: c_int,
    out: *mut ncclComm_t,
    config: *mut ncclConfig_t,
) -> ncclResult_t {
    // SAFETY: the caller's contract.
    let Some(parent) = (unsafe { from_handle(parent) }).cloned() else {
        return INVALID_ARGUMENT;
    };
    if out.is_null() {
        return INVALID_ARGUMENT;
    }
    if let Err(e) = parent.ensure_ready("ncclCommSplit") {
        return e;
    }
    // SAFETY: the caller's contract.
    let config = match unsafe { read_config("ncclCommSplit", config) } {
        Ok(c) => c,
        Err(e) => return e,
    };
    // SAFETY: valid by the contract; NCCL nulls it at once.
    unsafe { out.write(std::ptr::null_mut()) };
    let child_blocking = config.map_or(!parent.non_blocking, |c| c.blocking != 0);
    let name = comm_name(config.as_ref(), format!("{}/split", parent.name));
    let k = parent.next_control();
    let slot = ChildOut(out as usize);
    let p = Arc::clone(&parent);
    let answer = run_job(&parent, knobs::init_polls(), move || {
        let mine = [color.to_le_bytes(), key.to_le_bytes()].concat();
        let all: Vec<usize> = (0..p.nranks).collect();
        let records = p
            .gather("x", k, &mine, &all, &p.gone)
            .map_err(|e| (SYSTEM_ERROR, format!("split #{k}: {e}")))?;
        if color == SPLIT_NOCOLOR {
            return Ok(());
        }
        let mut members: Vec<(c_int, usize)> = Vec::new();
        for (r, rec) in records.iter().enumerate() {
            let c = c_int::from_le_bytes(rec[..4].try_into().unwrap_or([0; 4]));
            let kk = c_int::from_le_bytes(rec[4..8].try_into().unwrap_or([0; 4]));
            if c == color {
                members.push((kk, r));
            }
        }
        members.sort_unstable();
        let rank = members.iter().position(|&(_, r)| r == p.rank).unwrap_or(0);
        let child = ChildSpec {
            suffix: format!("x{k}-c{color}"),
            rank,
            nranks: members.len(),
            name,
            blocking: child_blocking,
        };
        // SAFETY: `out` stays valid until the parent reports completion (the contract), which it does only after
        // this job returns.
        unsafe { child.create_into(&p, slot) }?;
        Ok(())
    });
    child_job_answer(answer)
}

/// `ncclCommShrink`: a child of the ranks not in `exclude`, written as for [`ncclCommSplit`].
///
/// # Safety
///
/// `parent` is live; `exclude` holds `count` ints; `out` stays valid until the parent reports completion.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommShrink(
    parent: ncclComm_t,
    exclude: *mut c_int,
    count: c_int,
    out: *mut ncclComm_t,
    config: *mut ncclConfig_t,
    flags: c_int,
) -> ncclResult_t {
    // SAFETY: the caller's contract.
    let Some(parent) = (unsafe { from_handle(parent) }).cloned() else {
        return INVALID_ARGUMENT;
    };
    let Ok(count) = usize::try_from(count) else {
        return INVALID_ARGUMENT;
    };
    if out.is_null() || (count > 0 && exclude.is_null()) {
        return INVALID_ARGUMENT;
    }
    let mut excluded: Vec<usize> = if count == 0 {
        Vec::new()
    } else {
        // SAFETY: the contract: `exclude` holds `count` ints.
        unsafe { std::slice::from_raw_parts(exclude, count) }
            .iter()
            .filter_map(|&r| usize::try_from(r).ok())
            .collect()
    };
    excluded.sort_unstable();
    excluded.dedup();
    if excluded.len() != count
        || excluded.iter().any(|&r| r >= parent.nranks)
        || excluded.contains(&parent.rank)
    {
        eprintln!(
            "fake-nccl: ncclCommShrink on {}: bad exclude list {excluded:?}",
            parent.label()
        );
        return INVALID_ARGUMENT;
    }
    // NCCL refuses an empty list (`excludeRanksCount > 0`, ncclCommInitChildComm), seen on an H100.
    if excluded.is_empty() || excluded.len() == parent.nranks {
        eprintln!(
            "fake-nccl: ncclCommShrink on {}: {} ranks to exclude",
            parent.label(),
            excluded.len()
        );
        return INVALID_ARGUMENT;
    }
    if flags & SHRINK_ABORT != 0 {
        parent.stop.store(true, Ordering::Release);
    } else if let Err(e) = parent.ensure_ready("ncclCommShrink") {
        return e;
    }
    // SAFETY: the caller's contract.
    let config = match unsafe { read_config("ncclCommShrink", config) } {
        Ok(c) => c,
        Err(e) => return e,
    };
    // SAFETY: valid by the contract; NCCL nulls it at once.
    unsafe { out.write(std::ptr::null_mut()) };
    let child_blocking = config.map_or(!parent.non_blocking, |c| c.blocking != 0);
    let name = comm_name(config.as_ref(), format!("{}/shrink", parent.name));
    let k = parent.next_control();
    let slot = ChildOut(out as usize);
    let p = Arc::clone(&parent);
    let answer = run_job(&parent, knobs::init_polls(), move || {
        let survivors: Vec<usize> = (0..p.nranks).filter(|r| !excluded.contains(r)).collect();
        let mine: Vec<u8> = excluded
            .iter()
            .flat_map(|&r| (r as u64).to_le_bytes())
            .collect();
        let records = p
            .gather("k", k, &mine, &survivors, &p.gone)
            .map_err(|e| (SYSTEM_ERROR, format!("shrink #{k}: {e}")))?;
        if let Some(r) = records.iter().position(|rec| *rec != mine) {
            return Err((
                INVALID_USAGE,
                format!(
                    "shrink #{k}: rank {} excludes other ranks than this rank's {excluded:?}",
                    survivors[r]
                ),
            ));
        }
        let rank = survivors.iter().position(|&r| r == p.rank).unwrap_or(0);
        let child = ChildSpec {
            suffix: format!("k{k}"),
            rank,
            nranks: survivors.len(),
            name,
            blocking: child_blocking,
        };
        // SAFETY: as in ncclCommSplit.
        unsafe { child.create_into(&p, slot) }?;
        Ok(())
    });
    child_job_answer(answer)
}
