//! MSI-X (PCI 3.0 §6.8.2) for any PCI function: the capability, the table (message address,
//! data and vector control of each entry), the pending-bit array, and Message Control (MSI-X
//! Enable, Function Mask).
//!
//! The model keeps only what the guest wrote to the table; the mask and pending bits and the
//! routes live in an [`MsiVectors`], which this model drives. Each guest access becomes at
//! most one [`MsiVectors::update`] holding complete address/data pairs, so no interrupt can use
//! a half-written message and an access that makes many vectors live at once (MSI-X Enable,
//! Function Mask clear) costs one routing commit when commits are batched.
//!
//! When a message takes effect (the rule the batching and `crates/exitless/tests/machine/msix.rs` rely on):
//! - at unmask of its entry: the entry is complete when software unmasks it (§6.8.2.9);
//! - at a data write while the entry is effectively unmasked (MSI-X enabled, entry and
//!   function unmasked): software should mask an entry before changing it, and if it did not,
//!   the data write is the last of the three (Linux's order), so the pair takes effect then;
//! - at MSI-X Enable or Function Mask clear: every unmasked entry, as it then is.
//!
//! While MSI-X is disabled the table is not in use, so address and data writes only land in it.

use std::sync::Arc;

use crate::guest_error;
use crate::irq::{MsiChange, MsiVectors};
use crate::pci::config::{Capability, ConfigSpace, touches};
use crate::pci::regs::*;

/// Most entries an MSI-X table can have: Table Size is 11 bits, N − 1 (PCI 3.0 §6.8.2.3).
pub const MAX_ENTRIES: usize = 2048;

/// Words of one entry as the guest wrote them: address low, address high, data. The mask bit
/// lives in the [`MsiVectors`].
pub type Entry = [u32; 3];

/// The MSI-X state of one function.
pub struct Msix {
    vectors: Arc<MsiVectors>,
    table: Vec<Entry>,
    /// Entries whose address or data the guest changed since their message last reached the
    /// vectors: what an Enable or a Function Mask clear must still hand over (the others'
    /// messages are there already, and an Enable of a large table must not pay for them).
    stale: Vec<bool>,
    /// Offset of the MSI-X capability in configuration space, once the function is placed.
    cap: Option<u16>,
    enabled: bool,
}

/// Where a structure lives: a BAR slot (the BIR) and the offset in it, 8-byte aligned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MsixLocation {
    /// BAR Indicator Register value: the BAR slot 0..=5.
    pub bir: u8,
    /// Offset in the BAR; bits 2:0 must be zero (they hold the BIR in the register).
    pub offset: u32,
}

impl MsixLocation {
    fn register(self) -> u32 {
        debug_assert!(self.offset.trailing_zeros() >= 3 && u32::from(self.bir) <= 5);
        self.offset | (u32::from(self.bir) & PCI_MSIX_BIR_MASK)
    }
}

impl Msix {
    /// The MSI-X capability for `entries` entries (clamped to 1..=[`MAX_ENTRIES`]) with its
    /// table and PBA at `table` and `pba`. Enable and Function Mask are the only writable bits.
    pub fn capability(entries: usize, table: MsixLocation, pba: MsixLocation) -> Capability {
        let size = u16::try_from(entries.clamp(1, MAX_ENTRIES) - 1).expect("≤ 2047");
        let mut body = size.to_le_bytes().to_vec();
        body.extend_from_slice(&table.register().to_le_bytes());
        body.extend_from_slice(&pba.register().to_le_bytes());
        Capability {
            id: PCI_CAP_ID_MSIX,
            body,
            body_wmask: (PCI_MSIX_FLAGS_ENABLE | PCI_MSIX_FLAGS_MASKALL)
                .to_le_bytes()
                .to_vec(),
        }
    }

    /// A table of one entry per vector of `vectors`, every entry zero (and masked, as the
    /// vectors start), MSI-X disabled.
    pub fn new(vectors: Arc<MsiVectors>) -> Self {
        Msix {
            table: vec![[0; 3]; vectors.len()],
            stale: vec![false; vectors.len()],
            vectors,
            cap: None,
            enabled: false,
        }
    }

    /// The vectors this table drives.
    pub fn vectors(&self) -> &Arc<MsiVectors> {
        &self.vectors
    }

    /// Whether MSI-X Enable is set.
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// The function was placed: find the capability in its configuration space.
    pub fn attached(&mut self, config: &ConfigSpace) {
        self.cap = config.find_capability(PCI_CAP_ID_MSIX);
    }

    /// The guest wrote `len` bytes of configuration space at `offset`. If that touched Message
    /// Control, apply Enable and Function Mask (in one update) and return `true`.
    pub fn config_written(&mut self, config: &ConfigSpace, offset: u16, len: usize) -> bool {
        let Some(flags) = self.cap.map(|cap| cap + PCI_MSIX_FLAGS) else {
            return false;
        };
        if !touches(offset, len, flags, 2) {
            return false;
        }
        let control = config.get_u16(flags);
        self.enabled = control & PCI_MSIX_FLAGS_ENABLE != 0;
        let function_masked = control & PCI_MSIX_FLAGS_MASKALL != 0;
        let mut changes = vec![
            MsiChange::FunctionMask(function_masked),
            MsiChange::Enable(self.enabled),
        ];
        // Entries software changed while the function was disabled or masked take effect
        // now, all in this one access: one routing commit when batched.
        if self.enabled && !function_masked {
            for i in 0..self.table.len() {
                if self.stale[i] && !self.vectors.is_masked(i) {
                    changes.push(self.entry_message(i));
                }
            }
        }
        self.vectors.update(&changes);
        true
    }

    /// The dword fields an access of `len` bytes at `offset` covers: aligned DWORDs and aligned
    /// QWORDs only (PCI 3.0 §6.8.2: other accesses have undefined results).
    fn dwords(offset: u64, len: usize) -> Option<impl Iterator<Item = u64>> {
        let aligned = match len {
            4 => offset.is_multiple_of(4),
            8 => offset.is_multiple_of(8),
            _ => false,
        };
        let count = u64::try_from(len / 4).expect("4 or 8");
        aligned.then(|| (0..count).map(move |i| offset + 4 * i))
    }

    /// Guest read of the table at `offset` (relative to the table's start). Entries past the
    /// table and other than aligned DWORD/QWORD accesses read zero.
    pub fn table_read(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let Some(dwords) = Self::dwords(offset, data.len()) else {
            guest_error!(
                self.vectors.log(),
                "MSI-X: {}-byte table read at {offset:#x} is not an aligned DWORD or QWORD; \
                 reads zero",
                data.len()
            );
            return;
        };
        for (chunk, dword) in data.chunks_exact_mut(4).zip(dwords) {
            chunk.copy_from_slice(&self.read_dword(dword).to_le_bytes());
        }
    }

    fn read_dword(&self, offset: u64) -> u32 {
        let Some((entry, field)) = self.locate(offset) else {
            return 0;
        };
        if field == PCI_MSIX_ENTRY_VECTOR_CTRL {
            u32::from(self.vectors.is_masked(entry))
        } else {
            self.table[entry][field as usize / 4]
        }
    }

    /// Entry index and field offset of table offset `offset`, if the entry exists.
    fn locate(&self, offset: u64) -> Option<(usize, u32)> {
        let size = u64::from(PCI_MSIX_ENTRY_SIZE);
        let entry = usize::try_from(offset / size).ok()?;
        let field = u32::try_from(offset % size).expect("< 16");
        (entry < self.table.len()).then_some((entry, field))
    }

    /// Guest write to the table at `offset`: an aligned DWORD or QWORD; anything else, and
    /// entries past the table, are ignored. The whole access is one update.
    pub fn table_write(&mut self, offset: u64, data: &[u8]) {
        let Some(dwords) = Self::dwords(offset, data.len()) else {
            guest_error!(
                self.vectors.log(),
                "MSI-X: {}-byte table write at {offset:#x} is not an aligned DWORD or QWORD; \
                 ignored",
                data.len()
            );
            return;
        };
        let mut changes = Vec::new();
        for (chunk, dword) in data.chunks_exact(4).zip(dwords) {
            let value = u32::from_le_bytes(chunk.try_into().expect("4-byte chunk"));
            self.write_dword(dword, value, &mut changes);
        }
        if !changes.is_empty() {
            self.vectors.update(&changes);
        }
    }

    fn write_dword(&mut self, offset: u64, value: u32, changes: &mut Vec<MsiChange>) {
        let Some((entry, field)) = self.locate(offset) else {
            guest_error!(
                self.vectors.log(),
                "MSI-X: table offset {offset:#x} is past the table; write ignored"
            );
            return;
        };
        if field == PCI_MSIX_ENTRY_VECTOR_CTRL {
            let masked = value & PCI_MSIX_ENTRY_CTRL_MASKBIT != 0;
            if !masked {
                // The entry is complete when software unmasks it (PCI 3.0 §6.8.2.9).
                changes.push(self.entry_message(entry));
            }
            changes.push(MsiChange::Mask {
                index: entry,
                masked,
            });
            return;
        }
        self.table[entry][field as usize / 4] = value;
        self.stale[entry] = true;
        // The data write of an effectively unmasked entry completes the pair (module comment).
        // In a QWORD access the data dword comes before vector control, so the mask is the
        // one from before the access.
        if field == PCI_MSIX_ENTRY_DATA
            && self.enabled
            && !self.vectors.is_masked(entry)
            && !self.vectors.is_function_masked()
        {
            changes.push(self.entry_message(entry));
        }
    }

    /// The message of entry `entry` as the guest wrote it, to hand to the vectors (which then
    /// hold it: the entry is no longer stale).
    fn entry_message(&mut self, entry: usize) -> MsiChange {
        self.stale[entry] = false;
        let [lo, hi, data] = self.table[entry];
        MsiChange::Program {
            index: entry,
            address: u64::from(hi) << 32 | u64::from(lo),
            data,
        }
    }

    /// Guest read of the pending-bit array at `offset`: any width, bit `n` of the array is
    /// vector `n` (PCI 3.0 §6.8.2.10); bits past the table read zero.
    pub fn pba_read(&self, offset: u64, data: &mut [u8]) {
        for (i, byte) in data.iter_mut().enumerate() {
            let first = usize::try_from(offset)
                .ok()
                .and_then(|o| o.checked_add(i))
                .and_then(|o| o.checked_mul(8));
            *byte = first.map_or(0, |first| {
                (0..8).fold(0u8, |b, bit| {
                    b | (u8::from(self.vectors.is_pending(first + bit)) << bit)
                })
            });
        }
    }

    /// Guest write to the pending-bit array: its bits are read-only (PCI 3.0 §6.8.2.10).
    pub fn pba_write(&self, offset: u64, data: &[u8]) {
        guest_error!(
            self.vectors.log(),
            "MSI-X: {}-byte write to the read-only PBA at {offset:#x} ignored",
            data.len()
        );
    }
}

mod persist;
#[cfg(test)]
mod tests;

pub use persist::MsixState;
