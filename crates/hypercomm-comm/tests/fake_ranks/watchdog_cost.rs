//! What the GPU's watchdog costs in CPU with 1,000 device operations in flight, under the fake: a measurement
//! run by hand (`docs/perf/watchdog.md`), not a timed test. Nothing here asserts a time.
//!
//! Every fake stream waits a minute before each piece of work (`FAKE_GPU_STREAM_DELAY_MS`), so the operations
//! enqueued stay in flight for the whole window; the watchdog's thread (named `hypercomm-watchdog-gpu0`) is found
//! in `/proc/self/task` and its CPU time read from `schedstat` (nanoseconds on a CPU) before and after.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hypercomm_comm::device::Gpu;
use hypercomm_comm::{CommOptions, Communicator, ReduceOp, Work};
use hypercomm_store::MemoryStore;

use crate::fake_support::{nccl, pass_under_fake, runtime};

/// How long each figure is measured over.
const WINDOW: Duration = Duration::from_secs(10);

#[test]
#[ignore = "a measurement, run by hand: docs/perf/watchdog.md"]
fn measure_the_watchdog_at_1000_operations_in_flight() {
    let log = pass_under_fake(
        "watchdog_cost::fake_the_watchdog_at_1000_operations_in_flight",
        &[("FAKE_GPU_STREAM_DELAY_MS", "60000")],
    );
    for line in log.lines().filter(|l| l.starts_with("watchdog-cost:")) {
        println!("{line}");
    }
}

/// The watchdog thread's time on a CPU so far (it names itself a moment after it starts: waits for that).
fn watchdog_cpu() -> Duration {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
            let name = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            // The kernel keeps 15 bytes of a thread's name.
            if name.trim_end() == "hypercomm-watch" {
                let stat = std::fs::read_to_string(task.path().join("schedstat")).unwrap();
                let ns: u64 = stat.split_whitespace().next().unwrap().parse().unwrap();
                return Duration::from_nanos(ns);
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("no watchdog thread");
}

/// The watchdog's CPU share over [`WINDOW`] as it is now.
fn measure(what: &str, gpu: &Gpu) {
    let (cpu, wall) = (watchdog_cpu(), Instant::now());
    std::thread::sleep(WINDOW);
    let (cpu, wall) = (watchdog_cpu() - cpu, wall.elapsed());
    let ticks = wall.as_secs_f64() / 0.1;
    eprintln!(
        "watchdog-cost: {what}: {} operations watched, {:.1} ms of CPU in {:.1} s ({:.3} %), {:.1} us per tick",
        gpu.watched_operations(),
        cpu.as_secs_f64() * 1e3,
        wall.as_secs_f64(),
        100.0 * cpu.as_secs_f64() / wall.as_secs_f64(),
        cpu.as_secs_f64() * 1e6 / ticks
    );
}

#[test]
#[ignore = "run under fake-gpu by measure_the_watchdog_at_1000_operations_in_flight"]
fn fake_the_watchdog_at_1000_operations_in_flight() {
    let gpu = Gpu::open(runtime(), 0).unwrap();
    // Single-rank communicators, each on its own stream; a long timeout, so that nothing times out.
    let comms: Vec<Communicator> = (0..8)
        .map(|i| {
            Communicator::with_gpu(
                Arc::clone(&gpu),
                Arc::new(MemoryStore::new()),
                vec![0],
                0,
                CommOptions {
                    timeout: Duration::from_secs(600),
                    ..CommOptions::named(format!("cost{i}"))
                },
            )
            .unwrap()
        })
        .collect();
    let mut works: Vec<Work<_>> = Vec::new();
    let mut issue = |comm: &Communicator, n: usize| {
        for _ in 0..n {
            let buf = gpu.upload(&[1.0f32; 16]).unwrap();
            works.push(comm.all_reduce(buf, ReduceOp::Sum).unwrap());
        }
    };
    // An idle watchdog first (one operation, to start it).
    issue(&comms[0], 1);
    measure("1 operation, 1 stream", &gpu);
    issue(&comms[0], 999);
    measure("1,000 operations on 1 stream", &gpu);
    for comm in &comms[1..] {
        issue(comm, 1000);
    }
    measure("8,000 operations on 8 streams", &gpu);
    // The streams would take hours to drain: stop the communicators, and leave the handles' buffers to the
    // process's exit (releasing them would wait, on the fake's null stream, for the work queued on them).
    for comm in &comms {
        nccl(comm).abort();
    }
    std::mem::forget(works);
}
