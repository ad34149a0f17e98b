//! Ranks as separate processes meeting through a `TcpStore`: collectives over shared memory and TCP, and a rank
//! killed mid-collective, after which the others fail within the timeout naming it and no shared-memory file
//! stays behind.
//!
//! The test binary re-runs itself as each rank: `rank_process` does nothing unless the parent set `HC_TEST_ROLE`.

mod comm_support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use comm_support::checks::*;
use hypercomm::comm::{CommError, CommOptions, Communicator, P2p, ReduceOp};
use hypercomm::store::{ClientOptions, ServerOptions, TcpStore, TcpStoreServer};

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} must be set for a rank process"))
}

/// The rank side. A no-op in a normal test run.
#[test]
fn rank_process() {
    let Ok(role) = std::env::var("HC_TEST_ROLE") else {
        return;
    };
    let rank: usize = var("HC_RANK").parse().unwrap();
    let size: usize = var("HC_SIZE").parse().unwrap();
    let tcp = var("HC_TCP") == "1";
    let store = TcpStore::connect(var("HC_ADDR"), ClientOptions::default()).unwrap();
    let options = CommOptions {
        timeout: Duration::from_secs(60),
        force_tcp: tcp,
        scratch_bytes: (role == "matrix").then_some(SMALL_SCRATCH),
        symmetric_bytes: if role == "symmetric" { 4 << 20 } else { 0 },
        ..CommOptions::named(role.clone())
    };
    let comm = Communicator::world(std::sync::Arc::new(store), size, rank, options).unwrap();
    assert_eq!(comm.transport(), if tcp { "tcp" } else { "shm" });
    match role.as_str() {
        "collectives" => {
            for len in [0, 1, 7, 1000] {
                check_type::<f32>(&comm, len);
                check_type::<i64>(&comm, len);
                check_type::<half::bf16>(&comm, len);
            }
            big_buffers::<f32>(&comm);
            let child = comm.split(Some((rank % 2) as u32), 0).unwrap().unwrap();
            check_type::<u8>(&child, 7);
            println!("rank {rank} ok");
        }
        "matrix" => {
            full_matrix(&comm);
            println!("rank {rank} ok");
        }
        "symmetric" => {
            // Each rank's buffer holds rank-dependent values; the peers read them from this process's window and write
            // their parts of the sum into it.
            for len in [0, 3, 1000, 100_000, 300_001] {
                let mine: Vec<f32> = (0..len).map(|i| ((rank * 7 + i) % 13) as f32).collect();
                let mut buf = comm.symmetric_buffer(len, 0.0f32).unwrap();
                assert_eq!(buf.is_shared(), !tcp);
                buf.copy_from_slice(&mine);
                let got = comm
                    .all_reduce_symmetric(buf, ReduceOp::Sum)
                    .unwrap()
                    .wait()
                    .unwrap();
                let want: Vec<f32> = (0..len)
                    .map(|i| (0..size).map(|r| ((r * 7 + i) % 13) as f32).sum())
                    .collect();
                assert_eq!(&got[..], &want[..], "len {len}");
            }
            // All-gather and reduce-scatter of 50 001 elements per rank, each rank's block from its window.
            let block = 50_001;
            let mut buf = comm.symmetric_buffer(size * block, 0u32).unwrap();
            for i in 0..block {
                buf[rank * block + i] = (rank * block + i) as u32;
            }
            let gathered = comm.all_gather_symmetric(buf).unwrap().wait().unwrap();
            assert!(gathered.iter().enumerate().all(|(i, &x)| x == i as u32));
            let mut buf = comm.symmetric_buffer(size * block, 0u32).unwrap();
            buf.iter_mut()
                .enumerate()
                .for_each(|(i, x)| *x = (i * (rank + 1)) as u32);
            let scattered = comm
                .reduce_scatter_symmetric(buf, ReduceOp::Sum)
                .unwrap()
                .wait()
                .unwrap();
            let factor: usize = (1..=size).sum();
            for i in rank * block..(rank + 1) * block {
                assert_eq!(
                    scattered[i],
                    (i * factor) as u32,
                    "reduce_scatter index {i}"
                );
            }
            println!("rank {rank} ok");
        }
        "memfd" => {
            let sum = comm
                .all_reduce(vec![rank as u32 + 1], ReduceOp::Sum)
                .unwrap()
                .wait()
                .unwrap();
            assert_eq!(sum[0] as usize, size * (size + 1) / 2);
            // The segment is mapped from an anonymous memory file (its inode identifies it across processes), and
            // no descriptor of it stays open: the mappings alone keep it.
            let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
            let inodes: Vec<&str> = maps
                .lines()
                .filter(|l| l.contains("/memfd:hypercomm-segment"))
                .filter_map(|l| l.split_whitespace().nth(4))
                .collect();
            assert_eq!(inodes.len(), 1, "one mapping of the segment: {maps}");
            let open: Vec<String> = std::fs::read_dir("/proc/self/fd")
                .unwrap()
                .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .map(|p| p.to_string_lossy().into_owned())
                .filter(|p| p.contains("memfd:"))
                .collect();
            assert!(
                open.is_empty(),
                "descriptors of the segment left open: {open:?}"
            );
            println!("rank {rank} inode {}", inodes[0]);
            println!("rank {rank} ok");
        }
        "kill" => {
            comm.barrier().unwrap().wait().unwrap();
            if rank == size - 1 {
                // Enter the collective, announce it and never finish: the parent kills this process.
                let pending = comm
                    .all_reduce(vec![1.0f32; 1 << 22], ReduceOp::Sum)
                    .unwrap();
                println!("victim ready");
                std::thread::sleep(Duration::from_secs(120));
                drop(pending);
                return;
            }
            // The victim's progress thread may finish this collective with us before the kill lands; then the
            // next one meets the dead rank (the victim issues nothing more). Two are always enough.
            let start = Instant::now();
            let err = (0..2)
                .find_map(|_| {
                    comm.all_reduce(vec![1.0f32; 1 << 22], ReduceOp::Sum)
                        .unwrap()
                        .wait()
                        .err()
                })
                .expect("two all-reduces succeeded after the victim was killed");
            let elapsed = start.elapsed();
            let text = err.to_string();
            assert!(
                matches!(
                    err,
                    CommError::PeerDied { .. }
                        | CommError::Timeout { .. }
                        | CommError::AbortedByPeer { .. }
                ),
                "{text}"
            );
            assert!(text.contains("kill"), "names the communicator: {text}");
            // Every survivor names the dead rank: the one that notices directly, and one stopped by that rank's
            // abort, through its failure record (never the messenger).
            assert_eq!(err.lost_ranks(), [size - 1], "{text}");
            if let CommError::AbortedByPeer { by, .. } = &err {
                assert_ne!(*by, size - 1, "the messenger is a survivor: {text}");
                assert!(
                    text.contains(&format!("rank(s) [{}] died", size - 1)),
                    "{text}"
                );
            }
            assert!(elapsed < Duration::from_secs(40), "took {elapsed:?}");
            // Broken afterwards; abort releases it.
            assert!(comm.barrier().is_err());
            comm.abort();
            println!("rank {rank} saw: {text}");
        }
        "ring" => {
            // Every rank sends 64 MiB to the next and receives 64 MiB from the previous in one batch, with the
            // parts in one order on even ranks and the other on odd ranks, then swapped: whatever the order, the
            // batch completes (as separate blocking operations, each rank's send would wait on its neighbour's).
            let (next, prev) = ((rank + 1) % size, (rank + size - 1) % size);
            let len = 16 << 20; // u32s: 64 MiB
            let pattern =
                |from: usize, i: usize| (i as u32).wrapping_mul(2_654_435_761) ^ from as u32;
            for round in 0..2 {
                let mine: Vec<u32> = (0..len).map(|i| pattern(rank, i)).collect();
                let send = P2p::send(mine, next);
                let recv = P2p::recv(vec![0u32; len], prev);
                let send_first = (rank + round) % 2 == 0;
                let parts = if send_first {
                    vec![send, recv]
                } else {
                    vec![recv, send]
                };
                let mut bufs = comm.batch(parts).unwrap().wait().unwrap();
                let got = bufs.remove(usize::from(send_first));
                let bad = (0..len).find(|&i| got[i] != pattern(prev, i));
                assert_eq!(
                    bad, None,
                    "round {round}: first wrong element from rank {prev}"
                );
            }
            println!("rank {rank} ok");
        }
        other => panic!("unknown role {other}"),
    }
}

fn spawn(role: &str, addr: &str, rank: usize, size: usize, tcp: bool) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "rank_process", "--nocapture", "--test-threads=1"])
        .env("HC_TEST_ROLE", role)
        .env("HC_RANK", rank.to_string())
        .env("HC_SIZE", size.to_string())
        .env("HC_TCP", if tcp { "1" } else { "0" })
        .env("HC_ADDR", addr)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

fn shm_files_of(pids: &[u32]) -> Vec<String> {
    let prefixes: Vec<String> = pids.iter().map(|p| format!("hypercomm-{p}-")).collect();
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| prefixes.iter().any(|p| n.starts_with(p)))
                .collect()
        })
        .unwrap_or_default()
}

/// Runs `role` on `n` rank processes over a fresh store; requires every rank to succeed and no segment to remain.
/// Returns each rank's output.
fn run_processes(role: &str, n: usize, tcp: bool) -> Vec<String> {
    let server = TcpStoreServer::bind("127.0.0.1:0", ServerOptions::default()).unwrap();
    let addr = server.local_addr().to_string();
    let children: Vec<Child> = (0..n).map(|r| spawn(role, &addr, r, n, tcp)).collect();
    let pids: Vec<u32> = children.iter().map(Child::id).collect();
    let mut outputs = Vec::new();
    for (r, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{role} n={n} tcp={tcp}: rank {r} failed"
        );
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(stdout.contains(&format!("rank {r} ok")));
        outputs.push(stdout);
    }
    assert_eq!(shm_files_of(&pids), Vec::<String>::new());
    outputs
}

/// Four rank processes exchange 64 MiB around a ring in one batch each, in both orders of the parts, over shared
/// memory and over TCP; every byte arrives.
#[test]
fn processes_exchange_64_mib_around_a_ring_in_one_batch() {
    for tcp in [false, true] {
        run_processes("ring", 4, tcp);
    }
}

/// Processes on one host share one anonymous segment: every rank maps the same memfd (same inode), holds no
/// descriptor of it after the bootstrap, and a collective through it is right.
#[test]
fn processes_share_one_anonymous_segment() {
    let outputs = run_processes("memfd", 3, false);
    let inodes: Vec<&str> = outputs
        .iter()
        .map(|out| {
            out.lines()
                .find_map(|l| l.split_once(" inode ").map(|(_, i)| i.trim()))
                .expect("every rank prints its segment's inode")
        })
        .collect();
    assert!(inodes.iter().all(|i| *i == inodes[0]), "{inodes:?}");
}

/// Symmetric buffers with ranks as processes: read in place from the other processes' windows under shared
/// memory, through the ordinary algorithms under TCP.
#[test]
fn processes_all_reduce_symmetric_buffers() {
    for (n, tcp) in [(2, false), (3, false), (2, true)] {
        run_processes("symmetric", n, tcp);
    }
}

/// The whole collective matrix (every collective x type x reduction x size, forced algorithms, 1 MiB+ buffers) with
/// ranks as processes: 1, 2, 3, 4 and 8 ranks, shared memory and TCP.
#[test]
fn processes_run_the_full_matrix() {
    for n in [1, 2, 3, 4, 8] {
        for tcp in [false, true] {
            run_processes("matrix", n, tcp);
        }
    }
}

#[test]
fn processes_run_collectives_over_shared_memory_and_tcp() {
    for (n, tcp) in [(2, false), (3, false), (2, true), (3, true)] {
        let server = TcpStoreServer::bind("127.0.0.1:0", ServerOptions::default()).unwrap();
        let addr = server.local_addr().to_string();
        let children: Vec<Child> = (0..n)
            .map(|r| spawn("collectives", &addr, r, n, tcp))
            .collect();
        let pids: Vec<u32> = children.iter().map(Child::id).collect();
        for (r, child) in children.into_iter().enumerate() {
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success(), "n={n} tcp={tcp}: rank {r} failed");
            assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("rank {r} ok")));
        }
        assert_eq!(shm_files_of(&pids), Vec::<String>::new());
    }
}

#[test]
fn killing_a_rank_mid_collective_fails_the_others_and_leaves_no_files() {
    for tcp in [false, true] {
        let n = 3;
        let server = TcpStoreServer::bind("127.0.0.1:0", ServerOptions::default()).unwrap();
        let addr = server.local_addr().to_string();
        let mut children: Vec<Child> = (0..n).map(|r| spawn("kill", &addr, r, n, tcp)).collect();
        let pids: Vec<u32> = children.iter().map(Child::id).collect();
        let mut victim = children.pop().unwrap();
        let mut lines = BufReader::new(victim.stdout.take().unwrap()).lines();
        // Bounded: the victim prints its line within the others' bootstrap and barrier, or exits (line = None).
        let ready = lines
            .by_ref()
            .take(1000)
            .find(|l| l.as_ref().is_ok_and(|l| l.contains("victim ready")));
        assert!(
            ready.is_some(),
            "tcp={tcp}: the victim never entered the collective"
        );
        victim.kill().unwrap();
        victim.wait().unwrap();
        for (r, child) in children.into_iter().enumerate() {
            let out = child.wait_with_output().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "tcp={tcp}: rank {r} did not report the failure: {stdout}"
            );
            assert!(stdout.contains(&format!("rank {r} saw")), "{stdout}");
            eprintln!("tcp={tcp}: {}", stdout.trim());
        }
        assert_eq!(shm_files_of(&pids), Vec::<String>::new(), "tcp={tcp}");
    }
}
