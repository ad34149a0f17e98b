//! The catalog of NCCL entry points in the bindings, and the release that introduced each.
//!
//! The bindings come from the 2.28.9 header, but the library found at run time may be older. Every symbol is
//! looked up when the library is opened and may be missing; beyond that, [`Nccl::has`](crate::Nccl::has) also
//! requires the loaded release to be at least [`Function::introduced`], so a symbol that an older release happens
//! to export under the same name (with other semantics, or as an internal stub) is not called either.
//!
//! Where the versions come from: NCCL's release notes and user guide (2.4 abort and async errors, 2.7 send/recv,
//! 2.11 pre-multiplied sums, 2.13 `ncclGetLastError`, 2.14 configs and non-blocking communicators, 2.18 split, 2.19
//! buffer registration and `ncclMemAlloc`, 2.23 scalable init, 2.27 windows and shrink), the versioned struct names
//! in `nccl.h` (`ncclSimInfo_v22200` for `ncclGroupSimulateEnd`), and the 2.27.7 header, which lacks
//! `ncclCommRevoke`, `ncclAlltoAll`, `ncclGather` and `ncclScatter` (all new in 2.28). PyTorch's `NCCLUtils.hpp`
//! gates on the same versions. Where a date is uncertain the table errs late: a late date refuses a call that
//! might have worked, an early one would make a call that cannot.

use crate::version::Version;

macro_rules! functions {
    ($( $(#[$doc:meta])* $variant:ident => $symbol:ident, ($major:literal, $minor:literal); )*) => {
        /// One entry point of `nccl.h` that the bindings load (the `pnccl*` profiling aliases are left out).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum Function {
            $( $(#[$doc])* $variant, )*
        }

        impl Function {
            /// Every entry point, in header order.
            pub const ALL: &'static [Function] = &[ $( Function::$variant, )* ];

            /// The C symbol name, e.g. `"ncclCommShrink"`.
            pub const fn symbol(self) -> &'static str {
                match self { $( Function::$variant => stringify!($symbol), )* }
            }

            /// The first NCCL release that has this entry point.
            pub const fn introduced(self) -> Version {
                match self { $( Function::$variant => Version::new($major, $minor, 0), )* }
            }

            /// Whether the opened library exports this entry point's symbol (whatever its version says).
            pub(crate) fn is_exported(self, lib: &crate::sys::NcclLib) -> bool {
                match self { $( Function::$variant => lib.$symbol.is_ok(), )* }
            }
        }
    };
}

functions! {
    /// `ncclMemAlloc`: allocate memory suited to NCCL's optimisations.
    MemAlloc => ncclMemAlloc, (2, 19);
    /// `ncclMemFree`: free memory from `ncclMemAlloc`.
    MemFree => ncclMemFree, (2, 19);
    /// `ncclGetVersion`: the loaded release; the loader requires it.
    GetVersion => ncclGetVersion, (2, 0);
    /// `ncclGetUniqueId`: the id that ranks share to build a communicator.
    GetUniqueId => ncclGetUniqueId, (2, 0);
    /// `ncclCommInitRankConfig`: communicator from an id, with a config.
    CommInitRankConfig => ncclCommInitRankConfig, (2, 14);
    /// `ncclCommInitRank`: communicator from an id, default config.
    CommInitRank => ncclCommInitRank, (2, 0);
    /// `ncclCommInitAll`: one communicator per local device, single process.
    CommInitAll => ncclCommInitAll, (2, 0);
    /// `ncclCommFinalize`: flush outstanding work before destroy.
    CommFinalize => ncclCommFinalize, (2, 14);
    /// `ncclCommDestroy`: free a communicator.
    CommDestroy => ncclCommDestroy, (2, 0);
    /// `ncclCommAbort`: free a communicator, aborting its work.
    CommAbort => ncclCommAbort, (2, 4);
    /// `ncclCommRevoke`: stop in-flight work so the communicator can be shrunk or destroyed.
    CommRevoke => ncclCommRevoke, (2, 28);
    /// `ncclCommSplit`: communicators from a parent by colour and key.
    CommSplit => ncclCommSplit, (2, 18);
    /// `ncclCommShrink`: a communicator without some ranks of its parent.
    CommShrink => ncclCommShrink, (2, 27);
    /// `ncclCommInitRankScalable`: communicator from several ids.
    CommInitRankScalable => ncclCommInitRankScalable, (2, 23);
    /// `ncclGetErrorString`: text for a result code.
    GetErrorString => ncclGetErrorString, (2, 0);
    /// `ncclGetLastError`: text of the last error.
    GetLastError => ncclGetLastError, (2, 13);
    /// `ncclResetDebugInit`: re-read the logging variables (deprecated in 2.28; first
    /// release not verified, so gated late, at 2.14).
    ResetDebugInit => ncclResetDebugInit, (2, 14);
    /// `ncclCommGetAsyncError`: poll a communicator's state.
    CommGetAsyncError => ncclCommGetAsyncError, (2, 4);
    /// `ncclCommCount`: number of ranks.
    CommCount => ncclCommCount, (2, 0);
    /// `ncclCommCuDevice`: the communicator's CUDA device.
    CommCuDevice => ncclCommCuDevice, (2, 0);
    /// `ncclCommUserRank`: this rank's index.
    CommUserRank => ncclCommUserRank, (2, 0);
    /// `ncclCommRegister`: register a buffer for zero-copy.
    CommRegister => ncclCommRegister, (2, 19);
    /// `ncclCommDeregister`: undo `ncclCommRegister`.
    CommDeregister => ncclCommDeregister, (2, 19);
    /// `ncclCommWindowRegister`: register a symmetric memory window.
    CommWindowRegister => ncclCommWindowRegister, (2, 27);
    /// `ncclCommWindowDeregister`: undo `ncclCommWindowRegister`.
    CommWindowDeregister => ncclCommWindowDeregister, (2, 27);
    /// `ncclRedOpCreatePreMulSum`: a reduction that scales before summing.
    RedOpCreatePreMulSum => ncclRedOpCreatePreMulSum, (2, 11);
    /// `ncclRedOpDestroy`: free a created reduction.
    RedOpDestroy => ncclRedOpDestroy, (2, 11);
    /// `ncclReduce`.
    Reduce => ncclReduce, (2, 0);
    /// `ncclBcast` (in-place broadcast, deprecated).
    Bcast => ncclBcast, (2, 0);
    /// `ncclBroadcast`.
    Broadcast => ncclBroadcast, (2, 0);
    /// `ncclAllReduce`.
    AllReduce => ncclAllReduce, (2, 0);
    /// `ncclReduceScatter`.
    ReduceScatter => ncclReduceScatter, (2, 0);
    /// `ncclAllGather`.
    AllGather => ncclAllGather, (2, 0);
    /// `ncclAlltoAll`.
    AlltoAll => ncclAlltoAll, (2, 28);
    /// `ncclGather`.
    Gather => ncclGather, (2, 28);
    /// `ncclScatter`.
    Scatter => ncclScatter, (2, 28);
    /// `ncclSend`.
    Send => ncclSend, (2, 7);
    /// `ncclRecv`.
    Recv => ncclRecv, (2, 7);
    /// `ncclGroupStart`.
    GroupStart => ncclGroupStart, (2, 0);
    /// `ncclGroupEnd`.
    GroupEnd => ncclGroupEnd, (2, 0);
    /// `ncclGroupSimulateEnd`: estimate a group's time without running it.
    GroupSimulateEnd => ncclGroupSimulateEnd, (2, 22);
}

impl std::fmt::Display for Function {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.symbol())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// The symbols that the generated `NcclLib` loads, read from the checked-in bindings.
    fn generated_symbols() -> BTreeSet<String> {
        include_str!("sys.rs")
            .lines()
            .filter_map(|line| line.trim().strip_prefix("let "))
            .filter_map(|rest| rest.split_once(" = __library.get("))
            .map(|(name, _)| name.to_string())
            .collect()
    }

    #[test]
    fn catalog_matches_generated_bindings_exactly() {
        let generated = generated_symbols();
        assert!(
            generated.len() > 30,
            "parsed too few symbols: {generated:?}"
        );
        let catalog: BTreeSet<String> = Function::ALL
            .iter()
            .map(|f| f.symbol().to_string())
            .collect();
        assert_eq!(
            catalog.len(),
            Function::ALL.len(),
            "a symbol is listed twice"
        );
        assert_eq!(
            catalog, generated,
            "Function must list exactly the symbols NcclLib loads"
        );
    }

    #[test]
    fn nothing_is_newer_than_the_header() {
        for f in Function::ALL {
            assert!(f.introduced() <= crate::version::HEADER_VERSION, "{f}");
        }
    }

    #[test]
    fn known_dates() {
        assert_eq!(Function::CommShrink.introduced(), Version::new(2, 27, 0));
        assert_eq!(Function::CommSplit.introduced(), Version::new(2, 18, 0));
        assert_eq!(
            Function::CommInitRankScalable.introduced(),
            Version::new(2, 23, 0)
        );
        assert_eq!(Function::CommRegister.introduced(), Version::new(2, 19, 0));
        assert_eq!(
            Function::GroupSimulateEnd.introduced(),
            Version::new(2, 22, 0)
        );
        assert_eq!(Function::CommShrink.to_string(), "ncclCommShrink");
    }
}
