//! Two "hosts" made of this machine's namespaces, for tests that need several machines.
//!
//! Each host is a network namespace (`ip netns`) joined to the other by a veth pair (`10.77.0.1` and `10.77.0.2`);
//! a program runs on a host under `unshare --uts --mount` with the host's own hostname, its own `/dev/shm` (a
//! private tmpfs) and an `/etc/hosts` that resolves both hosts' names, so hypercomm sees two machines: shared
//! memory within one, TCP between them. [`Hosts::make`] says why it cannot when it cannot (not root, a tool
//! missing, namespaces refused), and dropping [`Hosts`] kills whatever still runs on the hosts and deletes the
//! namespaces, also when the test fails.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

/// How long any one `ip` command may take.
const COMMAND_LIMIT: Duration = Duration::from_secs(10);

/// The tools a host needs, all from iproute2, util-linux and the shell.
const TOOLS: [&str; 5] = ["ip", "unshare", "mount", "hostname", "sh"];

/// Two namespaced hosts joined by a veth pair; dropped, they are torn down.
pub struct Hosts {
    /// Network namespace of each host (`hc<pid>a`, `hc<pid>b`): unique per test process.
    namespaces: [String; 2],
    /// The `/etc/hosts` every host sees.
    hosts_file: PathBuf,
}

/// A host's veth end, inside its own namespace (names there cannot collide with anyone else's).
const VETH: [&str; 2] = ["hcveth0", "hcveth1"];

/// Runs `cmd` to completion within [`COMMAND_LIMIT`]; `Err` names the command and says what went wrong.
fn run(cmd: &mut Command) -> Result<String, String> {
    let shown = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{shown}: {e}"))?;
    let deadline = Instant::now() + COMMAND_LIMIT;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{shown} did not finish within {COMMAND_LIMIT:?}"));
            }
            Err(e) => return Err(format!("{shown}: {e}")),
        }
    }
    // The child has exited, so its pipes are at their end: this read does not block.
    let out = child
        .wait_with_output()
        .map_err(|e| format!("{shown}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{shown} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()))
}

impl Hosts {
    /// Makes the two hosts, or says why they cannot be made here.
    pub fn make() -> Result<Hosts, String> {
        if !rustix::process::geteuid().is_root() {
            return Err("namespaces need root, and this test runs as another user".into());
        }
        if let Some(tool) = TOOLS.iter().find(|t| !on_path(t)) {
            return Err(format!("{tool} is not on PATH"));
        }
        sweep_stale();
        let id = std::process::id();
        let hosts = Hosts {
            namespaces: [format!("hc{id}a"), format!("hc{id}b")],
            hosts_file: std::env::temp_dir().join(format!("hypercomm-hosts-{id}")),
        };
        // From here on, dropping `hosts` undoes whatever part was made.
        let mut names = String::from("127.0.0.1 localhost\n");
        for host in 0..2 {
            names += &format!("{} {}\n", Hosts::addr(host), Hosts::hostname(host));
        }
        std::fs::write(&hosts.hosts_file, names)
            .map_err(|e| format!("cannot write {}: {e}", hosts.hosts_file.display()))?;
        for ns in &hosts.namespaces {
            run(Command::new("ip").args(["netns", "add", ns]))?;
        }
        let [a, b] = &hosts.namespaces;
        run(Command::new("ip").args([
            "link", "add", VETH[0], "netns", a, "type", "veth", "peer", "name", VETH[1], "netns", b,
        ]))?;
        for (host, ns) in hosts.namespaces.iter().enumerate() {
            let addr = format!("{}/24", Hosts::addr(host));
            run(Command::new("ip").args(["-n", ns, "addr", "add", &addr, "dev", VETH[host]]))?;
            run(Command::new("ip").args(["-n", ns, "link", "set", VETH[host], "up"]))?;
            run(Command::new("ip").args(["-n", ns, "link", "set", "lo", "up"]))?;
        }
        Ok(hosts)
    }

    /// Host `host`'s address on the link between the hosts.
    pub fn addr(host: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 77, 0, 1 + host as u8)
    }

    /// Host `host`'s hostname (what hypercomm tells machines apart by, with the boot id).
    pub fn hostname(host: usize) -> String {
        format!("hc-host-{host}")
    }

    /// A command that runs `program` on host `host`: in its network namespace, with its hostname, its own
    /// `/dev/shm` and the hosts' `/etc/hosts`.
    pub fn command(&self, host: usize, program: impl AsRef<Path>) -> Command {
        // `ip netns exec` and `unshare --mount` both make private mount namespaces, so these mounts stay on the
        // host; the shell then becomes the program.
        let script = "hostname \"$HC_HOSTNAME\" && mount -t tmpfs -o size=256m hypercomm-shm /dev/shm \
                      && mount --bind \"$HC_HOSTS_FILE\" /etc/hosts && exec \"$@\"";
        let mut cmd = Command::new("ip");
        cmd.args([
            "netns",
            "exec",
            &self.namespaces[host],
            "unshare",
            "--uts",
            "--mount",
            "sh",
            "-c",
        ])
        .arg(script)
        .arg("sh")
        .arg(program.as_ref())
        .env("HC_HOSTNAME", Hosts::hostname(host))
        .env("HC_HOSTS_FILE", &self.hosts_file);
        cmd
    }

    /// Cuts host `host` off the link, as a pulled cable or a lost machine would: its peers get no FIN or RST,
    /// only silence.
    pub fn cut(&self, host: usize) -> Result<(), String> {
        run(Command::new("ip").args([
            "-n",
            &self.namespaces[host],
            "link",
            "set",
            VETH[host],
            "down",
        ]))
        .map(drop)
    }

    /// The processes running on host `host`.
    pub fn pids(&self, host: usize) -> Result<Vec<i32>, String> {
        let out = run(Command::new("ip").args(["netns", "pids", &self.namespaces[host]]))?;
        Ok(out
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect())
    }

    /// SIGKILLs every process on host `host` until none is left (at most 10 s); `Err` lists the survivors.
    pub fn kill(&self, host: usize) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let pids = self.pids(host)?;
            if pids.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("processes {pids:?} of host {host} survive SIGKILL"));
            }
            for pid in pids.iter().filter_map(|&p| Pid::from_raw(p)) {
                // A process may exit between the listing and the signal; that is what we want anyway.
                let _ = rustix::process::kill_process(pid, Signal::KILL);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Deletes the namespaces of earlier runs whose process is gone (killed before its `Drop` could run): each is
/// named `hc<pid>a` or `hc<pid>b` after the test process that made it.
fn sweep_stale() {
    let Ok(list) = run(Command::new("ip").args(["netns", "list"])) else {
        return;
    };
    for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
        let pid = name
            .strip_prefix("hc")
            .and_then(|rest| rest.strip_suffix(['a', 'b']))
            .and_then(|pid| pid.parse::<i32>().ok());
        if let Some(pid) = pid
            && !Path::new(&format!("/proc/{pid}")).exists()
        {
            let _ = run(Command::new("ip").args(["netns", "pids", name])).map(|pids| {
                for p in pids
                    .split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .filter_map(Pid::from_raw)
                {
                    let _ = rustix::process::kill_process(p, Signal::KILL);
                }
            });
            let _ = run(Command::new("ip").args(["netns", "del", name]));
        }
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for (host, ns) in self.namespaces.iter().enumerate() {
            // Only the namespaces that were made (`make` may have stopped part-way).
            if !Path::new("/run/netns").join(ns).exists() {
                continue;
            }
            if let Err(e) = self.kill(host) {
                eprintln!("cleaning up host {host}: {e}");
            }
            // Deleting a namespace also deletes its end of the veth pair, and with it the other end.
            if let Err(e) = run(Command::new("ip").args(["netns", "del", ns])) {
                eprintln!("cleaning up: {e}");
            }
        }
        let _ = std::fs::remove_file(&self.hosts_file);
    }
}
