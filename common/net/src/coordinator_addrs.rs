//! Where the coordinators are: one address, or a comma-separated list (`h1:7400,h2:7400,h3:7400`)
//! of the nodes of a replicated coordinator. The CLI, workers, trainers and the Python package
//! all parse `--coordinator` / `STOKER_COORDINATOR` here, so the syntax and the errors are the
//! same everywhere.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::str::FromStr;

/// A coordinator address list is empty or names something that is not an address.
#[derive(Debug, thiserror::Error)]
pub enum CoordinatorAddrsError {
    /// No address at all (an empty string, or only commas and spaces).
    #[error("no coordinator address in {text:?}: give HOST:PORT, or several as HOST:PORT,HOST:PORT,...")]
    Empty {
        /// What was given.
        text: String,
    },
    /// One entry of the list is empty (`a,,b`, or a trailing comma).
    #[error("coordinator entry {position} of {text:?} is empty: give HOST:PORT,HOST:PORT,...")]
    EmptyEntry {
        /// Its position, counted from 1.
        position: usize,
        /// The whole list.
        text: String,
    },
    /// One entry cannot be resolved (no port, unknown host, bad syntax).
    #[error("coordinator {entry:?} (entry {position} of {text:?}) is not an address: {reason} (expected HOST:PORT)")]
    Unresolvable {
        /// The entry.
        entry: String,
        /// Its position, counted from 1.
        position: usize,
        /// The whole list.
        text: String,
        /// The resolver's reason.
        reason: String,
    },
    /// One entry's name resolves to no address.
    #[error("coordinator {entry:?} (entry {position} of {text:?}) resolves to no address")]
    NoAddress {
        /// The entry.
        entry: String,
        /// Its position, counted from 1.
        position: usize,
        /// The whole list.
        text: String,
    },
}

/// The addresses of the coordinator nodes a client may call: at least one, no duplicates, in the
/// order given. Calls start at the first and follow the Raft leader from there
/// ([`super::QuicCoordinator`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoordinatorAddrs {
    addrs: Vec<SocketAddr>,
}

impl CoordinatorAddrs {
    /// One coordinator.
    pub fn one(addr: SocketAddr) -> Self {
        Self { addrs: vec![addr] }
    }

    /// `addrs` without duplicates (the first of each kept), or `None` when it is empty.
    pub fn from_addrs(addrs: impl IntoIterator<Item = SocketAddr>) -> Option<Self> {
        let mut unique: Vec<SocketAddr> = Vec::new();
        for addr in addrs {
            if !unique.contains(&addr) {
                unique.push(addr);
            }
        }
        (!unique.is_empty()).then_some(Self { addrs: unique })
    }

    /// Parse `HOST:PORT` or `HOST:PORT,HOST:PORT,...` (spaces around entries are ignored),
    /// resolving each name to its first address as a single `HOST:PORT` always was.
    pub fn parse(text: &str) -> Result<Self, CoordinatorAddrsError> {
        if text.split(',').all(|entry| entry.trim().is_empty()) {
            return Err(CoordinatorAddrsError::Empty { text: text.to_owned() });
        }
        let mut addrs = Vec::new();
        // A well-formed name that does not resolve now (a coordinator whose DNS record is gone
        // while its host is replaced) is skipped if another entry resolves: the others lead.
        let mut unresolved = None;
        for (index, entry) in text.split(',').enumerate() {
            let entry = entry.trim();
            let position = index + 1;
            if entry.is_empty() {
                return Err(CoordinatorAddrsError::EmptyEntry { position, text: text.to_owned() });
            }
            let well_formed = entry.rsplit_once(':').is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
            let resolved = match entry.to_socket_addrs() {
                Ok(mut resolved) => resolved.next().ok_or_else(|| CoordinatorAddrsError::NoAddress {
                    entry: entry.to_owned(),
                    position,
                    text: text.to_owned(),
                }),
                Err(error) => Err(CoordinatorAddrsError::Unresolvable {
                    entry: entry.to_owned(),
                    position,
                    text: text.to_owned(),
                    reason: error.to_string(),
                }),
            };
            match resolved {
                Ok(addr) => addrs.push(addr),
                Err(error) if well_formed && entry.parse::<SocketAddr>().is_err() => {
                    tracing::warn!(%error, "skipping a coordinator address that does not resolve");
                    unresolved.get_or_insert(error);
                }
                Err(error) => return Err(error),
            }
        }
        match (Self::from_addrs(addrs), unresolved) {
            (Some(addrs), _) => Ok(addrs),
            (None, Some(error)) => Err(error),
            (None, None) => Err(CoordinatorAddrsError::Empty { text: text.to_owned() }),
        }
    }

    /// The first address given.
    pub fn first(&self) -> SocketAddr {
        self.addrs[0]
    }

    /// Every address, in the order given.
    pub fn as_slice(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// How many addresses.
    pub fn len(&self) -> usize {
        self.addrs.len()
    }

    /// Always false: there is at least one address.
    pub fn is_empty(&self) -> bool {
        self.addrs.is_empty()
    }
}

impl From<SocketAddr> for CoordinatorAddrs {
    fn from(addr: SocketAddr) -> Self {
        Self::one(addr)
    }
}

impl FromStr for CoordinatorAddrs {
    type Err = CoordinatorAddrsError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

/// `a,b,c`: what [`CoordinatorAddrs::parse`] reads back.
impl fmt::Display for CoordinatorAddrs {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, addr) in self.addrs.iter().enumerate() {
            if index > 0 {
                formatter.write_str(",")?;
            }
            write!(formatter, "{addr}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(text: &str) -> SocketAddr {
        text.parse().expect("a socket address")
    }

    #[test]
    fn one_address_parses_as_a_list_of_one() {
        let addrs = CoordinatorAddrs::parse("127.0.0.1:7400").expect("parses");
        assert_eq!(addrs.as_slice(), &[addr("127.0.0.1:7400")]);
        assert_eq!(addrs.first(), addr("127.0.0.1:7400"));
        assert_eq!(addrs, CoordinatorAddrs::from(addr("127.0.0.1:7400")));
    }

    #[test]
    fn a_list_keeps_its_order_ignores_spaces_and_drops_duplicates() {
        let addrs = CoordinatorAddrs::parse(" 127.0.0.3:7400, 127.0.0.1:7400 ,[::1]:7401,127.0.0.3:7400").expect("parses");
        assert_eq!(addrs.as_slice(), &[addr("127.0.0.3:7400"), addr("127.0.0.1:7400"), addr("[::1]:7401")]);
        assert_eq!(addrs.to_string(), "127.0.0.3:7400,127.0.0.1:7400,[::1]:7401");
        assert_eq!(addrs.to_string().parse::<CoordinatorAddrs>().expect("round trip"), addrs);
    }

    #[test]
    fn names_are_resolved() {
        let addrs = CoordinatorAddrs::parse("localhost:7400,127.0.0.2:7400").expect("parses");
        assert!(addrs.first().ip().is_loopback() && addrs.first().port() == 7400, "{addrs}");
        assert_eq!(addrs.len(), 2);
    }

    #[test]
    fn an_empty_list_is_refused() {
        for text in ["", "  ", ",", " , "] {
            let error = CoordinatorAddrs::parse(text).expect_err("empty");
            assert!(matches!(error, CoordinatorAddrsError::Empty { .. }), "{text:?}: {error}");
            assert!(error.to_string().contains("HOST:PORT,HOST:PORT"), "{error}");
        }
    }

    #[test]
    fn an_empty_entry_is_named_by_its_position() {
        let error = CoordinatorAddrs::parse("127.0.0.1:7400,,127.0.0.2:7400").expect_err("empty entry");
        assert!(matches!(error, CoordinatorAddrsError::EmptyEntry { position: 2, .. }), "{error}");
        let error = CoordinatorAddrs::parse("127.0.0.1:7400,").expect_err("trailing comma");
        assert!(error.to_string().contains("entry 2"), "{error}");
    }

    #[test]
    fn a_bad_entry_is_named_in_the_error() {
        for (text, entry, position) in [
            ("127.0.0.1:7400,127.0.0.2", "127.0.0.2", 2),
            ("nonsense:port,127.0.0.1:7400", "nonsense:port", 1),
            ("127.0.0.1:99999", "127.0.0.1:99999", 1),
        ] {
            let error = CoordinatorAddrs::parse(text).expect_err("bad entry");
            let message = error.to_string();
            assert!(message.contains(&format!("{entry:?}")) && message.contains(&format!("entry {position}")), "{message}");
            assert!(message.contains("HOST:PORT"), "{message}");
        }
    }

    #[test]
    fn from_addrs_refuses_nothing_and_drops_duplicates() {
        assert!(CoordinatorAddrs::from_addrs([]).is_none());
        let addrs = CoordinatorAddrs::from_addrs([addr("127.0.0.1:1"), addr("127.0.0.1:1"), addr("127.0.0.1:2")]).expect("some");
        assert_eq!(addrs.as_slice(), &[addr("127.0.0.1:1"), addr("127.0.0.1:2")]);
    }
}
