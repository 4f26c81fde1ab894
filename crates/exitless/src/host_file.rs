//! Host files that exitless opens on the user's word (a kernel, an initrd, a disk image, a
//! console): what kind of file a path turned out to be, in words for an error line, and how to
//! make a descriptor opened with `O_NONBLOCK` (so that opening a FIFO never waits, fifo(7))
//! block again for the reads and writes that follow.

use std::fs::{File, FileType};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;

/// What a file is, in words: "a directory", "a FIFO", ….
pub fn kind(t: FileType) -> &'static str {
    if t.is_file() {
        "a regular file"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// Clear `O_NONBLOCK`, which was only for the open: the reads and writes that follow wait for
/// the disk or a slow reader, as their callers expect.
pub fn set_blocking(file: &File) -> io::Result<()> {
    let fd = file.as_raw_fd();
    // SAFETY: F_GETFL and F_SETFL read and set the status flags of a descriptor `file` owns;
    // no memory is passed.
    let ok = unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) == 0
    };
    if ok {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
