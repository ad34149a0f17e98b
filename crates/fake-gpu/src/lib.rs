//! A stand-in for the CUDA driver and NCCL, so the device backend's Rust side runs where there is no GPU.
//!
//! Built as a shared library that tests put on the loader path as `libcuda.so` and name in `NCCL_LIBRARY`.
//! It exports the driver and NCCL functions hypercomm (through cudarc and `nccl-sys`) calls, with the C
//! signatures of CUDA 13 and NCCL 2.28.9. Everything runs at once on the calling thread: "device" memory is host
//! memory, streams are already idle when work is enqueued, events complete when recorded, and communicators have
//! one rank (a collective is a copy; a send waits in the communicator's mailbox for the matching receive).
//!
//! What it shows: the whole path of hypercomm's calls (probing, loading, config, non-blocking polling, events,
//! buffers, grouping, split, shrink, abort, the bench) without a crash, a hang or a wrong value. What it cannot
//! show: anything about real GPU concurrency or NCCL's own behaviour; that is the GPU machine's job
//! (`docs/gpu-validation.md`).
//!
//! Knobs, read from the environment of the process that loads it: `FAKE_GPU_DEVICES` (device count, default
//! 1), `FAKE_NCCL_VERSION` (the code `ncclGetVersion` reports, default 22809), `FAKE_NCCL_INIT_POLLS` (how many
//! `ncclCommGetAsyncError` polls a non-blocking communicator stays in progress after creation, default 2).
//! Each communicator's creation is logged to stderr as `fake-nccl: ...` with every config field it received.

mod cuda;
mod memory;
mod nccl;
