//! The translation structures in guest memory (VT-d chapter 9), walked for one request: the
//! root table (one entry per bus), a context table per bus (one entry per device/function)
//! and a 4-level second-level page table per domain, of 4 KiB and 2 MiB pages. Every read of guest
//! memory is checked: a structure outside guest RAM is a fault with its own reason, never a
//! host access elsewhere. With four fixed levels a walk cannot loop.

// Register, entry and descriptor fields are cut to their width, as the hardware cuts them.
#![allow(clippy::cast_possible_truncation)]

use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use super::regs::*;
use crate::dma::Access;

/// Size of a page, and of every table (VT-d §9: tables are 4 KiB).
pub const PAGE_SIZE: u64 = 0x1000;
/// Bits of the offset inside a page.
pub const PAGE_SHIFT: u32 = 12;
/// Levels of a second-level table with a 48-bit address width (§3.6: 4-level, SAGAW bit 2).
const LEVELS: u32 = 4;
/// Address bits each level translates: 512 eight-byte entries per table.
const LEVEL_BITS: u32 = 9;
/// Bits 63:12 of a root or context entry: the address of the next structure.
const TABLE_ADDR_MASK: u64 = !(PAGE_SIZE - 1);

/// The paging-entry bit `access` needs (VT-d §3.6: a read needs R, a write needs W, at every
/// level).
fn permission(access: Access) -> u64 {
    match access {
        Access::Read => VTD_PTE_R,
        Access::Write => VTD_PTE_W,
    }
}

/// The fault reason when that bit is clear (§7.1.3: 5 for writes, 6 for reads).
fn denied(access: Access) -> u8 {
    match access {
        Access::Read => VTD_FR_READ,
        Access::Write => VTD_FR_WRITE,
    }
}

/// A present, valid context entry (§9.3), as the context cache keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Context {
    /// Domain ID: what IOTLB entries are tagged with.
    pub domain: u16,
    /// Guest-physical address of the second-level page table (SLPTPTR).
    pub page_table: u64,
}

/// A translated page (§9.8): where it is, how large, and what it allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Leaf {
    /// Guest-physical address of the page.
    pub page: u64,
    /// `PAGE_SIZE`, or `LARGE_PAGE_SIZE` for a PDE with PS set.
    pub size: u64,
    /// `VTD_PTE_R` and `VTD_PTE_W`, ANDed over the levels; never 0 (a page that allows
    /// nothing is not present, and is neither returned nor cached).
    pub permissions: u64,
}

impl Leaf {
    /// The guest-physical address of `iova` in this page, if `access` is allowed.
    pub fn allows(&self, iova: u64, access: Access) -> Result<u64, u8> {
        if self.permissions & permission(access) == 0 {
            return Err(denied(access));
        }
        Ok(self.page | iova & (self.size - 1))
    }

    /// Bytes from `iova` to the end of this page.
    pub fn rest(&self, iova: u64) -> u64 {
        self.size - iova % self.size
    }
}

/// One 64-bit entry `index` of the table at `table`, or `outside` if it is not guest RAM.
fn entry(mem: &GuestMemoryMmap, table: u64, index: u64, outside: u8) -> Result<u64, u8> {
    let at = table.checked_add(index * 8).ok_or(outside)?;
    mem.read_obj::<u64>(GuestAddress(at)).map_err(|_| outside)
}

/// The context entry of source-id `source` (bus in 15:8, device/function in 7:0) under the
/// root table at `root_table` (§3.4.3: root entry by bus, context entry by devfn).
pub fn context(mem: &GuestMemoryMmap, root_table: u64, source: u16) -> Result<Context, u8> {
    let (bus, devfn) = (u64::from(source >> 8), u64::from(source & 0xff));
    // Each root and context entry is 16 bytes: the low qword is entry 2n of the table.
    let root = entry(mem, root_table, 2 * bus, VTD_FR_ROOT_TABLE)?;
    if root & VTD_ROOT_P == 0 {
        return Err(VTD_FR_ROOT_NOT_PRESENT);
    }
    let table = root & TABLE_ADDR_MASK;
    let low = entry(mem, table, 2 * devfn, VTD_FR_CONTEXT_TABLE)?;
    if low & VTD_CTX_P == 0 {
        return Err(VTD_FR_CONTEXT_NOT_PRESENT);
    }
    let high = entry(mem, table, 2 * devfn + 1, VTD_FR_CONTEXT_TABLE)?;
    // Only translation through a 4-level table is offered (ECAP.PT = 0, SAGAW bit 2 only).
    if low & VTD_CTX_TT_MASK != 0 || high & 7 != VTD_CTX_AW_4LEVEL {
        return Err(VTD_FR_CONTEXT_INVALID);
    }
    Ok(Context {
        domain: (high >> VTD_CTX_DID_SHIFT) as u16,
        page_table: low & TABLE_ADDR_MASK,
    })
}

/// The upper three levels of a walk for one 2 MiB region of IOVAs (what a PDE-cache entry
/// holds, VT-d §6.2.4): the last-level table and the permissions ANDed above it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Directory {
    /// The page table (SLPTPTR) it was walked from: an entry is used only for a context
    /// with the same one.
    pub page_table: u64,
    /// Guest-physical address of the last-level table.
    pub table: u64,
    /// `VTD_PTE_R` and `VTD_PTE_W` ANDed over the three levels; never 0.
    pub permissions: u64,
}

/// What the upper three levels lead to: a last-level table, or a 2 MiB page (a PDE with PS
/// set is a leaf, cached in the IOTLB and not in the paging-structure cache, §6.2.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Upper {
    /// A last-level table.
    Table(Directory),
    /// A 2 MiB page.
    Large(Leaf),
}

/// Bits of an IOVA a last-level table translates: a [`Directory`] covers 2^21 bytes.
pub const DIRECTORY_SHIFT: u32 = PAGE_SHIFT + LEVEL_BITS;
/// Size of a 2 MiB page (CAP.SLLPS bit 0), the span of a [`Directory`].
pub const LARGE_PAGE_SIZE: u64 = 1 << DIRECTORY_SHIFT;

/// The index of `iova`'s entry in its table at `level` (0 is the last).
fn index(iova: u64, level: u32) -> u64 {
    (iova >> (PAGE_SHIFT + LEVEL_BITS * level)) & ((1 << LEVEL_BITS) - 1)
}

/// Walk `context`'s page table for `iova` (§3.6): four levels, or three to a 2 MiB page,
/// permissions ANDed down them. A level that allows nothing is not present (the fault reason
/// then follows `access`); a page-size bit above the PDE, or a 2 MiB page's address bits
/// 20:12, are reserved; a table or page outside guest RAM is a paging-entry error.
pub fn walk(
    mem: &GuestMemoryMmap,
    context: &Context,
    iova: u64,
    access: Access,
) -> Result<Leaf, u8> {
    match upper(mem, context, iova, access)? {
        Upper::Table(directory) => leaf(mem, &directory, iova, access),
        Upper::Large(leaf) => Ok(leaf),
    }
}

/// The upper three levels of [`walk`].
pub fn upper(
    mem: &GuestMemoryMmap,
    context: &Context,
    iova: u64,
    access: Access,
) -> Result<Upper, u8> {
    if iova >> VTD_ADDRESS_WIDTH != 0 {
        return Err(VTD_FR_ADDRESS_WIDTH);
    }
    let mut table = context.page_table;
    let mut permissions = VTD_PTE_R | VTD_PTE_W;
    for level in (1..LEVELS).rev() {
        let e = entry(mem, table, index(iova, level), VTD_FR_PTE)?;
        permissions &= e;
        if permissions == 0 {
            return Err(denied(access));
        }
        if e & VTD_PTE_PS != 0 {
            return large(mem, level, e, permissions).map(Upper::Large);
        }
        table = e & VTD_PTE_ADDR_MASK;
    }
    Ok(Upper::Table(Directory {
        page_table: context.page_table,
        table,
        permissions,
    }))
}

/// The 2 MiB page a PDE (`level` 1) with PS set maps (§9.8); PS is reserved higher up.
fn large(mem: &GuestMemoryMmap, level: u32, e: u64, permissions: u64) -> Result<Leaf, u8> {
    let offset = LARGE_PAGE_SIZE - 1;
    if level != 1 || e & VTD_PTE_ADDR_MASK & offset != 0 {
        return Err(VTD_FR_PTE_RESERVED);
    }
    let page = e & VTD_PTE_ADDR_MASK;
    // The whole page must be guest RAM: a translation covers it all.
    if !mem.check_range(GuestAddress(page), LARGE_PAGE_SIZE as usize) {
        return Err(VTD_FR_PTE);
    }
    Ok(Leaf {
        page,
        size: LARGE_PAGE_SIZE,
        permissions,
    })
}

/// The last level of [`walk`], under `directory` (from the walk or the cache).
pub fn leaf(
    mem: &GuestMemoryMmap,
    directory: &Directory,
    iova: u64,
    access: Access,
) -> Result<Leaf, u8> {
    let e = entry(mem, directory.table, index(iova, 0), VTD_FR_PTE)?;
    let permissions = directory.permissions & e;
    if permissions == 0 {
        return Err(denied(access));
    }
    let page = e & VTD_PTE_ADDR_MASK;
    // The VMM copies device data only to and from guest RAM.
    if !mem.check_range(GuestAddress(page), PAGE_SIZE as usize) {
        return Err(VTD_FR_PTE);
    }
    Ok(Leaf {
        page,
        size: PAGE_SIZE,
        permissions,
    })
}

/// Builds translation structures in guest memory, as a guest driver does, for the tests.
#[cfg(test)]
pub(crate) mod build {
    use super::*;

    /// A root table at `root`, with tables allocated from `next` upward.
    pub struct Tables {
        pub mem: GuestMemoryMmap,
        pub root: u64,
        next: u64,
    }

    impl Tables {
        /// Empty tables in pages from `root` up.
        pub fn new(mem: &GuestMemoryMmap, root: u64) -> Self {
            let t = Tables {
                mem: mem.clone(),
                root,
                next: root + PAGE_SIZE,
            };
            t.zero(root);
            t
        }

        fn zero(&self, page: u64) {
            self.mem
                .write_slice(&[0u8; PAGE_SIZE as usize], GuestAddress(page))
                .unwrap();
        }

        fn page(&mut self) -> u64 {
            let page = self.next;
            self.next += PAGE_SIZE;
            self.zero(page);
            page
        }

        pub fn read(&self, at: u64) -> u64 {
            self.mem.read_obj(GuestAddress(at)).unwrap()
        }

        pub fn write(&self, at: u64, value: u64) {
            self.mem.write_obj(value, GuestAddress(at)).unwrap();
        }

        /// The entry at `at`, pointing at a new table unless it does already.
        fn table_at(&mut self, at: u64, flags: u64) -> u64 {
            let e = self.read(at);
            if e & flags != 0 {
                return e & VTD_PTE_ADDR_MASK;
            }
            let table = self.page();
            self.write(at, table | flags);
            table
        }

        /// Give `source` a context in `domain` with its own page table; returns the table.
        pub fn attach(&mut self, source: u16, domain: u16) -> u64 {
            let bus = u64::from(source >> 8);
            let devfn = u64::from(source & 0xff);
            let contexts = self.table_at(self.root + 16 * bus, VTD_ROOT_P);
            let at = contexts + 16 * devfn;
            let page_table = self.page();
            self.write(
                at + 8,
                VTD_CTX_AW_4LEVEL | u64::from(domain) << VTD_CTX_DID_SHIFT,
            );
            self.write(at, page_table | VTD_CTX_P);
            page_table
        }

        /// The address of the entry for `iova` at `level` (0: the last) under
        /// `page_table`, making the tables on the way (read and write at every upper level).
        fn entry_at(&mut self, page_table: u64, iova: u64, level: u32) -> u64 {
            let mut table = page_table;
            for upper in (level + 1..LEVELS).rev() {
                table = self.table_at(table + 8 * index(iova, upper), VTD_PTE_R | VTD_PTE_W);
            }
            table + 8 * index(iova, level)
        }

        /// The address of the last-level entry for `iova` under `page_table`.
        pub fn pte(&mut self, page_table: u64, iova: u64) -> u64 {
            self.entry_at(page_table, iova, 0)
        }

        /// Map the page at `iova` to `gpa` with `permissions` (`VTD_PTE_R | VTD_PTE_W`).
        pub fn map(&mut self, page_table: u64, iova: u64, gpa: u64, permissions: u64) {
            let pte = self.pte(page_table, iova);
            self.write(pte, gpa | permissions);
        }

        /// Map the 2 MiB page at `iova` to `gpa` with `permissions`: a PDE with PS set.
        pub fn map_large(&mut self, page_table: u64, iova: u64, gpa: u64, permissions: u64) {
            let pde = self.entry_at(page_table, iova, 1);
            self.write(pde, gpa | VTD_PTE_PS | permissions);
        }

        /// Clear the last-level entry of `iova`.
        pub fn unmap(&mut self, page_table: u64, iova: u64) {
            let pte = self.pte(page_table, iova);
            self.write(pte, 0);
        }
    }
}

#[cfg(test)]
mod tests;
