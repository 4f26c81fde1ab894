//! A same-host live update (`migrate local:PATH`): the source hands the target its guest
//! RAM's memfd and its devices' host files (disk images, tap queues) over the Unix socket
//! (SCM_RIGHTS, unix(7)) with the stream's first bytes, so no page is copied: the target maps
//! the same memory and runs on the same files, and only the devices' state crosses, in the
//! stream as for any migration. The way to replace the exitless binary under a running VM.
//!
//! The files go in one message, memfd first, then [`HostFiles::duplicates`]' order; the
//! target counts them against the configuration that follows before it uses any.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::net::UnixStream;

use vm_memory::{GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use crate::machine::config::NetBackendKind;
use crate::machine::migration::MigrationError;
use crate::machine::wiring::files::HostFiles;
use crate::machine::{MachineConfig, Ram};

/// Most descriptors one message carries (the kernel's SCM_MAX_FD).
const MAX_FILES: usize = 253;

/// Files a source hands over, as the target takes them: guest RAM's memfd, and the rest.
pub struct Handed {
    /// Guest RAM.
    pub memory: File,
    /// The disk images and tap queues, in order, not yet counted against the configuration.
    pub files: Vec<File>,
}

/// The files of a machine whose RAM is `memory` and whose devices run on `host`: the memfd,
/// then those. Refused with one line where RAM is private (nothing to hand over).
pub fn files_of(memory: &GuestMemoryMmap, host: &HostFiles) -> Result<Vec<File>, MigrationError> {
    let memfd = memory.iter().next().and_then(|r| r.file_offset());
    let Some(memfd) = memfd else {
        return Err(MigrationError::Unsupported(
            "private guest RAM (a live update hands RAM over: start it with --shared-memory)",
        ));
    };
    let mut files = vec![memfd.file().try_clone().map_err(handing)?];
    files.extend(host.duplicates().map_err(handing)?);
    if files.len() > MAX_FILES {
        return Err(MigrationError::Unsupported(
            "more disk images and tap queues than one message carries (252)",
        ));
    }
    Ok(files)
}

fn handing(source: io::Error) -> MigrationError {
    MigrationError::Connect {
        what: "hand files over to",
        address: "the live update's target".into(),
        source,
    }
}

/// Send `bytes`, the stream's first, with `files` (SCM_RIGHTS).
pub fn send_with(stream: &UnixStream, bytes: &[u8], files: &[File]) -> io::Result<()> {
    let fds: Vec<_> = files.iter().map(AsRawFd::as_raw_fd).collect();
    let sent = stream
        .send_with_fds(&[bytes], &fds)
        .map_err(|e| io::Error::from_raw_os_error(e.errno()))?;
    if sent != bytes.len() {
        // A Unix stream socket takes a message this small whole, or not at all.
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "a short first write",
        ));
    }
    Ok(())
}

/// Read up to `len` of the stream's first bytes, and the files sent with them if any: a
/// source migrating over `unix:` sends none.
pub fn receive_first(stream: &UnixStream, len: usize) -> io::Result<(Vec<u8>, Option<Handed>)> {
    let mut bytes = vec![0; len];
    let mut fds = [-1; MAX_FILES];
    let mut iov = [libc::iovec {
        iov_base: bytes.as_mut_ptr().cast(),
        iov_len: bytes.len(),
    }];
    // SAFETY: the iovec covers `bytes`, which lives across the call and may take any bytes.
    let (read, count) = unsafe { stream.recv_with_fds(&mut iov, &mut fds) }
        .map_err(|e| io::Error::from_raw_os_error(e.errno()))?;
    bytes.truncate(read);
    // SAFETY: recvmsg gave this process the first `count` descriptors; each is owned once.
    let mut files = fds[..count]
        .iter()
        .map(|&fd| unsafe { File::from_raw_fd(fd) });
    let handed = files.next().map(|memory| Handed {
        memory,
        files: files.collect(),
    });
    Ok((bytes, handed))
}

impl Handed {
    /// Guest RAM for the machine `cfg` describes on the memfd handed over, and the devices'
    /// files, counted against what `cfg` runs on.
    pub fn into_machine_parts(
        self,
        cfg: &MachineConfig,
    ) -> Result<(Ram, HostFiles), MigrationError> {
        let images = cfg.disks.iter().filter(|d| d.vhost_user.is_none()).count();
        let queues: Vec<usize> = (cfg.virtio.iter())
            .filter(|n| matches!(n.backend, NetBackendKind::Tap(_)))
            .map(|n| usize::from(n.queue_pairs))
            .collect();
        let given = self.files.len();
        let host = HostFiles::split(self.files, images, &queues).ok_or_else(|| {
            let wanted = images + queues.iter().sum::<usize>();
            MigrationError::Order(format!(
                "{given} device files handed over, for a machine that runs on {wanted}"
            ))
        })?;
        if !cfg.ram_is_shared() {
            return Err(MigrationError::Order(
                "guest RAM handed over for a machine whose RAM is private".into(),
            ));
        }
        let ram = Ram::handed(cfg, self.memory).map_err(Box::new)?;
        Ok((ram, host))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::config::{DiskConfig, VirtioNetConfig};

    /// A file to stand for a device's, holding `byte` so it can be told apart.
    fn file(byte: u8) -> File {
        let mut f = tempfile_in_memory();
        std::io::Write::write_all(&mut f, &[byte]).unwrap();
        f
    }

    fn tempfile_in_memory() -> File {
        // SAFETY: a NUL-terminated name; the call reads nothing else.
        let fd = unsafe { libc::memfd_create(c"t".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: a descriptor just made, owned once.
        unsafe { File::from_raw_fd(fd) }
    }

    fn first_byte(f: &File) -> u8 {
        let mut b = [0];
        std::os::unix::fs::FileExt::read_at(f, &mut b, 0).unwrap();
        b[0]
    }

    #[test]
    fn files_sent_with_the_first_bytes_arrive_with_them_in_order() {
        let (source, target) = UnixStream::pair().unwrap();
        let files: Vec<File> = (1..=4).map(file).collect();
        send_with(&source, b"EXLMIGR\n\x01\0\0\0", &files).unwrap();
        std::io::Write::write_all(&mut &source, b"more").unwrap();
        let (bytes, handed) = receive_first(&target, 12).unwrap();
        assert_eq!(bytes, b"EXLMIGR\n\x01\0\0\0");
        let handed = handed.unwrap();
        assert_eq!(first_byte(&handed.memory), 1);
        let rest: Vec<u8> = handed.files.iter().map(first_byte).collect();
        assert_eq!(rest, [2, 3, 4]);
        // A source that hands nothing over is an ordinary stream.
        std::io::Write::write_all(&mut &source, b"x").unwrap();
        let (bytes, handed) = receive_first(&target, 12).unwrap();
        assert_eq!(bytes, b"morex");
        assert!(handed.is_none());
    }

    #[test]
    fn files_that_do_not_fit_the_machine_are_refused_before_any_is_used() {
        let cfg = MachineConfig {
            disks: vec![DiskConfig::parse("a.img".as_ref()).unwrap()],
            virtio: vec!["tap=t0,queues=2".parse::<VirtioNetConfig>().unwrap()],
            shared_memory: true,
            ..MachineConfig::default()
        };
        let handed = |n: u8| Handed {
            memory: file(0),
            files: (0..n).map(file).collect(),
        };
        // An image and two tap queues: 3 files beside RAM.
        for n in [0, 2, 4] {
            let Err(e) = handed(n).into_machine_parts(&cfg) else {
                panic!("{n} files taken");
            };
            let said = e.to_string();
            assert!(
                said.contains(&format!(
                    "{n} device files handed over, for a machine that runs on 3"
                )),
                "{said}"
            );
        }
        // Three files, but RAM that is no sealed memfd of the machine's size.
        let Err(e) = handed(3).into_machine_parts(&cfg) else {
            panic!("an unsealed memfd taken");
        };
        assert!(e.to_string().contains("not sealed"), "{e}");
        let private = MachineConfig {
            shared_memory: false,
            ..cfg
        };
        let Err(e) = handed(3).into_machine_parts(&private) else {
            panic!("RAM handed over for private RAM taken");
        };
        assert!(e.to_string().contains("private"), "{e}");
    }

    #[test]
    fn split_lays_images_then_each_tap_s_queues() {
        let files: Vec<File> = (1..=5).map(file).collect();
        let host = HostFiles::split(files, 2, &[1, 2]).unwrap();
        let bytes = |v: &[File]| v.iter().map(first_byte).collect::<Vec<_>>();
        assert_eq!(bytes(&host.images), [1, 2]);
        assert_eq!(bytes(&host.taps[0]), [3]);
        assert_eq!(bytes(&host.taps[1]), [4, 5]);
        let again: Vec<u8> = host.duplicates().unwrap().iter().map(first_byte).collect();
        assert_eq!(again, [1, 2, 3, 4, 5]);
    }
}
