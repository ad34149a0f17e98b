//! Running tests of this crate under `fake-gpu`, the stand-in CUDA driver and NCCL.
//!
//! The driver library is opened once per process, so the fake cannot be swapped in later: a `suite_*` test
//! runs an `#[ignore]`d `fake_*` test of the same binary in a child process that has the fake on the loader
//! path (as `libcuda.so`) and in `NCCL_LIBRARY`, with a private directory for the fake's exchange files.

#![allow(dead_code)]

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;

use hypercomm_comm::Communicator;
use hypercomm_comm::device::{DeviceCommunicator, DeviceRuntime, Gpu};
use hypercomm_store::{MemoryStore, Store};

/// Set in the children, so their tests know they run under the fake.
pub const UNDER_FAKE: &str = "HYPERCOMM_UNDER_FAKE_GPU";

/// `libfake_gpu.so`, built by cargo beside this test binary (it is a dev-dependency).
pub fn fake_library() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let lib = exe
        .parent()
        .expect("test binaries live in target/<profile>/deps")
        .join("libfake_gpu.so");
    assert!(lib.exists(), "{} is missing", lib.display());
    lib
}

/// A scratch directory holding the `libcuda.so` link and the fake's exchange files; removed on drop.
pub struct FakeDir(pub PathBuf);

impl FakeDir {
    /// `tag` names the directory; a test's path in it (`module::test`) has its colons replaced, since the
    /// directory goes on `LD_LIBRARY_PATH`, where a colon separates entries.
    pub fn new(tag: &str) -> FakeDir {
        let tag = tag.replace(':', "-");
        let dir =
            std::env::temp_dir().join(format!("hypercomm-fake-gpu-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("exchange")).unwrap();
        std::os::unix::fs::symlink(fake_library(), dir.join("libcuda.so")).unwrap();
        FakeDir(dir)
    }
}

impl Drop for FakeDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The variables that put a process under the fake: the fake first on the loader path as `libcuda.so`, in
/// `NCCL_LIBRARY`, its exchange files in `dir`, and [`UNDER_FAKE`].
pub fn fake_vars(dir: &FakeDir) -> Vec<(&'static str, OsString)> {
    let mut path = dir.0.clone().into_os_string();
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        path.push(":");
        path.push(old);
    }
    vec![
        ("LD_LIBRARY_PATH", path),
        ("NCCL_LIBRARY", fake_library().into_os_string()),
        ("FAKE_NCCL_DIR", dir.0.join("exchange").into_os_string()),
        (UNDER_FAKE, "1".into()),
    ]
}

/// Puts `cmd` under the fake ([`fake_vars`]), then sets `env`. NCCL knobs the fake honours are not inherited: a
/// test sets them in `env`.
pub fn with_fake_env(cmd: &mut Command, dir: &FakeDir, env: &[(&str, &str)]) {
    cmd.envs(fake_vars(dir))
        .env_remove("NCCL_MULTI_RANK_GPU_ENABLE")
        .env_remove("NCCL_RUNTIME_CONNECT");
    for (k, v) in env {
        cmd.env(k, v);
    }
}

/// The command that runs the ignored test `name` of this binary under the fake.
pub fn fake_command(dir: &FakeDir, name: &str, env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        name,
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]);
    with_fake_env(&mut cmd, dir, env);
    cmd
}

/// Runs `name` under the fake and returns its output.
pub fn under_fake(name: &str, env: &[(&str, &str)]) -> Output {
    let dir = FakeDir::new(name);
    fake_command(&dir, name, env)
        .output()
        .expect("run the test binary again")
}

/// Requires that a child ran its one test (not filtered away) and passed; returns its stderr.
pub fn require_pass(name: &str, out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success() && stdout.contains("test result: ok. 1 passed"),
        "{name} under the fake:\n{stdout}\n{stderr}"
    );
    stderr
}

/// Runs `name` under the fake and requires that it passed; returns its stderr.
pub fn pass_under_fake(name: &str, env: &[(&str, &str)]) -> String {
    require_pass(name, &under_fake(name, env))
}

/// Starts `name` under the fake without waiting (for ranks as processes).
pub fn spawn_under_fake(dir: &FakeDir, name: &str, env: &[(&str, &str)]) -> Child {
    fake_command(dir, name, env)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the test binary again")
}

/// The runtime, in a child under the fake.
pub fn runtime() -> Arc<DeviceRuntime> {
    assert!(
        std::env::var_os(UNDER_FAKE).is_some(),
        "this test runs only under fake-gpu, started by a suite_* test of this binary"
    );
    DeviceRuntime::probe_with_env(|n| std::env::var_os(n)).expect("the fake driver and nccl load")
}

/// Runs `f(rank, gpu, store)` on `n` threads, rank `r` on fake device `r`, all sharing one in-process store; the
/// results in rank order (a rank that panics fails the caller).
pub fn ranks<R: Send>(n: usize, f: impl Fn(usize, Arc<Gpu>, Arc<dyn Store>) -> R + Sync) -> Vec<R> {
    let rt = runtime();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let (gpu, store, f) = (
                    Gpu::open(Arc::clone(&rt), r).unwrap(),
                    Arc::clone(&store),
                    &f,
                );
                s.spawn(move || f(r, gpu, store))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a rank panicked"))
            .collect()
    })
}

/// The NCCL flavor of `comm`, for what only NCCL has (its stream, a health check, the strided all-reduce); the
/// tests make their communicators `with_gpu`, so a communicator without one is a test bug.
pub fn nccl(comm: &Communicator) -> &DeviceCommunicator {
    comm.nccl()
        .unwrap_or_else(|| panic!("communicator {} was made without a gpu", comm.name()))
}
