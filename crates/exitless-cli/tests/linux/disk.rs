//! virtio-blk under Linux's virtio_blk driver, on virtio-pci: an ext2 file
//! system made, written and read back in the guest and checked on the host with debugfs; a
//! read-only disk refusing writes; a sparse disk over 4 GiB written past 4 GiB; several disks;
//! and what the guest synced surviving a SIGKILL of exitless. (virtio-mmio is not reached yet:
//! Debian's kernel has no CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES, so it finds virtio-mmio devices
//! only in ACPI, LNRO0005, which exitless does not describe; docs/linux-lab.md.)

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::guest::{Guest, Job};
use crate::lab::Lab;

/// What the guest writes into its file system, and the host reads back.
const CONTENT: &str = "written-by-linux-in-exitless";

/// Sector of the sparse disk the guest writes: 4.5 GiB in.
const HIGH_SECTOR: u64 = 9 << 20;
/// What it writes there.
const HIGH_MARKER: &str = "EXITLESS-PAST-4-GIB";

/// Make an ext2 file system on `$1`, write CONTENT into it, remount and read it back.
const FILE_SYSTEM: &str = r#"
fs() {
  mke2fs -F "/dev/$1" > /dev/null && mkdir -p /mnt && mount -t ext4 "/dev/$1" /mnt \
    && echo -n CONTENT > /mnt/hello && umount /mnt \
    && mount -t ext4 -o ro "/dev/$1" /mnt && echo "GUEST $1_readback $(cat /mnt/hello)" && umount /mnt
}
"#;

/// The file at `inner` in the ext2 image `image`, read on the host (e2fsprogs' debugfs).
fn debugfs_cat(image: &Path, inner: &str) -> String {
    let out = Command::new("debugfs")
        .args(["-R", &format!("cat {inner}")])
        .arg(image)
        .output()
        .expect("debugfs (e2fsprogs) runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
#[ignore = "boots Linux in the lab, minutes; see the linux test binary's docs"]
fn linux_writes_a_file_system_the_host_reads_and_a_read_only_disk_refuses_writes() {
    let Some(lab) = Lab::or_skip("disk") else {
        return;
    };
    let mut job = Job::new("disk");
    let (rw, ro, sparse) = (
        job.path("rw.img"),
        job.path("ro.img"),
        job.path("sparse.img"),
    );
    std::fs::write(&ro, vec![0x5a; 1 << 20]).unwrap();
    for (image, size) in [(&rw, 64u64 << 20), (&sparse, 5 << 30)] {
        std::fs::File::create(image).unwrap().set_len(size).unwrap();
    }
    let script = format!(
        r#"{fs}
echo "GUEST disks $(ls /sys/block | grep -c ^vd)"
fs vda
dd if=/dev/zero of=/dev/vdb bs=4096 count=1 conv=fsync 2>/dev/null && echo "GUEST ro_write accepted" || echo "GUEST ro_write refused"
echo "GUEST vdc_sectors $(cat /sys/block/vdc/size)"
echo -n {HIGH_MARKER} | dd of=/dev/vdc bs=512 seek={HIGH_SECTOR} conv=fsync 2>/dev/null
echo "GUEST vdc_high $(dd if=/dev/vdc bs=512 skip={HIGH_SECTOR} count=1 2>/dev/null | head -c {len})"
"#,
        fs = FILE_SYSTEM.replace("CONTENT", CONTENT),
        len = HIGH_MARKER.len(),
    );
    let guest = Guest::new(&job.dir, "disks", &script, &[]);
    job.exitless(
        "pci",
        &guest,
        "",
        &format!(
            "--memory 256 --disk {} --disk {},ro --disk {}",
            rw.display(),
            ro.display(),
            sparse.display()
        ),
    );
    let done = job.run(&lab, Duration::from_secs(900));

    let pci = done.run("pci");
    pci.expect_done(0);
    pci.expect("disks", "3");
    pci.expect("vda_readback", CONTENT);
    pci.expect("ro_write", "refused");
    pci.expect("vdc_sectors", &(5u64 << 21).to_string());
    pci.expect("vdc_high", HIGH_MARKER);
    assert_eq!(
        debugfs_cat(&rw, "/hello"),
        CONTENT,
        "the host reads the guest's file"
    );
    assert!(
        std::fs::read(&ro).unwrap().iter().all(|&b| b == 0x5a),
        "the read-only image is untouched"
    );
    let mut at = vec![0u8; HIGH_MARKER.len()];
    std::os::unix::fs::FileExt::read_exact_at(
        &std::fs::File::open(&sparse).unwrap(),
        &mut at,
        HIGH_SECTOR * 512,
    )
    .unwrap();
    assert_eq!(
        at,
        HIGH_MARKER.as_bytes(),
        "the write past 4 GiB is at its offset in the file"
    );
}

#[test]
#[ignore = "boots Linux in the lab, minutes; see the linux test binary's docs"]
fn what_linux_synced_is_in_the_image_after_exitless_is_killed() {
    let Some(lab) = Lab::or_skip("disk-kill") else {
        return;
    };
    let mut job = Job::new("disk-kill");
    let image = job.path("kill.img");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let script = format!(
        "{fs}\nmkdir -p /mnt && mke2fs -F /dev/vda > /dev/null && mount -t ext4 /dev/vda /mnt && echo -n {CONTENT} > /mnt/hello && sync && echo 'GUEST synced yes'\nsleep 100000",
        fs = FILE_SYSTEM.replace("CONTENT", CONTENT)
    );
    let guest = Guest::new(&job.dir, "kill", &script, &[]);
    // exitless in the background; SIGKILL once the guest says its data is synced.
    job.sh(&format!(
        "{exitless} run --kernel {kernel} --initrd {initrd} --cmdline '{cmdline}' --memory 256 --disk {image} --timeout 600 < /dev/null > killed.console 2>&1 &
pid=$!
for i in $(seq 300); do grep -q 'GUEST synced yes' killed.console && break; sleep 1; done
kill -KILL $pid; wait $pid; echo $? > killed.status",
        exitless = env!("CARGO_BIN_EXE_exitless"),
        kernel = guest.kernel.display(),
        initrd = guest.initramfs.display(),
        cmdline = crate::guest::CMDLINE,
        image = image.display(),
    ));
    let done = job.run(&lab, Duration::from_secs(900));
    let run = done.run("killed");
    run.expect("synced", "yes");
    assert_eq!(run.status, 128 + 9, "killed by SIGKILL; {}", run.tail());
    assert_eq!(
        debugfs_cat(&image, "/hello"),
        CONTENT,
        "the synced file is in the image"
    );
}
