//! Thousands of connections on one server: they share the server's one thread, and a `get` waiting on each of
//! them costs a registration in the server's table of waiters, not a thread. A binary of its own with a single
//! test, so the thread count it reads from `/proc/self/task` moves only with what this test does.

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use hypercomm_store::frame::{DEFAULT_MAX_FRAME, Frame, PROTOCOL_VERSION, read_frame, write_frame};
use hypercomm_store::{ClientOptions, Key, ServerOptions, Store, TcpStore, TcpStoreServer};
use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

const CONNECTIONS: usize = 2000;
const LONG: Duration = Duration::from_secs(60);

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// This process holds both ends of every connection: raise its soft open-file limit (never the hard one) when it
/// is below what the test needs.
fn ensure_open_files(needed: u64) {
    let limit = getrlimit(Resource::Nofile);
    if limit.current.is_some_and(|soft| soft < needed) {
        let raised = Rlimit {
            current: Some(limit.maximum.map_or(needed, |hard| hard.min(needed))),
            maximum: limit.maximum,
        };
        setrlimit(Resource::Nofile, raised).unwrap();
    }
    let soft = getrlimit(Resource::Nofile).current;
    assert!(
        soft.is_none_or(|soft| soft >= needed),
        "this test needs {needed} open files and the hard limit allows only {soft:?}"
    );
}

/// A raw connection through the handshake of a server without a secret.
fn welcomed(addr: std::net::SocketAddr) -> TcpStream {
    let mut raw = TcpStream::connect(addr).unwrap();
    raw.set_read_timeout(Some(LONG)).unwrap();
    assert!(matches!(
        read_frame(&mut raw, DEFAULT_MAX_FRAME).unwrap(),
        Frame::Hello { .. }
    ));
    let auth = Frame::Auth {
        version: PROTOCOL_VERSION,
        nonce: [1; 32],
        mac: None,
    };
    write_frame(&mut raw, &auth, DEFAULT_MAX_FRAME).unwrap();
    assert_eq!(
        read_frame(&mut raw, DEFAULT_MAX_FRAME).unwrap(),
        Frame::Welcome { mac: None }
    );
    raw
}

fn wait_for(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + LONG;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn thousands_of_connections_and_waiters_share_one_server_thread() {
    ensure_open_files(2 * CONNECTIONS as u64 + 256);
    let before = threads();
    let server = TcpStoreServer::bind("127.0.0.1:0", ServerOptions::default()).unwrap();
    let addr = server.local_addr();
    let mut raws: Vec<TcpStream> = (0..CONNECTIONS).map(|_| welcomed(addr)).collect();
    wait_for("every connection is counted", || {
        server.connections() == CONNECTIONS
    });
    let added = threads() - before;
    assert!(
        added <= 2,
        "{CONNECTIONS} idle connections cost the server {added} threads"
    );

    // Every connection asks for a key nobody has written: each request parks on the server.
    let get = Frame::Get {
        key: Key::new("go"),
        timeout: LONG,
    };
    for raw in &mut raws {
        write_frame(raw, &get, DEFAULT_MAX_FRAME).unwrap();
    }
    wait_for("every get is parked", || server.waiting() == CONNECTIONS);
    let added = threads() - before;
    assert!(
        added <= 2,
        "{CONNECTIONS} waiting gets cost the server {added} threads"
    );

    let setter = TcpStore::connect(addr, ClientOptions::default()).unwrap();
    setter.set(&Key::new("go"), b"released").unwrap();
    for raw in &mut raws {
        assert_eq!(
            read_frame(raw, DEFAULT_MAX_FRAME).unwrap(),
            Frame::Value(Some(b"released".to_vec()))
        );
    }
    wait_for("no get is parked any more", || server.waiting() == 0);
    // Every connection is still served after its wait.
    for raw in raws.iter_mut().take(10) {
        write_frame(raw, &Frame::NumKeys, DEFAULT_MAX_FRAME).unwrap();
        raw.flush().unwrap();
        assert_eq!(read_frame(raw, DEFAULT_MAX_FRAME).unwrap(), Frame::Count(1));
    }
    drop(raws);
    drop(setter);
    wait_for("every connection is closed", || server.connections() == 0);
}
