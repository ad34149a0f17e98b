//! A one-node SLURM cluster for a test: slurmctld, slurmd and munged from the system's packages, configured by a
//! generated slurm.conf in a scratch directory, on free loopback ports, and stopped again on drop.

use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{Scratch, find_program, free_port, run_bounded, stop, without_launcher_env};

/// slurmctld, slurmd and munged for one node, configured and run in a scratch directory, on loopback ports of
/// their own; every daemon is stopped on drop, and any job still running is cancelled first.
pub struct SlurmCluster {
    dir: Scratch,
    conf: PathBuf,
    /// munged, slurmctld, slurmd, in the order started.
    daemons: Vec<(&'static str, Child)>,
    programs: SlurmPrograms,
}

/// The programs a [`SlurmCluster`] runs and its tests call.
pub struct SlurmPrograms {
    munged: PathBuf,
    slurmctld: PathBuf,
    slurmd: PathBuf,
    srun: PathBuf,
    sinfo: PathBuf,
    scancel: PathBuf,
}

impl SlurmPrograms {
    /// Finds every program (on `PATH` or in the sbin directories), or says which is missing and in which Debian
    /// package; refuses when not root, which slurmd needs to run job steps.
    pub fn find() -> Result<SlurmPrograms, String> {
        let find = |name: &str, package: &str| {
            find_program(name).ok_or_else(|| format!("{name} is not installed (Debian: {package})"))
        };
        let programs = SlurmPrograms {
            munged: find("munged", "munge")?,
            slurmctld: find("slurmctld", "slurmctld")?,
            slurmd: find("slurmd", "slurmd")?,
            srun: find("srun", "slurm-client")?,
            sinfo: find("sinfo", "slurm-client")?,
            scancel: find("scancel", "slurm-client")?,
        };
        if !rustix::process::geteuid().is_root() {
            return Err("slurmd runs job steps as their user and needs root".into());
        }
        Ok(programs)
    }
}

impl SlurmCluster {
    /// Configures and starts the daemons, and waits (at most 60 s) until the node is idle.
    pub fn start(programs: SlurmPrograms) -> SlurmCluster {
        let dir = Scratch::new("slurm");
        // munged wants its socket's directory open to all and its key readable by its user alone.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let key = dir.join("munge.key");
        let mut bytes = [0u8; 128];
        std::io::Read::read_exact(&mut File::open("/dev/urandom").unwrap(), &mut bytes).unwrap();
        std::fs::write(&key, bytes).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let socket = dir.join("munge.socket");
        for sub in ["state", "spool"] {
            std::fs::create_dir(dir.join(sub)).unwrap();
        }
        let node = short_hostname();
        let conf = dir.join("slurm.conf");
        std::fs::write(
            &conf,
            slurm_conf(dir.path(), &socket, &node, &node_hardware(&programs.slurmd)),
        )
        .unwrap();
        let mut cluster = SlurmCluster {
            conf,
            daemons: Vec::new(),
            programs,
            dir,
        };

        let mut munged = Command::new(&cluster.programs.munged);
        munged
            .arg("--foreground")
            .arg(format!("--key-file={}", key.display()));
        for (flag, name) in [
            ("socket", "munge.socket"),
            ("pid-file", "munged.pid"),
            ("seed-file", "munged.seed"),
        ] {
            munged.arg(format!("--{flag}={}", cluster.dir.join(name).display()));
        }
        cluster.spawn("munged", munged);
        let mut slurmctld = Command::new(&cluster.programs.slurmctld);
        slurmctld.arg("-D").arg("-i").arg("-f").arg(&cluster.conf);
        cluster.spawn("slurmctld", slurmctld);
        let mut slurmd = Command::new(&cluster.programs.slurmd);
        slurmd
            .arg("-D")
            .arg("-f")
            .arg(&cluster.conf)
            .args(["-N", &node]);
        cluster.spawn("slurmd", slurmd);
        cluster.wait_for_idle_node(Duration::from_secs(60));
        cluster
    }

    fn spawn(&mut self, name: &'static str, mut command: Command) {
        without_launcher_env(&mut command);
        command
            .env("SLURM_CONF", &self.conf)
            .stdin(Stdio::null())
            .stdout(File::create(self.dir.join(&format!("{name}.out"))).unwrap())
            .stderr(File::create(self.dir.join(&format!("{name}.err"))).unwrap())
            .process_group(0);
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        self.daemons.push((name, child));
    }

    /// A command for one of the SLURM client programs, talking to this cluster only.
    fn client(&self, program: &Path) -> Command {
        let mut command = Command::new(program);
        without_launcher_env(&mut command);
        command.env("SLURM_CONF", &self.conf);
        command
    }

    fn wait_for_idle_node(&mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        let mut state = String::new();
        while Instant::now() < deadline {
            let exited = self
                .daemons
                .iter_mut()
                .find_map(|(name, child)| Some((*name, child.try_wait().ok()??)));
            if let Some((name, status)) = exited {
                panic!("{name} exited ({status}) while starting\n{}", self.logs());
            }
            let out = self
                .client(&self.programs.sinfo)
                .args(["-h", "-N", "-o", "%T"])
                .output();
            state = out
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
                .unwrap_or_default();
            if state == "idle" {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!(
            "the node is {state:?}, not idle, {} s after start\n{}",
            limit.as_secs(),
            self.logs()
        );
    }

    /// The scratch directory the cluster's configuration, state and logs are in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Every daemon's output, for a failure message.
    pub fn logs(&self) -> String {
        let mut text = String::new();
        for name in [
            "munged.err",
            "slurmctld.log",
            "slurmd.log",
            "slurmctld.err",
            "slurmd.err",
        ] {
            let log = std::fs::read_to_string(self.dir.join(name)).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(15).collect();
            text += &format!("--- {name} (last lines)\n");
            for line in tail.into_iter().rev() {
                text += line;
                text.push('\n');
            }
        }
        text
    }
}

impl Drop for SlurmCluster {
    fn drop(&mut self) {
        // Jobs first (their steps run under slurmstepd, outside any process group of ours), then the daemons.
        let mut scancel = self.client(&self.programs.scancel);
        scancel.args(["--quiet", "--user=root"]);
        let run = run_bounded("scancel", scancel, self.dir.path(), Duration::from_secs(20));
        if !run.status.is_some_and(|s| s.success()) {
            eprintln!("{run}");
        }
        for (_, child) in self.daemons.iter_mut().rev() {
            stop(child);
        }
    }
}

/// This machine's name up to the first dot (`hostname -s`), which slurmd is told to answer to.
fn short_hostname() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("the host name");
    name.trim().split('.').next().unwrap().to_owned()
}

/// The node's processors as slurmd itself counts them (`slurmd -C`: `CPUs=2 Boards=1 SocketsPerBoard=1 ...`),
/// without its memory and uptime; `CPUs=<available cores>` if that fails.
fn node_hardware(slurmd: &Path) -> String {
    let detected = Command::new(slurmd)
        .arg("-C")
        .output()
        .ok()
        .and_then(|out| {
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let line = text
                .lines()
                .find(|l| l.starts_with("NodeName="))?
                .to_owned();
            let fields: Vec<&str> = line
                .split_whitespace()
                .filter(|f| {
                    [
                        "CPUs=",
                        "Boards=",
                        "SocketsPerBoard=",
                        "CoresPerSocket=",
                        "ThreadsPerCore=",
                    ]
                    .iter()
                    .any(|k| f.starts_with(k))
                })
                .collect();
            (!fields.is_empty()).then(|| fields.join(" "))
        });
    detected.unwrap_or_else(|| {
        format!(
            "CPUs={}",
            std::thread::available_parallelism().map_or(1, |n| n.get())
        )
    })
}

/// A minimal one-node slurm.conf: daemons as root on free loopback ports, state and spool in `dir`, munge on
/// `socket`, no cgroups (process tracking through /proc, no task binding), one partition.
fn slurm_conf(dir: &Path, socket: &Path, node: &str, hardware: &str) -> String {
    let d = dir.display();
    format!(
        "ClusterName=hypercomm-test
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={socket}
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/linear
SchedulerType=sched/builtin
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
NodeName={node} NodeAddr=127.0.0.1 {hardware} State=UNKNOWN
PartitionName=test Nodes={node} Default=YES MaxTime=10 State=UP
",
        ctld_port = free_port(),
        slurmd_port = free_port(),
        socket = socket.display(),
    )
}

/// `srun` for this cluster: one node, `n` tasks on however few cores (overcommit), at most 2 minutes, the whole
/// step killed when a task fails, `vars` exported to the tasks.
pub fn srun_command(cluster: &SlurmCluster, n: usize, vars: &[(&str, String)]) -> Command {
    let mut command = cluster.client(&cluster.programs.srun);
    command
        .args([
            "--nodes=1",
            "--overcommit",
            "--time=2",
            "--kill-on-bad-exit=1",
        ])
        .arg(format!("--ntasks={n}"))
        .envs(vars.iter().map(|(k, v)| (k, v)));
    command
}
