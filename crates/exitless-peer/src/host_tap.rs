//! The host's end of `rr`'s comparison with QEMU: a tap in the host's network namespace with a
//! private /30, whose kernel answers the guest's ICMP echo requests (RFC 792) for its own
//! address. Each VMM opens it in turn, so both drive the same backend and the same responder.
//!
//! It is made with iproute2 before exitless confines itself (a confined process starts no
//! program), and deleted by a helper started just before it: the helper waits for its stdin
//! to close, which happens when the [`HostTap`] is dropped or the bench dies however it dies,
//! then runs `ip link del`; the tap's address and neighbour entry go with it.

use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// The tap's name and the two ends' addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TapLink {
    /// The interface's name (15 bytes at most).
    pub name: String,
    /// The host's address on it (a /30 with the guest's).
    pub host_ip: Ipv4Addr,
    /// The guest's address.
    pub guest_ip: Ipv4Addr,
    /// The tap's MAC: where the guest sends its requests.
    pub host_mac: [u8; 6],
    /// The guest device's MAC, which both VMMs give it.
    pub guest_mac: [u8; 6],
}

impl TapLink {
    /// The bench's: `exitless-rr0` on 10.211.0.0/30.
    pub fn bench() -> Self {
        TapLink::numbered("exitless-rr0", 0)
    }

    /// Tap `name` on 10.211.`n`.0/30, the host at .1 and the guest at .2, with locally
    /// administered MACs (IEEE 802 §8.2: the second bit of the first octet) 02:78:6c:`n`:00:01
    /// and :02; taps of different `n` can exist at once.
    pub fn numbered(name: &str, n: u8) -> Self {
        TapLink {
            name: name.into(),
            host_ip: Ipv4Addr::new(10, 211, n, 1),
            guest_ip: Ipv4Addr::new(10, 211, n, 2),
            host_mac: [0x02, 0x78, 0x6c, n, 0x00, 0x01],
            guest_mac: [0x02, 0x78, 0x6c, n, 0x00, 0x02],
        }
    }
}

/// A tap of [`TapLink`], up, deleted on drop.
pub struct HostTap {
    link: TapLink,
    /// The deleting helper; closing its stdin lets it go.
    helper: Child,
}

impl HostTap {
    /// Make the tap: `link.host_ip`/30, `link.host_mac`, IPv6 off (nothing but the replies
    /// reaches the guest, as far as the host decides), the guest's MAC a permanent neighbour
    /// (the host's kernel answers at once, with no ARP the probe would have to answer), up.
    /// The error is one line saying what to do.
    pub fn create(link: TapLink) -> Result<HostTap, String> {
        let name = link.name.clone();
        if Path::new("/sys/class/net").join(&name).exists() {
            return Err(format!(
                "interface {name} exists already (another exitless bench running?): \
                 `ip link del {name}` if not"
            ));
        }
        // In a process group of its own, so that a ^C at the terminal, which ends the bench,
        // leaves the helper to clean up after it.
        let helper = Command::new("sh")
            .args(["-c", "read _; exec ip link del \"$0\"", &name])
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start sh to delete tap {name} later: {e}"))?;
        // From here on, dropping `tap` deletes whatever was made.
        let tap = HostTap { link, helper };
        let l = &tap.link;
        let mac = |m: [u8; 6]| m.map(|b| format!("{b:02x}")).join(":");
        let steps: [&[&str]; 5] = [
            &["tuntap", "add", "dev", &name, "mode", "tap"],
            &["link", "set", "dev", &name, "address", &mac(l.host_mac)],
            &["addr", "add", &format!("{}/30", l.host_ip), "dev", &name],
            &["link", "set", "dev", &name, "up"],
            &[
                "neigh",
                "replace",
                &l.guest_ip.to_string(),
                "lladdr",
                &mac(l.guest_mac),
                "dev",
                &name,
                "nud",
                "permanent",
            ],
        ];
        let ipv6_off = format!("/proc/sys/net/ipv6/conf/{name}/disable_ipv6");
        for (i, step) in steps.into_iter().enumerate() {
            ip(step).map_err(|e| {
                format!(
                    "cannot make host tap {name} ({e}): the bench needs root or \
                     CAP_NET_ADMIN and /dev/net/tun"
                )
            })?;
            if i == 0 {
                // A kernel without IPv6 has nothing to silence.
                let _ = std::fs::write(&ipv6_off, "1");
            }
        }
        Ok(tap)
    }

    /// Its name and addresses.
    pub fn link(&self) -> &TapLink {
        &self.link
    }
}

impl Drop for HostTap {
    fn drop(&mut self) {
        // The helper reads EOF and deletes the tap. No wait: a confined bench cannot.
        drop(self.helper.stdin.take());
    }
}

/// `ip ARGS`, or its error message.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("ip (iproute2): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}
