//! `hypercomm launch` and `hypercomm store` run end to end as a user runs them.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use hypercomm_store::{ClientOptions, Key, Store, TcpStore};

fn hypercomm() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hypercomm"))
}

#[test]
fn launch_sets_rank_variables_and_prefixes_output() {
    let out = hypercomm()
        .args(["launch", "-n", "3", "--", "sh", "-c"])
        .arg("echo rank=$HYPERCOMM_RANK world=$HYPERCOMM_WORLD_SIZE store=${HYPERCOMM_STORE_ADDR:+set}")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for rank in 0..3 {
        let line = format!("[rank {rank}] rank={rank} world=3 store=set");
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in {text}"
        );
    }
}

#[test]
fn launch_bind_cpus_gives_each_rank_its_own_cpus_or_refuses_with_status_2() {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let here = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim()
        .to_owned();
    // `0-3,8,10-11`: count the CPUs.
    let cpus: usize = here
        .split(',')
        .map(|part| match part.split_once('-') {
            Some((a, b)) => b.parse::<usize>().unwrap() - a.parse::<usize>().unwrap() + 1,
            None => 1,
        })
        .sum();
    if cpus >= 2 {
        let out = hypercomm()
            .args(["launch", "-n", "2", "--bind-cpus", "--", "sh", "-c"])
            .arg("grep Cpus_allowed_list /proc/self/status | cut -f2")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        let lists: Vec<&str> = (0..2)
            .map(|r| {
                let prefix = format!("[rank {r}] ");
                text.lines()
                    .find_map(|l| l.strip_prefix(prefix.as_str()))
                    .unwrap()
            })
            .collect();
        assert_ne!(lists[0], lists[1], "{text}");
        assert!(
            lists.iter().all(|l| *l != here),
            "bound ranks see less than {here}: {text}"
        );
    }
    let out = hypercomm()
        .args([
            "launch",
            "-n",
            &(cpus + 1).to_string(),
            "--bind-cpus",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot bind"), "{err}");
}

#[test]
fn launch_stops_the_others_and_names_the_failed_rank() {
    let out = hypercomm()
        .args(["launch", "-n", "2", "--grace-secs", "1", "--", "sh", "-c"])
        .arg("if [ $HYPERCOMM_RANK = 1 ]; then exit 7; fi; sleep 60")
        .output()
        .unwrap();
    // The launcher passes the failed rank's own status on.
    assert_eq!(out.status.code(), Some(7));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("rank 1 failed first: it exited with status 7"),
        "{err}"
    );
    assert!(err.contains("rank 0 was killed by SIGTERM"), "{err}");
}

#[test]
fn launch_tells_the_ranks_the_communicator_timeout_and_checks_the_periods() {
    let out = hypercomm()
        .args(["launch", "-n", "1", "--comm-timeout-secs", "2.5", "--"])
        .args(["sh", "-c", "echo t=$HYPERCOMM_COMM_TIMEOUT_SECS"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8(out.stdout).unwrap(), "[rank 0] t=2.5\n");
    for (arg, says) in [
        ("--comm-timeout-secs=0", "communicator timeout 0s"),
        ("--kill-after-secs=-1", "--kill-after-secs=-1 is not"),
        // A negative value after a space reaches the same check, not clap's "unexpected argument '-1'".
        ("--kill-after-secs -1", "--kill-after-secs=-1 is not"),
        ("--grace-secs=NaN", "--grace-secs=NaN is not"),
    ] {
        let out = hypercomm()
            .args(["launch", "-n", "1"])
            .args(arg.split(' '))
            .args(["--", "true"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{arg}: {err}");
        assert!(err.contains(says), "{arg}: {err}");
    }
}

#[test]
fn launch_names_a_negative_rank_count() {
    let out = hypercomm()
        .args(["launch", "-n", "-4", "--", "true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("invalid value '-4' for '--nproc-per-node <NPROC>': cannot be negative"),
        "{err}"
    );
}

#[test]
fn launch_rejects_a_missing_program_with_status_2() {
    let out = hypercomm().args(["launch", "-n", "2"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn standalone_store_serves_clients_until_its_duration_ends() {
    let mut server = hypercomm()
        .args(["store", "--bind", "127.0.0.1:0", "--duration-secs", "30"])
        .env_remove("HYPERCOMM_STORE_SECRET")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("hypercomm store listening on ")
        .unwrap()
        .to_owned();
    let client = TcpStore::connect(
        addr.as_str(),
        ClientOptions::default().with_timeouts(Duration::from_secs(10), Duration::from_secs(10)),
    )
    .unwrap();
    client.set(&Key::new("cli").push(1u64), b"hello").unwrap();
    assert_eq!(
        client
            .get(&Key::new("cli").push(1u64), Duration::from_secs(5))
            .unwrap(),
        b"hello"
    );
    server.kill().unwrap();
    server.wait().unwrap();
    let err = client
        .get(&Key::new("never"), Duration::from_secs(5))
        .unwrap_err();
    assert!(err.to_string().contains(&addr), "{err}");
}
