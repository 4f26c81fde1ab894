//! HTTP/1.1 on the control socket, as far as its API needs it: one request per connection,
//! read as it arrives under a size limit (the deadline is the server's), and one JSON answer, after which the server closes
//! the connection (`Connection: close`).
//!
//! Parsing is httparse's (the parser hyper uses). micro_http, the server Firecracker and Cloud
//! Hypervisor use, is not on crates.io (a crate of that name there is an unrelated async
//! server), and the full servers that are (hyper, tiny_http) bring a runtime or threads of their
//! own that the seccomp filters would have to allow. What is left by hand is small: reading
//! until the head and its body are in, and writing a status line and three headers.

use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use serde::Serialize;

/// Largest request taken, head and body: a few hundred bytes of head, and a body that is at
/// most `vm.snapshot`'s destination (a path: PATH_MAX is 4096).
pub const MAX_REQUEST: usize = 16 * 1024;
/// Most header lines in a request.
const MAX_HEADERS: usize = 32;

/// A request's method, path (its query, if any, left off) and body.
#[derive(Debug, PartialEq, Eq)]
pub struct Request {
    /// `GET`, `PUT`, ...
    pub method: String,
    /// `/api/v1/vm.info`, ...
    pub path: String,
    /// What followed the head, as long as its Content-Length said.
    pub body: Vec<u8>,
}

/// Why no request could be read.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// Not an HTTP/1.x request.
    #[error("malformed HTTP request: {0}")]
    Malformed(httparse::Error),
    /// A Content-Length that is not a number, or a Transfer-Encoding (not accepted).
    #[error("the request's body must be given by one Content-Length")]
    BadBody,
    /// Past [`MAX_REQUEST`].
    #[error("the request is larger than {MAX_REQUEST} bytes")]
    TooLarge,
    /// Not all of it arrived within the deadline.
    #[error("the request did not arrive within {0:?}")]
    TimedOut(Duration),
    /// The client closed the connection before a whole request.
    #[error("the client closed the connection")]
    Closed,
    /// Reading the socket failed.
    #[error("cannot read the request: {0}")]
    Io(io::Error),
}

impl RequestError {
    /// The status to answer with, if the client is still there to read it.
    pub fn status(&self) -> Option<u16> {
        match self {
            RequestError::Malformed(_) | RequestError::BadBody => Some(400),
            RequestError::TooLarge => Some(413),
            RequestError::TimedOut(_) => Some(408),
            RequestError::Closed | RequestError::Io(_) => None,
        }
    }
}

/// The length of the body the head at `buf[..head]` announces.
fn body_length(headers: &[httparse::Header<'_>]) -> Result<usize, RequestError> {
    let mut length = None;
    for h in headers {
        if h.name.eq_ignore_ascii_case("transfer-encoding")
            || (h.name.eq_ignore_ascii_case("content-length") && length.is_some())
        {
            return Err(RequestError::BadBody);
        }
        if h.name.eq_ignore_ascii_case("content-length") {
            let text = std::str::from_utf8(h.value).map_err(|_| RequestError::BadBody)?;
            length = Some(text.trim().parse().map_err(|_| RequestError::BadBody)?);
        }
    }
    Ok(length.unwrap_or(0))
}

/// The request in `buf`, if all of it is there (`None`: read more).
fn parse(buf: &[u8]) -> Result<Option<Request>, RequestError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    let head = match request.parse(buf).map_err(RequestError::Malformed)? {
        httparse::Status::Complete(head) => head,
        httparse::Status::Partial => return Ok(None),
    };
    let total = head
        .checked_add(body_length(request.headers)?)
        .filter(|&total| total <= MAX_REQUEST)
        .ok_or(RequestError::TooLarge)?;
    if buf.len() < total {
        return Ok(None);
    }
    // Complete, so both are there (httparse::Request::parse).
    let path = request.path.unwrap_or_default();
    let path = path.split_once('?').map_or(path, |(path, _)| path);
    Ok(Some(Request {
        method: request.method.unwrap_or_default().to_owned(),
        path: path.to_owned(),
        body: buf[head..total].to_vec(),
    }))
}

/// A request arriving on a connection, read as its bytes come, so that one server thread can
/// wait on many clients at once and a slow one holds up none of the others.
#[derive(Default)]
pub struct Incoming {
    buf: Vec<u8>,
}

impl Incoming {
    /// Read what `stream` holds now, without waiting (recv(2) with MSG_DONTWAIT: the socket
    /// itself stays blocking, for the answer), and return the request once all of it is in.
    /// `Ok(None)`: more is to come.
    pub fn receive(&mut self, stream: &UnixStream) -> Result<Option<Request>, RequestError> {
        let mut chunk = [0u8; 4096];
        loop {
            let room = (MAX_REQUEST - self.buf.len()).min(chunk.len());
            if room == 0 {
                return Err(RequestError::TooLarge);
            }
            // SAFETY: recv writes at most `room` bytes into `chunk`, which holds more; the
            // descriptor is the stream's, open for the call.
            let got = unsafe {
                libc::recv(
                    stream.as_raw_fd(),
                    chunk.as_mut_ptr().cast(),
                    room,
                    libc::MSG_DONTWAIT,
                )
            };
            match usize::try_from(got) {
                Ok(0) => return Err(RequestError::Closed),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(_) => {
                    let e = io::Error::last_os_error();
                    return match e.kind() {
                        io::ErrorKind::Interrupted => continue,
                        io::ErrorKind::WouldBlock => Ok(None),
                        _ => Err(RequestError::Io(e)),
                    };
                }
            }
            if let Some(request) = parse(&self.buf)? {
                return Ok(Some(request));
            }
        }
    }
}

/// An answer: a status and a JSON body.
#[derive(Debug, PartialEq, Eq)]
pub struct Response {
    /// The HTTP status.
    pub status: u16,
    /// The body, JSON.
    pub body: String,
}

/// `{"error": "..."}`, the body of every failed request.
#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
}

impl Response {
    /// `status` with `value` as its JSON body.
    pub fn json(status: u16, value: &impl Serialize) -> Self {
        let body = serde_json::to_string_pretty(value).expect("the API's types serialize");
        Response { status, body }
    }

    /// `status` with `{"error": message}`.
    pub fn error(status: u16, message: &str) -> Self {
        Response::json(status, &ErrorBody { error: message })
    }

    /// The status line, headers and body, as sent.
    pub fn to_bytes(&self) -> Vec<u8> {
        format!(
            "HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{}\n",
            self.status,
            reason(self.status),
            self.body.len() + 1,
            self.body
        )
        .into_bytes()
    }

    /// Send it on `stream`, giving up after `deadline` (a client that does not read).
    pub fn send(&self, stream: &mut UnixStream, deadline: Duration) -> io::Result<()> {
        stream.set_write_timeout(Some(deadline))?;
        stream.write_all(&self.to_bytes())
    }
}

/// The reason phrase of the statuses the API answers with (RFC 9110 §15).
fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Content Too Large",
        503 => "Service Unavailable",
        _ => "Internal Server Error",
    }
}

#[cfg(test)]
mod tests;
