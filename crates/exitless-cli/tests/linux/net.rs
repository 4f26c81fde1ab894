//! virtio-net under Linux's virtio_net driver, on a tap the job makes: ping, TCP both ways and
//! UDP with iperf3 against servers beside exitless, the MAC `mac=` sets, four queue pairs
//! (`queues=4`) each carrying traffic both ways after `ethtool -L`, and the same card behind
//! virtio-mmio; the driver takes the checksum and segmentation offloads and mergeable receive
//! buffers, and TCP crosses the card in segments larger than the MTU, as under QEMU, whose
//! throughput is printed beside.

use std::time::Duration;

use crate::guest::{Guest, Job, Run};
use crate::lab::Lab;

/// The host's end of a tap is 10.0.N.1 and the guest's 10.0.N.15, N the tap's own subnet.
pub fn host_address(subnet: u8) -> String {
    format!("10.0.{subnet}.1")
}
fn guest_address(subnet: u8) -> String {
    format!("10.0.{subnet}.15")
}

/// The MAC the first run sets.
const MAC: &str = "52:54:00:12:34:56";

/// iperf3 on the host and in the guest, and ethtool in the guest: Debian's, with their
/// libraries.
pub const IPERF3: &str = "/usr/bin/iperf3";
pub const ETHTOOL: &str = "/usr/sbin/ethtool";

/// How long each iperf3 test runs, seconds.
pub const SECONDS: u32 = 3;

/// The guest's side: bring eth0 up, say its MAC and queue count, ping the host, then run the
/// iperf3 tests named in `$TESTS` (set by the case's script before it), one summary line each;
/// a test runs `SECONDS` unless its arguments give its end (`-t`, `-n`).
const NETWORK: &str = r#"
ip link set lo up
ip addr add @GUEST@/24 dev eth0 && ip link set eth0 up
echo "GUEST mac $(cat /sys/class/net/eth0/address)"
echo "GUEST rx_queues $(ls -d /sys/class/net/eth0/queues/rx-* | wc -l)"
ping -c 3 -W 10 @HOST@ > /tmp/ping 2>&1
echo "GUEST ping_replies $(grep -c 'bytes from' /tmp/ping)"
stat() { cat /sys/class/net/eth0/statistics/$1; }
iperf() {
  name="$1"; shift
  case " $* " in *" -t "*|*" -n "*) ;; *) set -- -t @SECONDS@ "$@" ;; esac
  tb=$(stat tx_bytes) tp=$(stat tx_packets) rb=$(stat rx_bytes) rp=$(stat rx_packets)
  iperf3 -c @HOST@ -f k "$@" > /tmp/$name 2>&1
  echo "GUEST ${name}_status $?"
  echo "GUEST ${name} $(grep -E 'receiver|error' /tmp/$name | tail -1)"
  echo "GUEST ${name}_tx_frame_bytes $(( ($(stat tx_bytes) - tb) / ($(stat tx_packets) - tp + 1) ))"
  echo "GUEST ${name}_rx_frame_bytes $(( ($(stat rx_bytes) - rb) / ($(stat rx_packets) - rp + 1) ))"
}
echo "GUEST features $(cat /sys/class/net/eth0/device/features)"
"#;

/// The guest's script on `subnet`.
pub fn network(subnet: u8) -> String {
    NETWORK
        .replace("@GUEST@", &guest_address(subnet))
        .replace("@HOST@", &host_address(subnet))
        .replace("@SECONDS@", &SECONDS.to_string())
}

/// The job's lines that make tap `name` on `subnet` (`mode`: `multi_queue` or empty), up.
pub fn tap(name: &str, subnet: u8, mode: &str) -> String {
    format!(
        "ip tuntap add dev {name} mode tap {mode} && ip addr add {}/24 dev {name} && ip link set {name} up",
        host_address(subnet)
    )
}

/// The guest's script on `subnet` that [`expect_traffic`] checks: ping, then TCP and UDP
/// out and in.
pub fn traffic(subnet: u8) -> String {
    format!(
        "{}\niperf tcp_tx\niperf tcp_rx -R\niperf udp_tx -u -b 10M\niperf udp_rx -u -b 10M -R\n",
        network(subnet)
    )
}

/// Start iperf3 servers in the job on ports 5200 to 5203 (5201, iperf3's default, serves
/// [`traffic`]; each of the others one more pinned client of the multiqueue run). A daemon
/// works in `/`: its files get whole paths, its pid files the job's local `$RUN`. The job's
/// `restart_servers` starts them afresh before a faulted guest runs again: a server still
/// serving the dead guest's test answers the next one "the server is busy" (seen in CI).
pub fn start_iperf3_servers(job: &mut Job) {
    let line = format!(
        "start_iperf3_servers() {{ for p in 5200 5201 5202 5203; do {IPERF3} -s -p $p -D -I \"$RUN/iperf3-$p.pid\" --logfile {dir}/iperf3-$p.log; done; }}
restart_servers() {{ {STOP_IPERF3_SERVERS}; sleep 1; start_iperf3_servers; }}
start_iperf3_servers",
        dir = job.dir.display()
    );
    job.sh(&line);
}

/// The job's line that stops them.
pub const STOP_IPERF3_SERVERS: &str =
    r#"for f in "$RUN"/iperf3-*.pid; do kill "$(cat "$f")"; done"#;

/// The bytes an iperf3 summary line says the receiver got (`9.02 MBytes`).
pub fn received_bytes(run: &Run, test: &str) -> f64 {
    run.expect(&format!("{test}_status"), "0");
    let line = run.value(test).unwrap_or_default();
    let words: Vec<&str> = line.split_whitespace().collect();
    let unit = |word: &str| match word {
        "Bytes" => Some(1.0),
        "KBytes" => Some(1024.0),
        "MBytes" => Some(1024.0 * 1024.0),
        "GBytes" => Some(1024.0 * 1024.0 * 1024.0),
        _ => None,
    };
    words
        .windows(2)
        .find_map(|w| Some(w[0].parse::<f64>().ok()? * unit(w[1])?))
        .unwrap_or_else(|| panic!("{}: no transfer in {line:?}; {}", run.name, run.tail()))
}

/// The datagrams a UDP test's receiver lost and the ones sent (`0/2590 (0%)`).
pub fn lost_of_sent(run: &Run, test: &str) -> (u64, u64) {
    let line = run.value(test).unwrap_or_default();
    line.split_whitespace()
        .find_map(|w| {
            let (lost, sent) = w.split_once('/')?;
            Some((lost.parse().ok()?, sent.parse().ok()?))
        })
        .unwrap_or_else(|| panic!("{}: no datagram counts in {line:?}", run.name))
}

/// The features a driver takes from a card on a tap for Linux's data path (virtio 1.2
/// §5.1.3): the offloads, CSUM, GUEST_CSUM, GUEST_TSO4, GUEST_TSO6, GUEST_ECN, HOST_TSO4,
/// HOST_TSO6, HOST_ECN; and MRG_RXBUF, with which a received segment larger than the MTU
/// spreads over several of the driver's page-sized buffers.
const DATA_PATH_BITS: [usize; 9] = [0, 1, 7, 8, 9, 11, 12, 13, 15];

/// The largest frame without segmentation offloads: a 1500-byte MTU and its Ethernet header.
const MTU_FRAME: u64 = 1514;

/// Check that the guest's driver negotiated the offloads and mergeable receive buffers (its
/// device's `features`, one character per bit) and that TCP crossed the card in segments
/// larger than the MTU each way (the driver's byte and packet counters over each test: a
/// segment counts once; received, each filled several buffers).
fn expect_offloads(run: &Run) {
    run.expect_features("features", &DATA_PATH_BITS);
    for (test, counter) in [("tcp_tx", "tx"), ("tcp_rx", "rx")] {
        let key = format!("{test}_{counter}_frame_bytes");
        let bytes: u64 = run.value(&key).and_then(|v| v.parse().ok()).unwrap_or(0);
        println!(
            "{}: {test}: {bytes} bytes per {counter} frame on average",
            run.name
        );
        assert!(
            bytes > MTU_FRAME,
            "{}: {key} {bytes}: no TCP segment larger than the MTU crossed the card",
            run.name
        );
    }
}

/// Check the single-queue guest's tests: the offloads, the echo replies, and data carried
/// each way.
pub fn expect_traffic(run: &Run) {
    run.expect_done(0);
    run.expect("ping_replies", "3");
    for test in ["tcp_tx", "tcp_rx", "udp_tx", "udp_rx"] {
        let bytes = received_bytes(run, test);
        println!(
            "{}: {test}: {:.1} MiB in {SECONDS} s (TCG-timed)",
            run.name,
            bytes / f64::from(1 << 20)
        );
        assert!(bytes > 0.0, "{}: {test} carried nothing", run.name);
    }
    // Datagrams arrive each way; how many are lost is said, not judged (TCG's timing drops
    // some at the receiver's socket now and then).
    for test in ["udp_tx", "udp_rx"] {
        let (lost, sent) = lost_of_sent(run, test);
        println!("{}: {test}: {lost} of {sent} datagrams lost", run.name);
        assert!(
            sent > 0 && lost < sent,
            "{}: {test}: {lost} of {sent} datagrams lost",
            run.name
        );
    }
    expect_offloads(run);
}

/// The per-queue packet counts `ethtool -S` gave (`GUEST stat rx_queue_0_packets N`), by name.
fn queue_packets(run: &Run) -> Vec<(String, u64)> {
    run.console
        .lines()
        .filter_map(|l| l.split_once("GUEST stat ").map(|(_, rest)| rest))
        .filter_map(|rest| {
            let (name, count) = rest.split_once(' ')?;
            Some((name.to_owned(), count.trim().parse().ok()?))
        })
        .collect()
}

/// The four-pair guest's script on `subnet` that [`four_pairs_carried`] checks: four queue
/// pairs on two CPUs, one pair after `ethtool -L combined 1` and four again after `combined 4`
/// (VQ_PAIRS_SET each time); then 16 flows from a client pinned to each CPU (the driver gives
/// CPU 0 queues 0 and 2 and CPU 1 queues 1 and 3, and a flow's hash picks between them) and 32
/// flows back, which the tap hashes over the four receive queues. `ethtool -S` counts each
/// queue's packets. Two CPUs, not four: with four vCPUs the lab's guests, under QEMU as under
/// exitless, now and then triple-fault (docs/linux-lab.md).
pub fn four_pairs(subnet: u8) -> String {
    format!(
        "{network}\n\
         ethtool -L eth0 combined 1 && echo \"GUEST combined_after_1 $(ethtool -l eth0 | awk '/Combined/ {{ n = $2 }} END {{ print n }}')\"\n\
         ethtool -L eth0 combined 4 && echo \"GUEST combined_after_4 $(ethtool -l eth0 | awk '/Combined/ {{ n = $2 }} END {{ print n }}')\"\n\
         for c in 0 1; do taskset -c $c iperf3 -c {host} -p 520$c -t {SECONDS} -P 16 > /tmp/cpu$c 2>&1 & done; wait\n\
         echo \"GUEST pinned_done $(grep -l 'SUM.*receiver' /tmp/cpu? | wc -l)\"\n\
         for c in 0 1; do echo \"GUEST pinned_$c $(grep -E 'SUM.*receiver|error' /tmp/cpu$c | tail -1)\"; done\n\
         iperf tcp_rx_parallel -R -P 32\n\
         ethtool -S eth0 | awk '/_queue_[0-9]+_packets:/ {{ sub(\":\", \"\", $1); print \"GUEST stat \" $1 \" \" $2 }}'\n",
        network = network(subnet),
        host = host_address(subnet),
    )
}

/// Whether the four-pair guest finished with each of its queues in both directions carrying
/// packets, after `ethtool -L` set one pair and four again: what it carried, or what it lacked.
pub fn four_pairs_carried(run: &Run) -> Result<String, String> {
    let finished = run.console.contains("GUEST done") && run.status == 0;
    if !finished {
        return Err(format!("did not finish (status {})", run.status));
    }
    for (key, want) in [
        // The driver starts with a pair per CPU (virtnet_probe), up to the device's four.
        ("rx_queues", "2"),
        ("ping_replies", "3"),
        ("combined_after_1", "1"),
        ("combined_after_4", "4"),
        ("pinned_done", "2"),
        ("tcp_rx_parallel_status", "0"),
    ] {
        if run.value(key) != Some(want) {
            return Err(format!("GUEST {key} {:?}, not {want}", run.value(key)));
        }
    }
    let bytes = received_bytes(run, "tcp_rx_parallel");
    let packets = queue_packets(run);
    for direction in ["rx", "tx"] {
        for queue in 0..4 {
            let name = format!("{direction}_queue_{queue}_packets");
            let count = packets.iter().find(|(n, _)| *n == name).map(|(_, c)| *c);
            if count.is_none_or(|c| c == 0) {
                return Err(format!("{name} is {count:?}: a pair carried nothing"));
            }
        }
    }
    Ok(format!(
        "{:.1} MiB back on 32 flows; packets by queue: {packets:?}",
        bytes / f64::from(1 << 20)
    ))
}

#[test]
#[ignore = "boots Linux in the lab, minutes; see the linux test binary's docs"]
fn linux_pings_and_carries_tcp_and_udp_both_ways_on_a_tap_with_one_or_four_queue_pairs() {
    let Some(lab) = Lab::or_skip("net") else {
        return;
    };
    let mut job = Job::new("net");
    let single = traffic(2);
    let multi = four_pairs(3);
    let single = Guest::new(&job.dir, "single", &single, &[IPERF3]);
    let multi = Guest::new(&job.dir, "multi", &multi, &[IPERF3, ETHTOOL]);
    job.sh(&tap("lab-tap2", 2, ""));
    job.sh(&tap("lab-tap3", 3, "multi_queue"));
    start_iperf3_servers(&mut job);
    job.exitless(
        "pci",
        &single,
        "",
        &format!("--memory 512 --cpus 2 --net tap=lab-tap2,mac={MAC}"),
    );
    // The same card under QEMU (virtio-net-pci on the same tap, vhost=off, its default), for
    // the offloads it negotiates and the throughput beside exitless's in the same lab run.
    job.qemu(
        "qemu-pci",
        &single,
        "q35",
        "",
        "-m 512 -smp 2 -netdev tap,id=n0,ifname=lab-tap2,script=no,downscript=no \
         -device virtio-net-pci,netdev=n0",
    );
    job.exitless(
        "queues-4",
        &multi,
        "",
        "--memory 512 --cpus 2 --net tap=lab-tap3,queues=4",
    );
    // The same guest and card shape under QEMU, in the same lab: a failure under both is the
    // lab's, one under exitless alone is exitless's (docs/linux-lab.md).
    job.qemu(
        "qemu-queues-4",
        &multi,
        "q35",
        "",
        "-m 512 -smp 2 -netdev tap,id=n0,ifname=lab-tap3,script=no,downscript=no,queues=4 \
         -device virtio-net-pci,netdev=n0,mq=on,vectors=10",
    );
    job.exitless(
        "mmio",
        &single,
        "",
        "--memory 512 --cpus 2 --net tap=lab-tap2,transport=mmio",
    );
    job.sh(&format!(
        "{STOP_IPERF3_SERVERS}; ip link del lab-tap2; ip link del lab-tap3"
    ));
    let done = job.run(&lab, Duration::from_secs(1200));

    let pci = done.run("pci");
    pci.expect("mac", MAC);
    pci.expect("rx_queues", "1");
    expect_traffic(&pci);
    let qemu_pci = done.run("qemu-pci");
    expect_traffic(&qemu_pci);
    for test in ["tcp_tx", "tcp_rx"] {
        let [exitless, qemu] = [&pci, &qemu_pci].map(|run| received_bytes(run, test));
        println!(
            "{test}: exitless/qemu {:.2} (one run each, TCG-timed)",
            exitless / qemu
        );
    }

    let outcomes = ["queues-4", "qemu-queues-4"].map(|name| {
        let run = done.run(name);
        let outcome = four_pairs_carried(&run);
        println!("{name}: {}", outcome.as_ref().unwrap_or_else(|e| e));
        outcome.map_err(|e| format!("{name}: {e}; {}", run.tail()))
    });
    for outcome in outcomes {
        outcome.unwrap_or_else(|e| panic!("{e}"));
    }

    let mmio = done.run("mmio");
    expect_traffic(&mmio);
}
