//! A snapshot's description (`snapshot.json`): what the snapshot is of and where its parts are,
//! versioned and checksummed, and the reader's checks.
//!
//! The file is JSON: `{"format_version": N, "crc32": C, "content": {...}}`, C being the CRC-32
//! (IEEE) of the content's bytes exactly as written (serde_json's `RawValue` keeps them), so a
//! byte changed anywhere in the content is caught before any of it is believed. The version is
//! read first, alone, so that a description of another format is named as such rather than
//! as corrupt. Then every value is checked as a user's option would be: a snapshot is a file
//! anyone may have edited.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::machine::config::{MAX_CPUS, MachineConfig};
use crate::machine::layout::MAX_RAM_SIZE;
use crate::machine::snapshot::SnapshotError;
use crate::machine::snapshot::directory::{SnapshotDir, is_file_name, temporary};
use crate::machine::snapshot::io_error;

/// The description's format; a reader takes this one only. Version 2: guest memory's file is
/// named per snapshot and checksummed.
pub const FORMAT_VERSION: u32 = 2;
/// The description's file in a snapshot's directory.
pub const DESCRIPTION_FILE: &str = "snapshot.json";
/// How the name of guest memory's file in a snapshot's directory begins; the rest is the
/// snapshot's own (`memory-PID-NANOS`), so a new snapshot's memory is written beside the one
/// the directory's description names, never over it.
pub const MEMORY_FILE_PREFIX: &str = "memory-";
/// Largest description read: the states of 64 vCPUs (a few KiB of MSRs and XSAVE each) and of
/// every device are well under a megabyte; past this it is not one exitless wrote.
pub const MAX_DESCRIPTION: u64 = 64 << 20;

/// What a snapshot holds, beside guest memory.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Description {
    /// The exitless that wrote it (`CARGO_PKG_VERSION`); another's is refused, as the layout of
    /// its states may differ.
    pub exitless_version: String,
    /// The machine, as built: RAM, vCPUs, devices with their host paths (images, taps,
    /// sockets), which a restore opens again.
    pub config: MachineConfig,
    /// Each vCPU's state (`vm::VcpuState`), in index order.
    pub vcpus: Vec<serde_json::Value>,
    /// The VM's own state (`vm::VmState`): in-kernel irqchip, PIT, KVM clock.
    pub vm: serde_json::Value,
    /// Every [`crate::persist::Persist`]'s state, by its id.
    pub devices: BTreeMap<String, serde_json::Value>,
    /// Guest memory's file.
    pub memory: MemoryFile,
}

/// What a paused machine is beside its memory and configuration, as a migration sends it
/// once the machine is paused (a snapshot's description holds the same three fields).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MachineState {
    /// Each vCPU's state (`vm::VcpuState`), in index order.
    pub vcpus: Vec<serde_json::Value>,
    /// The VM's own state (`vm::VmState`): in-kernel irqchip, PIT, KVM clock.
    pub vm: serde_json::Value,
    /// Every [`crate::persist::Persist`]'s state, by its id.
    pub devices: BTreeMap<String, serde_json::Value>,
}

/// A paused machine's state, borrowed from a snapshot's description or a migration's
/// [`MachineState`]: what a restore sets.
#[derive(Clone, Copy)]
pub struct StateRef<'a> {
    /// Each vCPU's state, in index order.
    pub vcpus: &'a [serde_json::Value],
    /// The VM's own state.
    pub vm: &'a serde_json::Value,
    /// Every device's state, by its id.
    pub devices: &'a BTreeMap<String, serde_json::Value>,
}

impl MachineState {
    /// The state, borrowed.
    pub fn as_ref(&self) -> StateRef<'_> {
        StateRef {
            vcpus: &self.vcpus,
            vm: &self.vm,
            devices: &self.devices,
        }
    }
}

impl StateRef<'_> {
    /// The state, for a machine of `cfg`: one vCPU state for each of its vCPUs.
    pub fn check(&self, cfg: &MachineConfig) -> Result<(), SnapshotError> {
        if self.vcpus.len() != usize::from(cfg.vcpus) {
            let why = format!("{} states for {} vCPUs", self.vcpus.len(), cfg.vcpus);
            return Err(SnapshotError::Field("vcpus".into(), why));
        }
        Ok(())
    }
}

/// The checks a machine's options get at `exitless run`, for a configuration read from a
/// snapshot or a migration stream: whole MiB of RAM within the layout, 1 to [`MAX_CPUS`]
/// vCPUs (the layout's own checks refuse the rest when the machine is built).
pub fn check_config(cfg: &MachineConfig) -> Result<(), SnapshotError> {
    let bad = |what: &str, why: String| Err(SnapshotError::Field(what.into(), why));
    let ram = cfg.ram_size as u64;
    if !(1..=MAX_RAM_SIZE >> 20).contains(&(ram >> 20)) || !ram.is_multiple_of(1 << 20) {
        let why = format!("{} is not whole MiB up to the layout's most", cfg.ram_size);
        return bad("config.ram_size", why);
    }
    if !(1..=MAX_CPUS).contains(&u64::from(cfg.vcpus)) {
        return bad("config.vcpus", format!("{}: 1 to {MAX_CPUS}", cfg.vcpus));
    }
    Ok(())
}

/// Where guest memory is: a file in the snapshot's directory, every RAM region at consecutive
/// offsets in layout order.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryFile {
    /// Its name in the directory (a name, not a path).
    pub file: String,
    /// Its length: the machine's RAM.
    pub length: u64,
    /// Its pages' checksum (`vm::state::memory::MemoryChecksum`): a restore refuses a file
    /// that does not match, another snapshot's of the same size or one changed since.
    pub crc32: u32,
}

/// The file as written: the format version, the content and its checksum.
#[derive(Serialize, Deserialize)]
struct Envelope<'a> {
    format_version: u32,
    crc32: u32,
    #[serde(borrow)]
    content: &'a RawValue,
}

/// The version alone, read before anything else is taken for granted.
#[derive(Deserialize)]
struct Version {
    format_version: u32,
}

impl Description {
    /// The machine's state, borrowed.
    pub fn state(&self) -> StateRef<'_> {
        StateRef {
            vcpus: &self.vcpus,
            vm: &self.vm,
            devices: &self.devices,
        }
    }

    /// The description's file's bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>, SnapshotError> {
        let content = serde_json::to_string_pretty(self).map_err(SnapshotError::Encode)?;
        let content = RawValue::from_string(content).map_err(SnapshotError::Encode)?;
        let envelope = Envelope {
            format_version: FORMAT_VERSION,
            crc32: crc32fast::hash(content.get().as_bytes()),
            content: &content,
        };
        let mut bytes = serde_json::to_vec(&envelope).map_err(SnapshotError::Encode)?;
        bytes.push(b'\n');
        Ok(bytes)
    }

    /// Read a description from its file's `bytes`, every check made: version, checksum,
    /// content, and the values a machine is built from.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, SnapshotError> {
        let version: Version = serde_json::from_slice(bytes).map_err(SnapshotError::NotOne)?;
        if version.format_version != FORMAT_VERSION {
            return Err(SnapshotError::FormatVersion(version.format_version));
        }
        let envelope: Envelope<'_> =
            serde_json::from_slice(bytes).map_err(SnapshotError::NotOne)?;
        let content = envelope.content.get();
        if crc32fast::hash(content.as_bytes()) != envelope.crc32 {
            return Err(SnapshotError::Checksum);
        }
        let description: Description =
            serde_json::from_str(content).map_err(SnapshotError::Content)?;
        description.check()?;
        Ok(description)
    }

    /// The checks a machine's options get at `exitless run`, and the parts' agreement.
    fn check(&self) -> Result<(), SnapshotError> {
        let this = env!("CARGO_PKG_VERSION");
        if self.exitless_version != this {
            return Err(SnapshotError::ExitlessVersion(
                self.exitless_version.clone(),
            ));
        }
        let bad = |what: &str, why: String| Err(SnapshotError::Field(what.into(), why));
        check_config(&self.config)?;
        self.state().check(&self.config)?;
        if self.memory.length != self.config.ram_size as u64 {
            let why = format!(
                "{} bytes for {} of RAM",
                self.memory.length, self.config.ram_size
            );
            return bad("memory.length", why);
        }
        // A name in the directory: never a path that leads out of it.
        let name = &self.memory.file;
        if !is_file_name(name) {
            return bad("memory.file", format!("`{name}` is not a file name"));
        }
        Ok(())
    }

    /// Write the description into `dir` atomically: a temporary file, synced, renamed over
    /// [`DESCRIPTION_FILE`] (rename(2) replaces it whole), and the directory synced, so a
    /// crash leaves the old description or the new one, never half of one. Written last:
    /// a directory with a description holds a whole snapshot.
    pub(crate) fn write_to(&self, dir: &SnapshotDir) -> Result<(), SnapshotError> {
        let bytes = self.to_bytes()?;
        let temp = temporary(DESCRIPTION_FILE);
        let mut file = dir.create(&temp)?;
        let path = dir.join(&temp);
        let written = file
            .write_all(&bytes)
            .map_err(io_error("write", &path))
            .and_then(|()| file.sync_all().map_err(io_error("sync", &path)))
            .and_then(|()| dir.rename(&temp, DESCRIPTION_FILE));
        if let Err(e) = written {
            let _ = dir.remove(&temp);
            return Err(e);
        }
        dir.sync()
    }

    /// [`Description::write_to`] the directory at `dir`, made if absent, checked and locked
    /// as a snapshot's destination is.
    pub fn write(&self, dir: &Path) -> Result<(), SnapshotError> {
        self.write_to(&SnapshotDir::for_snapshot(dir)?)
    }

    /// Read and check the description in the directory at `dir`, checked and locked as a
    /// restore's is.
    pub fn read(dir: &Path) -> Result<Self, SnapshotError> {
        Self::read_from(&SnapshotDir::for_restore(dir)?)
    }

    /// Read and check the description in `dir`.
    pub(crate) fn read_from(dir: &SnapshotDir) -> Result<Self, SnapshotError> {
        let file = dir.open_regular(DESCRIPTION_FILE)?;
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::io::Read::take(file, MAX_DESCRIPTION), &mut bytes)
            .map_err(io_error("read", &dir.join(DESCRIPTION_FILE)))?;
        Description::from_bytes(&bytes)
    }
}

#[cfg(test)]
mod tests;
