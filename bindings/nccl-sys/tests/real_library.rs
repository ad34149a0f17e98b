//! Against a real `libnccl.so.2`, when one can be found (`$NCCL_LIBRARY`, the dynamic linker, or a Python
//! package such as `pip install nvidia-nccl-cu13==2.28.9`). NCCL loads CUDA lazily, so everything here works on a
//! machine without a GPU. When no library is found the test says why on stderr and passes: CI machines without
//! the wheel still build and test everything else.

use nccl_sys::{Function, Nccl, NcclError, ResultCode, SearchConfig, Version, sys};

fn load_or_skip() -> Option<Nccl> {
    // Reads (never writes) the process environment: this test is about the user's real setup.
    match Nccl::load(&SearchConfig::from_env(|name| std::env::var_os(name))) {
        Ok(nccl) => Some(nccl),
        Err(e) => {
            eprintln!("skipping: no NCCL library on this machine ({e})");
            None
        }
    }
}

#[test]
fn loads_reports_version_and_gates_by_it() {
    let Some(nccl) = load_or_skip() else { return };
    let version = nccl.version();
    eprintln!("loaded nccl {version} from {}", nccl.origin());
    assert!(version >= Version::new(2, 0, 0), "{version}");

    for &f in Function::ALL {
        if f.introduced() > version {
            assert!(
                !nccl.has(f),
                "{f} is newer than {version} yet reported available"
            );
            assert!(matches!(
                nccl.require(f),
                Err(NcclError::Unavailable { .. })
            ));
        }
    }
    assert!(nccl.has(Function::GetVersion));
    assert!(nccl.has(Function::AllReduce));
    if version == nccl_sys::version::HEADER_VERSION {
        // The release the bindings come from exports every entry point they declare.
        for &f in Function::ALL {
            assert!(
                nccl.has(f),
                "{f} missing from nccl {version}: {:?}",
                nccl.require(f)
            );
        }
    }
}

#[test]
fn error_texts_come_from_the_library() {
    let Some(nccl) = load_or_skip() else { return };
    let text = nccl
        .error_string(ResultCode::InvalidArgument)
        .expect("ncclGetErrorString exists in every 2.x");
    assert!(!text.is_empty());
    // SAFETY: a null communicator is allowed for check; the code is a made-up failure.
    let err = unsafe {
        nccl.check(
            Function::CommInitRank,
            sys::ncclInvalidArgument,
            std::ptr::null_mut(),
        )
    }
    .unwrap_err();
    let shown = err.to_string();
    assert!(
        shown.starts_with("ncclCommInitRank returned ncclInvalidArgument (4): "),
        "{shown}"
    );
    assert!(shown.contains(&text), "{shown}");
    let ok =
        // SAFETY: success never consults the library; the communicator is null.
        unsafe {
            nccl.check(
                Function::CommInitRank,
                sys::ncclSuccess,
                std::ptr::null_mut(),
            )
        };
    assert!(ok.is_ok());
}

#[test]
fn invalid_arguments_are_errors_not_crashes() {
    let Some(nccl) = load_or_skip() else { return };
    let api = nccl.api(Function::CommInitRank).unwrap();
    let mut comm: sys::ncclComm_t = std::ptr::null_mut();
    // An all-zero id and nranks = 0 are invalid input NCCL must refuse: without a GPU it stops at its CUDA check
    // (ncclUnhandledCudaError), with one at its argument check (ncclInvalidArgument).
    let id = sys::ncclUniqueId { internal: [0; 128] };
    // SAFETY: `comm` is a live local NCCL writes at most one pointer to; the id is passed by value; api() checked
    // that the symbol exists.
    let raw = unsafe { api.ncclCommInitRank(&mut comm, 0, id, 0) };
    // SAFETY: no communicator was created; null is accepted by ncclGetLastError.
    let result = unsafe { nccl.check(Function::CommInitRank, raw, std::ptr::null_mut()) };
    let err = result.expect_err("nranks = 0 must be refused");
    eprintln!("{err}");
    assert!(
        matches!(
            err.code(),
            Some(ResultCode::InvalidArgument | ResultCode::UnhandledCudaError)
        ),
        "{err}"
    );
}
