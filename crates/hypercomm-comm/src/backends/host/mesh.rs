//! Building the TCP mesh of a communicator through its leader, with no per-peer store traffic.
//!
//! The leader (rank 0) has published its listening address in the store. Every other rank listens too, connects to
//! the leader and sends a greeting with its rank and address; the leader answers each with the table of all
//! addresses. Then each rank connects to every lower rank except the leader and accepts every higher one, so each
//! pair has exactly one connection, opened by its higher rank. Store cost per rank: one record, whatever the size.
//!
//! Greeting: `magic u64 | rank u64 | address length u16 | address (UTF-8 "ip:port")`, all little-endian.
//! Table: `count u64`, then per rank `length u16 | address`.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::CommError;

const HELLO_MAGIC: u64 = 0x6863_7463_7068_656c;
/// The longest address text accepted ("[ipv6%scope]:port" fits easily).
const MAX_ADDR: usize = 128;

/// Where this rank listens, and what it tells peers.
pub(crate) struct Listening {
    pub listener: TcpListener,
    pub advertised: SocketAddr,
}

/// Listens on loopback when every member shares this host; otherwise on `host_addr` or, unset, the first
/// non-loopback address this host's name resolves to, and advertises that address.
pub(crate) fn listen(
    comm: &str,
    all_local: bool,
    host_addr: Option<IpAddr>,
) -> Result<Listening, CommError> {
    let io = |what: &str| {
        let (comm, what) = (comm.to_owned(), what.to_owned());
        move |source| CommError::Io { comm, what, source }
    };
    let (bind, advertise) = if all_local {
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        (lo, lo)
    } else {
        let ip = match host_addr {
            Some(ip) => ip,
            None => external_address().ok_or_else(|| CommError::Protocol {
                comm: comm.to_owned(),
                what: "members span several hosts, but this host's name resolves to no non-loopback address; \
                       set CommOptions::host_addr"
                    .into(),
            })?,
        };
        (ip, ip)
    };
    let listener = TcpListener::bind((bind, 0)).map_err(io("binding a listener"))?;
    let port = listener
        .local_addr()
        .map_err(io("reading the listener address"))?
        .port();
    Ok(Listening {
        listener,
        advertised: SocketAddr::new(advertise, port),
    })
}

fn external_address() -> Option<IpAddr> {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    (host.trim(), 0)
        .to_socket_addrs()
        .ok()?
        .map(|a| a.ip())
        .find(|ip| !ip.is_loopback() && !ip.is_unspecified())
}

/// Connects rank `me` of `n` into a full mesh. `leader` is rank 0's advertised address (unused by rank 0).
/// Returns one stream per peer (`None` for `me`).
pub(crate) fn connect(
    comm: &str,
    n: usize,
    me: usize,
    own: Listening,
    leader: Option<SocketAddr>,
    timeout: Duration,
) -> Result<Vec<Option<TcpStream>>, CommError> {
    let deadline = Instant::now() + timeout;
    let mut peers: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
    let table = if me == 0 {
        let mut table = vec![own.advertised.to_string(); n];
        for _ in 1..n {
            let Some((stream, rank, addr)) = accept_hello(comm, &own.listener, deadline)? else {
                return Err(missing(comm, &peers, 1..n, timeout));
            };
            if rank == 0 || rank >= n || peers[rank].is_some() {
                return Err(protocol(
                    comm,
                    format!("a connection claimed rank {rank} twice or out of 1..{n}"),
                ));
            }
            stream
                .set_read_timeout(Some(timeout))
                .map_err(io(comm, "configuring a connection"))?;
            table[rank] = addr;
            peers[rank] = Some(stream);
        }
        let encoded = encode_table(&table);
        for (rank, stream) in peers.iter_mut().enumerate().skip(1) {
            if let Some(stream) = stream {
                stream.write_all(&encoded).map_err(io(
                    comm,
                    &format!("sending the address table to rank {rank}"),
                ))?;
            }
        }
        table
    } else {
        let leader = leader.ok_or_else(|| protocol(comm, "no leader address".into()))?;
        let mut stream = connect_to(comm, leader, deadline, 0)?;
        stream
            .write_all(&hello(me, &own.advertised.to_string()))
            .map_err(io(comm, "greeting rank 0"))?;
        let table = read_table(comm, &mut stream, n)?;
        peers[0] = Some(stream);
        table
    };
    // Pairs among non-leaders: the higher rank connects.
    for (peer, slot) in peers.iter_mut().enumerate().take(me).skip(1) {
        let addr: SocketAddr = table[peer]
            .parse()
            .map_err(|_| protocol(comm, format!("rank {peer} advertised {:?}", table[peer])))?;
        let mut stream = connect_to(comm, addr, deadline, peer)?;
        stream
            .write_all(&hello(me, ""))
            .map_err(io(comm, &format!("greeting rank {peer}")))?;
        *slot = Some(stream);
    }
    if me > 0 {
        for _ in me + 1..n {
            let Some((stream, rank, _)) = accept_hello(comm, &own.listener, deadline)? else {
                return Err(missing(comm, &peers, me + 1..n, timeout));
            };
            if rank <= me || rank >= n || peers[rank].is_some() {
                return Err(protocol(
                    comm,
                    format!("unexpected greeting from a connection claiming rank {rank}"),
                ));
            }
            peers[rank] = Some(stream);
        }
    }
    Ok(peers)
}

fn io<'a>(comm: &'a str, what: &'a str) -> impl FnOnce(std::io::Error) -> CommError + 'a {
    move |source| CommError::Io {
        comm: comm.to_owned(),
        what: what.to_owned(),
        source,
    }
}

/// The timeout error naming the ranks in `expected` that never connected.
fn missing(
    comm: &str,
    peers: &[Option<TcpStream>],
    expected: std::ops::Range<usize>,
    timeout: Duration,
) -> CommError {
    CommError::timeout(
        comm,
        expected.filter(|&r| peers[r].is_none()).collect(),
        timeout,
        "tcp bootstrap: waiting for peers to connect",
    )
}

fn protocol(comm: &str, what: String) -> CommError {
    CommError::Protocol {
        comm: comm.to_owned(),
        what,
    }
}

fn hello(rank: usize, addr: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(18 + addr.len());
    out.extend_from_slice(&HELLO_MAGIC.to_le_bytes());
    out.extend_from_slice(&(rank as u64).to_le_bytes());
    out.extend_from_slice(&(addr.len() as u16).to_le_bytes());
    out.extend_from_slice(addr.as_bytes());
    out
}

fn encode_table(table: &[String]) -> Vec<u8> {
    let mut out = (table.len() as u64).to_le_bytes().to_vec();
    for addr in table {
        out.extend_from_slice(&(addr.len() as u16).to_le_bytes());
        out.extend_from_slice(addr.as_bytes());
    }
    out
}

fn read_exact<const N: usize>(
    comm: &str,
    stream: &mut TcpStream,
    what: &str,
) -> Result<[u8; N], CommError> {
    let mut buf = [0u8; N];
    stream.read_exact(&mut buf).map_err(io(comm, what))?;
    Ok(buf)
}

fn read_addr(comm: &str, stream: &mut TcpStream, what: &str) -> Result<String, CommError> {
    let len = u16::from_le_bytes(read_exact::<2>(comm, stream, what)?) as usize;
    if len > MAX_ADDR {
        return Err(protocol(comm, format!("{what}: an address of {len} bytes")));
    }
    let mut buf = vec![0u8; len];
    stream.read_exact(&mut buf).map_err(io(comm, what))?;
    String::from_utf8(buf)
        .map_err(|_| protocol(comm, format!("{what}: an address that is not UTF-8")))
}

fn read_table(comm: &str, stream: &mut TcpStream, n: usize) -> Result<Vec<String>, CommError> {
    let what = "reading the address table from rank 0";
    let count = u64::from_le_bytes(read_exact::<8>(comm, stream, what)?);
    if count != n as u64 {
        return Err(protocol(
            comm,
            format!("rank 0 sent a table of {count} ranks, not {n}"),
        ));
    }
    (0..n).map(|_| read_addr(comm, stream, what)).collect()
}

fn connect_to(
    comm: &str,
    addr: SocketAddr,
    deadline: Instant,
    peer: usize,
) -> Result<TcpStream, CommError> {
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    let stream = TcpStream::connect_timeout(&addr, left)
        .map_err(io(comm, &format!("connecting to rank {peer} at {addr}")))?;
    stream
        .set_read_timeout(Some(left))
        .map_err(io(comm, "configuring a connection"))?;
    Ok(stream)
}

/// Accepts one connection before `deadline` and reads its greeting: (stream, rank, advertised address), or `None`
/// when the deadline passes first.
fn accept_hello(
    comm: &str,
    listener: &TcpListener,
    deadline: Instant,
) -> Result<Option<(TcpStream, usize, String)>, CommError> {
    listener
        .set_nonblocking(true)
        .map_err(io(comm, "configuring the listener"))?;
    loop {
        match listener.accept() {
            Ok((mut stream, _)) => {
                stream
                    .set_nonblocking(false)
                    .map_err(io(comm, "configuring a connection"))?;
                let left = deadline
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(1));
                stream
                    .set_read_timeout(Some(left))
                    .map_err(io(comm, "configuring a connection"))?;
                let what = "reading a peer's greeting";
                let magic = u64::from_le_bytes(read_exact::<8>(comm, &mut stream, what)?);
                if magic != HELLO_MAGIC {
                    return Err(protocol(
                        comm,
                        "a connection sent no hypercomm greeting".into(),
                    ));
                }
                let rank = u64::from_le_bytes(read_exact::<8>(comm, &mut stream, what)?) as usize;
                let addr = read_addr(comm, &mut stream, what)?;
                return Ok(Some((stream, rank, addr)));
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Ok(None);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(io(comm, "accepting a peer")(e)),
        }
    }
}
