//! A minimal QEMU firmware configuration device (fw_cfg), the traditional port interface of
//! QEMU's docs/specs/fw_cfg.rst: a 16-bit selector at 0x510 picks an item, and each byte read
//! from the data port at 0x511 returns the item's next byte (zeros past its end). The items are
//! the ones test kernels written for QEMU read: the signature, the interface ID, the RAM size,
//! the CPU count and the file directory, with named files (the kernel command line). There is
//! no DMA interface (the ID says so), and writes to items are ignored, as QEMU ignores them.

mod persist;

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use crate::bus::BusDevice;

/// The selector register ("Selector Register IOport: 0x510", fw_cfg.rst); the data register
/// follows at 0x511.
pub const FW_CFG_PORT: u16 = 0x510;
/// Ports decoded: the selector (16 bits) and the data register (8 bits).
pub const FW_CFG_PORTS_LEN: u16 = 2;

/// Offset of the data register from [`FW_CFG_PORT`].
const DATA_OFFSET: u64 = 1;

// Selector keys (fw_cfg.rst, "Selector Register"; QEMU include/standard-headers/linux/
// qemu_fw_cfg.h).
/// The signature item: "QEMU" in ASCII, how a guest detects the device.
pub const FW_CFG_SIGNATURE: u16 = 0x00;
/// Interface features, 32 bits little-endian: bit 0 the traditional interface, bit 1 DMA.
pub const FW_CFG_ID: u16 = 0x01;
/// Guest RAM in bytes, 64 bits little-endian.
pub const FW_CFG_RAM_SIZE: u16 = 0x03;
/// CPUs at boot, 16 bits little-endian.
pub const FW_CFG_NB_CPUS: u16 = 0x05;
/// The file directory: a big-endian count, then one [`FILE_ENTRY_LEN`]-byte entry per file.
pub const FW_CFG_FILE_DIR: u16 = 0x19;
/// The first selector given to a file; the next ones follow in name order.
pub const FW_CFG_FILE_FIRST: u16 = 0x20;
/// Selector bits that are not part of the key: bit 14 asks for a write (ignored), bit 15 picks
/// the architecture's own items (there are none here).
const KEY_MASK: u16 = 0x3fff;
const ARCH_LOCAL: u16 = 0x8000;

/// The traditional interface only (`FW_CFG_VERSION`): no DMA.
const ID_TRADITIONAL: u32 = 1;
/// Bytes of a file directory entry: size (4), select (2), reserved (2), name (56).
pub const FILE_ENTRY_LEN: usize = 64;
/// Longest file name: the entry's 56 bytes hold it with its terminating NUL.
pub const MAX_FILE_NAME: usize = 55;

/// Why an item list cannot be served.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FwCfgError {
    /// A file name longer than its directory entry holds.
    #[error("fw_cfg file name {0:?} is longer than {MAX_FILE_NAME} bytes")]
    NameTooLong(String),
    /// Two files of one name.
    #[error("fw_cfg file {0:?} is given twice")]
    Duplicate(String),
    /// More files than selectors.
    #[error("too many fw_cfg files")]
    TooManyFiles,
}

/// What the device tells the guest.
#[derive(Clone, Debug, Default)]
pub struct FwCfgContents {
    /// Guest RAM in bytes.
    pub ram_size: u64,
    /// vCPUs at boot.
    pub cpus: u16,
    /// Named files (`opt/…` for a VMM's own, as fw_cfg.rst asks), in any order.
    pub files: Vec<(String, Vec<u8>)>,
}

/// The selected item and how far into it the guest has read.
#[derive(Default)]
struct Cursor {
    key: Option<u16>,
    offset: usize,
}

/// The fw_cfg device: its items by selector key, and the guest's read cursor.
pub struct FwCfg {
    items: BTreeMap<u16, Vec<u8>>,
    cursor: Mutex<Cursor>,
}

impl FwCfg {
    /// A device serving `contents`.
    pub fn new(contents: FwCfgContents) -> Result<Self, FwCfgError> {
        let mut items = BTreeMap::from([
            (FW_CFG_SIGNATURE, b"QEMU".to_vec()),
            (FW_CFG_ID, ID_TRADITIONAL.to_le_bytes().to_vec()),
            (FW_CFG_RAM_SIZE, contents.ram_size.to_le_bytes().to_vec()),
            (FW_CFG_NB_CPUS, contents.cpus.to_le_bytes().to_vec()),
        ]);
        // QEMU keeps the directory sorted by name (fw_cfg.rst, "File Directory").
        let mut files = BTreeMap::new();
        for (name, data) in contents.files {
            if name.len() > MAX_FILE_NAME {
                return Err(FwCfgError::NameTooLong(name));
            }
            if files.contains_key(&name) {
                return Err(FwCfgError::Duplicate(name));
            }
            files.insert(name, data);
        }
        let count = u32::try_from(files.len()).map_err(|_| FwCfgError::TooManyFiles)?;
        let mut dir = count.to_be_bytes().to_vec();
        for (i, (name, data)) in files.into_iter().enumerate() {
            let select = u16::try_from(i)
                .ok()
                .and_then(|i| FW_CFG_FILE_FIRST.checked_add(i))
                .filter(|&s| s <= KEY_MASK)
                .ok_or(FwCfgError::TooManyFiles)?;
            let size = u32::try_from(data.len()).map_err(|_| FwCfgError::TooManyFiles)?;
            let mut entry = [0u8; FILE_ENTRY_LEN];
            entry[..4].copy_from_slice(&size.to_be_bytes());
            entry[4..6].copy_from_slice(&select.to_be_bytes());
            entry[8..8 + name.len()].copy_from_slice(name.as_bytes());
            dir.extend_from_slice(&entry);
            items.insert(select, data);
        }
        items.insert(FW_CFG_FILE_DIR, dir);
        Ok(FwCfg {
            items,
            cursor: Mutex::default(),
        })
    }

    fn cursor(&self) -> std::sync::MutexGuard<'_, Cursor> {
        self.cursor.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl BusDevice for FwCfg {
    /// The data register reads one byte at a time, each the selected item's next. Everything
    /// else reads all-ones: the selector is write-only and the registers have one width each.
    fn read(&self, offset: u64, data: &mut [u8]) {
        match (offset, data) {
            (DATA_OFFSET, [byte]) => {
                let mut cursor = self.cursor();
                let item = cursor.key.and_then(|k| self.items.get(&k));
                *byte = item
                    .and_then(|i| i.get(cursor.offset))
                    .copied()
                    .unwrap_or(0);
                cursor.offset = cursor.offset.saturating_add(1);
            }
            (_, data) => data.fill(0xff),
        }
    }

    /// A 16-bit write to the selector selects an item from its first byte; every other write
    /// is ignored.
    fn write(&self, offset: u64, data: &[u8]) {
        if let (0, &[lo, hi]) = (offset, data) {
            let selector = u16::from_le_bytes([lo, hi]);
            *self.cursor() = Cursor {
                key: (selector & ARCH_LOCAL == 0).then_some(selector & KEY_MASK),
                offset: 0,
            };
        }
    }
}

#[cfg(test)]
mod tests;
