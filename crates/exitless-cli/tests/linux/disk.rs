//! virtio-blk under Linux's virtio_blk driver, on virtio-pci and on virtio-mmio (which Linux
//! finds in the DSDT): an ext2 file system made, written and read back in the guest and
//! checked on the host with debugfs; a read-only disk refusing writes; a request queue per
//! vCPU, each carrying requests; a sparse disk over 4 GiB written past 4 GiB; several disks;
//! discards and writes of zeroes, with and without `unmap`; and what the guest synced
//! surviving a SIGKILL of exitless.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::guest::{Guest, Job, exitless_command};
use crate::lab::Lab;

/// What the guest writes into its file system, and the host reads back.
pub const CONTENT: &str = "written-by-linux-in-exitless";

/// Sector of the sparse disk the guest writes: 4.5 GiB in.
const HIGH_SECTOR: u64 = 9 << 20;
/// What it writes there.
const HIGH_MARKER: &str = "EXITLESS-PAST-4-GIB";

/// vda's hardware queues (blk-mq's), and the interrupts each of its request queues' MSI-X
/// vectors took (`virtioN-req.K` in /proc/interrupts, all CPUs' columns summed) after each
/// CPU read a part of the disk of its own: a queue's interrupts are the device's used buffers
/// on it.
const PER_CPU_QUEUES: &str = r#"
echo "GUEST vda_queues $(ls /sys/block/vda/mq | wc -l)"
sync && echo 3 > /proc/sys/vm/drop_caches
for cpu in 0 1; do taskset -c $cpu dd if=/dev/vda of=/dev/null bs=4096 count=64 skip=$((cpu * 4096)) 2>/dev/null; done
vda=$(basename $(readlink /sys/block/vda/device))
echo "GUEST vda_queue_interrupts $(grep "$vda-req\." /proc/interrupts | awk '{ n = 0; for (i = 2; i <= NF; i++) if ($i ~ /^[0-9]+$/) n += $i; printf "%d ", n }')"
"#;

/// Make an ext2 file system on `$1`, write CONTENT into it, remount and read it back.
const FILE_SYSTEM: &str = r#"
fs() {
  mke2fs -F "/dev/$1" > /dev/null && mkdir -p /mnt && mount -t ext4 "/dev/$1" /mnt \
    && echo -n CONTENT > /mnt/hello && umount /mnt \
    && mount -t ext4 -o ro "/dev/$1" /mnt && echo "GUEST $1_readback $(cat /mnt/hello)" && umount /mnt
}
"#;

/// The shell function `fs DEVICE` (see FILE_SYSTEM), with the content filled in.
pub fn file_system() -> String {
    FILE_SYSTEM.replace("CONTENT", CONTENT)
}

/// The file at `inner` in the ext2 image `image`, read on the host (e2fsprogs' debugfs).
pub fn debugfs_cat(image: &Path, inner: &str) -> String {
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
    let (rw, sparse, mmio_image) = (
        job.image("rw.img", 64 << 20),
        job.image("sparse.img", 5 << 30),
        job.image("mmio.img", 64 << 20),
    );
    let ro = job.path("ro.img");
    std::fs::write(&ro, vec![0x5a; 1 << 20]).unwrap();
    let script = format!(
        r#"{fs}
echo "GUEST disks $(ls /sys/block | grep -c ^vd)"
fs vda
echo "GUEST vdb_ro $(cat /sys/block/vdb/ro)"
dd if=/dev/zero of=/dev/vdb bs=4096 count=1 conv=fsync 2>/dev/null && echo "GUEST ro_write accepted" || echo "GUEST ro_write refused"
echo "GUEST vdc_sectors $(cat /sys/block/vdc/size)"
echo -n {HIGH_MARKER} | dd of=/dev/vdc bs=512 seek={HIGH_SECTOR} conv=fsync 2>/dev/null
echo "GUEST vdc_high $(dd if=/dev/vdc bs=512 skip={HIGH_SECTOR} count=1 2>/dev/null | head -c {len})"
{queues}"#,
        queues = PER_CPU_QUEUES,
        fs = file_system(),
        len = HIGH_MARKER.len(),
    );
    let guest = Guest::new(&job.dir, "disks", &script, &[]);
    job.exitless(
        "pci",
        &guest,
        "",
        &format!(
            "--memory 256 --cpus 2 --disk {} --disk {},ro --disk {}",
            rw.display(),
            ro.display(),
            sparse.display()
        ),
    );
    let on_mmio = format!(
        "{fs}\necho \"GUEST disks $(ls /sys/block | grep -c ^vd)\"\nfs vda\n",
        fs = file_system(),
    );
    let on_mmio = Guest::new(&job.dir, "mmio", &on_mmio, &[]);
    job.exitless(
        "mmio",
        &on_mmio,
        "",
        &format!(
            "--memory 256 --disk {},transport=mmio",
            mmio_image.display()
        ),
    );
    let done = job.run(&lab, Duration::from_secs(900));

    let mmio = done.run("mmio");
    mmio.expect_done(0);
    mmio.expect("disks", "1");
    mmio.expect("vda_readback", CONTENT);
    assert_eq!(
        debugfs_cat(&mmio_image, "/hello"),
        CONTENT,
        "the host reads the file the guest wrote through virtio-mmio"
    );

    let pci = done.run("pci");
    pci.expect_done(0);
    pci.expect("disks", "3");
    pci.expect("vda_readback", CONTENT);
    // The driver read VIRTIO_BLK_F_RO (the block layer's read-only flag), and a write the
    // guest forces anyway is refused.
    pci.expect("vdb_ro", "1");
    pci.expect("ro_write", "refused");
    pci.expect("vdc_sectors", &(5u64 << 21).to_string());
    pci.expect("vdc_high", HIGH_MARKER);
    // One request queue per vCPU by default (VIRTIO_BLK_F_MQ): Linux made a hardware queue
    // of each, and the device completed requests on each.
    pci.expect("vda_queues", "2");
    let interrupts = pci.value("vda_queue_interrupts").unwrap_or_default();
    let per_queue: Vec<u64> = interrupts
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    assert!(
        per_queue.len() == 2 && per_queue.iter().all(|&n| n > 0),
        "interrupts on each request queue's vector: {interrupts:?}"
    );
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
    let image = job.image("kill.img", 64 << 20);
    let script = format!(
        "{fs}\nmkdir -p /mnt && mke2fs -F /dev/vda > /dev/null && mount -t ext4 /dev/vda /mnt && echo -n {CONTENT} > /mnt/hello && sync && echo 'GUEST synced yes'\nsleep 100000",
        fs = file_system()
    );
    let guest = Guest::new(&job.dir, "kill", &script, &[]);
    // exitless in the background; SIGKILL once the guest says its data is synced.
    job.sh(&format!(
        "{command} < /dev/null > killed.console 2>&1 &
pid=$!
for i in $(seq 300); do grep -q 'GUEST synced yes' killed.console && break; sleep 1; done
kill -KILL $pid; wait $pid; echo $? > killed.status",
        command = exitless_command(
            &guest,
            "",
            &format!("--memory 256 --disk {}", image.display())
        ),
    ));
    let done = job.run(&lab, Duration::from_secs(600));
    let run = done.run("killed");
    run.expect("synced", "yes");
    assert_eq!(run.status, 128 + 9, "killed by SIGKILL; {}", run.tail());
    assert_eq!(
        debugfs_cat(&image, "/hello"),
        CONTENT,
        "the synced file is in the image"
    );
}

/// util-linux's `blkdiscard` (its `-z`, BLKZEROOUT, which busybox's lacks) and `fallocate`
/// (`-p` and `-z` on a block device), run in the guest.
const ERASERS: [&str; 2] = ["/usr/sbin/blkdiscard", "/usr/bin/fallocate"];

/// The erase disk's size, and the guest's script on it: what its driver read (features, limits
/// and topology in sysfs), then, in its own MiB each, a discard (busybox's `blkdiscard`), a write
/// of zeroes without `unmap` (`blkdiscard -z`: BLKZEROOUT asks the device not to deallocate),
/// one with `unmap` (`fallocate -p`: a hole punched in a block device is a write of zeroes
/// that may deallocate) and one without (`fallocate -z`); each MiB read back through the
/// device (`O_DIRECT`), its bytes other than zero counted (a discard promises nothing).
const ERASE_MIB: u64 = 16;
const ERASE: &str = r#"
q=/sys/block/vda/queue
echo "GUEST erase_features $(cat /sys/block/vda/device/features)"
echo "GUEST erase_limits $(cat $q/discard_max_bytes $q/discard_granularity $q/write_zeroes_max_bytes $q/physical_block_size $q/minimum_io_size $q/max_segment_size | tr '\n' ' ')"
mib=1048576
busybox blkdiscard -o $((2 * mib)) -l $((2 * mib)) /dev/vda && echo "GUEST erase_discard ok"
/usr/sbin/blkdiscard -z -o $((5 * mib)) -l $mib /dev/vda && echo "GUEST erase_zeroout ok"
/usr/bin/fallocate -p -o $((7 * mib)) -l $((2 * mib)) /dev/vda && echo "GUEST erase_punch ok"
/usr/bin/fallocate -z -o $((10 * mib)) -l $mib /dev/vda && echo "GUEST erase_zero_range ok"
nonzero() { dd if=/dev/vda bs=$mib skip=$1 count=$2 iflag=direct 2>/dev/null | tr -d '\000' | wc -c; }
echo "GUEST erase_nonzero $(for m in 0 1 2 4 5 6 7 9 10 11; do printf '%s ' $(nonzero $m 1); done)"
"#;

/// Linux erases through exitless's virtio-blk: it negotiates DISCARD, WRITE_ZEROES, TOPOLOGY
/// and SIZE_MAX and takes the limits offered; a write of zeroes reads back as zeroes with and
/// without `unmap`, the MiB around each is untouched, and on the outer VM's tmpfs (under its
/// overlay: holes, but no zeroing in place, so zeroes are written there) the discard and the
/// write with `unmap` freed their pages while the writes without `unmap` kept theirs.
#[test]
#[ignore = "boots Linux in the lab, minutes; see the linux test binary's docs"]
fn linux_discards_and_writes_zeroes_and_the_host_frees_what_it_may() {
    let Some(lab) = Lab::or_skip("erase") else {
        return;
    };
    let mut job = Job::new("erase");
    let guest = Guest::new(&job.dir, "erase", ERASE, &ERASERS);
    // The image on the outer VM's own file system (a 9p share cannot punch holes), filled
    // with a pattern, its allocated 512-byte blocks said before and after.
    job.sh(&format!(
        r#"image="$RUN/erase.img"
yes exitless-erase | head -c {bytes} > "$image"
echo "blocks_before $(stat -c %b "$image")" > erase.facts"#,
        bytes = ERASE_MIB << 20
    ));
    job.exitless("erase", &guest, "", "--memory 256 --disk \"$image\"");
    job.sh(r#"echo "blocks_after $(stat -c %b "$image")" >> erase.facts"#);
    let done = job.run(&lab, Duration::from_secs(600));
    let run = done.run("erase");
    run.expect_done(0);
    // VIRTIO_BLK_F_SIZE_MAX, TOPOLOGY, DISCARD, WRITE_ZEROES.
    run.expect_features("erase_features", &[1, 10, 13, 14]);
    // 64 MiB per discard and per write of zeroes, discards in 4 KiB (the host's page, the
    // physical block), 4 KiB physical blocks and minimum I/O, 16 MiB segments.
    run.expect("erase_limits", "67108864 4096 67108864 4096 4096 16777216");
    for step in ["discard", "zeroout", "punch", "zero_range"] {
        run.expect(&format!("erase_{step}"), "ok");
    }
    // Bytes other than zero in each MiB read back (the script's order): untouched ones all
    // pattern, zeroed ones none; a discard (MiB 2) promises nothing.
    let nonzero = run.value("erase_nonzero").unwrap_or_default();
    let mib = (1u64 << 20).to_string();
    let want: Vec<(u32, Option<&str>)> = [0, 1, 2, 4, 5, 6, 7, 9, 10, 11]
        .into_iter()
        .map(|at| match at {
            2 => (at, None),
            5 | 7 | 10 => (at, Some("0")),
            _ => (at, Some(mib.as_str())),
        })
        .collect();
    let got: Vec<&str> = nonzero.split_whitespace().collect();
    assert_eq!(got.len(), want.len(), "{nonzero:?}");
    for ((at, want), got) in want.into_iter().zip(got) {
        if let Some(want) = want {
            assert_eq!(got, want, "MiB {at}'s bytes other than zero: {nonzero}");
        }
    }
    let facts = std::fs::read_to_string(done.dir.join("erase.facts")).unwrap_or_default();
    let blocks = |key: &str| -> u64 {
        facts
            .lines()
            .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{key} in {facts:?}"))
    };
    let freed = blocks("blocks_before ").saturating_sub(blocks("blocks_after "));
    // The discard's 2 MiB and the punched 2 MiB: 8,192 blocks of 512 bytes.
    assert_eq!(freed, 8192, "{facts}");
}

/// Debian's fio, run in the guest (with its libraries).
const FIO: &str = "/usr/bin/fio";

/// fio's jobs on vda, O_DIRECT through libaio, 5 s each: (`--rw`, `--bs`, `--iodepth`).
const FIO_JOBS: [(&str, &str, u32); 5] = [
    ("randread", "4k", 1),
    ("randread", "4k", 32),
    ("randwrite", "4k", 1),
    ("randwrite", "4k", 32),
    ("read", "1M", 4),
];

/// The guest's script: each of [`FIO_JOBS`] says its error (0: none) and its IOPS
/// (`--terse-version=3`: field 5, the reads' field 8, the writes' 49) as `GUEST` + its name
/// ([`fio_name`]).
fn fio_script() -> String {
    let jobs: Vec<String> = FIO_JOBS
        .iter()
        .map(|(rw, bs, depth)| format!("\"{rw} {bs} {depth}\""))
        .collect();
    format!(
        r#"
for job in {}; do
  set -- $job
  fio --name=job --filename=/dev/vda --direct=1 --ioengine=libaio --rw=$1 --bs=$2 \
    --iodepth=$3 --runtime=5 --time_based --size=48M --output-format=terse --terse-version=3 \
    > /tmp/fio 2>&1
  echo "GUEST fio_$1_$2_$3 $(awk -F';' '/^3;/ {{ print "error=" $5, "iops=" ($8 + $49) }}' /tmp/fio)"
done
"#,
        jobs.join(" ")
    )
}

/// The name a fio job's line has on the console.
fn fio_name((rw, bs, depth): (&str, &str, u32)) -> String {
    format!("fio_{rw}_{bs}_{depth}")
}

/// The runs of the fio case, in the order of its table: the name, and what QEMU's run of
/// the same kind is (the ratio's denominator).
const FIO_RUNS: [(&str, &str); 5] = [
    ("exitless", "qemu"),
    ("exitless-sync", "qemu"),
    ("qemu", "qemu"),
    ("exitless-vhost-user", "qemu-vhost-user"),
    ("qemu-vhost-user", "qemu-vhost-user"),
];

/// The same guest runs fio ([`FIO_JOBS`]) on a virtio-pci disk under exitless, with its
/// requests on an io_uring (the default) and a request at a time (`aio=sync`), and under
/// QEMU with `aio=io_uring`; then on a vhost-user disk served by qemu-storage-daemon (one
/// daemon per VMM, on its own image, exporting one queue: QEMU is told `num-queues=1`, where
/// exitless takes what the daemon offers) under exitless and under QEMU
/// (`vhost-user-blk-pci`); in
/// one lab run: every job completes without an error on each. The IOPS are printed side by
/// side, each VMM's over QEMU's of the same kind (TCG-timed: the ratios are what counts; one
/// run each). 768 MiB each: fio's libraries make a 90 MB initramfs, which 256 MiB cannot
/// unpack.
#[test]
#[ignore = "boots Linux in the lab, minutes; see the linux test binary's docs"]
fn fio_runs_on_exitless_and_on_qemu_in_the_same_lab() {
    let Some(lab) = Lab::or_skip("fio") else {
        return;
    };
    let mut job = Job::new("fio");
    let guest = Guest::new(&job.dir, "fio", &fio_script(), &[FIO]);
    let image = |name: &str| {
        job.image(&format!("{name}.img"), 64 << 20)
            .display()
            .to_string()
    };
    let (uring, sync, qemu) = (image("uring"), image("sync"), image("qemu"));
    let (exitless_vhost, qemu_vhost) = (image("exitless-vhost"), image("qemu-vhost"));
    job.exitless(
        "exitless",
        &guest,
        "",
        &format!("--cpus 2 --memory 768 --disk {uring}"),
    );
    job.exitless(
        "exitless-sync",
        &guest,
        "",
        &format!("--cpus 2 --memory 768 --disk {sync},aio=sync"),
    );
    job.qemu(
        "qemu",
        &guest,
        "q35",
        "",
        &format!(
            "-smp 2 -m 768 -drive id=d0,file={qemu},format=raw,if=none,aio=io_uring \
             -device virtio-blk-pci,drive=d0"
        ),
    );
    let exitless_socket =
        crate::vhost_user::start_storage_daemon(&mut job, Path::new(&exitless_vhost), "exitless");
    job.exitless(
        "exitless-vhost-user",
        &guest,
        "",
        &format!("--cpus 2 --memory 768 --disk vhost-user={exitless_socket}"),
    );
    let qemu_socket =
        crate::vhost_user::start_storage_daemon(&mut job, Path::new(&qemu_vhost), "qemu");
    // vhost-user needs guest memory the daemon can map: a shared memfd.
    job.qemu(
        "qemu-vhost-user",
        &guest,
        "q35,memory-backend=mem",
        "",
        &format!(
            "-smp 2 -m 768 -object memory-backend-memfd,id=mem,size=768M,share=on \
             -chardev socket,id=c0,path={qemu_socket} \
             -device vhost-user-blk-pci,chardev=c0,num-queues=1"
        ),
    );
    job.sh(crate::vhost_user::STOP_STORAGE_DAEMONS);
    let done = job.run(&lab, Duration::from_secs(1500));
    let runs = FIO_RUNS.map(|(name, _)| done.run(name));
    let iops = |run: &crate::guest::Run, name: &str| -> Option<f64> {
        let value = run.value(name)?;
        let (error, iops) = value.split_once(' ')?;
        (error == "error=0").then_some(())?;
        iops.strip_prefix("iops=")?.parse().ok()
    };
    println!(
        "fio IOPS (TCG-timed, one run each), each over QEMU's of its kind: {}",
        FIO_RUNS.map(|(name, _)| name).join(", ")
    );
    let mut failed = Vec::new();
    for fio in FIO_JOBS {
        let name = fio_name(fio);
        let got = runs.each_ref().map(|run| iops(run, &name));
        let of = |run: &str| {
            FIO_RUNS
                .iter()
                .position(|(n, _)| *n == run)
                .and_then(|k| got[k])
        };
        let cells: Vec<String> = FIO_RUNS
            .iter()
            .zip(got)
            .map(|((_, qemu), value)| match (value, of(qemu)) {
                (Some(v), Some(q)) => format!("{v:.0} ({:.2})", v / q),
                (value, _) => format!("{value:?}"),
            })
            .collect();
        println!("  {name}: {}", cells.join(", "));
        for (run, got) in runs.iter().zip(got) {
            if !got.is_some_and(|n| n > 0.0) {
                failed.push(format!("{}: {name}: {:?}", run.name, run.value(&name)));
            }
        }
    }
    for run in &runs {
        run.expect_done(0);
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
