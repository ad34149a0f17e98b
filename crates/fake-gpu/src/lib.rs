//! A stand-in for the CUDA driver and NCCL, so the device backend's Rust side runs where there is no GPU.
//!
//! Built as a shared library that tests put on the loader path as `libcuda.so` and name in `NCCL_LIBRARY`.
//! It exports the driver and NCCL functions hypercomm (through cudarc and `nccl-sys`) calls, with the C
//! signatures of CUDA 13 and NCCL 2.28.9, and it is strict where a GPU is: every behaviour a real GPU run showed
//! that an earlier, simpler fake did not became a behaviour here, with a test.
//!
//! - "Device" memory is host memory (module `memory`); streams are worker threads that run their work later, in
//!   order (module `stream`); events complete when their stream reaches them (module `event`), so a missing
//!   wait reads stale data.
//! - Communicators have any number of ranks, threads of one process or processes of one machine, which meet
//!   through files and exchange real data; creation, split and shrink are asynchronous as NCCL's are, configs are
//!   validated as NCCL validates them, a communicator's first collective waits for every rank to reach its own
//!   (NCCL's runtime connection), and failures come on demand (module `nccl`).
//! - Kernels do not run: `cuModuleLoadData` answers "not supported", and hypercomm reports a missing NVRTC.
//!
//! What it cannot show: real GPU concurrency and speed, and NCCL's own algorithms; that is the GPU machine's job
//! (`docs/gpu-validation.md`).
//!
//! Knobs (module `knobs`), read from the environment of the process that loads it: `FAKE_GPU_DEVICES`,
//! `FAKE_GPU_HANG_SECS`, `FAKE_GPU_STREAM_DELAY_MS`, `FAKE_GPU_TRACE_CALLS`, `FAKE_NCCL_VERSION`,
//! `FAKE_NCCL_INIT_POLLS`, `FAKE_NCCL_OP_POLLS`, `FAKE_NCCL_FAIL_AFTER`, `FAKE_NCCL_FAIL_RANK`,
//! `FAKE_NCCL_TIMEOUT_SECS`, `FAKE_NCCL_DIR`, and NCCL's own `NCCL_MULTI_RANK_GPU_ENABLE` and
//! `NCCL_RUNTIME_CONNECT`. Each communicator's config is logged to stderr as
//! `fake-nccl: <call>: <fields>`.

#[cfg(test)]
mod abort_tests;
pub(crate) mod cuda;
mod event;
#[cfg(test)]
mod group_tests;
mod knobs;
mod memory;
pub(crate) mod nccl;
mod stream;
#[cfg(test)]
mod tests;
