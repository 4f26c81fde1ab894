//! Snapshot and restore as a user drives them: `exitless ctl ... snapshot DIR` on a running
//! `exitless run --api-socket`, `exitless run --restore DIR` in a new process; and snapshots
//! that must be refused (another version, corrupt, memory cut short, a disk gone) with one
//! line and status 2, nothing started.

mod common;

use std::path::{Path, PathBuf};

use common::testkernel::*;
use exitless::machine::snapshot::{Description, MEMORY_FILE, MemoryFile};
use exitless::machine::{DiskConfig, MachineConfig};

/// A fresh folder for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("exitless-snap-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A snapshot as exitless writes one, in `dir`, of a 16 MiB machine with `disks`: its
/// description and a memory file of the RAM's length, all zero (sparse).
fn written(dir: &Path, disks: Vec<DiskConfig>) {
    let config = MachineConfig {
        ram_size: 16 << 20,
        disks,
        ..MachineConfig::default()
    };
    let memory = std::fs::File::create(dir.join(MEMORY_FILE)).unwrap();
    memory.set_len(16 << 20).unwrap();
    Description {
        exitless_version: env!("CARGO_PKG_VERSION").into(),
        config,
        vcpus: vec![serde_json::json!({})],
        vm: serde_json::json!({}),
        devices: Default::default(),
        memory: MemoryFile {
            file: MEMORY_FILE.into(),
            length: 16 << 20,
        },
    }
    .write(dir)
    .unwrap();
}

/// `exitless run --restore dir` with its console to a file: its one line of error, which
/// must say `says`, status 2, and no console file made (nothing started).
fn refused(dir: &Path, says: &str) {
    let console = dir.join("console");
    let ran = exitless_run(
        &[
            "--restore",
            dir.to_str().unwrap(),
            "--console",
            console.to_str().unwrap(),
        ],
        b"",
    );
    assert_eq!(ran.status.code(), Some(ERROR), "{}", ran.stderr);
    assert_eq!(ran.stderr.lines().count(), 1, "one line: {}", ran.stderr);
    assert!(ran.stderr.contains(says), "{says:?} in {}", ran.stderr);
    assert!(!console.exists(), "nothing started");
}

#[test]
fn a_snapshot_of_another_format_version_is_refused() {
    let dir = scratch("version");
    written(&dir, Vec::new());
    let path = dir.join("snapshot.json");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        text.replacen("\"format_version\":1", "\"format_version\":7", 1),
    )
    .unwrap();
    refused(
        &dir,
        "the snapshot's format is version 7; this exitless reads version 1",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_corrupt_description_is_refused() {
    let dir = scratch("checksum");
    written(&dir, Vec::new());
    let path = dir.join("snapshot.json");
    let text = std::fs::read_to_string(&path).unwrap();
    // 16 MiB becomes 17 MiB, the checksum left as it was.
    let edited = text.replacen("16777216", "17825792", 1);
    assert_ne!(edited, text);
    std::fs::write(&path, edited).unwrap();
    refused(&dir, "is corrupt: its content does not match its checksum");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_truncated_memory_file_is_refused() {
    let dir = scratch("truncated");
    written(&dir, Vec::new());
    let memory = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join(MEMORY_FILE))
        .unwrap();
    memory.set_len(8 << 20).unwrap();
    refused(
        &dir,
        "is 8388608 bytes, not the 16777216 its description says",
    );
    std::fs::remove_file(dir.join(MEMORY_FILE)).unwrap();
    refused(&dir, "cannot open");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_snapshot_whose_disk_is_gone_is_refused() {
    let dir = scratch("disk");
    let image = dir.join("disk.img");
    written(&dir, vec![DiskConfig::new(&image)]);
    refused(
        &dir,
        &format!("had the disk {}: No such file", image.display()),
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn no_snapshot_or_a_machine_option_beside_restore_is_refused() {
    let dir = scratch("none");
    refused(&dir, "snapshot.json: No such file");
    let elf = kernel("testkernel.elf");
    let restore = ["--restore", dir.to_str().unwrap()];
    for extra in [
        &["--kernel", elf.to_str().unwrap()][..],
        &["--memory", "64"],
        &["--disk", "x.img"],
    ] {
        let ran = exitless_run(&[&restore[..], extra].concat(), b"");
        assert_eq!(ran.status.code(), Some(ERROR), "{extra:?}: {}", ran.stderr);
        assert_eq!(ran.stderr.lines().count(), 1, "{}", ran.stderr);
        assert!(ran.stderr.contains("cannot be used with"), "{}", ran.stderr);
    }
    let ran = exitless_run(&["--kernel", elf.to_str().unwrap(), "--paused"], b"");
    assert_eq!(ran.status.code(), Some(ERROR), "{}", ran.stderr);
    assert!(ran.stderr.contains("--restore"), "{}", ran.stderr);
    std::fs::remove_dir_all(&dir).unwrap();
}
