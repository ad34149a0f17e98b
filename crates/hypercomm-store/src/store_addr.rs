//! [`StoreAddr`], the `host:port` of a store server: what a rank reads from its launcher's environment
//! ([`Rendezvous`](crate::Rendezvous)) and what it connects to, directly or through its node's relay. It has a
//! file of its own so that both of those can name it without importing each other.

use std::fmt;
use std::str::FromStr;

/// A store server's `host:port`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StoreAddr {
    /// Host name or IP address (IPv6 without brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
}

impl fmt::Display for StoreAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

impl FromStr for StoreAddr {
    type Err = String;

    /// Parses `host:port` or `[v6-address]:port`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (host, port) = s
            .rsplit_once(':')
            .ok_or_else(|| format!("{s:?} is not host:port"))?;
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if host.is_empty() {
            return Err(format!("{s:?} has an empty host"));
        }
        let port = port
            .parse::<u16>()
            .map_err(|_| format!("{s:?} has port {port:?}, not a number from 0 to 65535"))?;
        Ok(StoreAddr {
            host: host.to_owned(),
            port,
        })
    }
}
