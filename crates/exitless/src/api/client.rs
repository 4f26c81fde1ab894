//! `exitless ctl`: one request to a running `exitless run --api-socket`, and its answer.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::api::routes::{Endpoint, PAUSE_DEADLINE, PREFIX};

/// How long `exitless ctl` waits for an answer unless told (`--timeout`): a pause may take
/// [`PAUSE_DEADLINE`], a request may wait its turn behind another client's, and a snapshot
/// writes all of guest memory (a few seconds per GiB on a slow disk); a server that never
/// answers is given up on then.
pub const DEFAULT_ANSWER_WAIT: Duration = Duration::from_secs(30);
/// Largest answer read (vm.counters on a machine with many devices is a few KiB).
const MAX_ANSWER: u64 = 1 << 20;

const _: () = assert!(PAUSE_DEADLINE.as_secs() < DEFAULT_ANSWER_WAIT.as_secs());

/// What went wrong, before any answer.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing listens at the path.
    #[error(
        "cannot connect to {path}: {source} (is `exitless run --api-socket {path}` running?)",
        path = .path.display()
    )]
    Connect {
        /// The socket's path.
        path: PathBuf,
        /// The host's error.
        #[source]
        source: io::Error,
    },
    /// The exchange failed midway.
    #[error("the API socket: {0}")]
    Io(#[from] io::Error),
    /// The answer is not HTTP.
    #[error("the API socket answered with something that is not HTTP/1.1")]
    NotHttp,
    /// No whole answer came in time.
    #[error(
        "no answer from the API socket within {} s (the VMM is hung, or busy with a long \
         snapshot: --timeout SECONDS waits longer)",
        .0.as_secs()
    )]
    NoAnswer(Duration),
}

/// An answer: its status, and its JSON body.
#[derive(Debug)]
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// The body.
    pub body: String,
}

impl Answer {
    /// Whether the request was done (a 2xx status).
    pub fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The error the body gives (`{"error": "..."}`), or the body itself.
    pub fn error(&self) -> String {
        serde_json::from_str::<serde_json::Value>(&self.body)
            .ok()
            .and_then(|v| v.get("error")?.as_str().map(str::to_owned))
            .unwrap_or_else(|| self.body.trim().to_owned())
    }
}

/// Connect to the socket at `path` (before the caller confines itself: connect(2) is in no
/// thread's filter).
pub fn connect(path: &Path) -> Result<UnixStream, ClientError> {
    UnixStream::connect(path).map_err(|source| ClientError::Connect {
        path: path.to_owned(),
        source,
    })
}

/// Ask `endpoint` on `stream` with `body` (JSON, or empty), and read the whole answer, all of
/// it within `wait`.
pub fn request(
    mut stream: UnixStream,
    endpoint: Endpoint,
    body: &[u8],
    wait: Duration,
) -> Result<Answer, ClientError> {
    let head = format!(
        "{} {PREFIX}{} HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        endpoint.method(),
        endpoint.name(),
        body.len()
    );
    let late = |e: io::Error| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => ClientError::NoAnswer(wait),
        _ => ClientError::Io(e),
    };
    let end = Instant::now() + wait;
    stream.set_write_timeout(Some(wait))?;
    stream
        .write_all(&[head.as_bytes(), body].concat())
        .map_err(late)?;
    // Each read under what is left of `wait`: a server that trickles bytes is given up on too.
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ClientError::NoAnswer(wait));
        }
        stream.set_read_timeout(Some(left))?;
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) if bytes.len() as u64 + n as u64 > MAX_ANSWER => break,
            Ok(n) => bytes.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(late(e)),
        }
    }
    parse_answer(&bytes)
}

/// The status and body of a whole answer.
fn parse_answer(bytes: &[u8]) -> Result<Answer, ClientError> {
    let mut headers = [httparse::EMPTY_HEADER; 16];
    let mut response = httparse::Response::new(&mut headers);
    match response.parse(bytes) {
        Ok(httparse::Status::Complete(head)) => Ok(Answer {
            status: response.code.ok_or(ClientError::NotHttp)?,
            body: String::from_utf8_lossy(&bytes[head..]).into_owned(),
        }),
        _ => Err(ClientError::NotHttp),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::http::Response;

    #[test]
    fn an_answer_parses_to_its_status_and_error() {
        let sent = Response::error(400, "the VM is already paused").to_bytes();
        let answer = parse_answer(&sent).unwrap();
        assert_eq!(answer.status, 400);
        assert!(!answer.ok());
        assert_eq!(answer.error(), "the VM is already paused");
        assert!(parse_answer(b"SSH-2.0-OpenSSH\r\n").is_err());
        assert!(
            parse_answer(b"HTTP/1.1 200 OK\r\nContent-Le").is_err(),
            "cut short"
        );
    }
}
