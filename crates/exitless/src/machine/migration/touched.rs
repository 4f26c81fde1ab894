//! Which pages of guest RAM this process ever touched: present in its page tables or swapped
//! out, as `/proc/self/pagemap` says (Documentation/admin-guide/mm/pagemap.rst: bit 63
//! "present", bit 62 "swapped"; the flags need no privilege, only the frame numbers do).
//!
//! Private anonymous memory that was never written reads as zero and is in neither state; once
//! anything writes a page (the guest through KVM, a device thread, the kernel's vhost worker or
//! io_uring, all in this process's address space) it is present, and it stays present or
//! swapped. So a migration's scans hash only these pages, and those it sent before: a guest
//! that touched little of its RAM costs little at the switch-over. Guest RAM that is a shared
//! file (a memfd another process maps) is scanned whole: another process's writes need not
//! touch this one's page tables. By hand: no crate in the tree reads pagemap.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use crate::machine::migration::stream::PAGE;

/// pagemap's flags: the page is present in RAM, or swapped out.
const PRESENT: u64 = 1 << 63;
const SWAPPED: u64 = 1 << 62;

/// Entries read at a time: 2 MiB of guest RAM's worth.
const CHUNK: usize = 512;

/// This process's page map.
pub struct PageMap(File);

impl PageMap {
    /// Open `/proc/self/pagemap`.
    pub fn open() -> io::Result<Self> {
        File::open("/proc/self/pagemap").map(PageMap)
    }

    /// For each page of the `len` bytes mapped at `host` (page-aligned), whether it was ever
    /// touched.
    pub fn touched(&self, host: usize, len: usize) -> io::Result<Vec<bool>> {
        let pages = len.div_ceil(PAGE);
        let mut touched = Vec::with_capacity(pages);
        let mut entries = vec![0u8; CHUNK * 8];
        for first in (0..pages).step_by(CHUNK) {
            let n = CHUNK.min(pages - first);
            let at = ((host / PAGE + first) * 8) as u64;
            self.0.read_exact_at(&mut entries[..n * 8], at)?;
            touched.extend(entries[..n * 8].chunks(8).map(|entry| {
                let entry = u64::from_le_bytes(entry.try_into().expect("8 bytes"));
                entry & (PRESENT | SWAPPED) != 0
            }));
        }
        Ok(touched)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_written_is_touched_and_one_never_written_is_not() {
        let len = 8 * PAGE;
        // SAFETY: a fresh private anonymous mapping, unmapped below; nothing else uses it.
        let host = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(host, libc::MAP_FAILED);
        // SAFETY: page 3 of the mapping above.
        unsafe { host.cast::<u8>().add(3 * PAGE).write_volatile(1) };
        let touched = PageMap::open()
            .unwrap()
            .touched(host as usize, len)
            .unwrap();
        // SAFETY: the mapping made above, no longer used.
        unsafe { libc::munmap(host, len) };
        let expected: Vec<bool> = (0..8).map(|p| p == 3).collect();
        assert_eq!(touched, expected);
    }
}
