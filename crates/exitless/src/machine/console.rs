//! Where a machine's serial console writes: stdout, or `--console FILE`, checked before the
//! guest runs so that its output is never thrown away unseen.
//!
//! A target that cannot be written is refused at start. "Cannot be written" means: it cannot
//! be opened for writing (no such directory, no permission, a directory; `/proc/version` on a
//! host that refuses the open), it is a FIFO no process has open for reading (open(2) with
//! O_NONBLOCK fails with ENXIO, rather than waiting for ever), or a zero-length write to it
//! fails (write(2): "If count is zero and fd refers to a file other than a regular file, the
//! results are not specified", and Linux's `/dev/full` and `/proc/version` answer ENOSPC and
//! EIO). A regular file whose file system fills up later is not caught here: its write error
//! is reported when it happens. A console file that is also a `--disk` image is refused.
//!
//! The file is opened without O_TRUNC and emptied by [`Truncate::now`] only once every other
//! device is wired, so a run refused for a later option leaves the last run's log as it was.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::devices::serial::ConsoleOutput;
use crate::host_file;
use crate::machine::config::{Console, DiskConfig};

/// Why the console's target cannot be used. Each message is one line.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    /// open(2) failed.
    #[error("cannot open the console file {path}: {source}")]
    Open {
        /// The file.
        path: PathBuf,
        /// The error opening it.
        #[source]
        source: io::Error,
    },
    /// A FIFO with no reader.
    #[error(
        "--console {path}: a FIFO that no process reads; start its reader first, or give a file"
    )]
    NoReader {
        /// The FIFO.
        path: PathBuf,
    },
    /// A zero-length write failed.
    #[error("{target}: cannot be written ({source}); give a file or terminal that takes output")]
    NotWritable {
        /// The option that named it.
        target: String,
        /// The write's error.
        #[source]
        source: io::Error,
    },
    /// The file is one of the machine's disks.
    #[error(
        "--console {path} is also the disk image {disk}: the console would overwrite it; give \
         the console another file"
    )]
    IsDisk {
        /// The console file.
        path: PathBuf,
        /// The disk, as given.
        disk: PathBuf,
    },
    /// Emptying the file failed.
    #[error("cannot empty the console file {path}: {source}")]
    Truncate {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
}

/// A console file to empty once the machine is wired. Dropped before that (the start was
/// refused), a file this run created is removed again: a refused start leaves nothing behind.
pub struct Truncate {
    file: File,
    path: PathBuf,
    /// Whether this run created the file (it was not there before).
    created: bool,
}

impl Truncate {
    /// Empty the file: every option has been checked.
    pub fn now(mut self) -> Result<(), ConsoleError> {
        self.created = false;
        self.file
            .set_len(0)
            .map_err(|source| ConsoleError::Truncate {
                path: self.path.clone(),
                source,
            })
    }
}

impl Drop for Truncate {
    fn drop(&mut self) {
        if self.created {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Open where `console` says the output goes (`buffer` for memory), refusing a target that
/// cannot be written or that is one of `disks`. A regular file comes with its [`Truncate`].
pub fn open(
    console: &Console,
    disks: &[DiskConfig],
    buffer: &Arc<Mutex<Vec<u8>>>,
) -> Result<(ConsoleOutput, Option<Truncate>), ConsoleError> {
    let (file, truncate) = match console {
        Console::Buffer => return Ok((ConsoleOutput::Buffer(buffer.clone()), None)),
        Console::Stdout | Console::Stdio => (stdout()?, None),
        Console::File(path) => open_file(path, disks)?,
    };
    Ok((ConsoleOutput::Writer(Box::new(file)), truncate))
}

/// A descriptor of stdout, checked.
fn stdout() -> Result<File, ConsoleError> {
    let not_writable = |source| ConsoleError::NotWritable {
        target: "stdout (--console stdio)".into(),
        source,
    };
    let file = File::from(
        io::stdout()
            .as_fd()
            .try_clone_to_owned()
            .map_err(not_writable)?,
    );
    probe_write(&file).map_err(not_writable)?;
    Ok(file)
}

/// `path`, opened for writing without emptying it (created if absent), and checked.
fn open_file(path: &Path, disks: &[DiskConfig]) -> Result<(File, Option<Truncate>), ConsoleError> {
    let open = |create: bool| {
        OpenOptions::new()
            .write(true)
            .create_new(create)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
    };
    let (file, created) = match open(false) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => (open(true), true),
        file => (file, false),
    };
    let file = file.map_err(|source| match source.raw_os_error() {
        Some(libc::ENXIO) => ConsoleError::NoReader { path: path.into() },
        _ => ConsoleError::Open {
            path: path.into(),
            source,
        },
    })?;
    let opened = |source| ConsoleError::Open {
        path: path.into(),
        source,
    };
    let meta = file.metadata().map_err(opened)?;
    if let Some(disk) = disks.iter().find(|d| same_file(&meta, &d.path)) {
        return Err(ConsoleError::IsDisk {
            path: path.into(),
            disk: disk.path.clone(),
        });
    }
    probe_write(&file).map_err(|source| ConsoleError::NotWritable {
        target: format!("--console {}", path.display()),
        source,
    })?;
    // The console thread's writes wait for a slow reader (a FIFO, a terminal) rather than fail.
    host_file::set_blocking(&file).map_err(opened)?;
    let truncate = if meta.is_file() {
        let file = file.try_clone().map_err(opened)?;
        Some(Truncate {
            file,
            path: path.into(),
            created,
        })
    } else {
        None
    };
    Ok((file, truncate))
}

/// Whether `path` names the file `meta` describes (one device and inode, through any link).
fn same_file(meta: &std::fs::Metadata, path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.dev() == meta.dev() && m.ino() == meta.ino())
}

/// A zero-length write: a regular file or a pipe takes it, a device that refuses every write
/// does not.
fn probe_write(mut file: &File) -> io::Result<()> {
    file.write(&[]).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str) -> Console {
        Console::File(path.into())
    }

    fn refused(console: &Console, disks: &[DiskConfig]) -> String {
        match open(console, disks, &Arc::default()) {
            Ok(_) => panic!("{console:?} accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_console_that_refuses_writes_is_refused() {
        let line = refused(&file("/dev/full"), &[]);
        assert!(line.contains("/dev/full: cannot be written"), "{line}");
        let line = refused(&file("/proc/version"), &[]);
        assert!(line.contains("/proc/version"), "{line}");
        let line = refused(&file("/nonexistent/dir/log"), &[]);
        assert!(line.starts_with("cannot open the console file"), "{line}");
        assert!(open(&file("/dev/null"), &[], &Arc::default()).is_ok());
    }

    #[test]
    fn a_console_file_is_emptied_only_when_told() {
        let dir = std::env::temp_dir().join(format!("exitless-console-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("log");
        std::fs::write(&log, b"the last run").unwrap();
        let (_, truncate) = open(&Console::File(log.clone()), &[], &Arc::default()).unwrap();
        assert_eq!(std::fs::read(&log).unwrap(), b"the last run");
        truncate.expect("a regular file").now().unwrap();
        assert_eq!(std::fs::read(&log).unwrap(), b"");
        let disk = DiskConfig::new(&log);
        let line = refused(&Console::File(log.clone()), &[disk]);
        assert!(line.contains("is also the disk image"), "{line}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
