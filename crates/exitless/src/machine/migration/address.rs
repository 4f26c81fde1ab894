//! Where a migration goes: `tcp:HOST:PORT` or `unix:PATH`, connected to by the source and
//! listened on by the target (bound before the process confines itself: its filter allows no
//! bind(2)).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use crate::machine::migration::MigrationError;

/// A migration's address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    /// `tcp:HOST:PORT`: what `TcpStream::connect` resolves.
    Tcp(String),
    /// `unix:PATH`: a Unix socket's file.
    Unix(PathBuf),
    /// `local:PATH`: a Unix socket's file, to an exitless on this host that takes guest RAM
    /// and the devices' files as they are (a live update: nothing copied).
    Local(PathBuf),
}

impl FromStr for Address {
    type Err = MigrationError;

    fn from_str(text: &str) -> Result<Self, MigrationError> {
        let bad = || MigrationError::Address(text.into());
        for (prefix, unix) in [("unix:", true), ("local:", false)] {
            if let Some(path) = text.strip_prefix(prefix) {
                return match path {
                    "" => Err(bad()),
                    path if unix => Ok(Address::Unix(path.into())),
                    path => Ok(Address::Local(path.into())),
                };
            }
        }
        let host_port = text.strip_prefix("tcp:").ok_or_else(bad)?;
        let (host, port) = host_port.rsplit_once(':').ok_or_else(bad)?;
        if host.is_empty() || port.parse::<u16>().is_err() {
            return Err(bad());
        }
        Ok(Address::Tcp(host_port.into()))
    }
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Address::Tcp(host_port) => write!(f, "tcp:{host_port}"),
            Address::Unix(path) => write!(f, "unix:{}", path.display()),
            Address::Local(path) => write!(f, "local:{}", path.display()),
        }
    }
}

/// A migration's connection, either kind.
pub enum Stream {
    /// Over TCP.
    Tcp(TcpStream),
    /// Over a Unix socket.
    Unix(UnixStream),
}

impl Stream {
    /// The same connection, for a second reader or writer.
    pub fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }

    /// Give up on a read or a write that waits longer than `limit` (SO_RCVTIMEO,
    /// SO_SNDTIMEO): a peer that stopped is an error, not a hang.
    pub fn set_timeouts(&self, limit: Duration) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s
                .set_read_timeout(Some(limit))
                .and_then(|()| s.set_write_timeout(Some(limit))),
            Stream::Unix(s) => s
                .set_read_timeout(Some(limit))
                .and_then(|()| s.set_write_timeout(Some(limit))),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Address {
    /// How an error of the host's doing `what` with this address is said.
    pub(crate) fn failed(
        &self,
        what: &'static str,
    ) -> impl Fn(std::io::Error) -> MigrationError + Copy + '_ {
        move |source| MigrationError::Connect {
            what,
            address: self.to_string(),
            source,
        }
    }

    /// Connect to the target.
    pub fn connect(&self) -> Result<Stream, MigrationError> {
        let failed = self.failed("connect to the migration target at");
        match self {
            Address::Tcp(host_port) => {
                // An IP address and a port, never a name: a VMM that confines its threads
                // resolves no names (getaddrinfo reads files and opens sockets of its own).
                let at: SocketAddr = host_port.parse().map_err(|_| {
                    failed(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "give an IP address, not a host name",
                    ))
                })?;
                let stream = TcpStream::connect(at).map_err(failed)?;
                // The last records are small and answered: Nagle would hold them back.
                stream.set_nodelay(true).map_err(failed)?;
                Ok(Stream::Tcp(stream))
            }
            Address::Unix(path) | Address::Local(path) => {
                Ok(Stream::Unix(UnixStream::connect(path).map_err(failed)?))
            }
        }
    }

    /// A same-host live update's: guest RAM and the devices' files handed over.
    pub fn is_local(&self) -> bool {
        matches!(self, Address::Local(_))
    }

    /// Listen for one source. A Unix socket's path must not exist yet. `unix:` and `local:`
    /// listen alike: a source that hands files over makes it a live update.
    pub fn listen(&self) -> Result<Listener, MigrationError> {
        let failed = self.failed("listen for a migration on");
        match self {
            Address::Tcp(host_port) => {
                Ok(Listener::Tcp(TcpListener::bind(host_port).map_err(failed)?))
            }
            Address::Unix(path) | Address::Local(path) => Ok(Listener::Unix(
                UnixListener::bind(path).map_err(failed)?,
                path.clone(),
            )),
        }
    }
}

/// A target's listening socket, bound; a Unix socket's file goes when it is dropped.
pub enum Listener {
    /// On TCP.
    Tcp(TcpListener),
    /// On a Unix socket's file.
    Unix(UnixListener, PathBuf),
}

impl Listener {
    /// Wait for the source.
    pub fn accept(&self) -> io::Result<Stream> {
        match self {
            Listener::Tcp(l) => {
                let (stream, _) = l.accept()?;
                stream.set_nodelay(true)?;
                Ok(Stream::Tcp(stream))
            }
            Listener::Unix(l, _) => Ok(Stream::Unix(l.accept()?.0)),
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, path) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_read_back_as_written_and_others_are_refused() {
        for text in [
            "tcp:127.0.0.1:4444",
            "tcp:[::1]:80",
            "tcp:host:1",
            "unix:/run/x.sock",
            "local:/run/y.sock",
        ] {
            assert_eq!(text.parse::<Address>().unwrap().to_string(), text);
        }
        for text in [
            "",
            "tcp:",
            "tcp:host",
            "tcp::80",
            "tcp:host:99999",
            "unix:",
            "local:",
            "udp:h:1",
        ] {
            let err = text.parse::<Address>().unwrap_err().to_string();
            assert!(
                err.contains("give tcp:HOST:PORT, unix:PATH or local:PATH"),
                "{err}"
            );
        }
    }
}
