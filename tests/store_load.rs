//! Load on the TCP store: hundreds of concurrent clients, each with its own connection, setting, reading,
//! counting and waiting at once. Nothing may be lost: every key written is read back with its value, the shared
//! counter ends at exactly the number of increments, and every waiter is released.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use hypercomm::store::{ClientOptions, Key, ServerOptions, Store, TcpStore, TcpStoreServer};

const CLIENTS: usize = 256;
const OPS: usize = 20;
const LONG: Duration = Duration::from_secs(120);

#[test]
fn hundreds_of_concurrent_clients_lose_nothing() {
    let server = TcpStoreServer::bind("127.0.0.1:0", ServerOptions::default()).unwrap();
    let addr = server.local_addr().to_string();
    let start = Arc::new(Barrier::new(CLIENTS));
    let began = Instant::now();
    let handles: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (addr, start) = (addr.clone(), Arc::clone(&start));
            std::thread::Builder::new()
                .stack_size(256 * 1024)
                .spawn(move || -> Result<u64, String> {
                    let options = ClientOptions::default().with_timeouts(LONG, LONG);
                    let store = TcpStore::connect(addr, options).map_err(|e| e.to_string())?;
                    start.wait();
                    let mut ops = 0;
                    for i in 0..OPS {
                        let key = Key::new("load").push(c).push(i);
                        store
                            .set(&key, format!("{c}:{i}").as_bytes())
                            .map_err(|e| e.to_string())?;
                        store
                            .add(&Key::new("counter"), 1)
                            .map_err(|e| e.to_string())?;
                        // Read a neighbour's key: it may not exist yet, so wait for it (it will).
                        let other = Key::new("load").push((c + 1) % CLIENTS).push(i);
                        let v = store.get(&other, LONG).map_err(|e| e.to_string())?;
                        if v != format!("{}:{i}", (c + 1) % CLIENTS).into_bytes() {
                            return Err(format!("client {c} read {v:?} for {other}"));
                        }
                        ops += 3;
                    }
                    store
                        .set(&Key::new("finished").push(c), b"")
                        .map_err(|e| e.to_string())?;
                    let all: Vec<Key> =
                        (0..CLIENTS).map(|k| Key::new("finished").push(k)).collect();
                    store.wait(&all, LONG).map_err(|e| e.to_string())?;
                    Ok(ops + 2)
                })
                .unwrap()
        })
        .collect();
    let results: Vec<Result<u64, String>> =
        handles.into_iter().map(|h| h.join().unwrap()).collect();
    let errors: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        errors.is_empty(),
        "{} clients failed: {:?}",
        errors.len(),
        &errors[..errors.len().min(5)]
    );
    let ops: u64 = results.iter().map(|r| *r.as_ref().unwrap()).sum();
    let check = TcpStore::connect(addr, ClientOptions::default()).unwrap();
    assert_eq!(
        check.add(&Key::new("counter"), 0).unwrap(),
        (CLIENTS * OPS) as i64
    );
    for c in 0..CLIENTS {
        for i in 0..OPS {
            let v = check.try_get(&Key::new("load").push(c).push(i)).unwrap();
            assert_eq!(v, Some(format!("{c}:{i}").into_bytes()));
        }
    }
    assert_eq!(
        check.num_keys().unwrap(),
        (CLIENTS * OPS + CLIENTS + 1) as u64
    );
    println!(
        "store load: {CLIENTS} concurrent clients, {ops} requests in {:.1} s, 0 lost",
        began.elapsed().as_secs_f64()
    );
}
