//! The control socket (`exitless run --api-socket PATH`): a small HTTP/1.1 + JSON API on a Unix
//! socket, in Cloud Hypervisor's style, that reads a running machine's state and counters and
//! pauses, resumes and shuts it down; and its client (`exitless ctl`).
//!
//! One thread of its own ([`ThreadKind::Api`]) reads up to [`MAX_CLIENTS`] connections at once
//! and answers each request as soon as all of it is in, one at a time: a request is read under
//! a size limit ([`http::MAX_REQUEST`]) and a deadline of its own ([`REQUEST_DEADLINE`]), so a
//! client that says nothing, too much or half a request holds one place that long, never the
//! other clients and never the VM, whose vCPU and device threads never wait on it. Placed above `machine`: it sees the
//! machine only through its [`MachineView`]. Described for users in docs/api.md.

pub mod client;
pub mod http;
mod migration;
pub mod routes;

use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::api::migration::MigrationThread;
use crate::api::routes::Reply;
use crate::machine::{MachineError, MachineView};
use crate::seccomp::{self, ThreadKind};

/// Longest a client may take to send its whole request.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(2);
/// Longest a client may take to read the answer (a few hundred bytes, which the socket's
/// buffer holds: only a client that lets it fill up waits).
const ANSWER_DEADLINE: Duration = Duration::from_secs(2);
/// How long the server waits before it tries again to take a client it could not.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);
/// Most clients whose requests are read at once: each connection that says nothing holds one
/// place for [`REQUEST_DEADLINE`], and the rest wait in the listener's backlog meanwhile.
const MAX_CLIENTS: usize = 256;

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

/// The listening socket, bound; its file is removed when it is dropped, if it is still this
/// socket's.
#[derive(Debug)]
pub struct ApiSocket {
    listener: UnixListener,
    path: PathBuf,
    /// The socket file's device and inode once bound: what is at the path at the end is
    /// removed only if it is that file, not one a newer VMM bound there since.
    file: (u64, u64),
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
        let host = |source| SocketError::Host {
            path: path.to_owned(),
            source,
        };
        let listener = bound.map_err(host)?;
        let meta = fs::symlink_metadata(path).map_err(host)?;
        Ok(ApiSocket {
            listener,
            path: path.to_owned(),
            file: (meta.dev(), meta.ino()),
        })
    }

    /// Serve `view` on a thread of its own until the returned [`Server`] is dropped.
    pub fn serve(self, view: MachineView) -> Result<Server, MachineError> {
        let host = |what| move |source| MachineError::Host { what, source };
        let stop =
            Arc::new(EventFd::new(EFD_NONBLOCK).map_err(host("make the API thread's stop event"))?);
        let stop_here = stop.clone();
        let migration = MigrationThread::start(view.migrate.clone())
            .map_err(host("start the migration's thread"))?;
        let thread = seccomp::spawn(ThreadKind::Api, "api".into(), move || {
            self.accept_until(&stop_here, &view, &migration)
        })
        .map_err(host("start the API socket's thread"))?;
        Ok(Server {
            stop,
            thread: Some(thread),
        })
    }

    /// Serve clients until `stop` is signalled: up to [`MAX_CLIENTS`] read from at once,
    /// each request answered as soon as all of it is in, each client given up on at its own
    /// deadline; more clients wait in the listener's backlog. A migration runs on
    /// `migration`'s thread, its client answered when it ends (at the latest before this
    /// returns), the others meanwhile.
    fn accept_until(&self, stop: &EventFd, view: &MachineView, migration: &MigrationThread) {
        let mut clients: Vec<Client> = Vec::new();
        // The client whose migration is under way.
        let mut migrating: Option<UnixStream> = None;
        // When to try the listener again after an accept failed (out of descriptors, say).
        let mut listen_at = Instant::now();
        loop {
            let now = Instant::now();
            let listening = clients.len() < MAX_CLIENTS && now >= listen_at;
            let mut fds = vec![pollfd(stop.as_raw_fd()), pollfd(migration.done_fd())];
            if listening {
                fds.push(pollfd(self.listener.as_raw_fd()));
            }
            fds.extend(clients.iter().map(|c| pollfd(c.stream.as_raw_fd())));
            let wake = clients.iter().map(|c| c.deadline);
            let wake = wake.chain((!listening && clients.len() < MAX_CLIENTS).then_some(listen_at));
            let timeout = wake.min().map(|at| at.saturating_duration_since(now));
            if !wait(&mut fds, timeout) {
                continue;
            }
            if fds[0].revents != 0 {
                if let Some(mut client) = migrating.take()
                    && let Some((to, sent)) = migration.wait()
                {
                    let _ = routes::migration_answer(&to, sent).send(&mut client, ANSWER_DEADLINE);
                }
                return;
            }
            if fds[1].revents != 0
                && let Some((to, sent)) = migration.ended()
                && let Some(mut client) = migrating.take()
            {
                let _ = routes::migration_answer(&to, sent).send(&mut client, ANSWER_DEADLINE);
            }
            let ready = fds[if listening { 3 } else { 2 }..]
                .iter()
                .map(|f| f.revents != 0);
            let now = Instant::now();
            let mut waiting = Vec::with_capacity(clients.len());
            for (mut client, readable) in clients.drain(..).zip(ready) {
                match client.go_on(readable, now, view, migrating.is_some()) {
                    Next::Wait => waiting.push(client),
                    Next::Answered => {}
                    Next::Migrate(options) => {
                        migration.begin(options);
                        migrating = Some(client.stream);
                    }
                }
            }
            clients = waiting;
            if listening && fds[2].revents != 0 {
                match self.listener.accept() {
                    Ok((stream, _)) => clients.push(Client {
                        stream,
                        incoming: http::Incoming::default(),
                        deadline: Instant::now() + REQUEST_DEADLINE,
                    }),
                    // The client waits in the backlog; try again later rather than spin on a
                    // listener that stays readable.
                    Err(_) => listen_at = Instant::now() + ACCEPT_RETRY,
                }
            }
        }
    }
}

/// A client whose request is still arriving, and when all of it must be in.
struct Client {
    stream: UnixStream,
    incoming: http::Incoming,
    deadline: Instant,
}

/// What comes of a client's turn.
enum Next {
    /// Its request is not all in yet.
    Wait,
    /// It was answered, or is gone.
    Answered,
    /// It asked for a migration: answered when that ends.
    Migrate(crate::machine::migration::MigrationOptions),
}

impl Client {
    /// Read what the client sent if `readable`, and answer once its request is whole, bad, or
    /// late at `now` (408); `migrating` while a migration is under way.
    fn go_on(&mut self, readable: bool, now: Instant, view: &MachineView, migrating: bool) -> Next {
        let received = if readable {
            self.incoming.receive(&self.stream)
        } else {
            Ok(None)
        };
        let response = match received {
            Ok(Some(request)) => match routes::answer(&request, view, migrating) {
                Reply::Now(response) => response,
                Reply::Migrate(options) => return Next::Migrate(options),
            },
            Ok(None) if now < self.deadline => return Next::Wait,
            Ok(None) => http::Response::error(
                408,
                &format!("the request did not arrive within {REQUEST_DEADLINE:?}"),
            ),
            Err(e) => match e.status() {
                Some(status) => http::Response::error(status, &e.to_string()),
                // Gone: nobody to answer.
                None => return Next::Answered,
            },
        };
        let _ = response.send(&mut self.stream, ANSWER_DEADLINE);
        Next::Answered
    }
}

/// A pollfd waiting for `fd` to be readable.
fn pollfd(fd: libc::c_int) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// Wait until one of `fds` is readable or `timeout` passes (`None`: no limit); false if
/// interrupted by a signal, to be tried again.
fn wait(fds: &mut [libc::pollfd], timeout: Option<Duration>) -> bool {
    // Rounded up: a deadline a fraction of a millisecond away is not a busy loop.
    let ms = timeout.map_or(-1, |t| {
        libc::c_int::try_from(t.as_micros().div_ceil(1000)).unwrap_or(libc::c_int::MAX)
    });
    let count = libc::nfds_t::try_from(fds.len()).expect("at most MAX_CLIENTS + 2");
    // SAFETY: `fds` holds `count` initialised pollfds that poll only writes the revents of;
    // every descriptor stays open for the call.
    let ready = unsafe { libc::poll(fds.as_mut_ptr(), count, ms) };
    ready >= 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted
}

impl Drop for ApiSocket {
    fn drop(&mut self) {
        let ours = fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.file);
        if ours {
            let _ = fs::remove_file(&self.path);
        }
    }
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
