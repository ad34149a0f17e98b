//! The fault-injection suite: real rank processes through the launcher, one fault per case, and a bounded outcome.
//!
//! For every case: each rank that should notice the fault returns an error naming the communicator and the lost
//! rank within the communicator timeout plus a margin; the job never hangs (the launcher's own timeout never
//! fires); every rank process is gone afterwards; and no file of any rank is left in `/dev/shm`, nor any socket.
//! The cases run one after another in a single `#[test]` (this binary holds nothing else but the rank programs),
//! and a table of the observed times to error is printed (`cargo test --test faults -- --nocapture`).
//!
//! The host backend's shared memory is an anonymous memfd handed over a socket in the abstract namespace, and its
//! TCP talks over loopback: nothing it uses has a file name. The checks look in `/dev/shm` and `/proc/net/unix`
//! all the same, so that a regression to named segments or socket files would show.
//!
//! The `step_*` cases kill a rank at every named step of a collection build (`BuildStep::NAMES`, through the
//! public hook `CollectionBuilder::with_step_hook`).

mod rank;

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
const VICTIM: usize = RANKS - 1;

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

struct Case {
    name: String,
    what: String,
    fate: Fate,
    /// Text every reporting rank's error must contain besides the communicator name: the lost rank. `VICTIM_NAMED`:
    /// the victim's rank, or (for failures that cascade through a collection) a survivor that failed before.
    names: &'static str,
    /// The rank the fault hits.
    victim: usize,
}

/// `Case::names` for "names the victim (or a survivor that gave up before)".
const VICTIM_NAMED: &str = "victim";

fn cases() -> Vec<Case> {
    let lost = "[3]";
    let mut cases = vec![
        Case {
            name: "bootstrap_kill".into(),
            what: "SIGKILL during bootstrap (shm)".into(),
            fate: Fate::Killed,
            names: lost,
            victim: VICTIM,
        },
        Case {
            name: "small_kill_shm".into(),
            what: "SIGKILL during a 64 B all-reduce (shm)".into(),
            fate: Fate::Killed,
            names: lost,
            victim: VICTIM,
        },
        Case {
            name: "small_kill_tcp".into(),
            what: "SIGKILL during a 64 B all-reduce (tcp)".into(),
            fate: Fate::Killed,
            names: lost,
            victim: VICTIM,
        },
        Case {
            name: "large_kill_shm".into(),
            what: "SIGKILL during a 16 MiB all-reduce (shm)".into(),
            fate: Fate::Killed,
            names: lost,
            victim: VICTIM,
        },
        Case {
            name: "large_kill_tcp".into(),
            what: "SIGKILL during a 16 MiB all-reduce (tcp)".into(),
            fate: Fate::Killed,
            names: lost,
            victim: VICTIM,
        },
        Case {
            name: "between_kill".into(),
            what: "SIGKILL between collectives (shm)".into(),
            fate: Fate::Killed,
            names: lost,
            victim: VICTIM,
        },
        // A survivor may fail first on a group it shares only with survivors that already gave up; its error
        // then names those ranks, so here any named rank will do.
        Case {
            name: "collection_kill".into(),
            what: "SIGKILL while a collection is built".into(),
            fate: Fate::Killed,
            names: "rank(s) [",
            victim: VICTIM,
        },
        Case {
            name: "stop_shm".into(),
            what: "SIGSTOP: a rank stalls without dying (shm)".into(),
            fate: Fate::Stopped,
            names: lost,
            victim: VICTIM,
        },
        Case {
            name: "stop_tcp".into(),
            what: "SIGSTOP: a rank stalls without dying (tcp)".into(),
            fate: Fate::Stopped,
            names: lost,
            victim: VICTIM,
        },
        Case {
            name: "tcp_drop".into(),
            what: "TCP connection 0-1 dropped".into(),
            fate: Fate::Survives,
            names: "rank",
            victim: VICTIM,
        },
        Case {
            name: "store_kill".into(),
            what: "store server SIGKILLed, then a split".into(),
            fate: Fate::Survives,
            names: "store at",
            victim: VICTIM,
        },
        Case {
            name: "wrong_secret".into(),
            what: "a rank has the wrong store secret".into(),
            fate: Fate::Faulty,
            names: lost,
            victim: VICTIM,
        },
        Case {
            name: "wrong_world".into(),
            what: "a rank has the wrong world size".into(),
            fate: Fate::Faulty,
            names: lost,
            victim: VICTIM,
        },
    ];
    cases.extend(step_cases());
    cases
}

/// Steps that only ranks other than 0 go through: killing rank 0 there is impossible, so rank 1 dies instead.
const JOINER_STEPS: [&str; 3] = ["record_read", "segment_received", "segment_attached"];

/// One case per named step of a collection build (`BuildStep::NAMES`): a `tp 2, dp 2` collection with a world
/// group, where the segment creator (rank 0; rank 1 for the steps rank 0 never takes) SIGKILLs itself at that step
/// of the last group, `world`. The survivors must fail within the bound, and nothing of the dead rank stays: no
/// process, no file in `/dev/shm`, no socket.
fn step_cases() -> Vec<Case> {
    BuildStep::NAMES
        .iter()
        .map(|step| Case {
            name: format!("step_{step}"),
            what: format!("SIGKILL at step {step} of the world group (collection)"),
            fate: Fate::Killed,
            names: VICTIM_NAMED,
            victim: if JOINER_STEPS.contains(step) { 1 } else { 0 },
        })
        .collect()
}

/// One rank's parsed output.
struct Seen {
    pid: Option<u32>,
    ms: Option<u128>,
    err: String,
}

fn parse(lines: &[String]) -> Seen {
    let mut seen = Seen {
        pid: None,
        ms: None,
        err: String::new(),
    };
    for line in lines {
        if let Some(pid) = line.strip_prefix("pid ") {
            seen.pid = pid.trim().parse().ok();
        }
        for tag in ["SEEN ms=", "FAULTY ms="] {
            if let Some(rest) = line.strip_prefix(tag)
                && let Some((ms, err)) = rest.split_once(" err=")
            {
                seen.ms = ms.parse().ok();
                seen.err = err.to_owned();
            }
        }
    }
    seen
}

/// Whether `err` names `rank` in one of its rank lists (`rank(s) [0, 3]`) or store keys (`.../#3`).
fn names_rank(err: &str, rank: usize) -> bool {
    let in_list = err.split('[').skip(1).any(|rest| {
        rest.split(']').next().is_some_and(|list| {
            list.split(',')
                .any(|r| r.trim().parse::<usize>() == Ok(rank))
        })
    });
    in_list || err.contains(&format!("/#{rank}"))
}

/// Whether `err` names `rank` in a rank list, a store key, or as "rank <r> (pid ...)" (a failed socket exchange
/// with rank 0) or "aborted by rank <r>".
fn names_victim(err: &str, rank: usize) -> bool {
    names_rank(err, rank)
        || err.contains(&format!("rank {rank} (pid"))
        || err.contains(&format!("aborted by rank {rank} "))
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
/// old `hypercomm-<pid>-...` segment files did). Not every new name: other jobs on the machine share `/dev/shm`,
/// and some of them (older builds of this suite) leave files by design.
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
/// A passing case: the fastest and slowest time to error, the job's wall time, and a sample error.
type Row = (u128, u128, f64, String);

fn run(case: &Case) -> Result<Row, String> {
    let mut launcher = Launcher::current_test("rank::fault_rank")
        .map_err(|e| e.to_string())?
        .nproc(RANKS)
        // After the first rank exits, the others have this long to report before the launcher stops them.
        .grace(TIMEOUT * 2)
        .timeout(Duration::from_secs(90))
        .env("HC_FAULT_CASE", &case.name)
        .env("HC_FAULT_VICTIM", case.victim.to_string())
        .env("HC_FAULT_TIMEOUT_MS", TIMEOUT.as_millis().to_string());
    let store = (case.name == "store_kill").then(start_store);
    if let Some((_, addr)) = &store {
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
    let mut sample = String::new();
    let mut pids = Vec::new();
    // The ranks that reported an error: under `VICTIM_NAMED`, a survivor may name one of them instead of the victim
    // (it failed on a group it shares only with survivors that had given up), so long as one names the victim.
    let reporters: Vec<usize> = report
        .ranks
        .iter()
        .filter(|o| o.rank != case.victim && parse(&o.stdout).ms.is_some())
        .map(|o| o.rank)
        .collect();
    let mut victim_named_once = case.names != VICTIM_NAMED;
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
                Fate::Faulty => outcome.exit == Exit::Code(rank::EXPECTED),
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
        if outcome.exit != Exit::Code(rank::EXPECTED) {
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
        let victim_named = if case.names == "[3]" {
            names_rank(&seen.err, case.victim)
        } else if case.names == VICTIM_NAMED {
            let direct = names_victim(&seen.err, case.victim);
            victim_named_once |= direct;
            direct || reporters.iter().any(|&r| names_rank(&seen.err, r))
        } else {
            seen.err.contains(case.names)
        };
        let comm_named = seen.err.contains(&comm) || case.name == "store_kill";
        if !(victim || comm_named && victim_named) {
            return Err(format!(
                "rank {}'s error does not name {comm} and {}: {}",
                outcome.rank, case.names, seen.err
            ));
        }
        if !victim && sample.is_empty() {
            sample = seen.err.clone();
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
    if !victim_named_once {
        return Err(format!(
            "no survivor's error names the victim, rank {}\n{}",
            case.victim,
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
    Ok((min, max, job.as_secs_f64(), sample))
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
            Ok((min, max, job, err)) => rows.push(format!(
                "| {} | {} | {min}-{max} | {job:.1} | {} |",
                case.name,
                case.what,
                err.chars().take(110).collect::<String>().replace('|', "/")
            )),
            Err(e) => {
                rows.push(format!("| {} | {} | FAILED | | |", case.name, case.what));
                failures.push(format!("{}: {e}", case.name));
            }
        }
    }
    println!(
        "\nfault cases ({RANKS} ranks, timeout {TIMEOUT:?}, bound timeout + {MARGIN:?}):\n\
         | case | fault | time to error (ms, min-max over reporting ranks) | job (s) | first survivor's error |\n\
         |---|---|---|---|---|"
    );
    for row in &rows {
        println!("{row}");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
