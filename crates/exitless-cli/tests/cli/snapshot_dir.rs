//! What a snapshot's directory may be trusted with, and what a snapshot never does to another:
//! a directory another user owns, or others may write, is refused for a snapshot and for a
//! restore; one snapshot at a time is written into a directory; a snapshot that fails leaves
//! the older one whole; a restored VM's memory is its own, whatever is done to the file after;
//! a memory file that is not the description's is refused.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::Path;

use crate::common::running::*;
use crate::common::testkernel::*;
use crate::snapshot::{refused, written};
use exitless::machine::snapshot::memory_path;

/// `exitless ctl snapshot snap` on `vm`, which must fail: its stderr, and the VM's state is
/// as it was.
fn snapshot_refused(vm: &Running, snap: &Path) -> String {
    let state = vm.ctl(&["info"])["state"].clone();
    let out = vm.ctl_output(&["snapshot", snap.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert_eq!(vm.ctl(&["info"])["state"], state);
    stderr
}

#[test]
fn a_directory_another_user_owns_or_others_may_write_is_refused() {
    let dir = scratch("untrusted");
    let snap = dir.join("snap");
    let mut vm = spamming(&dir, "vm", 300);
    vm.wait_for_lines("spam ", 10);
    // Others may write it: refused for the snapshot, and nothing is written into it.
    std::fs::create_dir(&snap).unwrap();
    std::fs::set_permissions(&snap, std::fs::Permissions::from_mode(0o777)).unwrap();
    let stderr = snapshot_refused(&vm, &snap);
    assert!(
        stderr.contains("its group or others may write it (mode 777)"),
        "{stderr}"
    );
    assert!(names(&snap).is_empty(), "{:?}", names(&snap));
    // Owned by another user (root can make one; others cannot, and are refused by the kernel
    // anyway where they may not write).
    // SAFETY: geteuid has no arguments.
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        std::fs::set_permissions(&snap, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::chown(&snap, Some(65534), Some(65534)).unwrap();
        let stderr = snapshot_refused(&vm, &snap);
        assert!(
            stderr.contains("it is owned by user 65534, not by this one (0)"),
            "{stderr}"
        );
        std::os::unix::fs::chown(&snap, Some(0), Some(0)).unwrap();
    } else {
        eprintln!("skipped (not root): a directory of another user's");
    }
    // A link to a good directory is not followed either.
    std::fs::set_permissions(&snap, std::fs::Permissions::from_mode(0o700)).unwrap();
    let link = dir.join("link");
    std::os::unix::fs::symlink(&snap, &link).unwrap();
    let stderr = snapshot_refused(&vm, &link);
    assert!(stderr.contains("cannot open the directory"), "{stderr}");
    // Once it is this user's alone, the snapshot is taken.
    assert_eq!(
        vm.ctl(&["snapshot", snap.to_str().unwrap()])["state"],
        "running"
    );
    let (status, stderr, _) = vm.end();
    assert_eq!(status, PASSED, "{stderr}");

    // The same checks at a restore: one line, status 2, nothing started.
    std::fs::set_permissions(&snap, std::fs::Permissions::from_mode(0o770)).unwrap();
    refused(&snap, "its group or others may write it (mode 770)");
    if root {
        std::fs::set_permissions(&snap, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&snap, Some(65534), None).unwrap();
        refused(&snap, "it is owned by user 65534, not by this one (0)");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// flock(2) on `dir`, as another exitless's snapshot would hold it.
fn lock(dir: &Path, how: libc::c_int) -> File {
    let file = File::open(dir).unwrap();
    // SAFETY: flock takes the descriptor just opened.
    assert_eq!(unsafe { libc::flock(file.as_raw_fd(), how) }, 0);
    file
}

#[test]
fn one_snapshot_at_a_time_is_written_into_a_directory() {
    let dir = scratch("locked");
    let snap = dir.join("snap");
    std::fs::create_dir(&snap).unwrap();
    let mut vm = spamming(&dir, "vm", 300);
    vm.wait_for_lines("spam ", 10);
    // Another snapshot is being written into it: refused at once, not waited for.
    let held = lock(&snap, libc::LOCK_EX);
    let stderr = snapshot_refused(&vm, &snap);
    assert!(
        stderr.contains("another snapshot is being taken into it"),
        "{stderr}"
    );
    assert!(names(&snap).is_empty(), "{:?}", names(&snap));
    drop(held);
    // A restore reading it holds it shared: a snapshot waits for none and is refused.
    let reading = lock(&snap, libc::LOCK_SH);
    snapshot_refused(&vm, &snap);
    drop(reading);
    assert_eq!(
        vm.ctl(&["snapshot", snap.to_str().unwrap()])["state"],
        "running"
    );
    let (status, stderr, _) = vm.end();
    assert_eq!(status, PASSED, "{stderr}");
    // And a restore is refused while a snapshot is being written.
    let held = lock(&snap, libc::LOCK_EX);
    refused(
        &snap,
        "a snapshot is being taken into it; restore it when that is done",
    );
    drop(held);
    let restored = Running::start(&dir, "restored", &["--restore", snap.to_str().unwrap()]);
    let (status, stderr, _) = restored.end();
    assert_eq!(status, PASSED, "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Limit the files `pid` may write to `bytes` (RLIMIT_FSIZE), as a full disk would stop it.
fn limit_file_size(pid: u32, bytes: u64) {
    let limit = libc::rlimit {
        rlim_cur: bytes,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: prlimit reads the struct given and writes nothing (no old limit asked).
    let set =
        unsafe { libc::prlimit(pid as i32, libc::RLIMIT_FSIZE, &limit, std::ptr::null_mut()) };
    assert_eq!(set, 0, "{}", std::io::Error::last_os_error());
}

#[test]
fn a_failed_snapshot_leaves_the_older_one_whole() {
    const LINES: u32 = 400;
    let dir = scratch("failed");
    let snap = dir.join("snap");
    let mut vm = spamming(&dir, "vm", LINES);
    vm.wait_for_lines("spam ", 20);
    assert_eq!(vm.ctl(&["pause"])["state"], "paused");
    vm.ctl(&["snapshot", snap.to_str().unwrap()]);
    let before = std::fs::read_to_string(&vm.console).unwrap();
    let good = names(&snap);
    assert_eq!(vm.ctl(&["resume"])["state"], "running");
    vm.wait_for_lines("spam ", 40);
    // The disk is full, for exitless: the next snapshot's memory cannot be written (paused
    // meanwhile, so that the console's file is not written past the limit).
    assert_eq!(vm.ctl(&["pause"])["state"], "paused");
    limit_file_size(vm.child.id(), 1);
    let stderr = snapshot_refused(&vm, &snap);
    limit_file_size(vm.child.id(), libc::RLIM_INFINITY);
    assert!(stderr.contains("File too large"), "{stderr}");
    assert_eq!(
        names(&snap),
        good,
        "the older snapshot, and nothing of the new one"
    );
    vm.ctl(&["shutdown"]);
    let (status, stderr, _) = vm.end();
    assert_eq!(status, 0, "{stderr}");
    // The older snapshot restores, and the guest goes on from where it was then.
    restored_with_every_line(&dir, "restored", &snap, &before, LINES);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_restored_vm_keeps_its_memory_whatever_is_done_to_the_file() {
    const LINES: u32 = 600;
    let dir = scratch("ownmemory");
    let snap = dir.join("snap");
    let mut first = spamming(&dir, "first", LINES);
    first.wait_for_lines("spam ", 20);
    let before = snapshotted_and_shut_down(first, &snap);
    let mut second = Running::start(&dir, "second", &["--restore", snap.to_str().unwrap()]);
    second.wait_for_lines("spam ", 30);
    // Cut short, then grown back full of other bytes, under the running VM.
    let path = memory_path(&snap).unwrap();
    let memory = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let length = memory.metadata().unwrap().len();
    memory.set_len(0).unwrap();
    memory.set_len(length).unwrap();
    let junk = vec![0xa5u8; 1 << 20];
    for at in (0..length).step_by(junk.len()) {
        memory.write_all_at(&junk, at).unwrap();
    }
    let (status, stderr, after) = second.end();
    assert_eq!(status, PASSED, "{stderr}\n{after}");
    every_line(&before, &after, LINES);
    // That file is no longer the description's: refused.
    refused(&snap, "does not match its description's checksum");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_memory_file_that_is_not_the_descriptions_is_refused() {
    let dir = scratch("othermemory");
    written(&dir, Vec::new());
    // Of the right length, but not the pages the description sums: another snapshot's.
    let path = memory_path(&dir).unwrap();
    let memory = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    memory.write_all_at(&[1; 4096], 8 << 20).unwrap();
    refused(&dir, "does not match its description's checksum");
    let _ = std::fs::remove_dir_all(&dir);
}
