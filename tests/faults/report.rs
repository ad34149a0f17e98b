//! How a fault rank reports what it saw: a rank that observes the fault prints
//! `SEEN ms=<time to error> lost=[..] culprits=[..] err=<error>` and exits with [`EXPECTED`]; a misconfigured (or
//! otherwise faulty) rank that fails as it should prints `FAULTY ...` and exits the same way. The ranks blamed
//! are the error's structured fields, not its text.

use hypercomm::comm::CommError;
use hypercomm::pgc::CollectionError;
use hypercomm::store::StoreError;
use std::time::Instant;

/// Exit status of a rank that saw the injected fault as it should.
pub const EXPECTED: i32 = 17;

/// The ranks an error blames, as its structured fields say (not its text).
pub trait Blame: std::fmt::Display {
    /// Lost (dead or missing) ranks at the root of the failure.
    fn lost(&self) -> Vec<usize>;
    /// Every rank to blame, disagreeing ones included.
    fn culprits(&self) -> Vec<usize>;
}

impl Blame for CommError {
    fn lost(&self) -> Vec<usize> {
        self.lost_ranks().to_vec()
    }
    fn culprits(&self) -> Vec<usize> {
        CommError::culprits(self).to_vec()
    }
}

impl Blame for CollectionError {
    fn lost(&self) -> Vec<usize> {
        self.lost_ranks().to_vec()
    }
    fn culprits(&self) -> Vec<usize> {
        CollectionError::culprits(self).to_vec()
    }
}

impl Blame for StoreError {
    fn lost(&self) -> Vec<usize> {
        Vec::new()
    }
    fn culprits(&self) -> Vec<usize> {
        Vec::new()
    }
}

/// Prints the observation (`<tag> ms=<time> lost=[..] culprits=[..] err=<text>`) and exits; an `Ok` means the
/// fault went unnoticed, which fails the case.
pub fn seen<T, E: Blame>(tag: &str, start: Instant, result: Result<T, E>) -> ! {
    match result {
        Ok(_) => panic!("the fault went unnoticed: the operation succeeded"),
        Err(e) => {
            println!(
                "{tag} ms={} lost={:?} culprits={:?} err={e}",
                start.elapsed().as_millis(),
                e.lost(),
                e.culprits()
            );
            std::process::exit(EXPECTED);
        }
    }
}
