//! In-process tests of the TCP store: a server and clients on loopback in one test process.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use super::*;
use crate::frame::{DEFAULT_MAX_FRAME, Frame, write_frame};
use crate::{Key, Secret, Store, StoreError};

const LONG: Duration = Duration::from_secs(30);

fn server() -> TcpStoreServer {
    TcpStore::server("127.0.0.1:0", ServerOptions::default()).unwrap()
}

fn client(server: &TcpStoreServer) -> TcpStore {
    TcpStore::connect(server.local_addr(), ClientOptions::default()).unwrap()
}

fn quick() -> ClientOptions {
    ClientOptions::default().with_timeouts(Duration::from_secs(2), LONG)
}

#[test]
fn every_operation_works_over_tcp() {
    let server = server();
    let a = client(&server);
    let b = client(&server);
    let key = Key::new("k").push(1u64);
    a.set(&key, b"v").unwrap();
    assert_eq!(b.try_get(&key).unwrap().unwrap(), b"v");
    assert_eq!(b.get(&key, LONG).unwrap(), b"v");
    b.wait(std::slice::from_ref(&key), LONG).unwrap();
    assert_eq!(a.add(&Key::new("n"), 3).unwrap(), 3);
    assert_eq!(b.add(&Key::new("n"), -1).unwrap(), 2);
    let cs = b.compare_set(&key, Some(b"v"), b"w").unwrap();
    assert!(cs.swapped);
    assert_eq!(cs.current.as_deref(), Some(&b"w"[..]));
    assert!(!a.compare_set(&key, None, b"x").unwrap().swapped);
    assert_eq!(a.num_keys().unwrap(), 2);
    assert!(a.delete(&key).unwrap());
    assert_eq!(b.try_get(&key).unwrap(), None);
    assert!(matches!(
        a.add(&Key::new("n"), i64::MAX),
        Err(StoreError::CounterOverflow { current: 2, .. })
    ));
}

#[test]
fn remote_timeout_names_the_missing_key() {
    let server = server();
    let c = client(&server);
    c.set(&Key::new("present"), b"").unwrap();
    let err = c
        .wait(
            &[Key::new("present"), Key::new("absent").push(7u64)],
            Duration::from_millis(50),
        )
        .unwrap_err();
    match err {
        StoreError::Timeout { missing, after } => {
            assert_eq!(missing, vec![Key::new("absent").push(7u64)]);
            assert_eq!(after, Duration::from_millis(50));
        }
        other => panic!("expected timeout, got {other}"),
    }
}

#[test]
fn a_waiting_get_does_not_block_other_callers_of_the_same_client() {
    let server = server();
    let c = Arc::new(client(&server));
    let waiter = {
        let c = Arc::clone(&c);
        thread::spawn(move || c.get(&Key::new("late"), LONG))
    };
    // The setter uses the same client while the waiter's request is parked on the server.
    c.set(&Key::new("late"), b"here").unwrap();
    assert_eq!(waiter.join().unwrap().unwrap(), b"here");
}

#[test]
fn client_started_before_the_server_connects_once_it_is_up() {
    // Reserve a port, release it, and start the server there only after the client began retrying.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let connecting = {
        let addr = addr.clone();
        thread::spawn(move || TcpStore::connect(addr, ClientOptions::default()))
    };
    thread::sleep(Duration::from_millis(100));
    let server = TcpStore::server(&*addr, ServerOptions::default()).unwrap();
    let c = connecting.join().unwrap().unwrap();
    c.set(&Key::new("x"), b"1").unwrap();
    assert_eq!(
        client(&server).try_get(&Key::new("x")).unwrap().unwrap(),
        b"1"
    );
}

#[test]
fn connecting_to_nothing_fails_after_the_deadline_naming_the_address() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let options = ClientOptions::default().with_timeouts(Duration::from_millis(200), LONG);
    let err = TcpStore::connect(&*addr, options).unwrap_err();
    assert!(matches!(err, StoreError::Connect { .. }), "{err}");
    assert!(err.to_string().contains(&addr), "{err}");
}

#[test]
fn secrets_are_checked_both_ways() {
    let secret = Secret::new("right").unwrap();
    let guarded = TcpStore::server(
        "127.0.0.1:0",
        ServerOptions {
            secret: Some(secret.clone()),
            ..ServerOptions::default()
        },
    )
    .unwrap();
    let addr = guarded.local_addr();
    let ok = TcpStore::connect(addr, quick().with_secret(Some(secret.clone()))).unwrap();
    ok.set(&Key::new("a"), b"1").unwrap();

    let wrong = TcpStore::connect(
        addr,
        quick().with_secret(Some(Secret::new("wrong").unwrap())),
    )
    .unwrap_err();
    assert!(matches!(wrong, StoreError::Auth { .. }), "{wrong}");
    assert!(wrong.to_string().contains("wrong shared secret"), "{wrong}");

    let none = TcpStore::connect(addr, quick()).unwrap_err();
    assert!(
        none.to_string().contains("HYPERCOMM_STORE_SECRET"),
        "{none}"
    );

    let open = server();
    let extra =
        TcpStore::connect(open.local_addr(), quick().with_secret(Some(secret))).unwrap_err();
    assert!(matches!(extra, StoreError::Auth { .. }), "{extra}");
    // The refused clients changed nothing.
    assert_eq!(ok.num_keys().unwrap(), 1);
}

#[test]
fn garbage_and_oversized_frames_close_only_their_connection() {
    let server = TcpStore::server(
        "127.0.0.1:0",
        ServerOptions {
            max_frame: 1024,
            ..ServerOptions::default()
        },
    )
    .unwrap();
    let good = TcpStore::connect(
        server.local_addr(),
        ClientOptions {
            max_frame: 1024,
            ..ClientOptions::default()
        },
    )
    .unwrap();
    good.set(&Key::new("before"), b"1").unwrap();
    let attacks: [&[u8]; 4] = [
        b"GET / HTTP/1.1\r\n\r\n",
        &u32::MAX.to_le_bytes(),
        &[3, 0, 0, 0, 0xee, 1, 2],
        &[2, 0, 0],
    ];
    for attack in attacks {
        let mut raw = TcpStream::connect(server.local_addr()).unwrap();
        raw.set_read_timeout(Some(LONG)).unwrap();
        raw.write_all(attack).unwrap();
        let _ = raw.shutdown(std::net::Shutdown::Write);
        // The server answers with at most a hello and a refusal or failure, then closes: reading reaches EOF.
        let mut sink = Vec::new();
        let _ = raw.read_to_end(&mut sink);
    }
    // An authenticated connection that then sends an unknown frame type is closed too.
    let mut raw = TcpStream::connect(server.local_addr()).unwrap();
    raw.set_read_timeout(Some(LONG)).unwrap();
    let _ = crate::frame::read_frame(&mut raw, 1024).unwrap();
    write_frame(
        &mut raw,
        &Frame::Auth {
            version: crate::frame::PROTOCOL_VERSION,
            nonce: [0; 32],
            mac: None,
        },
        1024,
    )
    .unwrap();
    assert_eq!(
        crate::frame::read_frame(&mut raw, 1024).unwrap(),
        Frame::Welcome { mac: None }
    );
    raw.write_all(&[1, 0, 0, 0, 0x7f]).unwrap();
    assert!(matches!(
        crate::frame::read_frame(&mut raw, 1024).unwrap(),
        Frame::Failed { .. }
    ));
    let mut rest = Vec::new();
    assert_eq!(raw.read_to_end(&mut rest).unwrap(), 0);

    good.set(&Key::new("after"), b"2").unwrap();
    assert_eq!(good.num_keys().unwrap(), 2);
    assert_eq!(
        client(&server)
            .try_get(&Key::new("before"))
            .unwrap()
            .unwrap(),
        b"1"
    );
}

#[test]
fn oversized_requests_fail_locally() {
    let server = server();
    let c = TcpStore::connect(
        server.local_addr(),
        ClientOptions {
            max_frame: 64,
            ..ClientOptions::default()
        },
    )
    .unwrap();
    let err = c.set(&Key::new("big"), &[0; 100]).unwrap_err();
    assert!(matches!(err, StoreError::TooLarge { max: 64, .. }), "{err}");
    c.set(&Key::new("small"), b"ok").unwrap();
}

#[test]
fn stopping_the_server_fails_waiting_and_later_calls() {
    let mut server = server();
    let addr = server.local_addr();
    let options =
        ClientOptions::default().with_timeouts(Duration::from_secs(2), Duration::from_secs(2));
    let c = Arc::new(TcpStore::connect(addr, options).unwrap());
    c.set(&Key::new("a"), b"").unwrap();
    let waiter = {
        let c = Arc::clone(&c);
        thread::spawn(move || c.get(&Key::new("never"), Duration::from_secs(600)))
    };
    // Usually the waiter's request is parked on the server by now; if not, it meets a closed server instead. Both
    // orders must end in an error naming the address, long before the 600 s wait.
    thread::sleep(Duration::from_millis(100));
    server.shutdown();
    assert_eq!(server.connections(), 0);
    let err = waiter.join().unwrap().unwrap_err();
    assert!(err.to_string().contains(&addr.to_string()), "{err}");
    let err = c.set(&Key::new("b"), b"").unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Disconnected { .. } | StoreError::Connect { .. }
        ),
        "{err}"
    );
}

#[test]
fn full_server_refuses_with_a_reason() {
    let server = TcpStore::server(
        "127.0.0.1:0",
        ServerOptions {
            max_connections: 1,
            ..ServerOptions::default()
        },
    )
    .unwrap();
    let first = client(&server);
    let options = ClientOptions::default().with_timeouts(Duration::from_millis(300), LONG);
    let err = TcpStore::connect(server.local_addr(), options).unwrap_err();
    assert!(err.to_string().contains("maximum"), "{err}");
    first.set(&Key::new("still"), b"served").unwrap();
}

#[test]
fn frames_over_the_default_limit_are_refused_by_write() {
    let frame = Frame::Value(Some(vec![0; 8]));
    let mut out = Vec::new();
    assert!(write_frame(&mut out, &frame, DEFAULT_MAX_FRAME).is_ok());
    assert!(write_frame(&mut Vec::new(), &frame, 4).is_err());
}

/// A raw connection that has completed the handshake with a server that has no secret.
fn raw_welcomed(server: &TcpStoreServer) -> TcpStream {
    let mut raw = TcpStream::connect(server.local_addr()).unwrap();
    raw.set_read_timeout(Some(LONG)).unwrap();
    assert!(matches!(
        crate::frame::read_frame(&mut raw, DEFAULT_MAX_FRAME).unwrap(),
        Frame::Hello { .. }
    ));
    write_frame(
        &mut raw,
        &Frame::Auth {
            version: crate::frame::PROTOCOL_VERSION,
            nonce: [7; 32],
            mac: None,
        },
        DEFAULT_MAX_FRAME,
    )
    .unwrap();
    assert_eq!(
        crate::frame::read_frame(&mut raw, DEFAULT_MAX_FRAME).unwrap(),
        Frame::Welcome { mac: None }
    );
    raw
}

#[test]
fn pipelined_requests_are_answered_in_order_even_behind_a_waiting_get() {
    let server = server();
    let mut raw = raw_welcomed(&server);
    // One write carrying three requests: a get that must wait, a set and a count. The set and the count run only
    // once the get is answered, and the replies come back in request order.
    let mut wire = Vec::new();
    for frame in [
        Frame::Get {
            key: Key::new("later"),
            timeout: LONG,
        },
        Frame::Set {
            key: Key::new("other"),
            value: b"x".to_vec(),
        },
        Frame::NumKeys,
    ] {
        write_frame(&mut wire, &frame, DEFAULT_MAX_FRAME).unwrap();
    }
    raw.write_all(&wire).unwrap();
    let deadline = std::time::Instant::now() + LONG;
    while server.waiting() == 0 {
        assert!(std::time::Instant::now() < deadline, "the get never parked");
        thread::sleep(Duration::from_millis(5));
    }
    // The set behind the parked get has not run yet.
    assert_eq!(client(&server).try_get(&Key::new("other")).unwrap(), None);
    client(&server).set(&Key::new("later"), b"now").unwrap();
    let read = |raw: &mut TcpStream| crate::frame::read_frame(raw, DEFAULT_MAX_FRAME).unwrap();
    assert_eq!(read(&mut raw), Frame::Value(Some(b"now".to_vec())));
    assert_eq!(read(&mut raw), Frame::Done);
    assert_eq!(read(&mut raw), Frame::Count(2));
    // The count is published at the end of the loop's turn, which may come just after the replies.
    while server.waiting() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the get stayed parked"
        );
        thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn idle_and_silent_connections_are_closed_at_their_deadlines() {
    let server = TcpStore::server(
        "127.0.0.1:0",
        ServerOptions {
            idle_timeout: Duration::from_millis(200),
            handshake_timeout: Duration::from_millis(200),
            ..ServerOptions::default()
        },
    )
    .unwrap();
    let c = client(&server);
    // A raw client that reads the hello and never answers it.
    let mut silent = TcpStream::connect(server.local_addr()).unwrap();
    silent.set_read_timeout(Some(LONG)).unwrap();
    let mut sink = Vec::new();
    assert!(
        silent.read_to_end(&mut sink).is_ok(),
        "closed, not timed out"
    );
    assert!(!sink.is_empty(), "the hello came first");
    let deadline = std::time::Instant::now() + LONG;
    while server.connections() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "idle connection never closed"
        );
        thread::sleep(Duration::from_millis(20));
    }
    // The client reopens its closed connection without the caller noticing.
    c.set(&Key::new("after idle"), b"1").unwrap();
    assert_eq!(c.try_get(&Key::new("after idle")).unwrap().unwrap(), b"1");
}

#[test]
fn a_waiting_get_from_a_client_that_went_away_is_forgotten() {
    let server = server();
    let mut raw = raw_welcomed(&server);
    write_frame(
        &mut raw,
        &Frame::Get {
            key: Key::new("never"),
            timeout: LONG,
        },
        DEFAULT_MAX_FRAME,
    )
    .unwrap();
    let deadline = std::time::Instant::now() + LONG;
    while server.waiting() == 0 {
        assert!(std::time::Instant::now() < deadline, "the get never parked");
        thread::sleep(Duration::from_millis(5));
    }
    drop(raw);
    while server.waiting() > 0 || server.connections() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the waiter outlived its client"
        );
        thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn replies_larger_than_the_socket_buffer_go_out_in_pieces() {
    let server = server();
    let a = client(&server);
    let b = client(&server);
    // Several megabytes: the server's first write takes only part, and the rest waits for writability.
    let big: Vec<u8> = (0..8 << 20).map(|i: u32| (i % 251) as u8).collect();
    a.set(&Key::new("big"), &big).unwrap();
    for _ in 0..3 {
        assert_eq!(b.get(&Key::new("big"), LONG).unwrap(), big);
    }
    // The connection is still served normally afterwards.
    assert_eq!(b.num_keys().unwrap(), 1);
}
