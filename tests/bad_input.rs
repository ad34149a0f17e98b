//! Bad input everywhere: invalid sizes, layouts, option and cluster files, ranks, roots and buffers, and garbage
//! bytes on the store's socket and on a host-backend TCP connection. Every one must be an error (or, for garbage on
//! a socket, a closed connection) — never a panic, a hang or a corrupted state.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hypercomm::comm::{CommError, CommOptions, Communicator, ReduceOp};
use hypercomm::grid::layout::{GroupKind, LayoutConfig};
use hypercomm::grid::{Grid, parse_dims};
use hypercomm::pgc::{GroupOptions, ShrunkLayout};
use hypercomm::plan::Cluster;
use hypercomm::store::{
    ClientOptions, Key, MemoryStore, ServerOptions, Store, TcpStore, TcpStoreServer,
};
use proptest::prelude::*;

/// An error message as the house style wants it: not empty, no trailing period.
fn clean(msg: &str) -> bool {
    !msg.trim().is_empty() && !msg.ends_with('.')
}

fn quick() -> ProptestConfig {
    ProptestConfig {
        cases: 64,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(quick())]

    /// Any sizes, including zeros and non-divisors: a layout or an error naming the problem; every rank query
    /// outside the layout is an error.
    #[test]
    fn layouts_from_any_sizes_are_built_or_refused(
        world in 0usize..70, tp in 0usize..9, pp in 0usize..5, cp in 0usize..5, ep in 0usize..5,
        order in prop::sample::select(vec!["tp-cp-ep-dp-pp", "tp-pp-dp", "dp-tp", "tp-tp-dp", "xx", ""]),
        rank in 0usize..200, lost in prop::collection::vec(0usize..80, 0..4),
    ) {
        let built = LayoutConfig::new(world).tp(tp).pp(pp).cp(cp).ep(ep).order(order).build();
        match built {
            Err(e) => prop_assert!(clean(&e.to_string()), "{}", e),
            Ok(layout) => {
                let r = layout.group_of(rank, GroupKind::Tp);
                prop_assert_eq!(r.is_err(), rank >= layout.world());
                // Shrinking around any lost ranks either works or says why.
                if let Ok(s) = ShrunkLayout::without_replicas_of(&layout, &lost) {
                    prop_assert!(s.layout.world() < layout.world() || lost.is_empty());
                }
            }
        }
    }

    /// Grids from any text and any sizes.
    #[test]
    fn grids_from_any_text_are_parsed_or_refused(text in ".{0,40}", a in 0usize..5, b in 0usize..5) {
        // Whatever parses builds a grid of exactly those dimensions, or is refused with a reason; text that does
        // not parse is refused with a clean message.
        match parse_dims(&text) {
            Ok(dims) => match Grid::new(dims.clone()) {
                Ok(grid) => {
                    prop_assert_eq!(grid.dims(), &dims[..]);
                    prop_assert_eq!(grid.size(), dims.iter().map(|d| d.size).product::<usize>());
                }
                Err(e) => prop_assert!(clean(&e.to_string()), "{}", e),
            },
            Err(e) => prop_assert!(clean(&e.to_string()), "{}", e),
        }
        let grid = Grid::new([("tp", a), ("dp", b)]);
        prop_assert_eq!(grid.is_err(), a == 0 || b == 0);
    }

    /// Option and cluster files: arbitrary text and JSON-shaped junk are errors, never panics.
    #[test]
    fn option_and_cluster_files_from_any_text_are_refused_cleanly(
        text in prop_oneof![
            ".{0,80}",
            r#"\{"[a-z_]{1,8}": ?(\{"[a-z_]{1,12}": ?(-?[0-9]{1,12}|"[a-z]*"|true|null)\}|[0-9]+)\}"#,
            r#"\{"hosts": ?\[[0-9, ]{0,10}\], ?"[a-z]{1,6}": ?-?[0-9]{1,3}\}"#,
        ],
    ) {
        // Accepted or refused with a clean message (never a panic); the junk shapes are never accepted whole.
        if let Err(e) = GroupOptions::from_json(&text) {
            prop_assert!(clean(&e.to_string()), "{}", e);
        }
        match Cluster::from_json(&text) {
            Ok(_) => prop_assert!(text.contains("\"hosts\""), "a cluster without hosts was accepted: {}", text),
            Err(e) => prop_assert!(clean(&e.to_string()), "{}", e),
        }
    }

    /// Out-of-range roots and peers, mismatched buffers and counts, bad options, bad exclusion lists: each is
    /// an error before anything is sent, and the communicator still works afterwards.
    #[test]
    fn bad_arguments_are_errors_and_leave_the_communicator_usable(
        root in 1usize..1000, len in 0usize..50, other in 0usize..50, scratch in 0usize..64,
    ) {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let comm = Communicator::world(Arc::clone(&store), 1, 0,
            CommOptions { timeout: Duration::from_secs(10), ..CommOptions::named("bad") }).unwrap();
        let invalid = |r: Result<(), CommError>| matches!(r, Err(CommError::InvalidArgument { .. }));
        prop_assert!(invalid(comm.broadcast(vec![0u8; len], root).map(|_| ())));
        prop_assert!(invalid(comm.reduce(vec![0i32; len], ReduceOp::Sum, root).map(|_| ())));
        prop_assert!(invalid(comm.send(vec![0u8; len], root, 0).map(|_| ())));
        prop_assert!(invalid(comm.recv(vec![0u8; len], 0, 0).map(|_| ())));
        if len != other {
            prop_assert!(invalid(comm.all_reduce_into(vec![0f32; len], vec![0f32; other], ReduceOp::Max).map(|_| ())));
            prop_assert!(invalid(comm.all_to_all_v(vec![0u8; len], vec![other], vec![0u8; other], vec![other]).map(|_| ())));
        }
        prop_assert!(invalid(comm.shrink(&[root]).map(|_| ())));
        prop_assert!(invalid(comm.shrink(&[0]).map(|_| ())));
        let opts = CommOptions { scratch_bytes: Some(scratch), ..CommOptions::named("tiny") };
        prop_assert!(Communicator::world(Arc::clone(&store), 1, 0, opts).is_err());
        prop_assert!(Communicator::new(Arc::clone(&store), vec![0, 0], 0,
            CommOptions::named("dup")).is_err());
        prop_assert!(Communicator::new(Arc::clone(&store), vec![1, 2], 0,
            CommOptions::named("absent")).is_err());
        let sum = comm.all_reduce(vec![len as i64; 3], ReduceOp::Sum).unwrap().wait().unwrap();
        prop_assert_eq!(sum, vec![len as i64; 3]);
    }

    /// Garbage on the store's socket closes that connection only; the server keeps serving others correctly.
    #[test]
    fn garbage_on_the_store_socket_harms_nobody_else(junk in prop::collection::vec(any::<u8>(), 0..600)) {
        let server = TcpStoreServer::bind("127.0.0.1:0", ServerOptions::default()).unwrap();
        let addr = server.local_addr();
        let good = TcpStore::connect(addr.to_string(), ClientOptions::default()).unwrap();
        good.set(&Key::new("before"), b"1").unwrap();
        let mut raw = TcpStream::connect(addr).unwrap();
        raw.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let _ = raw.write_all(&junk);
        let _ = raw.shutdown(std::net::Shutdown::Write);
        // The server answers with at most a hello or an error and then closes: reading ends, it does not hang.
        let mut reply = Vec::new();
        let started = Instant::now();
        let _ = raw.read_to_end(&mut reply);
        prop_assert!(started.elapsed() < Duration::from_secs(15));
        prop_assert_eq!(good.get(&Key::new("before"), Duration::from_secs(5)).unwrap(), b"1".to_vec());
        good.set(&Key::new("after"), b"2").unwrap();
        prop_assert_eq!(good.num_keys().unwrap(), 2);
    }
}

/// Plays rank 1 of a 2-rank TCP communicator by hand against a real rank 0, following the bootstrap protocol
/// (count in under `arrivals` and decide, read the leader's address, greet it) and then sending `junk` where frames should
/// be; with `greet: false` the junk replaces the greeting. Rank 0 must fail with an error, not panic or hang.
fn junk_to_rank0(name: &str, greet: bool, junk: &[u8]) -> Result<Vec<i32>, CommError> {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let options = CommOptions {
        timeout: Duration::from_secs(3),
        force_tcp: true,
        ..CommOptions::named(name)
    };
    let key = |what: &str| Key::new("comm").push(name).push(what);
    let rank0 = {
        let store = Arc::clone(&store);
        std::thread::spawn(move || {
            let comm = Communicator::world(store, 2, 0, options)?;
            comm.all_reduce(vec![1i32; 100], ReduceOp::Sum)?.wait()
        })
    };
    // Rank 0's record is its arrival; rank 1, on its host, counts in with its bit (`1 << 1`) and, completing the
    // count, writes the decision.
    assert_eq!(store.add(&key("arrivals"), 1 << 1).unwrap(), 1 << 1);
    store.set(&key("decision"), b"tcp-local").unwrap();
    let addr = store.get(&key("tcp"), Duration::from_secs(30)).unwrap();
    let mut peer = TcpStream::connect(String::from_utf8(addr).unwrap()).unwrap();
    if greet {
        let own = b"127.0.0.1:9";
        let mut hello = 0x6863_7463_7068_656c_u64.to_le_bytes().to_vec();
        hello.extend(1u64.to_le_bytes());
        hello.extend((own.len() as u16).to_le_bytes());
        hello.extend(own);
        peer.write_all(&hello).unwrap();
    }
    let _ = peer.write_all(junk);
    let result = rank0.join().expect("rank 0 panicked on garbage");
    drop(peer);
    result
}

#[test]
fn garbage_on_a_host_tcp_connection_is_an_error() {
    let mut huge = vec![0u8; 65];
    huge[57..65].copy_from_slice(&u64::MAX.to_le_bytes());
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("zeros", vec![0u8; 65]),
        ("ff", vec![0xff; 200]),
        ("huge-length", huge),
        ("short", vec![7u8; 10]),
        ("text", b"GET / HTTP/1.1\r\n\r\n".repeat(8)),
    ];
    for greet in [true, false] {
        for (name, junk) in &cases {
            let comm = format!("junk-{name}-{greet}");
            let started = Instant::now();
            let err = junk_to_rank0(&comm, greet, junk).unwrap_err();
            assert!(err.to_string().contains(&comm), "{err}");
            let took = started.elapsed();
            assert!(took < Duration::from_secs(3 + 10), "{comm}: {took:?}");
        }
    }
}
