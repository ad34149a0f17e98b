//! `Rendezvous::from_env` under real launchers: Open MPI's `mpirun -n 4`, SLURM's `srun -n 4` (a one-node cluster
//! of slurmctld, slurmd and munged that the test starts in a scratch directory and stops again), `mpirun` inside a
//! SLURM job step, and the self-launching `rl_pipeline` example under `mpirun -n 8`.
//!
//! The test binary re-runs itself as each rank: the `#[ignore]`d `launcher_probe` is the rank program. Each rank
//! reads its place from the environment, checks it against the launcher's own variables, joins the store that rank
//! 0 hosts at the address the test exported, builds a host communicator over the job, all-reduces and
//! all-gathers, and writes one line to a file of its own; the test then requires every rank 0..n exactly once.
//!
//! A launcher that is not installed (`mpirun`; `slurmctld`, `slurmd`, `srun`, `munged`) is skipped with a line on
//! stderr; `.ci/run` installs them and sets `HYPERCOMM_REQUIRE_LAUNCHERS=1`, which turns a skip into a failure.
//! Every launcher process and daemon is waited for with a deadline and killed at the end, pass or fail.

mod launcher_support;

use std::collections::BTreeSet;
use std::error::Error;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hypercomm::comm::{CommError, CommOptions, Communicator, ReduceOp};
use hypercomm::store::{EnvSource, Key, Rendezvous, Store};
use launcher_support::slurm::{SlurmCluster, SlurmPrograms, srun_command};
use launcher_support::{Run, Scratch, free_port, mpirun_command, open_mpi, run_bounded, skip};

/// How long one launcher run (start, rendezvous, collectives, exit) may take before it is killed.
const JOB_LIMIT: Duration = Duration::from_secs(120);
/// The ranks' own bound on any wait: shorter than [`JOB_LIMIT`], so a lost peer is reported by the ranks.
const RANK_TIMEOUT: Duration = Duration::from_secs(60);
/// Where a probe rank writes its report; set by the test, so the probe does nothing when run by hand.
const PROBE_DIR_ENV: &str = "HC_LAUNCHER_PROBE_DIR";

// ---- the rank program --------------------------------------------------------------------------------------------

/// The one place this file builds a communicator: a host communicator over ranks `0..world`, as member `me`.
fn host_communicator(
    store: Arc<dyn Store>,
    world: usize,
    me: usize,
) -> Result<Communicator, CommError> {
    let options = CommOptions {
        timeout: RANK_TIMEOUT,
        ..CommOptions::named("launcher-probe")
    };
    Communicator::new(store, (0..world).collect(), me, options)
}

/// What a launcher calls rank, world size, local rank and local world size, read by this test on its own (not
/// through the store crate's table); for SLURM, the job step's own counts, where `from_env` reads the job's.
fn launcher_variables(source: EnvSource) -> Option<[&'static str; 4]> {
    match source {
        EnvSource::OpenMpi => Some([
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
        ]),
        EnvSource::Slurm => Some([
            "SLURM_PROCID",
            "SLURM_STEP_NUM_TASKS",
            "SLURM_LOCALID",
            "SLURM_STEP_TASKS_PER_NODE",
        ]),
        _ => None,
    }
}

/// Rank program for the launcher tests: does nothing unless [`PROBE_DIR_ENV`] is set.
#[test]
#[ignore = "rank program for the launcher tests"]
fn launcher_probe() {
    let Some(dir) = std::env::var_os(PROBE_DIR_ENV) else {
        return;
    };
    let report =
        probe().unwrap_or_else(|e| panic!("launcher probe (pid {}): {e}", std::process::id()));
    // Named by process id, not rank: two ranks that believed they were the same rank leave two files.
    let path = Path::new(&dir).join(format!("rank-{}.txt", std::process::id()));
    std::fs::write(path, report).expect("write the probe report");
}

fn probe() -> Result<String, Box<dyn Error>> {
    let rdv = Rendezvous::from_env()?;
    let (rank, world) = (rdv.rank, rdv.world_size);
    let names = launcher_variables(rdv.source).ok_or_else(|| {
        format!(
            "from_env read {:?}, not a launcher this test runs",
            rdv.source
        )
    })?;
    let own: Vec<String> = names
        .iter()
        .map(|name| std::env::var(name).map_err(|_| format!("{name} is not set")))
        .collect::<Result<_, _>>()?;
    let ours = [rank, world, rdv.local_rank, rdv.local_world_size].map(|n| n.to_string());
    if own != ours {
        return Err(format!("from_env read {ours:?}, the launcher set {names:?} = {own:?}").into());
    }

    let options = rdv.client_options();
    let io_timeout = options.io_timeout;
    let joined = rdv.join(options.with_timeouts(RANK_TIMEOUT, io_timeout))?;
    let store: Arc<dyn Store> = Arc::new(joined.store);
    let comm = host_communicator(Arc::clone(&store), world, rank)?;
    let sum = comm
        .all_reduce(vec![rank as u64; 3], ReduceOp::Sum)?
        .wait()?;
    let mut blocks = vec![0u64; 2 * world];
    blocks[2 * rank] = 10 * rank as u64;
    blocks[2 * rank + 1] = 10 * rank as u64 + 1;
    let gathered = comm.all_gather(blocks)?.wait()?;
    comm.barrier()?.wait()?;
    drop(comm);

    // Rank 0 hosts the store: it leaves after everyone else has said they are done with it.
    let left = Key::new("launcher-probe").push("left");
    store.add(&left, 1)?;
    if joined.server.is_some() {
        let deadline = Instant::now() + RANK_TIMEOUT;
        while store.add(&left, 0)? < world as i64 {
            if Instant::now() > deadline {
                return Err("not every rank left the store in time".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let list = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    Ok(format!(
        "source={:?} rank={rank} world={world} local_rank={} local_world={} store={} sum={} gathered={}\n",
        rdv.source,
        rdv.local_rank,
        rdv.local_world_size,
        rdv.store_addr,
        list(&sum),
        list(&gathered),
    ))
}

// ---- checking the ranks' reports ---------------------------------------------------------------------------------

/// One rank's report line, as `key=value` pairs.
struct Report(Vec<(String, String)>);

impl Report {
    fn get(&self, key: &str) -> &str {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("report has no {key}"))
    }

    fn number(&self, key: &str) -> usize {
        self.get(key).parse().expect("a number")
    }
}

fn read_reports(dir: &Path) -> Vec<Report> {
    let mut reports = Vec::new();
    for entry in std::fs::read_dir(dir).expect("probe directory") {
        let path = entry.expect("directory entry").path();
        if path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("rank-"))
        {
            let text = std::fs::read_to_string(&path).expect("probe report");
            let pairs = text
                .split_whitespace()
                .filter_map(|pair| pair.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
            reports.push(Report(pairs));
        }
    }
    reports
}

/// Requires `n` reports from `source`, ranks and local ranks `0..n` each exactly once (one node), world and local
/// world `n` everywhere, one store address, and the collectives' results.
fn check_reports(run: &Run, dir: &Path, source: &str, n: usize) {
    let reports = read_reports(dir);
    assert_eq!(reports.len(), n, "{n} ranks should have reported\n{run}");
    let ranks: Vec<usize> = reports.iter().map(|r| r.number("rank")).collect();
    let locals: Vec<usize> = reports.iter().map(|r| r.number("local_rank")).collect();
    let all: BTreeSet<usize> = (0..n).collect();
    assert_eq!(
        ranks.iter().copied().collect::<BTreeSet<_>>(),
        all,
        "ranks {ranks:?}\n{run}"
    );
    assert_eq!(
        locals.iter().copied().collect::<BTreeSet<_>>(),
        all,
        "local ranks {locals:?}\n{run}"
    );
    let stores: BTreeSet<&str> = reports.iter().map(|r| r.get("store")).collect();
    assert_eq!(stores.len(), 1, "one store for the job: {stores:?}");
    let sum = (0..n).sum::<usize>().to_string();
    let want_sum = [sum.as_str(); 3].join(",");
    let want_gathered = (0..n)
        .map(|r| format!("{},{}", 10 * r, 10 * r + 1))
        .collect::<Vec<_>>()
        .join(",");
    for r in &reports {
        assert_eq!(r.get("source"), source, "{run}");
        assert_eq!((r.number("world"), r.number("local_world")), (n, n));
        assert_eq!(
            r.get("sum"),
            want_sum,
            "all-reduce at rank {}",
            r.get("rank")
        );
        assert_eq!(
            r.get("gathered"),
            want_gathered,
            "all-gather at rank {}",
            r.get("rank")
        );
    }
}

/// The arguments that make this test binary run `launcher_probe` and nothing else.
fn probe_args() -> [&'static str; 6] {
    [
        "launcher_probe",
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
        "--quiet",
    ]
}

#[test]
fn mpirun_runs_four_ranks_that_find_each_other() {
    let mpirun = match open_mpi() {
        Ok(mpirun) => mpirun,
        Err(why) => return skip("mpirun_runs_four_ranks_that_find_each_other", &why),
    };
    let dir = Scratch::new("mpirun");
    let vars = [
        (PROBE_DIR_ENV, dir.path().display().to_string()),
        ("HYPERCOMM_STORE_ADDR", format!("127.0.0.1:{}", free_port())),
    ];
    let mut command = mpirun_command(&mpirun, 4, &vars);
    command
        .arg(std::env::current_exe().unwrap())
        .args(probe_args());
    let run = run_bounded("mpirun -n 4", command, dir.path(), JOB_LIMIT).require_success();
    check_reports(&run, dir.path(), "OpenMpi", 4);
}

/// `target/<profile>/examples/<name>`, found from this test binary's path (`target/<profile>/deps/...`).
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let path = exe
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join("examples")
        .join(name);
    assert!(
        path.exists(),
        "{} is missing: `cargo test` builds the examples (or `cargo build --example {name}`)",
        path.display()
    );
    path
}

#[test]
fn rl_pipeline_under_mpirun_is_one_job_of_eight_ranks() {
    let mpirun = match open_mpi() {
        Ok(mpirun) => mpirun,
        Err(why) => return skip("rl_pipeline_under_mpirun_is_one_job_of_eight_ranks", &why),
    };
    let dir = Scratch::new("rl-pipeline");
    let vars = [("HYPERCOMM_STORE_ADDR", format!("127.0.0.1:{}", free_port()))];
    let mut command = mpirun_command(&mpirun, 8, &vars);
    command.arg(example("rl_pipeline"));
    let run =
        run_bounded("mpirun -n 8 rl_pipeline", command, dir.path(), JOB_LIMIT).require_success();
    // One job: each rank prints its own line once, unprefixed; a rank that launched a job of its own would print
    // its ranks' lines prefixed `[rank k] ` and a summary `all 8 rank(s) exited ...`.
    for rank in 0..8 {
        let lines = run
            .stdout
            .lines()
            .filter(|l| l.starts_with(&format!("rank {rank}: ")))
            .count();
        assert_eq!(lines, 1, "rank {rank}'s line\n{run}");
    }
    assert!(
        !run.stdout.contains("[rank ") && !run.stdout.contains("rank(s) exited"),
        "{run}"
    );
    assert!(
        run.stdout
            .contains("rank 0: policy tp [0, 1] sum ok, dp [0, 2] average ok, weights synced"),
        "{run}"
    );
}

#[test]
fn srun_runs_four_ranks_that_find_each_other_and_mpirun_inside_a_job_step_is_read_as_open_mpi() {
    const TEST: &str = "srun_runs_four_ranks_that_find_each_other_and_mpirun_inside_a_job_step_is_read_as_open_mpi";
    let programs = match SlurmPrograms::find() {
        Ok(programs) => programs,
        Err(why) => return skip(TEST, &why),
    };
    let cluster = SlurmCluster::start(programs);
    let exe = std::env::current_exe().unwrap();

    // srun -n 4: the store address as MASTER_ADDR and MASTER_PORT.
    let out = Scratch::new("srun-probe");
    let vars = [
        (PROBE_DIR_ENV, out.path().display().to_string()),
        ("MASTER_ADDR", "127.0.0.1".to_owned()),
        ("MASTER_PORT", free_port().to_string()),
    ];
    let mut command = srun_command(&cluster, 4, &vars);
    command.arg(&exe).args(probe_args());
    let run = run_bounded("srun -n 4", command, cluster.dir(), JOB_LIMIT);
    if !run.status.is_some_and(|s| s.success()) {
        panic!("{run}\n{}", cluster.logs());
    }
    check_reports(&run, out.path(), "Slurm", 4);

    // mpirun -n 4 in a one-task job step: every rank also sees the step's SLURM_PROCID=0 and SLURM_NTASKS=1.
    match open_mpi() {
        Err(why) => skip(TEST, &format!("mpirun inside srun: {why}")),
        Ok(mpirun) => {
            let out = Scratch::new("srun-mpirun-probe");
            let vars = [
                (PROBE_DIR_ENV, out.path().display().to_string()),
                ("HYPERCOMM_STORE_ADDR", format!("127.0.0.1:{}", free_port())),
            ];
            let mut command = srun_command(&cluster, 1, &vars);
            let inner = mpirun_command(&mpirun, 4, &vars);
            command.arg(inner.get_program()).args(inner.get_args());
            // mpirun's own settings, which srun passes on to it (the launcher variables were removed above).
            command.envs(inner.get_envs().filter_map(|(k, v)| Some((k, v?))));
            command.arg(&exe).args(probe_args());
            let run = run_bounded("srun -n 1 mpirun -n 4", command, cluster.dir(), JOB_LIMIT);
            if !run.status.is_some_and(|s| s.success()) {
                panic!("{run}\n{}", cluster.logs());
            }
            check_reports(&run, out.path(), "OpenMpi", 4);
        }
    }
}
