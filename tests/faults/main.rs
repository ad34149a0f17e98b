//! The fault-injection suite: real rank processes through the launcher, one fault per case, and a bounded outcome.
//!
//! For every case: each rank that should notice the fault returns an error naming the communicator and the lost
//! rank within the communicator timeout plus a margin; the job never hangs (the launcher's own timeout never
//! fires); every rank process is gone afterwards; and no shared-memory segment of any rank is left in `/dev/shm`.
//! The cases run one after another in a single `#[test]` (this binary holds nothing else but the rank programs),
//! and a table of the observed times to error is printed (`cargo test --test faults -- --nocapture`).
//!
//! The host backend talks TCP over loopback and keeps no socket files, so `/dev/shm` is the only place a rank
//! could leave something behind.

mod rank;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use hypercomm::launch::{Exit, LaunchReport, Launcher};

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
    name: &'static str,
    what: &'static str,
    fate: Fate,
    /// Text every reporting rank's error must contain besides the communicator name: the lost rank.
    names: &'static str,
}

fn cases() -> Vec<Case> {
    let lost = "[3]";
    vec![
        Case {
            name: "bootstrap_kill",
            what: "SIGKILL during bootstrap (shm)",
            fate: Fate::Killed,
            names: lost,
        },
        Case {
            name: "small_kill_shm",
            what: "SIGKILL during a 64 B all-reduce (shm)",
            fate: Fate::Killed,
            names: lost,
        },
        Case {
            name: "small_kill_tcp",
            what: "SIGKILL during a 64 B all-reduce (tcp)",
            fate: Fate::Killed,
            names: lost,
        },
        Case {
            name: "large_kill_shm",
            what: "SIGKILL during a 16 MiB all-reduce (shm)",
            fate: Fate::Killed,
            names: lost,
        },
        Case {
            name: "large_kill_tcp",
            what: "SIGKILL during a 16 MiB all-reduce (tcp)",
            fate: Fate::Killed,
            names: lost,
        },
        Case {
            name: "between_kill",
            what: "SIGKILL between collectives (shm)",
            fate: Fate::Killed,
            names: lost,
        },
        // A survivor may fail first on a group it shares only with survivors that already gave up; its error
        // then names those ranks, so here any named rank will do.
        Case {
            name: "collection_kill",
            what: "SIGKILL while a collection is built",
            fate: Fate::Killed,
            names: "rank(s) [",
        },
        Case {
            name: "stop_shm",
            what: "SIGSTOP: a rank stalls without dying (shm)",
            fate: Fate::Stopped,
            names: lost,
        },
        Case {
            name: "stop_tcp",
            what: "SIGSTOP: a rank stalls without dying (tcp)",
            fate: Fate::Stopped,
            names: lost,
        },
        Case {
            name: "tcp_drop",
            what: "TCP connection 0-1 dropped",
            fate: Fate::Survives,
            names: "rank",
        },
        Case {
            name: "store_kill",
            what: "store server SIGKILLed, then a split",
            fate: Fate::Survives,
            names: "store at",
        },
        Case {
            name: "wrong_secret",
            what: "a rank has the wrong store secret",
            fate: Fate::Faulty,
            names: lost,
        },
        Case {
            name: "wrong_world",
            what: "a rank has the wrong world size",
            fate: Fate::Faulty,
            names: lost,
        },
    ]
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

/// Whether `pid` is still one of our rank processes (a reused pid running something else does not count).
fn still_running(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|c| String::from_utf8_lossy(&c).contains("fault_rank"))
}

fn shm_files_of(pids: &[u32]) -> Vec<String> {
    let prefixes: Vec<String> = pids.iter().map(|p| format!("hypercomm-{p}-")).collect();
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| prefixes.iter().any(|p| n.starts_with(p)))
                .collect()
        })
        .unwrap_or_default()
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
        .env("HC_FAULT_CASE", case.name)
        .env("HC_FAULT_TIMEOUT_MS", TIMEOUT.as_millis().to_string());
    let store = (case.name == "store_kill").then(start_store);
    if let Some((_, addr)) = &store {
        launcher = launcher.env("HC_STORE", addr);
    }
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
    for outcome in &report.ranks {
        let seen = parse(&outcome.stdout);
        pids.extend(seen.pid);
        let victim = outcome.rank == VICTIM && case.fate != Fate::Survives;
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
            names_rank(&seen.err, VICTIM)
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
    if let Some(pid) = pids.iter().find(|&&p| still_running(p)) {
        return Err(format!("rank process {pid} is still running"));
    }
    let left = shm_files_of(&pids);
    if !left.is_empty() {
        return Err(format!("shared-memory files left behind: {left:?}"));
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
