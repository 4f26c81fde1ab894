//! A tap device (Linux's TUN/TAP driver, `Documentation/networking/tuntap.rst`) as a virtio-net
//! backend: frames the driver transmits are written to the tap and so reach the host's network
//! stack; frames the host sends out of the tap are read for the driver's receive queue.
//!
//! The tap is opened with IFF_VNET_HDR and a 12-byte vnet header, the virtio 1.x
//! `struct virtio_net_hdr` with `num_buffers` (virtio 1.2 §5.1.6), so offloads can later pass
//! through unchanged. None are offered yet: the device offers no VIRTIO_NET_F_CSUM, GUEST_CSUM
//! or GSO feature, and the tap's offloads are set to none (TUNSETOFFLOAD 0), so the kernel hands
//! over only whole, checksummed frames. The header is then all zeros both ways (§5.1.6.2: no
//! flags, VIRTIO_NET_HDR_GSO_NONE) apart from the kernel's informational DATA_VALID, which a
//! driver that did not take GUEST_CSUM must not be shown. So the device writes its own headers
//! both ways: a header a driver filled in against features it did not negotiate (a GSO type,
//! NEEDS_CSUM) never reaches the kernel, which would act on it.
//!
//! The file is non-blocking: the device thread waits for it in its epoll set (edge-triggered,
//! see [`NetBackend::wake_fd`]) and never sleeps in a read or a write. It is opened, and the
//! TUNSET* ioctls made, on the main thread while the machine is built; the device thread only
//! reads and writes it.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

use super::backend::NetBackend;
use super::{HDR, MAX_FRAME};

/// Destination, source and type: the least a tap takes as a frame.
const ETHERNET_HEADER: usize = 14;

/// The TUN/TAP driver's control file.
const TUN_PATH: &str = "/dev/net/tun";

/// Why a tap could not be opened. One line each, naming the tap and the likely cause.
#[derive(Debug, thiserror::Error)]
pub enum TapError {
    /// The name does not fit an interface name (IFNAMSIZ less the terminating NUL).
    #[error(
        "tap name `{0}`: an interface name is 1 to 15 bytes, not . or .., without `/`, `:`, `%` or spaces"
    )]
    Name(String),
    /// /dev/net/tun could not be opened.
    #[error("cannot open {TUN_PATH} for tap {name}: {source}{hint}", hint = hint(.source))]
    Open {
        /// The tap interface's name.
        name: String,
        /// What opening the tun device returned.
        #[source]
        source: io::Error,
    },
    /// TUNSETIFF (attach to, or create, the tap) or one of the settings failed.
    #[error("cannot open tap {name} ({what}): {source}{hint}", hint = hint(.source))]
    Setup {
        /// The tap interface's name.
        name: String,
        /// The step that failed.
        what: &'static str,
        /// What the failed ioctl returned.
        #[source]
        source: io::Error,
    },
}

/// What the errno of a failed open usually means for a tap.
fn hint(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::ENOENT | libc::ENODEV) => " (no TUN/TAP driver on this host: modprobe tun)",
        Some(libc::EPERM | libc::EACCES) => {
            " (needs CAP_NET_ADMIN, or a tap made for this user: ip tuntap add dev NAME mode tap user USER)"
        }
        Some(libc::EBUSY) => " (busy: another process has it open)",
        Some(libc::EINVAL) => {
            " (a device of that name exists and is not a tap, or its multi_queue setting differs)"
        }
        _ => "",
    }
}

/// One queue of a tap: a file of /dev/net/tun attached to the interface.
pub struct Tap {
    file: File,
    /// A frame read or written with its vnet header in front.
    buf: Vec<u8>,
    /// One of several queues (IFF_MULTI_QUEUE): detached while its pair is disabled.
    multi_queue: bool,
    /// Whether the queue is attached: the kernel spreads the tap's frames over attached
    /// queues only.
    attached: bool,
    /// A read failed other than for want of frames (the tap is gone), and it was logged.
    failed: bool,
}

impl Tap {
    /// Attach to the tap `name` (the kernel creates it, for as long as it is open, if there is
    /// none and the caller has CAP_NET_ADMIN). With `multi_queue`, the tap has one such file
    /// per queue pair (IFF_MULTI_QUEUE); open it once per pair.
    pub fn open(name: &str, multi_queue: bool) -> Result<Self, TapError> {
        let bytes = name.as_bytes();
        // dev_valid_name() refuses `.`, `..`, `/`, `:` and spaces; `%` would be a template
        // (`tap%d`: a new interface per open, not the one named).
        if bytes.is_empty()
            || bytes.len() >= libc::IFNAMSIZ
            || matches!(name, "." | "..")
            || bytes
                .iter()
                .any(|b| matches!(b, b'/' | b':' | b'%' | 0) || b.is_ascii_whitespace())
        {
            return Err(TapError::Name(name.to_owned()));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(TUN_PATH)
            .map_err(|source| TapError::Open {
                name: name.to_owned(),
                source,
            })?;
        let setup = |what| {
            move |source| TapError::Setup {
                name: name.to_owned(),
                what,
                source,
            }
        };
        // SAFETY: ifreq is plain data, for which all zeros is a valid value.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        for (dst, &src) in req.ifr_name.iter_mut().zip(bytes) {
            *dst = src.cast_signed();
        }
        let multi = if multi_queue {
            libc::IFF_MULTI_QUEUE
        } else {
            0
        };
        let flags = libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR | multi;
        req.ifr_ifru.ifru_flags = libc::c_short::try_from(flags).expect("the flags fit 16 bits");
        // The ioctls are made by hand with the libc crate's request numbers: the crates that
        // wrap them (Firecracker's and Cloud Hypervisor's `net_gen`) are not published
        // libraries, and three calls do not justify one.
        // SAFETY: TUNSETIFF reads and writes a `struct ifreq`, which `req` is.
        check(unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &mut req) })
            .map_err(setup("TUNSETIFF"))?;
        let hdr_size = libc::c_int::try_from(HDR).expect("12");
        // SAFETY: TUNSETVNETHDRSZ reads one int, which `hdr_size` is.
        check(unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETVNETHDRSZ, &hdr_size) })
            .map_err(setup("TUNSETVNETHDRSZ"))?;
        // SAFETY: TUNSETOFFLOAD takes its flags as the argument itself and touches no memory.
        check(unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETOFFLOAD, 0 as libc::c_ulong) })
            .map_err(setup("TUNSETOFFLOAD"))?;
        Ok(Tap {
            file,
            buf: vec![0; HDR + MAX_FRAME],
            multi_queue,
            attached: true,
            failed: false,
        })
    }
}

fn check(ret: libc::c_int) -> io::Result<()> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

impl NetBackend for Tap {
    fn transmit(&mut self, frame: &[u8]) -> bool {
        // The kernel refuses (EINVAL) a frame without a whole Ethernet header: drop it here.
        if frame.len() < ETHERNET_HEADER {
            return false;
        }
        // The zero header: no offloads were negotiated (see the module's comment).
        let total = HDR + frame.len();
        let Some(out) = self.buf.get_mut(..total) else {
            return false; // not reached: the device takes no frame above MAX_FRAME
        };
        out[..HDR].fill(0);
        out[HDR..].copy_from_slice(frame);
        // One write is one frame; a full tap queue (EAGAIN) or a tap whose link is down (EIO)
        // drops it, as a wire would.
        matches!(self.file.write(out), Ok(n) if n == total)
    }

    fn receive(&mut self) -> Option<Vec<u8>> {
        loop {
            match self.file.read(&mut self.buf) {
                // A frame after its header. A read too short for one is skipped; so is a
                // length past the buffer, which a read never returns but is not trusted.
                Ok(n) if n > HDR => match self.buf.get(HDR..n) {
                    Some(frame) => return Some(frame.to_vec()),
                    None => continue,
                },
                Ok(0) => return None,
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return None,
                // The tap was deleted (EBADFD) or worse: the guest's network is gone; say so
                // once, since every later read fails the same way.
                Err(e) => {
                    if !self.failed {
                        self.failed = true;
                        log::warn!("tap: cannot read frames any more: {e}");
                    }
                    return None;
                }
            }
        }
    }

    /// Frames queued in the kernel stay there for the next driver.
    fn reset(&mut self) {}

    fn wake_fd(&self) -> Option<RawFd> {
        Some(self.file.as_raw_fd())
    }

    /// A multiqueue tap hashes each flow to one of its attached queues: the queue of a pair
    /// the driver does not use is detached (TUNSETQUEUE, as QEMU does), or that pair's flows
    /// would wait for receive buffers no driver gives.
    fn set_enabled(&mut self, enabled: bool) {
        if !self.multi_queue || enabled == self.attached {
            return;
        }
        // SAFETY: ifreq is plain data, for which all zeros is a valid value.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        let flags = if enabled {
            libc::IFF_ATTACH_QUEUE
        } else {
            libc::IFF_DETACH_QUEUE
        };
        req.ifr_ifru.ifru_flags = libc::c_short::try_from(flags).expect("the flag fits 16 bits");
        // SAFETY: TUNSETQUEUE reads a `struct ifreq`, which `req` is.
        match check(unsafe { libc::ioctl(self.file.as_raw_fd(), libc::TUNSETQUEUE, &req) }) {
            Ok(()) => self.attached = enabled,
            Err(e) => log::warn!(
                "tap: cannot {} a queue: {e}",
                if enabled { "attach" } else { "detach" }
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_are_no_interface_name_are_refused_before_any_system_call() {
        for name in [
            "",
            "sixteen-bytes-xx",
            "a/b",
            "a:b",
            "a b",
            "tap%d",
            ".",
            "..",
        ] {
            let e = Tap::open(name, false).err().expect("refused");
            assert!(matches!(e, TapError::Name(_)), "{name}: {e}");
        }
    }

    /// A unique tap name for this test process.
    fn unique(tag: &str) -> String {
        format!("xl{tag}{}", std::process::id() % 100_000)
    }

    /// Opening a tap needs /dev/net/tun and CAP_NET_ADMIN; without them the test says so and
    /// does nothing.
    fn open_or_skip(name: &str, multi_queue: bool) -> Option<Tap> {
        match Tap::open(name, multi_queue) {
            Ok(t) => Some(t),
            Err(e @ (TapError::Open { .. } | TapError::Setup { .. })) if skippable(&e) => {
                eprintln!("skipped: cannot create a tap here: {e}");
                None
            }
            Err(e) => panic!("{e}"),
        }
    }

    fn skippable(e: &TapError) -> bool {
        let source = match e {
            TapError::Open { source, .. } | TapError::Setup { source, .. } => source,
            TapError::Name(_) => return false,
        };
        matches!(
            source.raw_os_error(),
            Some(libc::ENOENT | libc::ENODEV | libc::EPERM | libc::EACCES)
        )
    }

    #[test]
    fn a_second_open_of_a_single_queue_tap_is_busy_and_says_so() {
        let name = unique("b");
        let Some(_first) = open_or_skip(&name, false) else {
            return;
        };
        let e = Tap::open(&name, false).err().expect("busy");
        let line = e.to_string();
        assert!(
            line.contains(&format!("cannot open tap {name} (TUNSETIFF)")),
            "{line}"
        );
        assert!(line.contains("busy"), "{line}");
    }

    #[test]
    fn a_multi_queue_tap_opens_once_per_queue_pair() {
        let name = unique("m");
        let Some(first) = open_or_skip(&name, true) else {
            return;
        };
        let second = Tap::open(&name, true).expect("a second queue");
        assert_ne!(first.wake_fd(), second.wake_fd());
        let e = Tap::open(&name, false).err().expect("not multi-queue");
        assert!(e.to_string().contains("multi_queue"), "{e}");
    }

    /// The kernel spreads a multiqueue tap's frames over its attached queues: a detached
    /// queue leaves the interface's queue count (sysfs), and comes back when attached again.
    #[test]
    fn a_disabled_pair_detaches_its_queue_and_an_enabled_one_attaches_it() {
        let name = unique("q");
        let Some(_first) = open_or_skip(&name, true) else {
            return;
        };
        let mut second = Tap::open(&name, true).expect("a second queue");
        let rx_queues = || {
            std::fs::read_dir(format!("/sys/class/net/{name}/queues"))
                .unwrap()
                .filter(|e| {
                    e.as_ref()
                        .unwrap()
                        .file_name()
                        .to_string_lossy()
                        .starts_with("rx-")
                })
                .count()
        };
        assert_eq!(rx_queues(), 2);
        second.set_enabled(false);
        assert_eq!(rx_queues(), 1, "detached");
        second.set_enabled(true);
        assert_eq!(rx_queues(), 2, "attached again");
    }

    /// With the tap down nothing is queued for it: a read finds nothing and does not block,
    /// and a frame written is dropped (EIO), not an error of the device.
    #[test]
    fn a_tap_whose_link_is_down_receives_nothing_and_drops_what_is_sent() {
        let name = unique("d");
        let Some(mut tap) = open_or_skip(&name, false) else {
            return;
        };
        assert_eq!(tap.receive(), None);
        assert!(!tap.transmit(&[0xff; 60]));
    }
}
