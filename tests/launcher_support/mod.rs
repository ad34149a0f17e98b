//! Running launchers from a test: scratch directories, commands bounded by a deadline and killed with their process
//! group, Open MPI's `mpirun` for one node, and (in [`slurm`]) a one-node SLURM cluster of the test's own.
//!
//! A launcher that is not installed is [`skip`]ped with a note on stderr, or fails the test when [`REQUIRE_ENV`]
//! is 1.

pub mod slurm;

use std::fs::File;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

/// Set to 1 (as `.ci/run` does) to fail instead of skipping when a launcher is not installed.
const REQUIRE_ENV: &str = "HYPERCOMM_REQUIRE_LAUNCHERS";

/// A scratch directory under the system temp directory, removed on drop.
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let dir =
            std::env::temp_dir().join(format!("hypercomm-launchers-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("the temp directory is writable");
        Scratch(dir)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// A path in the directory.
    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A finished launcher run: its status (none when it was killed at the deadline) and its output.
pub struct Run {
    /// The command, in words (`mpirun -n 4`).
    pub what: String,
    /// How long it was given.
    pub limit: Duration,
    /// Its exit status; `None` when it was still running at the deadline and was killed.
    pub status: Option<ExitStatus>,
    /// Everything it wrote to stdout.
    pub stdout: String,
    /// Everything it wrote to stderr.
    pub stderr: String,
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let status = match self.status {
            Some(status) => status.to_string(),
            None => format!("killed after {} s", self.limit.as_secs()),
        };
        write!(
            f,
            "{}: {status}\n--- stdout\n{}--- stderr\n{}",
            self.what, self.stdout, self.stderr
        )
    }
}

impl Run {
    pub fn require_success(self) -> Run {
        assert!(self.status.is_some_and(|s| s.success()), "{self}");
        self
    }
}

/// Signals the process group a [`Command::process_group`]`(0)` child leads; it may be gone already.
fn signal_group(child: &Child, signal: Signal) {
    if let Some(pid) = Pid::from_raw(child.id() as i32) {
        let _ = rustix::process::kill_process_group(pid, signal);
    }
}

/// Waits for `child` until `deadline`; `None` if it is still running then.
fn wait_until(child: &mut Child, deadline: Instant) -> Option<ExitStatus> {
    loop {
        if let Some(status) = child.try_wait().expect("wait for a child") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Stops a child and everything in its process group: SIGTERM, then SIGKILL if it is still there after 5 s.
fn stop(child: &mut Child) {
    signal_group(child, Signal::TERM);
    if wait_until(child, Instant::now() + Duration::from_secs(5)).is_none() {
        signal_group(child, Signal::KILL);
        let _ = child.wait();
    }
}

/// Runs `command` in a process group of its own, output to files in `dir`, killed (with its group) after `limit`.
pub fn run_bounded(what: &str, mut command: Command, dir: &Path, limit: Duration) -> Run {
    let name = what.replace(|c: char| !c.is_ascii_alphanumeric(), "-");
    let (out_path, err_path) = (
        dir.join(format!("{name}.out")),
        dir.join(format!("{name}.err")),
    );
    command
        .stdin(Stdio::null())
        .stdout(File::create(&out_path).expect("stdout file"))
        .stderr(File::create(&err_path).expect("stderr file"))
        .process_group(0);
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("start {what}: {e}"));
    let status = wait_until(&mut child, Instant::now() + limit);
    if status.is_none() {
        stop(&mut child);
    }
    Run {
        what: what.to_owned(),
        limit,
        status,
        stdout: std::fs::read_to_string(&out_path).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
    }
}

/// Removes every launcher's variables that this process may itself have been started with (under `srun cargo
/// test`, say), so that the launcher under test is the only one its ranks see.
fn without_launcher_env(command: &mut Command) {
    const PREFIXES: [&str; 6] = [
        "HYPERCOMM_",
        "SLURM_",
        "OMPI_",
        "PMI_",
        "PMIX_",
        "MPI_LOCAL",
    ];
    const NAMES: [&str; 6] = [
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
    ];
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if PREFIXES.iter().any(|p| name.starts_with(p)) || NAMES.contains(&&*name) {
            command.env_remove(&*name);
        }
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `name` on `PATH`, or in the system binary directories a non-login root shell may leave off it.
fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/local/sbin", "/usr/bin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| {
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Says why a launcher test cannot run: a line on stderr (the test then passes), or a failure when
/// [`REQUIRE_ENV`] is 1.
pub fn skip(test: &str, why: &str) {
    if std::env::var(REQUIRE_ENV).is_ok_and(|v| v == "1") {
        panic!("{test}: {why}, and {REQUIRE_ENV}=1 requires it");
    }
    eprintln!(
        "{test}: skipped: {why} (.ci/run installs the launchers as root; {REQUIRE_ENV}=1 fails instead)"
    );
}

/// Open MPI's `mpirun`, or why there is none.
pub fn open_mpi() -> Result<PathBuf, String> {
    let mpirun = find_program("mpirun.openmpi")
        .or_else(|| find_program("mpirun"))
        .ok_or("mpirun is not installed (Debian: openmpi-bin)")?;
    let version = Command::new(&mpirun)
        .arg("--version")
        .output()
        .map_err(|e| format!("{}: {e}", mpirun.display()))?;
    let version = String::from_utf8_lossy(&version.stdout);
    // `mpirun (Open MPI) 4.1.4`, or `mpirun.openmpi (OpenRTE) 4.1.4` under its Debian name.
    if !version.contains("Open MPI") && !version.contains("OpenRTE") {
        return Err(format!("{} is not Open MPI's", mpirun.display()));
    }
    Ok(mpirun)
}

/// `mpirun -n <n>` for a single node, as root too: never rsh/ssh (plm isolated), more ranks than cores allowed,
/// and `vars` passed on to the ranks.
pub fn mpirun_command(mpirun: &Path, n: usize, vars: &[(&str, String)]) -> Command {
    let mut command = Command::new(mpirun);
    without_launcher_env(&mut command);
    command.env("OMPI_MCA_plm", "isolated").args([
        "--allow-run-as-root",
        "--oversubscribe",
        "-n",
        &n.to_string(),
    ]);
    for (name, value) in vars {
        command.env(name, value).args(["-x", name]);
    }
    command
}
