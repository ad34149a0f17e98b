//! What the server answers to each frame it reads: first the handshake, then requests against the [`Table`].
//!
//! Nothing here blocks or touches a socket. A request that cannot be answered yet (`get` or `wait` for a key
//! not written) comes back as [`Outcome::Park`]; the event loop parks it on the table and asks
//! [`Parked::poll`] again whenever the key it waits for is written.

use std::time::Duration;

use super::options::ServerOptions;
use super::table::{Table, Waiter};
use crate::frame::frame_name;
use crate::frame::{Frame, NONCE_LEN, PROTOCOL_VERSION};
use crate::secret::SECRET_ENV;
use crate::{Key, StoreError};

/// A handshake that failed: why (for the log), and the frame that tells the client, when the client can use one.
#[derive(Debug)]
pub(super) struct Refusal {
    pub reason: String,
    pub reply: Option<Frame>,
}

/// The server's first frame on a connection.
pub(super) fn hello(options: &ServerOptions, nonce: [u8; NONCE_LEN]) -> Frame {
    Frame::Hello {
        version: PROTOCOL_VERSION,
        auth_required: options.secret.is_some(),
        nonce,
    }
}

/// Checks the client's answer to [`hello`]: the welcome to send, or why the connection is refused.
pub(super) fn greet(
    options: &ServerOptions,
    nonce: &[u8; NONCE_LEN],
    frame: Frame,
) -> Result<Frame, Refusal> {
    let (version, client_nonce, mac) = match frame {
        Frame::Auth {
            version,
            nonce,
            mac,
        } => (version, nonce, mac),
        other => {
            return Err(Refusal {
                reason: format!("expected an auth frame, got {}", frame_name(&other)),
                reply: None,
            });
        }
    };
    let refusal = if version != PROTOCOL_VERSION {
        Some(format!(
            "client speaks protocol version {version}, server speaks {PROTOCOL_VERSION}"
        ))
    } else {
        match (&options.secret, mac) {
            (None, _) => None,
            (Some(_), None) => Some(format!(
                "server requires the shared secret and the client sent none (set {SECRET_ENV})"
            )),
            (Some(secret), Some(mac)) => (!secret.client_proof_matches(nonce, &client_nonce, &mac))
                .then(|| "wrong shared secret".to_owned()),
        }
    };
    if let Some(reason) = refusal {
        return Err(Refusal {
            reply: Some(Frame::Refused {
                reason: reason.clone(),
            }),
            reason,
        });
    }
    Ok(Frame::Welcome {
        mac: options
            .secret
            .as_ref()
            .map(|secret| secret.server_proof(nonce, &client_nonce)),
    })
}

/// What to do with one request.
#[derive(Debug)]
pub(super) enum Outcome {
    /// Send this reply and keep serving the connection.
    Reply(Frame),
    /// Send this reply, then close the connection.
    ReplyAndClose(Frame),
    /// Not answerable yet: park it until its key is written or `timeout` passes.
    Park {
        /// The request.
        parked: Parked,
        /// How long it may wait (already limited by the server's `max_wait`).
        timeout: Duration,
    },
}

/// A `get` or `wait` waiting for keys.
#[derive(Debug)]
pub(super) enum Parked {
    /// Waits for one key and returns its value.
    Get {
        /// The key.
        key: Key,
    },
    /// Waits for every key.
    Wait {
        /// The keys, in the client's order.
        keys: Vec<Key>,
        /// Every key before this index was present when last looked at, and is waited on no more.
        next: usize,
        /// The table's delete count when the keys before `next` were seen: if it moved, look at them again.
        deletes: u64,
    },
}

impl Parked {
    /// The key this request waits for now (the one it is parked under).
    pub fn watched(&self) -> &Key {
        match self {
            Parked::Get { key } => key,
            // `next` always indexes a missing key while parked: `poll` only returns `None` after setting it to one.
            Parked::Wait { keys, next, .. } => &keys[*next],
        }
    }

    /// The reply if the request can be answered now; otherwise `None`, with [`Parked::watched`] naming the key to
    /// park it under.
    pub fn poll(&mut self, table: &Table) -> Option<Frame> {
        match self {
            Parked::Get { key } => table.get(key).map(|v| Frame::Value(Some(v.to_vec()))),
            Parked::Wait {
                keys,
                next,
                deletes,
            } => {
                // At most two passes: after a restart from 0 the delete count matches, so the second pass returns.
                loop {
                    match table.first_missing(keys, *next) {
                        Some(i) => {
                            *next = i;
                            return None;
                        }
                        None if *deletes == table.deletes() => return Some(Frame::Done),
                        None => {
                            // A key seen earlier may have been deleted since: look at every key again.
                            *deletes = table.deletes();
                            *next = 0;
                        }
                    }
                }
            }
        }
    }

    /// The reply when time runs out after waiting `after`: the keys still missing.
    pub fn timed_out(&self, table: &Table, after: Duration) -> Frame {
        let missing = match self {
            Parked::Get { key } => vec![key.clone()],
            Parked::Wait { keys, .. } => keys
                .iter()
                .filter(|k| table.get(k).is_none())
                .cloned()
                .collect(),
        };
        Frame::TimedOut { missing, after }
    }
}

/// Answers one request frame, writing to `table` and collecting in `woken` the parked requests it may release.
pub(super) fn answer(
    table: &mut Table,
    request: Frame,
    max_wait: Duration,
    woken: &mut Vec<Waiter>,
) -> Outcome {
    let reply = match request {
        Frame::Set { key, value } => {
            table.set(key, value, woken);
            Frame::Done
        }
        Frame::TryGet { key } => Frame::Value(table.get(&key).map(<[u8]>::to_vec)),
        Frame::Get { key, timeout } => {
            return wait_or_answer(table, Parked::Get { key }, timeout.min(max_wait));
        }
        Frame::Wait { keys, timeout } => {
            let parked = Parked::Wait {
                keys,
                next: 0,
                deletes: table.deletes(),
            };
            return wait_or_answer(table, parked, timeout.min(max_wait));
        }
        Frame::Add { key, delta } => match table.add(key, delta, woken) {
            Ok(n) => Frame::Int(n),
            Err(StoreError::NotACounter { key, value }) => Frame::NotACounter {
                key,
                value: value.into_bytes(),
            },
            Err(StoreError::CounterOverflow {
                key,
                current,
                delta,
            }) => Frame::Overflow {
                key,
                current,
                delta,
            },
            Err(other) => Frame::Failed {
                message: other.to_string(),
            },
        },
        Frame::CompareSet {
            key,
            expected,
            desired,
        } => {
            let cs = table.compare_set(key, expected.as_deref(), desired, woken);
            Frame::Swapped {
                swapped: cs.swapped,
                current: cs.current,
            }
        }
        Frame::Delete { key } => Frame::Bool(table.delete(&key)),
        Frame::NumKeys => Frame::Count(table.len() as u64),
        other => {
            return Outcome::ReplyAndClose(Frame::Failed {
                message: format!("{} is not a request", frame_name(&other)),
            });
        }
    };
    Outcome::Reply(reply)
}

fn wait_or_answer(table: &Table, mut parked: Parked, timeout: Duration) -> Outcome {
    match parked.poll(table) {
        Some(reply) => Outcome::Reply(reply),
        None if timeout.is_zero() => Outcome::Reply(parked.timed_out(table, timeout)),
        None => Outcome::Park { parked, timeout },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONG: Duration = Duration::from_secs(60);

    fn key(i: u64) -> Key {
        Key::new("k").push(i)
    }

    #[test]
    fn a_wait_parks_on_each_missing_key_in_turn() {
        let mut table = Table::default();
        let mut woken = Vec::new();
        let request = Frame::Wait {
            keys: vec![key(0), key(1), key(2)],
            timeout: LONG,
        };
        let Outcome::Park { mut parked, .. } = answer(&mut table, request, LONG, &mut woken) else {
            panic!("an empty table cannot answer a wait")
        };
        assert_eq!(parked.watched(), &key(0));
        table.set(key(0), Vec::new(), &mut woken);
        table.set(key(2), Vec::new(), &mut woken);
        assert_eq!(parked.poll(&table), None);
        assert_eq!(parked.watched(), &key(1));
        table.set(key(1), Vec::new(), &mut woken);
        assert_eq!(parked.poll(&table), Some(Frame::Done));
    }

    #[test]
    fn a_wait_notices_a_key_deleted_after_it_was_seen() {
        let mut table = Table::default();
        let mut woken = Vec::new();
        table.set(key(0), Vec::new(), &mut woken);
        let mut parked = Parked::Wait {
            keys: vec![key(0), key(1)],
            next: 0,
            deletes: table.deletes(),
        };
        assert_eq!(parked.poll(&table), None);
        assert_eq!(parked.watched(), &key(1));
        table.delete(&key(0));
        table.set(key(1), Vec::new(), &mut woken);
        assert_eq!(parked.poll(&table), None);
        assert_eq!(parked.watched(), &key(0));
        assert_eq!(
            parked.timed_out(&table, LONG),
            Frame::TimedOut {
                missing: vec![key(0)],
                after: LONG
            }
        );
    }

    #[test]
    fn zero_timeouts_and_max_wait_are_honoured() {
        let mut table = Table::default();
        let mut woken = Vec::new();
        let get = Frame::Get {
            key: key(9),
            timeout: Duration::ZERO,
        };
        assert!(matches!(
            answer(&mut table, get, LONG, &mut woken),
            Outcome::Reply(Frame::TimedOut { .. })
        ));
        let get = Frame::Get {
            key: key(9),
            timeout: LONG,
        };
        let Outcome::Park { timeout, .. } =
            answer(&mut table, get, Duration::from_secs(1), &mut woken)
        else {
            panic!("a missing key parks the get")
        };
        assert_eq!(timeout, Duration::from_secs(1));
    }

    #[test]
    fn replies_are_not_requests() {
        let mut table = Table::default();
        assert!(matches!(
            answer(&mut table, Frame::Done, LONG, &mut Vec::new()),
            Outcome::ReplyAndClose(Frame::Failed { .. })
        ));
    }
}
