//! End-to-end tests of the launcher with small shell programs: environment, output, failure handling, timeouts.

use std::time::Duration;

use hypercomm_launch::{DEFAULT_COMM_TIMEOUT, Exit, LaunchError, Launcher, REPORT_MARGIN};

const JOB_LIMIT: Duration = Duration::from_secs(120);

fn sh(script: &str) -> Launcher {
    Launcher::new("/bin/sh")
        .args(["-c", script])
        .echo(false)
        .capture(true)
        .timeout(JOB_LIMIT)
}

#[test]
fn every_rank_gets_its_place_and_its_output_is_kept_per_rank() {
    let report = sh("echo \"r=$HYPERCOMM_RANK w=$HYPERCOMM_WORLD_SIZE l=$HYPERCOMM_LOCAL_RANK \
                     lw=$HYPERCOMM_LOCAL_WORLD_SIZE addr=$HYPERCOMM_STORE_ADDR\"; echo err-$HYPERCOMM_RANK >&2")
        .nproc(3)
        .run()
        .unwrap();
    assert!(report.success(), "{}", report.summary());
    assert_eq!(report.exit_code(), 0);
    for (k, outcome) in report.ranks.iter().enumerate() {
        assert_eq!(outcome.rank, k);
        assert_eq!(
            outcome.stdout,
            vec![format!("r={k} w=3 l={k} lw=3 addr={}", report.store_addr)]
        );
        assert_eq!(outcome.stderr, vec![format!("err-{k}")]);
    }
}

#[test]
fn multi_node_ranks_are_offset_by_the_node_rank() {
    // Node 1 of 2 does not host the store, so nothing needs to listen for this shell-only job.
    let report = sh("echo $HYPERCOMM_RANK/$HYPERCOMM_WORLD_SIZE/$HYPERCOMM_STORE_ADDR")
        .nproc(2)
        .nodes(2, 1)
        .master("127.0.0.1", 29999)
        .run()
        .unwrap();
    let lines: Vec<_> = report.ranks.iter().map(|r| r.stdout.join("")).collect();
    assert_eq!(lines, ["2/4/127.0.0.1:29999", "3/4/127.0.0.1:29999"]);
}

#[test]
fn a_failing_rank_stops_the_others_and_is_named_in_the_summary() {
    let report = sh("if [ \"$HYPERCOMM_RANK\" = 1 ]; then exit 3; fi; exec sleep 60")
        .nproc(3)
        .grace(Duration::from_millis(200))
        .run()
        .unwrap();
    assert!(!report.success());
    assert_eq!(report.first_failure, Some(1));
    assert_eq!(report.rank(1).unwrap().exit, Exit::Code(3));
    assert_eq!(report.exit_code(), 3);
    for other in [0, 2] {
        let outcome = report.rank(other).unwrap();
        assert_eq!(outcome.exit, Exit::Signal(15), "rank {other}");
        assert!(outcome.stopped_by_launcher);
    }
    let summary = report.summary();
    assert!(
        summary.starts_with("rank 1 failed first: it exited with status 3"),
        "{summary}"
    );
    assert!(!report.timed_out);
}

#[test]
fn by_default_survivors_get_the_communicator_timeout_and_a_margin_to_report() {
    // Rank 1 fails at once; rank 0 takes 6 s to report (as a survivor waiting out a 5 s communicator timeout
    // would). The derived grace (5 s + REPORT_MARGIN) lets it finish on its own, where a fixed 5 s would not.
    let launcher = sh("if [ \"$HYPERCOMM_RANK\" = 1 ]; then exit 3; fi; \
         sleep 6; echo \"reported after t=$HYPERCOMM_COMM_TIMEOUT_SECS\"; exit 9")
    .nproc(2)
    .comm_timeout(Duration::from_secs(5));
    assert_eq!(
        launcher.grace_period(),
        Duration::from_secs(5) + REPORT_MARGIN
    );
    let report = launcher.run().unwrap();
    assert_eq!(report.first_failure, Some(1), "{}", report.summary());
    let survivor = report.rank(0).unwrap();
    assert_eq!(survivor.exit, Exit::Code(9), "{}", report.summary());
    assert!(!survivor.stopped_by_launcher);
    assert_eq!(survivor.stdout, ["reported after t=5"]);
}

#[test]
fn the_default_communicator_timeout_is_told_to_the_ranks() {
    let report = sh("echo t=$HYPERCOMM_COMM_TIMEOUT_SECS").run().unwrap();
    assert!(report.success(), "{}", report.summary());
    assert_eq!(
        report.rank(0).unwrap().stdout,
        [format!("t={}", DEFAULT_COMM_TIMEOUT.as_secs())]
    );
    let err = Launcher::new("/bin/true")
        .comm_timeout(Duration::ZERO)
        .run()
        .unwrap_err();
    assert!(
        matches!(&err, LaunchError::Invalid(m) if m.contains("communicator timeout 0s")),
        "{err}"
    );
}

#[test]
fn ranks_that_ignore_sigterm_are_killed_once_kill_after_has_passed() {
    let report =
        sh("if [ \"$HYPERCOMM_RANK\" = 0 ]; then kill -SEGV $$; fi; trap '' TERM; sleep 60")
            .nproc(2)
            .grace(Duration::from_millis(200))
            .kill_after(Duration::from_millis(200))
            .run()
            .unwrap();
    assert_eq!(report.first_failure, Some(0));
    assert_eq!(report.rank(0).unwrap().exit, Exit::Signal(11));
    assert_eq!(report.exit_code(), 139);
    assert_eq!(report.rank(1).unwrap().exit, Exit::Signal(9));
    assert!(
        report.summary().contains("SIGSEGV (11)"),
        "{}",
        report.summary()
    );
}

#[test]
fn a_stopped_rank_is_continued_so_that_sigterm_ends_it() {
    // Rank 1 stops itself (as SIGSTOP or a debugger would); rank 0 then fails. The launcher sends SIGCONT before
    // SIGTERM, so rank 1 ends by SIGTERM after one grace period instead of waiting, stopped, for SIGKILL.
    let report = sh(
        "if [ \"$HYPERCOMM_RANK\" = 1 ]; then kill -STOP $$; sleep 60; else sleep 0.3; exit 3; fi",
    )
    .nproc(2)
    .grace(Duration::from_millis(300))
    .run()
    .unwrap();
    assert_eq!(report.first_failure, Some(0));
    assert_eq!(report.rank(0).unwrap().exit, Exit::Code(3));
    assert_eq!(
        report.rank(1).unwrap().exit,
        Exit::Signal(15),
        "{}",
        report.summary()
    );
}

#[test]
fn the_job_timeout_stops_every_rank() {
    let report = sh("exec sleep 60")
        .nproc(2)
        .timeout(Duration::from_millis(300))
        .kill_after(Duration::from_millis(200))
        .run()
        .unwrap();
    assert!(report.timed_out);
    assert_eq!(report.exit_code(), 124);
    assert!(
        report
            .ranks
            .iter()
            .all(|r| r.stopped_by_launcher && r.exit == Exit::Signal(15))
    );
}

#[test]
fn a_secret_is_handed_to_single_node_ranks() {
    let report = sh("test ${#HYPERCOMM_STORE_SECRET} -eq 64")
        .nproc(1)
        .run()
        .unwrap();
    assert!(report.success(), "{}", report.summary());
}

#[test]
fn start_up_errors_name_what_is_wrong() {
    let err = Launcher::new("/nonexistent/program")
        .nproc(2)
        .run()
        .unwrap_err();
    assert!(matches!(err, LaunchError::Spawn { rank: 0, .. }), "{err}");
    assert!(err.to_string().contains("/nonexistent/program"), "{err}");
    let err = Launcher::new("/bin/true").nproc(0).run().unwrap_err();
    assert_eq!(err.to_string(), "nproc=0: start at least one rank per node");
    let err = Launcher::new("/bin/true").nodes(2, 0).run().unwrap_err();
    assert!(err.to_string().contains("explicit master port"), "{err}");
    let err = Launcher::new("/bin/true")
        .nodes(2, 2)
        .master("127.0.0.1", 1)
        .run()
        .unwrap_err();
    assert_eq!(err.to_string(), "node rank 2 is not below nnodes=2");
}

#[test]
fn torchrun_env_gives_every_rank_torchruns_variables() {
    let report = sh("echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR $MASTER_PORT\"")
        .nproc(3)
        .torchrun_env(true)
        .run()
        .unwrap();
    assert!(report.success(), "{}", report.summary());
    let lines: Vec<&String> = report.ranks.iter().map(|r| &r.stdout[0]).collect();
    let port = lines[0].split(' ').next_back().unwrap().to_owned();
    assert!(port.parse::<u16>().is_ok_and(|p| p > 0), "{lines:?}");
    assert_ne!(
        port,
        report.store_addr.port.to_string(),
        "PyTorch's store needs a port of its own"
    );
    for (k, line) in lines.iter().enumerate() {
        assert_eq!(**line, format!("{k} 3 {k} 3 0 127.0.0.1 {port}"));
    }
    // Without the option, none of them is set.
    let plain = sh("echo \"[$RANK$MASTER_PORT]\"").nproc(1).run().unwrap();
    assert_eq!(plain.ranks[0].stdout, ["[]"]);
}

#[test]
fn a_torch_distributed_program_runs_unchanged_under_the_launcher() {
    let has_torch = std::process::Command::new("python3")
        .args(["-c", "import torch.distributed"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_torch {
        eprintln!(
            "skipping: python3 cannot import torch.distributed here (pip install torch to run this)"
        );
        return;
    }
    let program = "import torch, torch.distributed as dist\n\
                   dist.init_process_group('gloo')\n\
                   t = torch.tensor([float(dist.get_rank() + 1)])\n\
                   dist.all_reduce(t)\n\
                   print(f'rank {dist.get_rank()} of {dist.get_world_size()} sum {t.item():.0f}')\n\
                   dist.destroy_process_group()\n";
    let report = Launcher::new("python3")
        .args(["-c", program])
        .nproc(2)
        .torchrun_env(true)
        .echo(false)
        .capture(true)
        .timeout(JOB_LIMIT)
        .run()
        .unwrap();
    assert!(report.success(), "{}", report.summary());
    for k in 0..2 {
        assert!(
            report.ranks[k]
                .stdout
                .iter()
                .any(|l| *l == format!("rank {k} of 2 sum 3")),
            "{:?}",
            report.ranks[k]
        );
    }
}

/// CPUs in a `Cpus_allowed_list` line of /proc/PID/status: `0-3,8,10-11`.
fn cpu_list(text: &str) -> Vec<usize> {
    text.split(',')
        .flat_map(|part| {
            let (lo, hi) = part.split_once('-').unwrap_or((part, part));
            let (lo, hi): (usize, usize) = (lo.trim().parse().unwrap(), hi.trim().parse().unwrap());
            lo..=hi
        })
        .collect()
}

fn allowed_here() -> Vec<usize> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap();
    cpu_list(line)
}

#[test]
fn bound_ranks_get_disjoint_shares_of_the_cpus_that_cover_them_all() {
    let allowed = allowed_here();
    for nproc in 1..=allowed.len().min(4) {
        let report = sh("grep Cpus_allowed_list /proc/self/status | cut -f2")
            .nproc(nproc)
            .bind_cpus(true)
            .run()
            .unwrap();
        assert!(report.success(), "{}", report.summary());
        let shares: Vec<Vec<usize>> = report
            .ranks
            .iter()
            .map(|r| cpu_list(&r.stdout.concat()))
            .collect();
        // Every CPU in exactly one share, in rank order, and shares within one CPU of each other in size.
        assert_eq!(shares.concat(), allowed, "{nproc} ranks: {shares:?}");
        let sizes: Vec<usize> = shares.iter().map(Vec::len).collect();
        let (lo, hi) = (*sizes.iter().min().unwrap(), *sizes.iter().max().unwrap());
        assert!(lo >= 1 && hi - lo <= 1, "{nproc} ranks: {shares:?}");
    }
    // Unbound, a rank may run anywhere this process may.
    let report = sh("grep Cpus_allowed_list /proc/self/status | cut -f2")
        .nproc(2)
        .run()
        .unwrap();
    for rank in &report.ranks {
        assert_eq!(cpu_list(&rank.stdout.concat()), allowed);
    }
}

#[test]
fn binding_more_ranks_than_cpus_is_refused_before_anything_starts() {
    let cpus = allowed_here().len();
    let err = sh("echo started")
        .nproc(cpus + 1)
        .bind_cpus(true)
        .run()
        .unwrap_err();
    assert!(matches!(err, LaunchError::Invalid(_)), "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&format!("cannot bind {} local ranks", cpus + 1))
            && text.contains(&format!("{cpus} CPU")),
        "{text}"
    );
}
