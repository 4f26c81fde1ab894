//! The network table of the data-path work (docs/linux-lab.md, "virtio-net under iperf3 and
//! sockperf"): one guest, the same tap, four cards in turn, exitless's in-process card and its
//! `vhost=on` beside QEMU's `virtio-net-pci` with `vhost=off` and `vhost=on`; then, with
//! `EXITLESS_LAB_TESTPMD=1`, each VMM's vhost-user card on DPDK's testpmd, which forwards its
//! frames to a tap it makes (the same name and address, the guest's checksum offload turned
//! off: testpmd passes frames as they are). Each runs TCP
//! both ways, UDP streams of 32-byte and 1400-byte datagrams both ways (iperf3, unpaced), and
//! 32-byte and 1024-byte request/response over UDP (sockperf ping-pong, its median). The
//! case checks that every test ran and carried something; the figures are printed side by
//! side as ratios, never judged: the lab is TCG-timed and unsteady (docs/linux-lab.md).

use std::time::Duration;

use std::path::Path;

use exitless_peer::backends::{TESTPMD_BINARY, testpmd_tap_forwarder_args};

use crate::guest::{Guest, Job, Run};
use crate::lab::Lab;
use crate::net::{
    ETHTOOL, IPERF3, SECONDS, STOP_IPERF3_SERVERS, host_address, lost_of_sent, network,
    received_bytes, start_iperf3_servers, tap,
};
use crate::vhost_user::shell_line;

/// sockperf, Debian's: the request/response tool (its server beside exitless, its client in
/// the guest).
const SOCKPERF: &str = "/usr/bin/sockperf";

/// The tap's subnet.
const SUBNET: u8 = 9;

/// sockperf's server port.
const SOCKPERF_PORT: u16 = 11111;

/// The guest's tests after the network's setup: iperf3's (`iperf NAME ARGS`, [`network`]'s)
/// then sockperf's, each ping-pong's median latency and message count.
const TESTS: &str = r#"
# the tests
iperf tcp_tx
iperf tcp_rx -R
iperf udp32_tx -u -l 32 -b 0
iperf udp32_rx -u -l 32 -b 0 -R
iperf udp1400_tx -u -l 1400 -b 0
iperf udp1400_rx -u -l 1400 -b 0 -R
for m in 32 1024; do
  sockperf pp -i @HOST@ -p @PORT@ -t @SECONDS@ -m $m > /tmp/rr$m 2>&1
  echo "GUEST rr${m}_status $?"
  echo "GUEST rr${m}_p50_us $(grep 'percentile 50.000' /tmp/rr$m | awk '{ print $NF }')"
  echo "GUEST rr${m}_messages $(grep -o 'ReceivedMessages=[0-9]*' /tmp/rr$m | cut -d= -f2)"
done
"#;

/// Where [`TESTS`] starts in a guest's script.
const TESTS_START: &str = "# the tests\n";

/// A row of the table: how to read it from a run, and whether more is better.
struct Row {
    name: &'static str,
    unit: &'static str,
    read: fn(&Run, &str) -> f64,
    test: &'static str,
    higher_is_better: bool,
}

fn mib_per_s(run: &Run, test: &str) -> f64 {
    received_bytes(run, test) / f64::from(1 << 20) / f64::from(SECONDS)
}

/// Datagrams the receiver got per second.
fn packets_per_s(run: &Run, test: &str) -> f64 {
    run.expect(&format!("{test}_status"), "0");
    let (lost, sent) = lost_of_sent(run, test);
    assert!(
        sent > lost,
        "{}: {test}: {lost} of {sent} datagrams lost",
        run.name
    );
    (sent - lost) as f64 / f64::from(SECONDS)
}

/// The ping-pong's median latency, µs.
fn median_us(run: &Run, test: &str) -> f64 {
    run.expect(&format!("{test}_status"), "0");
    let messages: u64 = run
        .value(&format!("{test}_messages"))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(
        messages > 0,
        "{}: {test}: no answer; {}",
        run.name,
        run.tail()
    );
    run.value(&format!("{test}_p50_us"))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{}: {test}: no median; {}", run.name, run.tail()))
}

const ROWS: [Row; 8] = [
    Row {
        name: "TCP guest → host",
        unit: "MiB/s",
        read: mib_per_s,
        test: "tcp_tx",
        higher_is_better: true,
    },
    Row {
        name: "TCP host → guest",
        unit: "MiB/s",
        read: mib_per_s,
        test: "tcp_rx",
        higher_is_better: true,
    },
    Row {
        name: "UDP 32 B guest → host",
        unit: "packets/s",
        read: packets_per_s,
        test: "udp32_tx",
        higher_is_better: true,
    },
    Row {
        name: "UDP 32 B host → guest",
        unit: "packets/s",
        read: packets_per_s,
        test: "udp32_rx",
        higher_is_better: true,
    },
    Row {
        name: "UDP 1400 B guest → host",
        unit: "packets/s",
        read: packets_per_s,
        test: "udp1400_tx",
        higher_is_better: true,
    },
    Row {
        name: "UDP 1400 B host → guest",
        unit: "packets/s",
        read: packets_per_s,
        test: "udp1400_rx",
        higher_is_better: true,
    },
    Row {
        name: "request/response 32 B, median",
        unit: "µs",
        read: median_us,
        test: "rr32",
        higher_is_better: false,
    },
    Row {
        name: "request/response 1024 B, median",
        unit: "µs",
        read: median_us,
        test: "rr1024",
        higher_is_better: false,
    },
];

/// The cards, as (run name, exitless's `--net` options or QEMU's `-netdev` ones).
const EXITLESS: [(&str, &str); 2] = [("exitless", ""), ("exitless-vhost", ",vhost=on")];
const QEMU: [(&str, &str); 2] = [("qemu", ",vhost=off"), ("qemu-vhost", ",vhost=on")];

/// The runs on testpmd's forwarder.
const FORWARDED: [&str; 2] = ["exitless-vhost-user", "qemu-vhost-user"];

/// The job's lines after the tap's runs: the tap gone, testpmd started as a forwarder between
/// a vhost-user socket (`@SOCKET@`) and a tap of the same name it makes, given the host's
/// address, and sockperf's server started again on it. testpmd runs until its stdin reaches
/// EOF: a FIFO the job holds open on fd 3.
const FORWARDER: &str = r#"ip link del lab-tap9
mkfifo "$RUN/testpmd.in"
@TESTPMD@ < "$RUN/testpmd.in" > testpmd.log 2>&1 &
exec 3> "$RUN/testpmd.in"
wait_for_socket @SOCKET@
for i in $(seq 30); do ip link show lab-tap9 > /dev/null 2>&1 && break; sleep 1; done
ip addr add @HOST@/24 dev lab-tap9 && ip link set lab-tap9 up
kill "$(cat "$RUN/sockperf.pid")"; sleep 1; start_sockperf"#;

#[test]
#[ignore = "boots Linux in the lab, minutes; see the linux test binary's docs"]
fn linux_network_table_exitless_and_qemu_with_and_without_vhost_net() {
    let Some(lab) = Lab::or_skip("net-table") else {
        return;
    };
    let mut job = Job::new("net-table");
    let script = format!("{}\n{TESTS}", network(SUBNET))
        .replace("@HOST@", &host_address(SUBNET))
        .replace("@PORT@", &SOCKPERF_PORT.to_string())
        .replace("@SECONDS@", &SECONDS.to_string());
    let guest = Guest::new(&job.dir, "table", &script, &[IPERF3, SOCKPERF]);
    job.sh(&tap("lab-tap9", SUBNET, ""));
    start_iperf3_servers(&mut job);
    job.sh(&format!(
        "start_sockperf() {{ {SOCKPERF} sr -i {} -p {SOCKPERF_PORT} >> sockperf-server.log 2>&1 & echo $! > \"$RUN/sockperf.pid\"; }}\nstart_sockperf",
        host_address(SUBNET)
    ));
    for (name, options) in EXITLESS {
        job.exitless(
            name,
            &guest,
            "",
            &format!("--memory 512 --cpus 2 --net tap=lab-tap9{options}"),
        );
    }
    for (name, options) in QEMU {
        job.qemu(
            name,
            &guest,
            "q35",
            "",
            &format!(
                "-m 512 -smp 2 -netdev tap,id=n0,ifname=lab-tap9,script=no,downscript=no{options} \
                 -device virtio-net-pci,netdev=n0"
            ),
        );
    }
    let forwarded = std::env::var_os("EXITLESS_LAB_TESTPMD").is_some();
    if forwarded {
        on_testpmd(&mut job, &script);
    } else {
        println!(
            "net-table: the testpmd columns skipped (EXITLESS_LAB_TESTPMD=1 runs them; see on_testpmd)"
        );
    }
    job.sh(&format!(
        "exec 3>&- 2>/dev/null\n{STOP_IPERF3_SERVERS}; kill \"$(cat \"$RUN/sockperf.pid\")\"; ip link del lab-tap9 2>/dev/null; wait"
    ));
    let done = job.run(&lab, Duration::from_secs(1800));

    let runs: Vec<Run> = EXITLESS
        .iter()
        .chain(&QEMU)
        .map(|(name, _)| *name)
        .chain(FORWARDED.iter().copied().filter(|_| forwarded))
        .map(|name| {
            let run = done.run(name);
            run.expect_done(0);
            run
        })
        .collect();
    // exitless's in-process card against QEMU's vhost=off, its vhost=on against QEMU's, its
    // vhost-user card on testpmd against QEMU's.
    println!(
        "| {SECONDS} s each, one run each, TCG-timed | exitless | QEMU vhost=off | ratio | exitless vhost=on | QEMU vhost=on | ratio | exitless vhost-user (testpmd) | QEMU vhost-user | ratio |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for row in &ROWS {
        let read = |i: usize| runs.get(i).map(|run| (row.read)(run, row.test));
        let pair = |ours: usize, qemu: usize| match (read(ours), read(qemu)) {
            (Some(ours), Some(qemu)) => format!("{ours:.0} | {qemu:.0} | {:.2}", ours / qemu),
            _ => "- | - | -".to_owned(),
        };
        let better = if row.higher_is_better {
            "higher is better"
        } else {
            "lower is better"
        };
        println!(
            "| {} ({}, {better}) | {} | {} | {} |",
            row.name,
            row.unit,
            pair(0, 2),
            pair(1, 3),
            pair(4, 5)
        );
    }
}

/// The testpmd runs of the table (after the tap's, on `script` with the guest's checksum
/// offload turned off): run only when asked for, as in the nested lab they fail now and then
/// for the lab's want of CPU: testpmd's forwarding core spins on one of the outer VM's two
/// vCPUs, and once (of two runs, on the 6.12 outer kernel) its own control thread did not
/// answer exitless's memory table within the 5 s every vhost-user exchange is given, so the
/// card needed a reset Linux never makes.
fn on_testpmd(job: &mut Job, script: &str) {
    let tx_off = script.replacen(
        TESTS_START,
        &format!("ethtool -K eth0 tx off\n{TESTS_START}"),
        1,
    );
    let forwarded = Guest::new(&job.dir, "forwarded", &tx_off, &[IPERF3, SOCKPERF, ETHTOOL]);
    let socket = "$RUN/net.sock";
    job.sh(&FORWARDER
        .replace(
            "@TESTPMD@",
            &shell_line(
                TESTPMD_BINARY,
                &testpmd_tap_forwarder_args(Path::new(socket), "lab-tap9", "exitless-table"),
            ),
        )
        .replace("@SOCKET@", socket)
        .replace("@HOST@", &host_address(SUBNET)));
    let [exitless_forwarded, qemu_forwarded] = FORWARDED;
    job.exitless(
        exitless_forwarded,
        &forwarded,
        "",
        &format!("--memory 512 --cpus 2 --net vhost-user={socket}"),
    );
    // vhost-user needs guest memory testpmd can map: a shared memfd.
    job.qemu(
        qemu_forwarded,
        &forwarded,
        "q35,memory-backend=mem",
        "",
        &format!(
            "-m 512 -smp 2 -object memory-backend-memfd,id=mem,size=512M,share=on \
             -chardev socket,id=c1,path={socket} -netdev vhost-user,id=n1,chardev=c1 \
             -device virtio-net-pci,netdev=n1"
        ),
    );
}
