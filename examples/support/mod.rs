//! What the candle examples share: launching themselves as a job's ranks, the seeded generator every rank draws
//! the same weights and data from, the function they learn, and how they print their numbers. Each example includes it with `mod support;`.

#![allow(dead_code)]

use std::error::Error;
use std::time::Duration;

use hypercomm::candle::candle_core::{Device, Result as CandleResult, Tensor, Var};
use hypercomm::launch::Launcher;

/// Starts `nproc` ranks of this program with `args` (through `hypercomm::launch::Launcher`, which hosts the store
/// and sets every rank's rendezvous variables), prints rank 0's output, and on failure every rank's errors.
pub fn launch_self(args: &[String], nproc: usize) -> Result<(), Box<dyn Error>> {
    let report = Launcher::new(std::env::current_exe()?)
        .args(args)
        .nproc(nproc)
        .timeout(Duration::from_secs(120))
        .echo(false)
        .capture(true)
        .run()?;
    if let Some(rank0) = report.rank(0) {
        for line in &rank0.stdout {
            println!("{line}");
        }
    }
    if report.success() {
        return Ok(());
    }
    for rank in &report.ranks {
        for line in &rank.stderr {
            eprintln!("[rank {}] {line}", rank.rank);
        }
    }
    Err(report.summary().into())
}

/// A linear congruential generator (Knuth's MMIX constants): the same numbers on every rank.
pub struct Lcg(u64);

impl Lcg {
    /// The generator of `stream` under `seed`: streams of one seed are independent enough for weights and data.
    pub fn new(seed: u64, stream: u64) -> Lcg {
        let mut lcg = Lcg(seed ^ stream.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        lcg.next();
        lcg
    }

    /// The next 64 bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0
    }

    /// Uniform in `[-1, 1)`, from the 53 high bits.
    pub fn uniform(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }

    /// A `[rows, cols]` tensor uniform in `[-scale, scale)`.
    pub fn tensor(&mut self, rows: usize, cols: usize, scale: f64) -> CandleResult<Tensor> {
        let v: Vec<f32> = (0..rows * cols)
            .map(|_| (self.uniform() * scale) as f32)
            .collect();
        Tensor::from_vec(v, (rows, cols), &Device::Cpu)
    }

    /// A linear layer's weight `[out, fan_in]` and bias `[out]`, uniform in `±1/√fan_in`, as variables.
    pub fn layer(&mut self, out: usize, fan_in: usize) -> CandleResult<[Var; 2]> {
        let scale = 1.0 / (fan_in as f64).sqrt();
        let weight = self.tensor(out, fan_in, scale)?;
        let bias = self.tensor(1, out, scale)?.reshape(out)?;
        Ok([Var::from_tensor(&weight)?, Var::from_tensor(&bias)?])
    }
}

/// The function the examples' models learn, of 8 inputs.
pub fn target(x: &[f64]) -> f64 {
    (2.0 * x[0]).sin() + 0.5 * x[1] * x[2] - 0.3 * x[3] * x[3] + 0.2 * x[4..].iter().sum::<f64>()
}

/// `v` with `digits` significant digits, in plain decimal notation.
pub fn significant(v: f64, digits: i32) -> String {
    if v == 0.0 || !v.is_finite() {
        return v.to_string();
    }
    let decimals = (digits - 1 - v.abs().log10().floor() as i32).max(0) as usize;
    format!("{v:.decimals$}")
}
