//! Initramfs archives for the Linux tests: busybox, an `/init` script, and kernel modules with
//! what they depend on, in load order.

use std::path::{Path, PathBuf};

use super::debian::Kernel;

/// How every `/init` starts: busybox's applets, the kernel's file systems, then each module in
/// `/modules` loaded in order with its parameters from the kernel's command line (`NAME.KEY=V`),
/// as modprobe gives them (`virtio_mmio.device=`).
const INIT_START: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in /modules/*.ko; do
  name="${m##*/[0-9][0-9]-}"; name="${name%.ko}"
  args=$(for word in $(cat /proc/cmdline); do case "$word" in "$name".*) echo "${word#"$name".}" ;; esac; done)
  insmod "$m" $args || echo "insmod $m failed"
done
"#;

/// Mode bits of a directory and of an executable file in the archive.
const DIR: u32 = 0o040_755;
const FILE: u32 = 0o100_755;

/// A "newc" cpio archive (the initramfs format, Documentation/driver-api/early-userspace/
/// buffer-format.rst) being written. By hand because the format is 13 hex fields, a name and
/// the data, each padded to 4 bytes: less code than a crate's API around it.
#[derive(Default)]
pub struct Initramfs {
    archive: Vec<u8>,
    inode: u32,
    modules: Vec<String>,
    /// Paths already in the archive, so a folder or a library shared by two programs is
    /// written once.
    paths: Vec<String>,
}

impl Initramfs {
    /// An archive with busybox as `/bin/busybox`, the usual mount points, and an `/init` that
    /// mounts, loads the archive's modules and runs `script`.
    pub fn new(busybox: &Path, script: &str) -> Result<Initramfs, String> {
        let mut archive = Initramfs::default();
        for dir in ["bin", "dev", "proc", "sys", "tmp", "mnt", "modules"] {
            archive.member(dir, DIR, &[]);
            archive.paths.push(dir.to_owned());
        }
        archive.member("bin/busybox", FILE, &read(busybox)?);
        archive.member("init", FILE, format!("{INIT_START}{script}").as_bytes());
        Ok(archive)
    }

    fn member(&mut self, name: &str, mode: u32, data: &[u8]) {
        self.inode += 1;
        let size = u32::try_from(data.len()).expect("a file under 4 GiB");
        let name_size = u32::try_from(name.len() + 1).expect("a short name");
        let fields = [self.inode, mode, 0, 0, 1, 0, size, 0, 0, 0, 0, name_size, 0];
        self.archive.extend_from_slice(b"070701");
        for f in fields {
            self.archive
                .extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.archive.extend_from_slice(name.as_bytes());
        self.archive.push(0);
        self.archive
            .resize(self.archive.len().next_multiple_of(4), 0);
        self.archive.extend_from_slice(data);
        self.archive
            .resize(self.archive.len().next_multiple_of(4), 0);
    }

    /// Add a file (a script the init runs, a tool) at `name`, and the folders above it.
    pub fn file(&mut self, name: &str, data: &[u8]) {
        let name = name.trim_start_matches('/');
        let parents: Vec<String> = Path::new(name)
            .ancestors()
            .skip(1)
            .filter(|p| !p.as_os_str().is_empty())
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        for dir in parents.into_iter().rev() {
            if !self.paths.contains(&dir) {
                self.member(&dir, DIR, &[]);
                self.paths.push(dir);
            }
        }
        if !self.paths.iter().any(|p| p == name) {
            self.member(name, FILE, data);
            self.paths.push(name.to_owned());
        }
    }

    /// Add this host's program at `path` (say `/usr/sbin/mke2fs`) at the same path, with the
    /// shared libraries `ldd` says it loads: the guest then runs the host's tools.
    pub fn program(&mut self, path: &Path) -> Result<(), String> {
        let ldd = super::debian::sh(Path::new("/"), "ldd", &[&path.to_string_lossy()])?;
        let libraries = ldd.lines().filter_map(|line| {
            let after = line.split("=>").last()?.trim();
            let library = after.split_whitespace().next()?;
            library.starts_with('/').then(|| PathBuf::from(library))
        });
        for library in libraries.collect::<Vec<_>>() {
            self.file(&library.to_string_lossy(), &read(&library)?);
        }
        self.file(&path.to_string_lossy(), &read(path)?);
        Ok(())
    }

    /// Add the module `name` of `kernel` and, first, every module it depends on, as
    /// `/modules/NN-NAME.ko` in load order (`for m in /modules/*.ko; do insmod $m; done`). The
    /// package has no modules.dep (depmod writes it at install), so the dependencies come from
    /// each module's own `.modinfo` ("depends=a,b"). A module built into this kernel is skipped.
    pub fn module(&mut self, kernel: &Kernel, name: &str) -> Result<(), String> {
        let canonical = name.replace('-', "_");
        if self.modules.contains(&canonical) {
            return Ok(());
        }
        let Some(path) = find_module(&kernel.modules, &canonical) else {
            return if builtin(kernel, &canonical) {
                Ok(())
            } else {
                Err(format!("{} has no module {name}", kernel.modules.display()))
            };
        };
        let data = module_data(&path)?;
        for dependency in depends(&data) {
            self.module(kernel, &dependency)?;
        }
        let at = self.modules.len();
        self.member(&format!("modules/{at:02}-{canonical}.ko"), FILE, &data);
        self.modules.push(canonical);
        Ok(())
    }

    /// The archive, closed with its trailer.
    pub fn finish(mut self) -> Vec<u8> {
        self.inode = 0;
        self.member("TRAILER!!!", 0, &[]);
        self.archive
    }
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// A module file's ELF: as it is, or, for a kernel that ships its modules compressed
/// (Debian's 6.12: `NAME.ko.xz`), through `xz -dc` (busybox's `insmod` takes only ELF).
fn module_data(path: &Path) -> Result<Vec<u8>, String> {
    if path.extension().is_none_or(|e| e != "xz") {
        return read(path);
    }
    let out = std::process::Command::new("xz")
        .arg("-dc")
        .arg(path)
        .output()
        .map_err(|e| format!("xz -dc {}: {e} (install xz-utils)", path.display()))?;
    if !out.status.success() {
        return Err(format!(
            "xz -dc {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(out.stdout)
}

/// The file of module `canonical` (underscores for dashes, as the kernel compares them),
/// compressed or not.
fn find_module(dir: &Path, canonical: &str) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.filter_map(Result::ok) {
        let path = entry.path();
        if path.is_dir() {
            if let Some(found) = find_module(&path, canonical) {
                return Some(found);
            }
        } else if path.file_name().is_some_and(|n| {
            let n = n.to_string_lossy().replace('-', "_");
            n == format!("{canonical}.ko") || n == format!("{canonical}.ko.xz")
        }) {
            return Some(path);
        }
    }
    None
}

/// Whether `canonical` is built into the kernel: listed in the package's `modules.builtin`.
fn builtin(kernel: &Kernel, canonical: &str) -> bool {
    let list = kernel.modules.with_file_name("modules.builtin");
    std::fs::read_to_string(list).is_ok_and(|text| {
        text.lines().any(|l| {
            Path::new(l)
                .file_stem()
                .is_some_and(|s| s.to_string_lossy().replace('-', "_") == canonical)
        })
    })
}

/// The modules a module's `.modinfo` says it needs: the NUL-terminated "depends=" string.
fn depends(module: &[u8]) -> Vec<String> {
    let key = b"depends=";
    let Some(at) = module.windows(key.len()).position(|w| w == key) else {
        return Vec::new();
    };
    let rest = &module[at + key.len()..];
    let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    String::from_utf8_lossy(&rest[..end])
        .split(',')
        .filter(|m| !m.is_empty())
        .map(|m| m.replace('-', "_"))
        .collect()
}
