//! A piece of a kernel image and its place in guest memory: what an ELF program header
//! (`PT_LOAD`) or a multiboot header's address fields describe, the unit the kernel loaders
//! check against the machine's memory map and then write.

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// `file` bytes of the image at `addr`, zeros up to `addr + mem_size`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// What the errors call it ("ELF segment 2", "the kernel").
    pub what: String,
    /// Its bytes in the image.
    pub file: std::ops::Range<usize>,
    /// Its guest-physical address.
    pub addr: u64,
    /// Bytes in memory, zeros after the file's.
    pub mem_size: u64,
}

impl Segment {
    /// One past its last guest-physical byte.
    pub fn end(&self) -> u64 {
        self.addr + self.mem_size
    }

    /// Whether guest-physical `addr` is inside it.
    pub fn contains(&self, addr: u64) -> bool {
        self.addr <= addr && addr < self.end()
    }
}

/// The file bytes of each of `segments`, by `read` (from a file: [`ImageFile::read`], so that
/// only what is loaded is read; or from an image in memory).
///
/// [`ImageFile::read`]: crate::machine::loader::file::ImageFile::read
pub fn contents<E>(
    segments: &[Segment],
    read: impl FnMut(std::ops::Range<usize>) -> Result<Vec<u8>, E>,
) -> Result<Vec<Vec<u8>>, E> {
    segments.iter().map(|s| s.file.clone()).map(read).collect()
}

/// The file bytes of each of `segments` out of `image`, the whole file in memory.
pub fn contents_of(image: &[u8], segments: &[Segment]) -> Vec<Vec<u8>> {
    segments
        .iter()
        .map(|s| image[s.file.clone()].to_vec())
        .collect()
}

/// Write `segments`, whose file bytes are `contents` ([`contents`]), into `mem`, zero-filling
/// each past its file bytes (an ELF segment's bss, a multiboot kernel's up to
/// `bss_end_addr`).
pub fn write_segments(
    mem: &GuestMemoryMmap,
    segments: &[Segment],
    contents: &[Vec<u8>],
) -> Result<(), vm_memory::GuestMemoryError> {
    for (s, bytes) in segments.iter().zip(contents) {
        mem.write_slice(bytes, GuestAddress(s.addr))?;
        let bss = usize::try_from(s.mem_size).expect("inside RAM") - bytes.len();
        mem.write_slice(&vec![0; bss], GuestAddress(s.addr + bytes.len() as u64))?;
    }
    Ok(())
}

/// One past the highest byte of `segments` (0 for none): where what a loader places above the
/// kernel may start.
pub fn kernel_end(segments: &[Segment]) -> u64 {
    segments.iter().map(Segment::end).max().unwrap_or(0)
}
