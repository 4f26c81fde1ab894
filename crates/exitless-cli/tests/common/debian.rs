//! Debian's packages as the Linux tests use them: downloaded with `apt-get download` and taken
//! apart with `dpkg-deb -x` into the target directory, once (nothing is installed). A kernel
//! package brings its bzImage and its modules; `busybox-static` the one binary an initramfs
//! needs; the release's backports, the lab's outer QEMU.

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
    extract_downloaded(&dir)
}

/// The files of `packages` from the host's Debian release's `-backports` suite (the host's
/// archive, read with package lists of their own: nothing is installed and the host's
/// sources are not touched), extracted together under the returned folder, kept as `name`.
pub fn extracted_from_backports(name: &str, packages: &[&str]) -> Result<PathBuf, String> {
    let dir = cache(name);
    let root = dir.join("root");
    if root.exists() {
        return Ok(root);
    }
    let suite = format!("{}-backports", release()?);
    let apt = dir.join("apt");
    for sub in ["lists/partial", "cache/archives/partial"] {
        std::fs::create_dir_all(apt.join(sub)).map_err(|e| format!("{}: {e}", apt.display()))?;
    }
    let sources = apt.join("sources.list");
    let line = format!("deb {} {suite} main\n", archive()?);
    std::fs::write(&sources, line).map_err(|e| format!("{}: {e}", sources.display()))?;
    let options = [
        format!("Dir::Etc::SourceList={}", sources.display()),
        "Dir::Etc::SourceParts=/nonexistent".to_owned(),
        format!("Dir::State::Lists={}", apt.join("lists").display()),
        format!("Dir::Cache={}", apt.join("cache").display()),
    ];
    // apt-get with these lists, then `words`.
    let apt_get = |words: Vec<String>| {
        let mut args: Vec<&str> = options.iter().flat_map(|o| ["-o", o.as_str()]).collect();
        args.extend(words.iter().map(String::as_str));
        sh(&dir, "apt-get", &args)
    };
    apt_get(vec!["-qq".to_owned(), "update".to_owned()])?;
    let download = std::iter::once("download".to_owned())
        .chain(packages.iter().map(|p| format!("{p}/{suite}")));
    apt_get(download.collect())?;
    extract_downloaded(&dir)
}

/// The host's Debian release (`VERSION_CODENAME` in `/etc/os-release`: `bookworm`).
fn release() -> Result<String, String> {
    let text =
        std::fs::read_to_string("/etc/os-release").map_err(|e| format!("/etc/os-release: {e}"))?;
    text.lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|v| v.trim_matches('"').to_owned())
        .filter(|v| !v.is_empty())
        .ok_or("/etc/os-release names no VERSION_CODENAME (not Debian?)".into())
}

/// The archive the host's apt reads its release's main suite from (`apt-cache policy`'s
/// `500 URI RELEASE/main …` line): the one registry this project's machines reach.
fn archive() -> Result<String, String> {
    let suite = format!(" {}/main ", release()?);
    let policy = sh(Path::new("/"), "apt-cache", &["policy"])?;
    policy
        .lines()
        .find(|l| l.contains(&suite))
        .and_then(|l| l.split_whitespace().nth(1))
        .map(str::to_owned)
        .ok_or(format!(
            "apt-cache policy lists no archive for{suite}(run apt-get update)"
        ))
}

/// Take apart every `.deb` in `dir` into `dir/root` (whole, or not at all), then drop them.
fn extract_downloaded(dir: &Path) -> Result<PathBuf, String> {
    let debs: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| e.to_string())?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "deb"))
        .collect();
    if debs.is_empty() {
        return Err(format!(
            "apt-get download left no .deb in {}",
            dir.display()
        ));
    }
    let part = dir.join("root.part");
    let _ = std::fs::remove_dir_all(&part);
    for deb in &debs {
        sh(
            dir,
            "dpkg-deb",
            &["-x", &deb.to_string_lossy(), "root.part"],
        )?;
    }
    let root = dir.join("root");
    std::fs::rename(&part, &root).map_err(|e| e.to_string())?;
    for deb in &debs {
        let _ = std::fs::remove_file(deb);
    }
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
