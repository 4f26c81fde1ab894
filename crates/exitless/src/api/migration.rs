//! The thread `vm.send-migration` runs on ([`ThreadKind::Migration`]): a migration takes from
//! milliseconds to minutes, and meanwhile the API thread answers `vm.info` (where the migration
//! stands) and refuses what acts (409). Its own thread also keeps the sockets, KVM's dirty log
//! and the images' locks out of the API thread's seccomp filter.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::JoinHandle;

use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::machine::migration::{Migrated, MigrationError, MigrationOptions, SendMigration};
use crate::seccomp::{self, ThreadKind};

/// How a migration ended: where it went, and what was measured or why it failed.
pub type Ended = (String, Result<Migrated, MigrationError>);

/// The migration's thread, idle until asked; dropping it ends the thread once the migration
/// under way (if any) has ended.
pub struct MigrationThread {
    requests: Option<Sender<MigrationOptions>>,
    ended: Receiver<Ended>,
    /// Readable once a migration has ended.
    done: Arc<EventFd>,
    thread: Option<JoinHandle<()>>,
}

impl MigrationThread {
    /// Start the thread that sends the machine with `migrate` when asked.
    pub fn start(migrate: Arc<dyn SendMigration>) -> io::Result<Self> {
        let (requests, asked) = mpsc::channel::<MigrationOptions>();
        let (tell, ended) = mpsc::channel();
        let done = Arc::new(EventFd::new(EFD_NONBLOCK)?);
        let done_here = done.clone();
        let thread = seccomp::spawn(ThreadKind::Migration, "migration".into(), move || {
            for options in asked {
                let sent = migrate.send(&options);
                if tell.send((options.address.to_string(), sent)).is_err() {
                    return;
                }
                let _ = done_here.write(1);
            }
        })?;
        Ok(MigrationThread {
            requests: Some(requests),
            ended,
            done,
            thread: Some(thread),
        })
    }

    /// Send the machine as `options` say; [`MigrationThread::done_fd`] turns readable when
    /// it has ended.
    pub fn begin(&self, options: MigrationOptions) {
        if let Some(requests) = &self.requests {
            // Fails only if the thread is gone, which it is not while `self` lives.
            let _ = requests.send(options);
        }
    }

    /// What to poll for the migration's end.
    pub fn done_fd(&self) -> RawFd {
        self.done.as_raw_fd()
    }

    /// The migration's end, if it has ended.
    pub fn ended(&self) -> Option<Ended> {
        let _ = self.done.read();
        self.ended.try_recv().ok()
    }

    /// Wait for the migration under way to end.
    pub fn wait(&self) -> Option<Ended> {
        self.ended.recv().ok()
    }
}

impl Drop for MigrationThread {
    fn drop(&mut self) {
        self.requests = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
