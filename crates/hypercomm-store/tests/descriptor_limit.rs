//! The server's connection limit is the process's open-file limit. A server process whose `RLIMIT_NOFILE` is
//! lowered to [`LIMIT`] refuses the client that would exceed it with a message naming the limit, keeps serving the
//! clients it has, and accepts again once some close.
//!
//! The server runs in a child process (this test binary, running the ignored test [`fd_limited_server`]), so the
//! lowered limit binds only the server and the clients here never run short themselves.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use hypercomm_store::{
    ClientOptions, Key, ServerOptions, Store, StoreError, TcpStore, TcpStoreServer,
};
use rustix::process::{Pid, Resource, Rlimit, getrlimit, prlimit};

const CHILD_ENV: &str = "HYPERCOMM_TEST_FD_LIMITED_SERVER";
const LIMIT: u64 = 64;
const LONG: Duration = Duration::from_secs(60);

/// The child: serves on a free loopback port, prints it, and stops when its standard input closes (or after a
/// minute, should the parent never close it).
#[test]
#[ignore = "the server process of server_out_of_descriptors_refuses_cleanly"]
fn fd_limited_server() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let server = TcpStoreServer::bind("127.0.0.1:0", ServerOptions::default()).unwrap();
    println!("PORT {}", server.local_addr().port());
    let (done, stdin_closed) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        let _ = done.send(());
    });
    let _ = stdin_closed.recv_timeout(LONG);
}

struct Server {
    child: Child,
}

impl Drop for Server {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.child.try_wait().ok().flatten().is_none() {
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Starts the child server and lowers its soft open-file limit to [`LIMIT`]; returns it and its port.
fn start_limited_server() -> (Server, u16) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "fd_limited_server",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let server = Server { child };
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            // The test harness may print "test fd_limited_server ... " on the same line first.
            if let Some((_, port)) = line.split_once("PORT ") {
                let _ = tx.send(port.trim().parse::<u16>().unwrap());
            }
        }
    });
    let port = rx
        .recv_timeout(LONG)
        .expect("the server process never printed its port");
    let hard = getrlimit(Resource::Nofile).maximum;
    let lowered = Rlimit {
        current: Some(LIMIT),
        maximum: hard,
    };
    prlimit(
        Some(Pid::from_child(&server.child)),
        Resource::Nofile,
        lowered,
    )
    .unwrap();
    (server, port)
}

#[test]
fn server_out_of_descriptors_refuses_cleanly() {
    let (_server, port) = start_limited_server();
    let addr = format!("127.0.0.1:{port}");
    let options = ClientOptions::default().with_timeouts(Duration::from_secs(2), LONG);
    let mut clients = Vec::new();
    let refusal = loop {
        assert!(
            clients.len() < 2 * LIMIT as usize,
            "{} clients served under a limit of {LIMIT}",
            clients.len()
        );
        match TcpStore::connect(&*addr, options.clone()) {
            Ok(client) => clients.push(client),
            Err(e) => break e,
        }
    };
    assert!(matches!(refusal, StoreError::Connect { .. }), "{refusal}");
    let text = refusal.to_string();
    assert!(text.contains("out of file descriptors"), "{text}");
    assert!(
        text.contains(&format!("open-file limit (RLIMIT_NOFILE) of {LIMIT}")),
        "{text}"
    );
    // The server itself holds a few descriptors (standard streams, epoll, its listener, its reserve).
    assert!(
        clients.len() >= LIMIT as usize / 2,
        "only {} clients served",
        clients.len()
    );

    // The clients it has are still served.
    clients[0].set(&Key::new("still"), b"served").unwrap();
    assert_eq!(
        clients
            .last()
            .unwrap()
            .get(&Key::new("still"), LONG)
            .unwrap(),
        b"served"
    );

    // Once some clients leave, new ones are accepted again.
    clients.truncate(clients.len() - 4);
    let again =
        TcpStore::connect(&*addr, ClientOptions::default().with_timeouts(LONG, LONG)).unwrap();
    assert_eq!(
        again.try_get(&Key::new("still")).unwrap().unwrap(),
        b"served"
    );
}
