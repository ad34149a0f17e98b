//! The fault-injection suite: real rank processes through the launcher, one fault per case, and a bounded outcome.
//!
//! For every case: each rank that should notice the fault returns an error naming the communicator within the
//! communicator timeout plus a margin, and the error's structured fields (`lost_ranks()`, `culprits()`, printed by
//! the rank) blame exactly the faulty rank, by world rank, even on ranks that only met the fault through a cascade
//! of aborts; the job never hangs (the launcher's own timeout never
//! fires); every rank process is gone afterwards; and no file of any rank is left in `/dev/shm`, nor any socket.
//! The cases run one after another in a single `#[test]` (this binary holds nothing else but the rank programs),
//! and a table of the observed times to error is printed (`cargo test --test faults -- --nocapture`; with
//! `HC_FAULT_VERBOSE=1`, every reporting rank's error too).
//!
//! The host backend's shared memory is an anonymous memfd handed over a socket in the abstract namespace, and its
//! TCP talks over loopback: nothing it uses has a file name. The checks look in `/dev/shm` and `/proc/net/unix`
//! all the same, so that a regression to named segments or socket files would show.
//!
//! The `step_*` cases kill a rank at every named step of a collection build (`BuildStep::NAMES`, through the
//! public hook `CollectionBuilder::with_step_hook`).
//!
//! The `device_*` cases give every rank a GPU under `fake-gpu`, the strict stand-in CUDA driver and NCCL (see
//! `crates/hypercomm-comm/tests/fake_support`), and a collection whose communicators have an NCCL flavor: a rank
//! that never calls while the others only order their streams and read the result to the host, a rank that calls
//! another collective, an asynchronous NCCL error on one rank's communicator, and a ring of stages that each send
//! before they receive. There the GPU's watchdog must end what would hang, and every rank must also leave a flight
//! record (`HYPERCOMM_FLIGHT_RECORDER_DIR`) for each of its NCCL communicators, holding its operations.
//!
//! With `HC_FAULT_TABLE=<path>`, the table is also written to that file (`docs/reliability.md` is made so).

mod device;
#[path = "../../crates/hypercomm-comm/tests/fake_support/mod.rs"]
mod fake_support;
mod rank;
mod report;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use hypercomm::launch::{Exit, LaunchReport, Launcher};
use hypercomm::pgc::BuildStep;

/// Each communicator's timeout in the suite: short, so the whole suite runs in about a minute.
const TIMEOUT: Duration = Duration::from_secs(2);
/// What a surviving rank may take beyond the timeout to report (a bound on a loaded CI machine, not a speed test).
const MARGIN: Duration = Duration::from_secs(5);
const RANKS: usize = 4;

/// What happens to the faulty rank.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fate {
    /// It SIGKILLs itself.
    Killed,
    /// It SIGSTOPs itself; the launcher must kill it.
    Stopped,
    /// It is misconfigured and must fail with an error of its own.
    Faulty,
    /// Nobody dies (a dropped connection, a killed store): every rank must report.
    Survives,
}

/// What every reporting rank's error must say.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Expect {
    /// Its structured error blames exactly the victim: `lost_ranks() == [victim]` (and `culprits()` the same)
    /// when `lost`, else (a disagreement) `culprits() == [victim]` with nothing lost.
    Blames { lost: bool },
    /// The connection between these two ranks broke: each blames the other (`lost_ranks() == [other]`); the other
    /// ranks blame exactly one of the two.
    Link(usize, usize),
    /// The store died: the error names the store's address.
    StoreAddress,
    /// NCCL failed on the victim's communicator without saying why: nobody is blamed, and every rank's error
    /// carries NCCL's error (`ncclRemoteError`), the victim's as seen by its watchdog, the others' as the root
    /// cause the victim recorded.
    NcclFailure,
    /// Every rank waited on the next in a cycle: each blames all of them (`culprits()`), none is lost, and the
    /// error says it was a cycle.
    Cycle,
}

struct Case {
    name: String,
    what: String,
    fate: Fate,
    /// The faulty rank.
    victim: usize,
    expect: Expect,
}

fn cases() -> Vec<Case> {
    let case = |name: &str, what: &str, fate, victim, expect| Case {
        name: name.to_owned(),
        what: what.to_owned(),
        fate,
        victim,
        expect,
    };
    let lost = Expect::Blames { lost: true };
    let last = RANKS - 1;
    let mut cases = vec![
        case(
            "bootstrap_kill",
            "SIGKILL during bootstrap (shm)",
            Fate::Killed,
            last,
            lost,
        ),
        case(
            "small_kill_shm",
            "SIGKILL during a 64 B all-reduce (shm)",
            Fate::Killed,
            last,
            lost,
        ),
        case(
            "small_kill_tcp",
            "SIGKILL during a 64 B all-reduce (tcp)",
            Fate::Killed,
            last,
            lost,
        ),
        case(
            "large_kill_shm",
            "SIGKILL during a 16 MiB all-reduce (shm)",
            Fate::Killed,
            last,
            lost,
        ),
        case(
            "large_kill_tcp",
            "SIGKILL during a 16 MiB all-reduce (tcp)",
            Fate::Killed,
            last,
            lost,
        ),
        case(
            "between_kill",
            "SIGKILL between collectives (shm)",
            Fate::Killed,
            last,
            lost,
        ),
        // Survivors fail in different groups of the collection (some only with survivors that gave up); the
        // collection's failure records make every one of them name the dead rank.
        case(
            "collection_kill",
            "SIGKILL while a collection is built",
            Fate::Killed,
            last,
            lost,
        ),
        case(
            "stop_shm",
            "SIGSTOP: a rank stalls without dying (shm)",
            Fate::Stopped,
            last,
            lost,
        ),
        case(
            "stop_tcp",
            "SIGSTOP: a rank stalls without dying (tcp)",
            Fate::Stopped,
            last,
            lost,
        ),
        case(
            "tcp_drop",
            "TCP connection 0-1 dropped",
            Fate::Survives,
            last,
            Expect::Link(0, 1),
        ),
        case(
            "store_kill",
            "store server SIGKILLed, then a split",
            Fate::Survives,
            last,
            Expect::StoreAddress,
        ),
        case(
            "wrong_secret",
            "a rank has the wrong store secret",
            Fate::Faulty,
            last,
            lost,
        ),
        case(
            "wrong_world",
            "a rank has the wrong world size",
            Fate::Faulty,
            last,
            lost,
        ),
        // The job: tp 2, dp 2 over 4 ranks, checked 16 MiB all-reduces on tp then dp. Survivors meet the
        // fault directly (the victim's tp partner, its dp partner) or through a cascade (the other two).
        case(
            "tpdp_kill_shm",
            "tp2 dp2: SIGKILL mid 16 MiB tp all-reduce (shm)",
            Fate::Killed,
            2,
            lost,
        ),
        case(
            "tpdp_kill_tcp",
            "tp2 dp2: SIGKILL mid 16 MiB tp all-reduce (tcp)",
            Fate::Killed,
            2,
            lost,
        ),
        case(
            "tpdp_stop_shm",
            "tp2 dp2: SIGSTOP mid 16 MiB tp all-reduce (shm)",
            Fate::Stopped,
            2,
            lost,
        ),
        case(
            "tpdp_count",
            "tp2 dp2: a rank passes a wrong count, then all exit (shm)",
            Fate::Faulty,
            1,
            Expect::Blames { lost: false },
        ),
    ];
    cases.extend(step_cases());
    cases.extend([
        case(
            "device_never_calls",
            "device: a rank never calls; the others wait_on, then copy to host",
            Fate::Faulty,
            last,
            lost,
        ),
        case(
            "device_mismatch",
            "device: a rank calls all_gather where the others reduce_scatter",
            Fate::Faulty,
            last,
            Expect::Blames { lost: false },
        ),
        case(
            "device_async_error",
            "device: asynchronous NCCL error on one rank's world communicator",
            Fate::Faulty,
            last,
            Expect::NcclFailure,
        ),
        case(
            "device_cycle",
            "device: a ring of 4 stages, each send before recv",
            Fate::Survives,
            last,
            Expect::Cycle,
        ),
    ]);
    cases
}

/// The fake's settings for a device case: one fake device per rank; NCCL's own timeout far beyond the
/// communicators' (so the watchdog must act); the mismatch hanging as NCCL's kernels would; the asynchronous
/// error on the victim's world communicator (the only one where a rank is `victim`).
fn fake_env(case: &Case) -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("FAKE_GPU_DEVICES", RANKS.to_string()),
        ("FAKE_NCCL_TIMEOUT_SECS", "60".to_owned()),
    ];
    match case.name.as_str() {
        "device_mismatch" => env.push(("FAKE_NCCL_MISMATCH_HANGS", "1".to_owned())),
        "device_async_error" => {
            env.push(("FAKE_NCCL_FAIL_AFTER", "2".to_owned()));
            env.push(("FAKE_NCCL_FAIL_RANK", case.victim.to_string()));
            env.push(("FAKE_GPU_STREAM_DELAY_MS", "100".to_owned()));
        }
        _ => {}
    }
    env
}

/// Steps that only ranks other than 0 go through: killing rank 0 there is impossible, so rank 1 dies instead.
const JOINER_STEPS: [&str; 3] = ["record_read", "segment_received", "segment_attached"];

/// One case per named step of a collection build (`BuildStep::NAMES`): a `tp 2, dp 2` collection with a world
/// group, where the segment creator (rank 0; rank 1 for the steps rank 0 never takes) SIGKILLs itself at that step
/// of the last group, `world`. Every survivor must blame it by world rank within the bound (the failure domain
/// carries the root cause to the survivors that fail in other groups first), and nothing of the dead rank stays:
/// no process, no file in `/dev/shm`, no socket.
fn step_cases() -> Vec<Case> {
    BuildStep::NAMES
        .iter()
        .map(|step| Case {
            name: format!("step_{step}"),
            what: format!("SIGKILL at step {step} of the world group (collection)"),
            fate: Fate::Killed,
            victim: if JOINER_STEPS.contains(step) { 1 } else { 0 },
            expect: Expect::Blames { lost: true },
        })
        .collect()
}

/// One rank's parsed output.
#[derive(Default)]
struct Seen {
    pid: Option<u32>,
    ms: Option<u128>,
    /// The error's `lost_ranks()` and `culprits()`.
    lost: Option<Vec<usize>>,
    culprits: Option<Vec<usize>>,
    err: String,
    /// The NCCL communicators the rank had, with how many operations each numbered (`FLIGHT` lines).
    flights: Vec<(String, u64)>,
}

/// A rank list as `{:?}` prints it: `[0, 3]`.
fn parse_list(text: &str) -> Option<Vec<usize>> {
    let inner = text.strip_prefix('[')?.strip_suffix(']')?;
    inner
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse().ok())
        .collect()
}

fn parse(lines: &[String]) -> Seen {
    let mut seen = Seen::default();
    for line in lines {
        if let Some(pid) = line.strip_prefix("pid ") {
            seen.pid = pid.trim().parse().ok();
        }
        if let Some((comm, issued)) = line
            .strip_prefix("FLIGHT ")
            .and_then(|l| l.rsplit_once(" issued="))
            && let Ok(issued) = issued.trim().parse()
        {
            seen.flights.push((comm.to_owned(), issued));
        }
        for tag in ["SEEN ms=", "FAULTY ms="] {
            let Some(rest) = line.strip_prefix(tag) else {
                continue;
            };
            let Some((head, err)) = rest.split_once(" err=") else {
                continue;
            };
            let Some((ms, head)) = head.split_once(" lost=") else {
                continue;
            };
            let Some((lost, culprits)) = head.split_once(" culprits=") else {
                continue;
            };
            seen.ms = ms.parse().ok();
            seen.lost = parse_list(lost);
            seen.culprits = parse_list(culprits);
            seen.err = err.to_owned();
        }
    }
    seen
}

/// Whether a reporting rank's error says what `case` expects of rank `rank`; `Err` says what it says instead.
fn check_blame(case: &Case, rank: usize, seen: &Seen, store: Option<&str>) -> Result<(), String> {
    let (lost, culprits) = (
        seen.lost.clone().unwrap_or_default(),
        seen.culprits.clone().unwrap_or_default(),
    );
    let ok = match case.expect {
        Expect::Blames { lost: true } => lost == [case.victim] && culprits == [case.victim],
        Expect::Blames { lost: false } => lost.is_empty() && culprits == [case.victim],
        Expect::Link(a, b) if rank == a => lost == [b],
        Expect::Link(a, b) if rank == b => lost == [a],
        Expect::Link(a, b) => lost == [a] || lost == [b],
        Expect::StoreAddress => store.is_some_and(|addr| seen.err.contains(addr)),
        Expect::NcclFailure => {
            lost.is_empty() && culprits.is_empty() && seen.err.contains("ncclRemoteError")
        }
        Expect::Cycle => {
            lost.is_empty()
                && culprits == (0..RANKS).collect::<Vec<_>>()
                && seen.err.contains("a cycle of waits")
        }
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "rank {rank} blames lost={lost:?} culprits={culprits:?}, expected {:?} of victim {}: {}",
            case.expect, case.victim, seen.err
        ))
    }
}

/// Whether `pid` is still one of our rank processes (a reused pid running something else does not count).
fn still_running(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|c| String::from_utf8_lossy(&c).contains("fault_rank"))
}

/// The names in `/dev/shm` now.
fn shm_listing() -> BTreeSet<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `name` carries one of `pids` as a token (`hypercomm-<pid>-...`, `@hypercomm/<pid>/...`).
fn mentions_pid(name: &str, pids: &[u32]) -> bool {
    name.split(|c: char| !c.is_ascii_digit())
        .any(|token| token.parse::<u32>().is_ok_and(|t| pids.contains(&t)))
}

/// What the rank processes left in `/dev/shm` since `before`: every new name that mentions a rank's pid (as the
/// old `hypercomm-<pid>-...` segment files did). Not every new name: other jobs on the machine share `/dev/shm`.
fn shm_left(before: &BTreeSet<String>, pids: &[u32]) -> Vec<String> {
    shm_listing()
        .difference(before)
        .filter(|n| mentions_pid(n, pids))
        .cloned()
        .collect()
}

/// Unix sockets of the rank processes still bound (abstract names included: `/proc/net/unix` lists them).
fn sockets_left(pids: &[u32]) -> Vec<String> {
    std::fs::read_to_string("/proc/net/unix")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|line| line.split_whitespace().nth(7))
        .filter(|path| path.contains("hypercomm") && mentions_pid(path, pids))
        .map(str::to_owned)
        .collect()
}

/// The standalone store of the `store_kill` case and its address.
fn start_store() -> (Child, String) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "rank::fault_store",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
            "--quiet",
        ])
        .env("HC_FAULT_STORE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let addr = lines
        .by_ref()
        .take(100)
        .find_map(|l| l.ok()?.strip_prefix("addr ").map(str::to_owned))
        .expect("the store process prints its address");
    (child, addr)
}

/// Runs one case; returns the table row or what went wrong.
/// A passing case: the fastest and slowest time to error, the job's wall time, whom the first survivor blames
/// (`lost_ranks()` and `culprits()`) and its error.
type Row = (u128, u128, f64, String, String);

/// Whether rank `rank` left a flight record for each NCCL communicator it had (`seen.flights`), holding as many
/// operations as the communicator numbered, and the failure that stopped it.
fn check_flights(dir: &std::path::Path, rank: usize, seen: &Seen) -> Result<(), String> {
    if seen.flights.is_empty() {
        return Err(format!("rank {rank} listed no NCCL communicator"));
    }
    for (comm, issued) in &seen.flights {
        let path = dir.join(format!("{}.rank{rank}.json", comm.replace('/', "_")));
        let bytes = std::fs::read(&path)
            .map_err(|e| format!("rank {rank}: no flight record at {}: {e}", path.display()))?;
        let record: hypercomm_comm::device::FlightRecord = serde_json::from_slice(&bytes)
            .map_err(|e| format!("rank {rank}: {}: {e}", path.display()))?;
        let last = record.ops.last().map(|e| e.seq);
        if record.issued != *issued || (*issued > 0 && last != Some(*issued)) {
            return Err(format!(
                "rank {rank}: the flight record of {comm} holds {} operations up to {last:?}, the communicator \
                 numbered {issued}",
                record.issued
            ));
        }
        if record.failure.is_none() {
            return Err(format!(
                "rank {rank}: the flight record of {comm} has no failure"
            ));
        }
    }
    Ok(())
}

fn run(case: &Case) -> Result<Row, String> {
    let device = case.name.starts_with("device_");
    // Kept until the case ends: the fake's libraries and exchange files, and the flight records.
    let fake = device.then(|| fake_support::FakeDir::new(&case.name));
    let flight_dir = fake.as_ref().map(|f| f.0.join("flight"));
    let mut launcher = Launcher::current_test("rank::fault_rank")
        .map_err(|e| e.to_string())?
        .nproc(RANKS)
        // After the first rank exits, the others have this long to report before the launcher stops them.
        .grace(TIMEOUT + MARGIN)
        .timeout(Duration::from_secs(90))
        .env("HC_FAULT_CASE", &case.name)
        .env("HC_FAULT_VICTIM", case.victim.to_string())
        .env("HC_FAULT_TIMEOUT_MS", TIMEOUT.as_millis().to_string());
    if let (Some(fake), Some(flights)) = (&fake, &flight_dir) {
        for (k, v) in fake_support::fake_vars(fake) {
            launcher = launcher.env(k, v);
        }
        for (k, v) in fake_env(case) {
            launcher = launcher.env(k, v);
        }
        launcher = launcher.env(hypercomm_comm::device::FLIGHT_RECORDER_DIR_ENV, flights);
    }
    let store = (case.name == "store_kill").then(start_store);
    let store_addr = store.as_ref().map(|(_, addr)| addr.clone());
    if let Some(addr) = &store_addr {
        launcher = launcher.env("HC_STORE", addr);
    }
    let shm_before = shm_listing();
    let started = std::time::Instant::now();
    let report: LaunchReport = launcher.run().map_err(|e| e.to_string())?;
    let job = started.elapsed();
    if let Some((mut child, _)) = store {
        let status = child.wait().map_err(|e| e.to_string())?;
        if status.success() {
            return Err("the store process was not killed".into());
        }
    }
    let detail = || format!("{}\n{:#?}", report.summary(), report.ranks);
    if report.timed_out {
        return Err(format!("hang: the launcher timed out\n{}", detail()));
    }
    let comm = format!("fault-{}", case.name);
    let mut times = Vec::new();
    let (mut sample, mut blamed) = (String::new(), String::new());
    let mut pids = Vec::new();
    for outcome in &report.ranks {
        let seen = parse(&outcome.stdout);
        pids.extend(seen.pid);
        let victim = outcome.rank == case.victim && case.fate != Fate::Survives;
        let reports = !victim || case.fate == Fate::Faulty;
        if victim {
            let ok = match case.fate {
                Fate::Killed => outcome.exit == Exit::Signal(9),
                Fate::Stopped => {
                    matches!(outcome.exit, Exit::Signal(_)) && outcome.stopped_by_launcher
                }
                Fate::Faulty => outcome.exit == Exit::Code(report::EXPECTED),
                Fate::Survives => true,
            };
            if !ok {
                return Err(format!("victim ended {:?}\n{}", outcome.exit, detail()));
            }
        }
        if !reports {
            continue;
        }
        let Some(ms) = seen.ms else {
            return Err(format!(
                "rank {} reported nothing\n{}",
                outcome.rank,
                detail()
            ));
        };
        if outcome.exit != Exit::Code(report::EXPECTED) {
            return Err(format!(
                "rank {} ended {:?}\n{}",
                outcome.rank,
                outcome.exit,
                detail()
            ));
        }
        let bound = (TIMEOUT + MARGIN).as_millis();
        if ms > bound {
            return Err(format!(
                "rank {} took {ms} ms > {bound} ms: {}",
                outcome.rank, seen.err
            ));
        }
        // A misconfigured victim only has to fail (a wrong secret fails before any communicator exists).
        let excused = victim && case.fate == Fate::Faulty;
        if !excused && !seen.err.contains(&comm) {
            return Err(format!(
                "rank {}'s error does not name {comm}: {}",
                outcome.rank, seen.err
            ));
        }
        // A misconfigured victim only has to fail; a victim that disagrees in a communicator (tpdp_count,
        // device_mismatch) must blame itself like everyone else, and one whose NCCL failed must report it.
        if !victim
            || matches!(
                case.expect,
                Expect::Blames { lost: false } | Expect::NcclFailure
            )
        {
            check_blame(case, outcome.rank, &seen, store_addr.as_deref())?;
        }
        if let Some(dir) = &flight_dir {
            check_flights(dir, outcome.rank, &seen)?;
        }
        if std::env::var_os("HC_FAULT_VERBOSE").is_some() {
            println!(
                "[{} rank {}] {} ms: {}",
                case.name, outcome.rank, ms, seen.err
            );
        }
        if !victim && sample.is_empty() {
            sample = seen.err.clone();
            blamed = format!(
                "{:?} / {:?}",
                seen.lost.clone().unwrap_or_default(),
                seen.culprits.clone().unwrap_or_default()
            );
        }
        times.push(ms);
    }
    if pids.len() != RANKS {
        return Err(format!(
            "only {} of {RANKS} ranks printed a pid\n{}",
            pids.len(),
            detail()
        ));
    }
    if let Some(pid) = pids.iter().find(|&&p| still_running(p)) {
        return Err(format!("rank process {pid} is still running"));
    }
    let left = shm_left(&shm_before, &pids);
    if !left.is_empty() {
        return Err(format!("shared-memory files left behind: {left:?}"));
    }
    let sockets = sockets_left(&pids);
    if !sockets.is_empty() {
        return Err(format!("sockets left behind: {sockets:?}"));
    }
    let (min, max) = (
        times.iter().copied().min().unwrap_or(0),
        times.iter().copied().max().unwrap_or(0),
    );
    Ok((min, max, job.as_secs_f64(), blamed, sample))
}

#[test]
fn every_fault_ends_in_a_named_error_within_the_timeout() {
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    // HC_FAULT_ONLY=name,name runs a subset (while debugging one case).
    let only = std::env::var("HC_FAULT_ONLY").ok();
    let chosen = cases().into_iter().filter(|c| {
        only.as_ref()
            .is_none_or(|o| o.split(',').any(|n| n == c.name))
    });
    for case in chosen {
        match run(&case) {
            Ok((min, max, job, blamed, err)) => rows.push(format!(
                "| {} | {} | {min}-{max} | {job:.1} | {blamed} | {} |",
                case.name,
                case.what,
                err.chars().take(110).collect::<String>().replace('|', "/")
            )),
            Err(e) => {
                rows.push(format!("| {} | {} | FAILED | | | |", case.name, case.what));
                failures.push(format!("{}: {e}", case.name));
            }
        }
    }
    let table = format!(
        "fault cases ({RANKS} ranks, timeout {TIMEOUT:?}, bound timeout + {MARGIN:?}):\n\n\
         | case | fault | time to error (ms, min-max over reporting ranks) | job (s) | first survivor blames \
         (lost / culprits) | first survivor's error |\n\
         |---|---|---|---|---|---|\n{}\n",
        rows.join("\n")
    );
    println!("\n{table}");
    if let Some(path) = std::env::var_os("HC_FAULT_TABLE") {
        let doc = format!(
            "# Fault-injection results\n\n\
             Written by `HC_FAULT_TABLE={} cargo test --test faults -- --nocapture` (`tests/faults/`; debug build).\n\
             Each case: {RANKS} rank processes through the launcher; every reporting rank must blame the faulty rank by\n\
             world rank (`lost_ranks()`/`culprits()`), within the timeout + margin, leaving no process, no file in\n\
             `/dev/shm` and no socket. The `device_*` cases give each rank a GPU under `fake-gpu` (the strict stand-in\n\
             CUDA driver and NCCL), where the GPU's watchdog must end what would hang, and each rank must also leave a\n\
             flight record for every NCCL communicator of its collection. Load average (1 min) when the run ended: {}.\n\n{table}",
            path.to_string_lossy(),
            std::fs::read_to_string("/proc/loadavg")
                .ok()
                .and_then(|l| l.split_whitespace().next().map(str::to_owned))
                .unwrap_or_else(|| "unknown".into()),
        );
        if let Err(e) = std::fs::write(&path, doc) {
            failures.push(format!(
                "writing the table to {}: {e}",
                path.to_string_lossy()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
