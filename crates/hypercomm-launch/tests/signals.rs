//! The launcher forwards SIGTERM to its ranks. The launcher runs in a child process (this test binary, running the
//! `#[ignore]`d `peer_launcher`), so the signal never touches the test process itself.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use hypercomm_launch::Launcher;

/// Launcher program: two ranks that report SIGTERM and exit 5; prints the summary and exits with the job's status.
#[test]
#[ignore = "launcher program for sigterm_is_forwarded_to_every_rank"]
fn peer_launcher() {
    if std::env::var_os("HYPERCOMM_TEST_LAUNCHER").is_none() {
        return;
    }
    let report = Launcher::new("/bin/sh")
        .args([
            "-c",
            "trap 'echo got-term; exit 5' TERM; echo ready; sleep 60 & wait",
        ])
        .nproc(2)
        .forward_signals(true)
        .timeout(Duration::from_secs(120))
        .run()
        .unwrap();
    println!("summary: {}", report.summary());
    std::process::exit(report.exit_code());
}

#[test]
fn sigterm_is_forwarded_to_every_rank() {
    let mut launcher = Command::new(std::env::current_exe().unwrap())
        .args([
            "peer_launcher",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
            "--quiet",
        ])
        .env("HYPERCOMM_TEST_LAUNCHER", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(launcher.stdout.take().unwrap()).lines();
    let mut ready = 0;
    let mut seen = Vec::new();
    // Bounded by the launcher's own 120 s job timeout: its output ends when it exits.
    for line in lines.by_ref() {
        let line = line.unwrap();
        if line.ends_with("] ready") {
            ready += 1;
            if ready == 2 {
                break;
            }
        }
        seen.push(line);
    }
    assert_eq!(ready, 2, "ranks never became ready: {seen:?}");
    let status = Command::new("kill")
        .args(["-TERM", &launcher.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let rest: Vec<String> = lines.map(Result::unwrap).collect();
    let exit = launcher.wait().unwrap();
    assert_eq!(exit.code(), Some(128 + 15), "{rest:?}");
    assert_eq!(
        rest.iter().filter(|l| l.ends_with("] got-term")).count(),
        2,
        "{rest:?}"
    );
    let summary = rest.iter().find(|l| l.starts_with("summary: ")).unwrap();
    assert!(
        summary.contains("received SIGTERM (15) and forwarded it"),
        "{summary}"
    );
}
