//! The control socket (`exitless run --api-socket PATH`): a small HTTP/1.1 + JSON API on a Unix
//! socket, in Cloud Hypervisor's style, that reads a running machine's state and counters and
//! pauses, resumes and shuts it down; and its client (`exitless ctl`).
//!
//! One thread of its own ([`ThreadKind::Api`]) serves one connection at a time: a request is
//! read under a size limit ([`http::MAX_REQUEST`]) and a deadline ([`REQUEST_DEADLINE`]), so a
//! client that says nothing, too much or half a request costs the API that long and never the
//! VM, whose vCPU and device threads never wait on it. Placed above `machine`: it sees the
//! machine only through its [`MachineView`]. Described for users in docs/api.md.

pub mod client;
pub mod http;
pub mod routes;

use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::machine::{MachineError, MachineView};
use crate::seccomp::{self, ThreadKind};

/// Longest a client may take to send its whole request.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(2);
/// Longest a client may take to read the answer (a few hundred bytes, which the socket's
/// buffer holds: only a client that lets it fill up waits).
const ANSWER_DEADLINE: Duration = Duration::from_secs(2);
/// How long the server waits before it tries again to take a client it could not.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// Why the socket cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// Something else is at the path.
    #[error("--api-socket {0}: the path exists and is not a socket (remove it, or name another)")]
    NotASocket(PathBuf),
    /// A live socket is there: another VMM listens on it.
    #[error("--api-socket {0}: another process listens on it (name another path)")]
    InUse(PathBuf),
    /// The host refused.
    #[error("--api-socket {path}: {source}")]
    Host {
        /// The path.
        path: PathBuf,
        /// The host's error.
        #[source]
        source: io::Error,
    },
}

/// The listening socket, bound; its file is removed when it is dropped.
#[derive(Debug)]
pub struct ApiSocket {
    listener: UnixListener,
    path: PathBuf,
}

/// Remove a socket nobody listens on any more (a VMM that was killed leaves it behind); refuse
/// a live one or anything else at `path`.
fn clear_stale(path: &Path) -> Result<(), SocketError> {
    let host = |source| SocketError::Host {
        path: path.to_owned(),
        source,
    };
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(host(e)),
        Ok(meta) if !meta.file_type().is_socket() => Err(SocketError::NotASocket(path.to_owned())),
        Ok(_) => match UnixStream::connect(path) {
            Ok(_) => Err(SocketError::InUse(path.to_owned())),
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                fs::remove_file(path).map_err(host)
            }
            Err(e) => Err(host(e)),
        },
    }
}

impl ApiSocket {
    /// Listen at `path`, the file owner-only (0600). A stale socket there is replaced.
    pub fn bind(path: &Path) -> Result<Self, SocketError> {
        clear_stale(path)?;
        // bind(2) gives a socket's file the mode 0777 less the umask (unix(7)): with 0177 it
        // is 0600 from the start, with no moment where another user may connect.
        // SAFETY: umask only swaps the process's file mode mask; no thread creates files
        // meanwhile (this runs before the machine's threads start).
        let old = unsafe { libc::umask(0o177) };
        let bound = UnixListener::bind(path);
        // SAFETY: as above, putting the mask back.
        unsafe { libc::umask(old) };
        let listener = bound.map_err(|source| SocketError::Host {
            path: path.to_owned(),
            source,
        })?;
        Ok(ApiSocket {
            listener,
            path: path.to_owned(),
        })
    }

    /// Serve `view` on a thread of its own until the returned [`Server`] is dropped.
    pub fn serve(self, view: MachineView) -> Result<Server, MachineError> {
        let host = |what| move |source| MachineError::Host { what, source };
        let stop =
            Arc::new(EventFd::new(EFD_NONBLOCK).map_err(host("make the API thread's stop event"))?);
        let stop_here = stop.clone();
        let thread = seccomp::spawn(ThreadKind::Api, "api".into(), move || {
            self.accept_until(&stop_here, &view)
        })
        .map_err(host("start the API socket's thread"))?;
        Ok(Server {
            stop,
            thread: Some(thread),
        })
    }

    /// Take clients one at a time until `stop` is signalled.
    fn accept_until(&self, stop: &EventFd, view: &MachineView) {
        let mut fds = [
            libc::pollfd {
                fd: self.listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: stop.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        loop {
            // SAFETY: `fds` is an array of two initialised pollfds that poll only writes the
            // revents of; both descriptors stay open for the call.
            let ready = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
            if ready < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            if ready < 0 || fds[1].revents != 0 {
                return;
            }
            if fds[0].revents == 0 {
                continue;
            }
            match self.listener.accept() {
                Ok((stream, _)) => serve_client(stream, view),
                // Out of descriptors, say: the client waits in the backlog; try again later
                // rather than spin on a listener that stays readable.
                Err(_) => wait_readable(&mut fds[1..], ACCEPT_RETRY),
            }
        }
    }
}

/// Wait up to `timeout` for one of `fds` to be readable.
fn wait_readable(fds: &mut [libc::pollfd], timeout: Duration) {
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    let count = libc::nfds_t::try_from(fds.len()).expect("a few descriptors");
    // SAFETY: `fds` holds `count` initialised pollfds that poll only writes the revents of.
    unsafe { libc::poll(fds.as_mut_ptr(), count, ms) };
}

impl Drop for ApiSocket {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// Read one request from `stream` and answer it. A client that went away gets nothing; one
/// that sent a bad request gets its error.
fn serve_client(mut stream: UnixStream, view: &MachineView) {
    let response = match http::read_request(&mut stream, REQUEST_DEADLINE) {
        Ok(request) => routes::answer(&request, view),
        Err(e) => match e.status() {
            Some(status) => http::Response::error(status, &e.to_string()),
            None => return,
        },
    };
    let _ = response.send(&mut stream, ANSWER_DEADLINE);
}

/// The control socket's thread; dropping it stops the thread (after the request it is
/// serving, at most [`REQUEST_DEADLINE`] and the answer's) and removes the socket's file.
pub struct Server {
    stop: Arc<EventFd>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.stop.write(1);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
