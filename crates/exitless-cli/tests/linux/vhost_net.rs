//! `--net tap=NAME,vhost=on`: the kernel's vhost-net moves the tap's frames, under Linux's
//! virtio_net driver in the lab (the outer VM has `/dev/vhost-net`). The same checks as the
//! in-process card's ([`crate::net`]): ping, TCP and UDP both ways, the offloads and mergeable
//! buffers negotiated, TCP segments larger than the MTU each way; four queue pairs each
//! carrying traffic after `ethtool -L` took them to one and back (each pair's rings started
//! and stopped on the kernel's files); and QEMU's `vhost=on` beside, in the same lab run.

use std::time::Duration;

use crate::guest::{Guest, Job};
use crate::lab::Lab;
use crate::net::{
    ETHTOOL, IPERF3, STOP_IPERF3_SERVERS, expect_traffic, four_pairs, four_pairs_carried,
    received_bytes, start_iperf3_servers, tap, traffic,
};

#[test]
#[ignore = "boots Linux in the lab, minutes; see the linux test binary's docs"]
fn linux_carries_traffic_on_the_kernels_vhost_net_with_one_or_four_queue_pairs() {
    let Some(lab) = Lab::or_skip("vhost-net") else {
        return;
    };
    let mut job = Job::new("vhost-net");
    let single = Guest::new(&job.dir, "single", &traffic(7), &[IPERF3]);
    let multi = Guest::new(&job.dir, "multi", &four_pairs(8), &[IPERF3, ETHTOOL]);
    job.sh(&tap("lab-tap7", 7, ""));
    job.sh(&tap("lab-tap8", 8, "multi_queue"));
    start_iperf3_servers(&mut job);
    job.exitless(
        "vhost",
        &single,
        "",
        "--memory 512 --cpus 2 --net tap=lab-tap7,vhost=on",
    );
    job.qemu(
        "qemu-vhost",
        &single,
        "q35",
        "",
        "-m 512 -smp 2 -netdev tap,id=n0,ifname=lab-tap7,script=no,downscript=no,vhost=on \
         -device virtio-net-pci,netdev=n0",
    );
    job.exitless(
        "vhost-queues-4",
        &multi,
        "",
        "--memory 512 --cpus 2 --net tap=lab-tap8,queues=4,vhost=on",
    );
    job.sh(&format!(
        "{STOP_IPERF3_SERVERS}; ip link del lab-tap7; ip link del lab-tap8"
    ));
    let done = job.run(&lab, Duration::from_secs(900));

    let vhost = done.run("vhost");
    expect_traffic(&vhost);
    let qemu = done.run("qemu-vhost");
    expect_traffic(&qemu);
    for test in ["tcp_tx", "tcp_rx"] {
        let [exitless, qemu] = [&vhost, &qemu].map(|run| received_bytes(run, test));
        println!(
            "{test}: exitless vhost=on / qemu vhost=on {:.2} (one run each, TCG-timed)",
            exitless / qemu
        );
    }
    let multi = done.run("vhost-queues-4");
    match four_pairs_carried(&multi) {
        Ok(carried) => println!("vhost-queues-4: {carried}"),
        Err(e) => panic!("vhost-queues-4: {e}; {}", multi.tail()),
    }
}
