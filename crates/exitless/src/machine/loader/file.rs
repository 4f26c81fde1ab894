//! A kernel or initrd file, opened so that nothing a user names can hang or exhaust the VMM
//! before the guest starts: the open never blocks (a FIFO opened `O_NONBLOCK` for reading
//! returns at once, open(2)), only a regular file is taken (a character device such as
//! `/dev/zero` has no end, a directory no bytes), a file larger than the guest's RAM is
//! refused by its size before a byte is read, and the loaders read only the ranges they load
//! (pread(2), so each read is one allocation of the size the format's headers gave, checked
//! against the file's).

use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use crate::host_file;
use crate::machine::loader::elf;

/// Bytes of a kernel file read to find its format and headers: more than a multiboot
/// header's search area (8 KiB), a bzImage's setup header (to 0x290) and an ELF header.
pub const HEAD: u64 = 64 << 10;

/// Why a kernel or initrd file is not taken.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// It cannot be opened or read.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// Not a regular file.
    #[error("it is {0}, not a regular file: give the path of an image file")]
    NotRegular(&'static str),
    /// More bytes than guest RAM.
    #[error(
        "it is {size} bytes, more than the machine's {ram} MiB of RAM can hold (--memory)",
        ram = ram >> 20
    )]
    TooLarge {
        /// Its size.
        size: u64,
        /// Bytes of guest RAM.
        ram: u64,
    },
}

/// Why a kernel could not be read from its file: the file failed, or its format's loader
/// refused it.
#[derive(Debug)]
pub enum ReadError<E> {
    /// Reading the file.
    Io(io::Error),
    /// The format's refusal.
    Format(E),
}

impl<E> ReadError<E> {
    /// The same failure, the format's refusal made another error.
    pub fn map<F>(self, f: impl FnOnce(E) -> F) -> ReadError<F> {
        match self {
            ReadError::Io(e) => ReadError::Io(e),
            ReadError::Format(e) => ReadError::Format(f(e)),
        }
    }
}

/// A regular file of at most the guest's RAM, read range by range.
#[derive(Debug)]
pub struct ImageFile {
    file: File,
    len: u64,
}

impl ImageFile {
    /// Open `path` without blocking and check it: a regular file of at most `ram` bytes.
    pub fn open(path: &Path, ram: u64) -> Result<Self, FileError> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)?;
        let meta = file.metadata()?;
        if !meta.file_type().is_file() {
            return Err(FileError::NotRegular(host_file::kind(meta.file_type())));
        }
        let len = meta.len();
        if len > ram {
            return Err(FileError::TooLarge { size: len, ram });
        }
        Ok(ImageFile { file, len })
    }

    /// Its size in bytes, as it was opened.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes of `range`, clipped to the file's size: a file that shrank since it was
    /// opened gives an error, never more than the size checked at the open.
    pub fn read(&self, range: Range<u64>) -> io::Result<Vec<u8>> {
        let end = range.end.min(self.len);
        let len = usize::try_from(end.saturating_sub(range.start))
            .map_err(|_| io::Error::other("a range larger than memory"))?;
        let mut bytes = vec![0; len];
        self.file.read_exact_at(&mut bytes, range.start)?;
        Ok(bytes)
    }

    /// The start of a kernel file, where its format and headers are: the first [`HEAD`]
    /// bytes, and for an ELF file as far as its program header table's end, where the file
    /// has that much ([`elf::headers_end`]).
    pub fn kernel_head(&self) -> io::Result<Vec<u8>> {
        let head = self.read(0..HEAD)?;
        match elf::headers_end(&head) {
            Some(end) if end > HEAD && end <= self.len => self.read(0..end),
            _ => Ok(head),
        }
    }

    /// The whole file (at most the guest's RAM, checked at the open).
    pub fn read_all(&self) -> io::Result<Vec<u8>> {
        self.read(0..self.len)
    }

    /// The bytes of `range` of the file, inside it: a segment's ([`contents`]).
    ///
    /// [`contents`]: crate::machine::loader::segment::contents
    pub fn read_segment(&self, range: Range<usize>) -> io::Result<Vec<u8>> {
        self.read(range.start as u64..range.end as u64)
    }
}
