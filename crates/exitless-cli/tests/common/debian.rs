//! Debian's packages as the Linux tests use them: downloaded with `apt-get download` and taken
//! apart with `dpkg-deb -x` into the target directory, once (nothing is installed). A kernel
//! package brings its bzImage and its modules; `busybox-static` the one binary an initramfs
//! needs.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Run `cmd` in `dir`; its standard output, or why it failed.
pub fn sh(dir: &Path, cmd: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(cmd)
        .args(args)
        .current_dir(dir)
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(format!("{cmd} {args:?}: {}", stderr.trim()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Where the packages are kept: one folder per package under the target directory's `debian/`.
fn cache(package: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("debian")
        .join(package)
}

/// The files of `package`, extracted under the returned folder on first use.
pub fn extracted(package: &str) -> Result<PathBuf, String> {
    let dir = cache(package);
    let root = dir.join("root");
    if root.exists() {
        return Ok(root);
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    sh(&dir, "apt-get", &["download", package])?;
    let deb = std::fs::read_dir(&dir)
        .map_err(|e| e.to_string())?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .ok_or(format!("apt-get download {package} left no .deb"))?;
    let part = dir.join("root.part");
    let _ = std::fs::remove_dir_all(&part);
    sh(
        &dir,
        "dpkg-deb",
        &["-x", &deb.to_string_lossy(), "root.part"],
    )?;
    std::fs::rename(&part, &root).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&deb);
    Ok(root)
}

/// The versioned `linux-image-…` package a kernel metapackage (`linux-image-amd64`,
/// `linux-image-cloud-amd64`) depends on today.
pub fn kernel_package(metapackage: &str) -> Result<String, String> {
    let depends = sh(Path::new("/"), "apt-cache", &["depends", metapackage])?;
    depends
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .find(|p| p.starts_with("linux-image-"))
        .map(str::to_owned)
        .ok_or(format!(
            "apt-cache depends {metapackage} names no linux-image package"
        ))
}

/// A Debian kernel: its bzImage and the folder of its modules (`lib/modules/VERSION/kernel`).
pub struct Kernel {
    pub vmlinuz: PathBuf,
    pub modules: PathBuf,
}

/// The kernel `metapackage` names, downloaded on first use.
pub fn kernel(metapackage: &str) -> Result<Kernel, String> {
    let root = extracted(&kernel_package(metapackage)?)?;
    let first = |dir: &Path, pick: &dyn Fn(&Path) -> bool| {
        std::fs::read_dir(dir).ok().and_then(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .find(|p| pick(p))
        })
    };
    let vmlinuz = first(&root.join("boot"), &|p| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
    })
    .ok_or(format!("{} holds no boot/vmlinuz-*", root.display()))?;
    let modules = first(&root.join("lib/modules"), &|_| true)
        .map(|version| version.join("kernel"))
        .ok_or(format!("{} holds no lib/modules", root.display()))?;
    Ok(Kernel { vmlinuz, modules })
}

/// Debian's statically linked busybox, downloaded on first use.
pub fn busybox() -> Result<PathBuf, String> {
    let binary = extracted("busybox-static")?.join("bin/busybox");
    binary
        .exists()
        .then_some(binary)
        .ok_or("busybox-static holds no bin/busybox".into())
}

/// The uncompressed ELF vmlinux inside `vmlinuz`, with its PVH note (Debian ships none), beside
/// it: the bzImage's payload is an LZ4 legacy frame (the cloud kernel, CONFIG_KERNEL_LZ4) or an
/// xz stream (the generic one, CONFIG_KERNEL_XZ), found by its magic and given to `lz4`/`xz`.
pub fn vmlinux(vmlinuz: &Path) -> Result<PathBuf, String> {
    let out = vmlinuz.with_file_name("vmlinux");
    if out.exists() {
        return Ok(out);
    }
    let image = std::fs::read(vmlinuz).map_err(|e| e.to_string())?;
    let formats: [(&[u8], &str); 2] = [
        (&0x184c_2102u32.to_le_bytes(), "lz4 -dc"),
        (b"\xfd7zXZ\0", "xz -dc --single-stream"),
    ];
    let (at, tool) = formats
        .iter()
        .find_map(|(magic, tool)| {
            image
                .windows(magic.len())
                .position(|w| w == *magic)
                .map(|at| (at, *tool))
        })
        .ok_or("no LZ4 or xz payload in the bzImage")?;
    let dir = vmlinuz.parent().expect("a directory");
    std::fs::write(dir.join("payload"), &image[at..]).map_err(|e| e.to_string())?;
    // Both complain of the bytes after the stream (the bzImage's tail) once they have written it.
    let _ = sh(
        dir,
        "sh",
        &["-c", &format!("{tool} < payload > vmlinux.part")],
    );
    let _ = std::fs::remove_file(dir.join("payload"));
    let part = dir.join("vmlinux.part");
    let elf = std::fs::read(&part).map_err(|e| format!("{tool}: {e}"))?;
    if !elf.starts_with(b"\x7fELF") {
        return Err(format!("{tool} gave no ELF file (is it installed?)"));
    }
    std::fs::rename(&part, &out).map_err(|e| e.to_string())?;
    Ok(out)
}
