//! Host-backend collective benchmarks: median time and bus bandwidth for 2 ranks (threads over shared memory) at
//! the sizes the performance bar names: 8 B and 4 KiB (latency), 16 MiB (bandwidth).
//!
//! `cargo bench --bench comm`; under `cargo test --benches` it runs a quick smoke pass.

use hypercomm::comm::CommOptions;
use hypercomm_bench::BenchOp;
use hypercomm_bench::cpus::Placement;
use hypercomm_bench::harness::smoke_run;
use hypercomm_bench::host::{BenchConfig, run};

fn main() {
    let smoke = smoke_run();
    let sizes = if smoke {
        vec![8, 4096]
    } else {
        vec![8, 4096, 16 << 20]
    };
    for op in [
        BenchOp::AllReduce,
        BenchOp::AllGather,
        BenchOp::ReduceScatter,
    ] {
        let config = BenchConfig {
            op,
            ranks: 2,
            sizes: sizes.clone(),
            options: CommOptions::named(format!("bench-{}", op.name())),
            max_iters: if smoke { 5 } else { 500 },
            placement: Placement::OneCpuEach,
            huge_pages: false,
            symmetric: false,
            in_place: false,
            seed: 1,
        };
        let results = match run(&config, &|_| {}) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("comm bench {}: {e}", op.name());
                std::process::exit(1);
            }
        };
        for r in results {
            println!(
                "{:<15} ranks={} {:>9} B  median {:>10.2} µs  busbw {:>7.3} GB/s ({})",
                op.name(),
                r.ranks,
                r.bytes,
                r.time_us,
                r.busbw_gbps,
                r.transport
            );
        }
    }
}
