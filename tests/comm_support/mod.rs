//! Shared helpers for the communicator tests: ranks as threads, test values, and independent reference results.
#![allow(dead_code)]

pub mod checks;

use std::sync::Arc;
use std::time::Duration;

use hypercomm::comm::{CommOptions, Communicator, DType, Element, ReduceOp};
use hypercomm::store::MemoryStore;

/// Runs `body` on `n` ranks, each a thread with its own communicator over one shared `MemoryStore`; returns the
/// ranks' results in rank order.
pub fn on_threads<R: Send + 'static>(
    n: usize,
    options: CommOptions,
    body: impl Fn(Communicator) -> R + Send + Sync + 'static,
) -> Vec<R> {
    let store = Arc::new(MemoryStore::new());
    let body = Arc::new(body);
    let handles: Vec<_> = (0..n)
        .map(|me| {
            let store = Arc::clone(&store);
            let body = Arc::clone(&body);
            let options = options.clone();
            std::thread::spawn(move || {
                let comm = Communicator::world(store, n, me, options).expect("bootstrap");
                body(comm)
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("rank thread panicked"))
        .collect()
}

/// Options with a name, a generous timeout for a loaded 2-core machine, and the transport chosen.
pub fn options(name: &str, tcp: bool) -> CommOptions {
    CommOptions {
        timeout: Duration::from_secs(60),
        force_tcp: tcp,
        ..CommOptions::named(name)
    }
}

/// Test element: conversion from small integers and to f64 for comparisons.
pub trait TestElem: Element {
    fn from_i64(v: i64) -> Self;
    fn to_f64(self) -> f64;
    /// Reference reduction of one position's values (in rank order) computed in i128 / f64 and converted with
    /// this type's rules (wrapping for integers, one rounding for floats).
    fn reference(op: ReduceOp, vals: &[i64]) -> Self;
}

macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl TestElem for $t {
            fn from_i64(v: i64) -> Self { v as $t }
            fn to_f64(self) -> f64 { self as f64 }
            fn reference(op: ReduceOp, vals: &[i64]) -> Self {
                let xs: Vec<$t> = vals.iter().map(|&v| v as $t).collect();
                let wrap = |x: i128| x as $t;
                match op {
                    ReduceOp::Sum => wrap(xs.iter().map(|&x| x as i128).sum::<i128>()),
                    ReduceOp::Prod => xs.iter().fold(1 as $t, |a, &x| a.wrapping_mul(x)),
                    ReduceOp::Min => *xs.iter().min().unwrap(),
                    ReduceOp::Max => *xs.iter().max().unwrap(),
                    ReduceOp::Avg => {
                        let s = wrap(xs.iter().map(|&x| x as i128).sum::<i128>());
                        (s as i128 / xs.len() as i128) as $t
                    }
                    // The factor as a value of the type (a whole number), then wrapping as Sum.
                    ReduceOp::PreMulSum(f) => {
                        let f = f.value() as $t as i128;
                        wrap(xs.iter().map(|&x| x as i128 * f).sum::<i128>())
                    }
                }
            }
        }
    )*};
}
int_elem!(i8, u8, i32, i64, u32, u64);

macro_rules! float_elem {
    ($($t:ty => $from:expr, $to:expr);*) => {$(
        impl TestElem for $t {
            fn from_i64(v: i64) -> Self { $from(v as f64) }
            fn to_f64(self) -> f64 { $to(self) }
            fn reference(op: ReduceOp, vals: &[i64]) -> Self {
                let xs: Vec<f64> = vals.iter().map(|&v| v as f64).collect();
                let r = match op {
                    ReduceOp::Sum => xs.iter().sum(),
                    ReduceOp::Prod => xs.iter().product(),
                    ReduceOp::Min => xs.iter().cloned().fold(f64::INFINITY, f64::min),
                    ReduceOp::Max => xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
                    ReduceOp::Avg => xs.iter().sum::<f64>() / xs.len() as f64,
                    // The factor rounded to the type first, as the reduction takes it.
                    ReduceOp::PreMulSum(f) => {
                        let f = $to($from(f.value()));
                        xs.iter().map(|x| x * f).sum()
                    }
                };
                $from(r)
            }
        }
    )*};
}
float_elem!(
    f32 => |x: f64| x as f32, |x: f32| x as f64;
    f64 => |x: f64| x, |x: f64| x;
    half::f16 => half::f16::from_f64, |x: half::f16| x.to_f64();
    half::bf16 => half::bf16::from_f64, |x: half::bf16| x.to_f64()
);

/// The value rank `r` contributes at index `i` for `op`: small integers whose sums and products every type
/// represents exactly (products use only -1, 1 and 2 so eight ranks stay below 2^8).
pub fn value(dtype: DType, op: ReduceOp, r: usize, i: usize) -> i64 {
    let signed = matches!(
        dtype,
        DType::I8 | DType::I32 | DType::I64 | DType::F32 | DType::F64 | DType::F16 | DType::BF16
    );
    let h = (i * 7 + r * 3 + i / 5) as i64;
    match op {
        ReduceOp::Prod => [1, 2, if signed { -1 } else { 1 }][(h % 3) as usize],
        _ if signed => h % 11 - 5,
        _ => h % 11,
    }
}

pub fn values<T: TestElem>(op: ReduceOp, r: usize, len: usize) -> Vec<T> {
    (0..len)
        .map(|i| T::from_i64(value(T::DTYPE, op, r, i)))
        .collect()
}

pub fn expected<T: TestElem>(op: ReduceOp, n: usize, len: usize) -> Vec<T> {
    (0..len)
        .map(|i| {
            T::reference(
                op,
                &(0..n)
                    .map(|r| value(T::DTYPE, op, r, i))
                    .collect::<Vec<_>>(),
            )
        })
        .collect()
}

/// Compares with the tolerance a float average needs (exact elsewhere).
pub fn assert_close<T: TestElem>(got: &[T], want: &[T], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let tol = match T::DTYPE {
        DType::F16 => 1e-3,
        DType::BF16 => 1e-2,
        DType::F32 => 1e-6,
        _ => 0.0,
    };
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let (g, w) = (g.to_f64(), w.to_f64());
        assert!(
            (g - w).abs() <= tol * w.abs().max(1.0),
            "{what}: index {i}: got {g}, want {w}"
        );
    }
}

/// Forbids this thread (and the threads it starts) `process_vm_readv`, as a container's seccomp profile can: the
/// call fails with EPERM. Returns false where the filter cannot be installed here.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
pub fn forbid_reading_other_processes() -> bool {
    // Load the system call number; EPERM for process_vm_readv, allow anything else. (The architecture word is not
    // checked: the filter lives only as long as this test thread and the ones it starts, all x86_64.)
    let errno_eperm = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
    let mut program = [
        libc::sock_filter {
            code: (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16,
            jt: 0,
            jf: 0,
            k: 0,
        },
        libc::sock_filter {
            code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
            jt: 0,
            jf: 1,
            k: libc::SYS_process_vm_readv as u32,
        },
        libc::sock_filter {
            code: (libc::BPF_RET | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: errno_eperm,
        },
        libc::sock_filter {
            code: (libc::BPF_RET | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ALLOW,
        },
    ];
    let prog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_mut_ptr(),
    };
    // SAFETY: plain prctl calls on this thread; `prog` points at `program`, which outlives the call (the kernel
    // copies the filter).
    unsafe {
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
            && libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &prog as *const libc::sock_fprog,
            ) == 0
    }
}

#[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
pub fn forbid_reading_other_processes() -> bool {
    false
}
