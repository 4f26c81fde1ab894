//! A tap device (Linux's TUN/TAP driver, `Documentation/networking/tuntap.rst`) as a virtio-net
//! backend: frames the driver transmits are written to the tap and so reach the host's network
//! stack; frames the host sends out of the tap are read for the driver's receive queue.
//!
//! The tap is opened with IFF_VNET_HDR and a 12-byte vnet header, the virtio 1.x
//! `struct virtio_net_hdr` with `num_buffers` (virtio 1.2 §5.1.6), so offloads pass through
//! unchanged both ways ([`NetBackend::passes_headers`]): the kernel takes a TCP segment of up
//! to 64 KiB with its checksum left to fill in, as the driver sent it, and segments and
//! checksums it where it must. What the kernel hands over is set by TUNSETOFFLOAD from what
//! the driver takes (GUEST_CSUM, GUEST_TSO4/6, GUEST_ECN, GUEST_USO4/6 where the kernel has
//! them: [`NetBackend::set_offloads`], as
//! QEMU's tap backend does); none until DRIVER_OK and after a reset, when the kernel hands over
//! only whole, checksummed frames. Headers are checked by the device both ways
//! ([`super::header`]): a header a driver filled in against features it did not negotiate
//! never reaches the kernel, which would act on it.
//!
//! The file is non-blocking: the device thread waits for it in its epoll set (edge-triggered,
//! see [`NetBackend::wake_fd`]) and never sleeps in a read or a write. It is opened, and the
//! TUNSET* ioctls made, on the main thread while the machine is built; the device thread only
//! reads and writes it.
//!
//! A tap that does not exist is created by the first open, and lives as long as a queue holds
//! it open. The kernel makes it down, and a down tap drops every frame both ways, so
//! [`Tap::open_queues`] brings it up (netdevice(7) SIOCSIFFLAGS, IFF_UP); its addresses, and a
//! tap the user made, stay as the user set them.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

use super::backend::NetBackend;
use super::header::{Direction, NetHeader};
use super::{HDR, MAX_FRAME};
use crate::dma::Segments;

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
    /// TUNSETIFF refused the name (EINVAL), for the reason the kernel shows.
    #[error("cannot open tap {name} (TUNSETIFF): {source} ({why})")]
    Refused {
        /// The tap interface's name.
        name: String,
        /// What TUNSETIFF returned.
        #[source]
        source: io::Error,
        /// Why, from what the kernel shows of the interface: [`refusal`].
        why: String,
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
        _ => "",
    }
}

/// Why TUNSETIFF refused `name` with EINVAL, from what the kernel shows of it. With an
/// interface of that name, tun.c's tun_set_iff() found no tap of these flags there: another
/// kind of device (sysfs shows tun_flags for tuns and taps only), a tun, or a tap whose
/// multi_queue setting differs. With none, registering the new tap failed: the IPv4 and IPv6
/// sysctls refuse the names `all` and `default` (sysctl_dev_name_is_allowed(): they name
/// /proc/sys/net/ipv4/conf's settings for every interface and for new ones).
fn refusal(name: &str, multi_queue: bool) -> String {
    let exists = Control::new().and_then(|c| c.flags(name));
    if let Ok(None) = exists {
        return "the kernel reserves the name; `all` and `default` name the settings in \
                /proc/sys/net/ipv4/conf: choose another"
            .into();
    }
    let sysfs = format!("/sys/class/net/{name}");
    let tun_flags = std::fs::read_to_string(format!("{sysfs}/tun_flags")).ok();
    let tun_flags = tun_flags.and_then(|f| {
        let hex = f.trim().trim_start_matches("0x");
        libc::c_int::from_str_radix(hex, 16).ok()
    });
    match tun_flags {
        None if std::path::Path::new(&sysfs).exists() => {
            format!("a device of that name exists and is not a tap: ip -d link show {name}")
        }
        None => "a device of that name exists and is not a tap, or its multi_queue setting \
                 differs"
            .into(),
        Some(flags) if flags & libc::IFF_TAP == 0 => {
            "it is a tun, not a tap (ip tuntap add dev NAME mode tap)".into()
        }
        Some(flags) if (flags & libc::IFF_MULTI_QUEUE != 0) != multi_queue => {
            if multi_queue {
                "the tap was made without multi_queue, which queues=N needs".into()
            } else {
                "the tap was made with multi_queue: give queues=N of 2 or more".into()
            }
        }
        Some(_) => "the kernel refuses these flags for it".into(),
    }
}

/// A socket to name interfaces to the kernel by: netdevice(7)'s ioctls work on any socket, and
/// an AF_UNIX one needs no network protocol.
struct Control(OwnedFd);

impl Control {
    fn new() -> io::Result<Self> {
        // SAFETY: socket() takes no pointers.
        let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        check(fd)?;
        // SAFETY: `fd` is a descriptor socket() just returned, owned by nothing else.
        Ok(Control(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// The flags of the interface `name` (SIOCGIFFLAGS), or `None` where there is none.
    fn flags(&self, name: &str) -> io::Result<Option<libc::c_short>> {
        let mut req = ifreq(name);
        // SAFETY: SIOCGIFFLAGS reads and writes a `struct ifreq`, which `req` is.
        match check(unsafe { libc::ioctl(self.0.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) }) {
            // SAFETY: SIOCGIFFLAGS filled in the union's flags.
            Ok(()) => Ok(Some(unsafe { req.ifr_ifru.ifru_flags })),
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Set the flags of the interface `name` (SIOCSIFFLAGS; CAP_NET_ADMIN).
    fn set_flags(&self, name: &str, flags: libc::c_short) -> io::Result<()> {
        let mut req = ifreq(name);
        req.ifr_ifru.ifru_flags = flags;
        // SAFETY: SIOCSIFFLAGS reads a `struct ifreq`, which `req` is.
        check(unsafe { libc::ioctl(self.0.as_raw_fd(), libc::SIOCSIFFLAGS, &req) })
    }
}

/// A `struct ifreq` naming `name`, which [`check_name`] took: it fits with its NUL.
fn ifreq(name: &str) -> libc::ifreq {
    // SAFETY: ifreq is plain data, for which all zeros is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, &src) in req.ifr_name.iter_mut().zip(name.as_bytes()) {
        *dst = src.cast_signed();
    }
    req
}

/// The error of the step `what` failing on the tap `name`.
fn step_failed(name: &str, what: &'static str) -> impl FnOnce(io::Error) -> TapError {
    let name = name.to_owned();
    move |source| TapError::Setup { name, what, source }
}

/// Refuse a name that is no interface name before any system call. dev_valid_name() refuses
/// `.`, `..`, `/`, `:` and spaces; `%` would be a template (`tap%d`: a new interface per open,
/// not the one named).
fn check_name(name: &str) -> Result<(), TapError> {
    let bytes = name.as_bytes();
    if bytes.is_empty()
        || bytes.len() >= libc::IFNAMSIZ
        || matches!(name, "." | "..")
        || bytes
            .iter()
            .any(|b| matches!(b, b'/' | b':' | b'%' | 0) || b.is_ascii_whitespace())
    {
        return Err(TapError::Name(name.to_owned()));
    }
    Ok(())
}

/// One queue of a tap: a file of /dev/net/tun attached to the interface.
pub struct Tap {
    file: File,
    /// A received frame with its vnet header in front: the one copy on the receive path (the
    /// frame's length decides whether a receive buffer fits it, so it is read before a buffer
    /// is taken, as QEMU's tap backend does).
    buf: Vec<u8>,
    /// The length of the frame held in `buf` (after its header), until it is delivered.
    held: Option<usize>,
    /// The `iovec`s of a transmitted frame: the vnet header, then the guest's buffers.
    iov: Vec<libc::iovec>,
    /// The vnet header of the frame being transmitted (the device's checked copy).
    tx_header: [u8; HDR],
    /// One of several queues (IFF_MULTI_QUEUE): detached while its pair is disabled.
    multi_queue: bool,
    /// Whether the queue is attached: the kernel spreads the tap's frames over attached
    /// queues only.
    attached: bool,
    /// A read failed other than for want of frames (the tap is gone), and it was logged.
    failed: bool,
    /// The kernel takes UDP segments on this tap (TUN_F_USO4/6, Linux 6.2).
    uso: bool,
}

impl Tap {
    /// The `pairs` queues of the tap `name` for one device (IFF_MULTI_QUEUE with more than
    /// one). A tap that did not exist is created for as long as they are open, and brought up;
    /// one that exists is left as its owner set it, with a warning if it is down.
    pub fn open_queues(name: &str, pairs: usize) -> Result<Vec<Tap>, TapError> {
        check_name(name)?;
        let control = Control::new().map_err(step_failed(name, "socket"))?;
        let existing = control
            .flags(name)
            .map_err(step_failed(name, "SIOCGIFFLAGS"))?;
        let queues = (0..pairs)
            .map(|_| Tap::open(name, pairs > 1))
            .collect::<Result<Vec<_>, _>>()?;
        let up = libc::c_short::try_from(libc::IFF_UP).expect("IFF_UP fits 16 bits");
        match existing {
            None => {
                let flags = control
                    .flags(name)
                    .map_err(step_failed(name, "SIOCGIFFLAGS"))?;
                control
                    .set_flags(name, flags.unwrap_or_default() | up)
                    .map_err(step_failed(name, "SIOCSIFFLAGS, bringing it up"))?;
            }
            Some(flags) if flags & up == 0 => log::warn!(
                "tap {name} is down: the guest's frames are dropped until `ip link set {name} up`"
            ),
            Some(_) => {}
        }
        Ok(queues)
    }

    /// Attach to the tap `name` (the kernel creates it, down, for as long as it is open, if
    /// there is none and the caller has CAP_NET_ADMIN). With `multi_queue`, the tap has one
    /// such file per queue pair (IFF_MULTI_QUEUE); open it once per pair.
    pub fn open(name: &str, multi_queue: bool) -> Result<Self, TapError> {
        check_name(name)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(TUN_PATH)
            .map_err(|source| TapError::Open {
                name: name.to_owned(),
                source,
            })?;
        let mut req = ifreq(name);
        let multi = if multi_queue {
            libc::IFF_MULTI_QUEUE
        } else {
            0
        };
        let flags = libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR | multi;
        req.ifr_ifru.ifru_flags = libc::c_short::try_from(flags).expect("the flags fit 16 bits");
        // The ioctls are made by hand with the libc crate's request numbers: the crates that
        // wrap them (Firecracker's and Cloud Hypervisor's `net_gen`) are not published
        // libraries, and a handful of calls do not justify one.
        // SAFETY: TUNSETIFF reads and writes a `struct ifreq`, which `req` is.
        check(unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &mut req) }).map_err(
            |source| match source.raw_os_error() {
                Some(libc::EINVAL) => TapError::Refused {
                    name: name.to_owned(),
                    source,
                    why: refusal(name, multi_queue),
                },
                _ => step_failed(name, "TUNSETIFF")(source),
            },
        )?;
        Self::configured(file, name, multi_queue)
    }

    /// The `queues` of the tap `name` another exitless opened and handed over (`migrate
    /// local:`), each checked to be a queue of that tap, as [`Tap::open_queues`] opens them.
    pub fn adopt_queues(name: &str, queues: Vec<File>) -> Result<Vec<Tap>, TapError> {
        let multi_queue = queues.len() > 1;
        (queues.into_iter())
            .map(|file| {
                let attached = queue_of(&file, name, multi_queue)?;
                let tap = Self::configured(file, name, multi_queue)?;
                Ok(Tap { attached, ..tap })
            })
            .collect()
    }

    /// `file`, attached to the tap `name`, set up for a device's queue.
    fn configured(file: File, name: &str, multi_queue: bool) -> Result<Self, TapError> {
        let hdr_size = libc::c_int::try_from(HDR).expect("12");
        // SAFETY: TUNSETVNETHDRSZ reads one int, which `hdr_size` is.
        check(unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETVNETHDRSZ, &hdr_size) })
            .map_err(step_failed(name, "TUNSETVNETHDRSZ"))?;
        // No bound on the bytes of this queue's frames still in the host's stack, as QEMU's
        // default (tap_set_sndbuf: INT_MAX). The socket's default (net.core.wmem_default,
        // 212,992 bytes) holds a few hundred small frames: a stream of them fills it, and the
        // kernel's vhost-net then waits for room before it takes the next from the ring.
        let sndbuf = libc::c_int::MAX;
        // SAFETY: TUNSETSNDBUF reads one int, which `sndbuf` is.
        check(unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETSNDBUF, &sndbuf) })
            .map_err(step_failed(name, "TUNSETSNDBUF"))?;
        // UDP segments (Linux 6.2): the kernel refuses offload flags it does not know, so a tap
        // that takes TUN_F_USO4/6 (with the checksum, as it takes them) can carry them, as
        // QEMU's tap_probe_has_uso() asks. Then none until the driver says.
        let uso = Direction {
            csum: true,
            uso4: true,
            uso6: true,
            ..Direction::default()
        };
        let uso = set_offload(&file, uso).is_ok();
        set_offload(&file, Direction::default()).map_err(step_failed(name, "TUNSETOFFLOAD"))?;
        Ok(Tap {
            file,
            buf: vec![0; HDR + MAX_FRAME],
            held: None,
            iov: Vec::new(),
            tx_header: [0; HDR],
            multi_queue,
            attached: true,
            failed: false,
            uso,
        })
    }

    /// The queue's file, for the kernel's vhost-net to read and write (VHOST_NET_SET_BACKEND).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// A duplicate of the queue's file (the same open file: the same queue), for a same-host
    /// live update to hand over.
    pub fn duplicate(&self, name: &str) -> Result<File, TapError> {
        (self.file.try_clone()).map_err(step_failed(name, "F_DUPFD_CLOEXEC"))
    }
}

/// Check that `file` is a queue of the tap `name` as exitless opens one (TUNGETIFF), one of
/// several queues if `multi_queue`: a file handed over by another process proves nothing by
/// itself. Whether the queue is attached: a multiqueue tap's queue stays detached
/// (IFF_DETACH_QUEUE) where its device had detached it. (IFF_NO_PI cannot be checked:
/// TUNGETIFF reports IFF_NOFILTER, the same bit, for any file without a socket filter.)
fn queue_of(file: &File, name: &str, multi_queue: bool) -> Result<bool, TapError> {
    let mut req = ifreq("");
    // SAFETY: TUNGETIFF writes a `struct ifreq`, which `req` is.
    check(unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNGETIFF, &mut req) })
        .map_err(step_failed(name, "TUNGETIFF on a file handed over"))?;
    let named: Vec<u8> = (req.ifr_name.iter())
        .take_while(|&&c| c != 0)
        .map(|&c| c.cast_unsigned())
        .collect();
    // SAFETY: TUNGETIFF filled the flags member of the union.
    let flags = libc::c_int::from(unsafe { req.ifr_ifru.ifru_flags });
    let wanted = libc::IFF_TAP | libc::IFF_VNET_HDR;
    let multi = flags & libc::IFF_MULTI_QUEUE != 0;
    if named != name.as_bytes() || flags & wanted != wanted || multi != multi_queue {
        let why = format!(
            "the file handed over is {}, flags {flags:#x}, not a queue of tap {name}",
            String::from_utf8_lossy(&named)
        );
        return Err(step_failed(name, "TUNGETIFF on a file handed over")(
            io::Error::new(io::ErrorKind::InvalidInput, why),
        ));
    }
    Ok(flags & libc::IFF_DETACH_QUEUE == 0)
}

fn check(ret: libc::c_int) -> io::Result<()> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Tell the kernel which offloads it may leave in the frames it hands over (TUNSETOFFLOAD,
/// tun.c's set_offload()): the checksum, then TCP and UDP segments, which it takes only with
/// the checksum, as [`Direction`] holds them. UDP segments only both ways or not at all: the
/// kernel takes TUN_F_USO4 and TUN_F_USO6 together only (and refuses one alone), so a driver
/// that takes one gets datagrams the kernel has cut.
fn set_offload(file: &File, rx: Direction) -> io::Result<()> {
    let uso = rx.uso4 && rx.uso6;
    let flags = [
        (rx.csum, libc::TUN_F_CSUM),
        (rx.tso4, libc::TUN_F_TSO4),
        (rx.tso6, libc::TUN_F_TSO6),
        (rx.ecn, libc::TUN_F_TSO_ECN),
        (uso, libc::TUN_F_USO4 | libc::TUN_F_USO6),
    ]
    .into_iter()
    .filter(|(on, _)| *on)
    .fold(0, |all, (_, flag)| all | flag);
    // SAFETY: TUNSETOFFLOAD takes its flags as the argument itself and touches no memory.
    check(unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            libc::TUNSETOFFLOAD,
            libc::c_ulong::from(flags),
        )
    })
}

// SAFETY: the only pointers a `Tap` holds are in `iov`, which is empty between calls of
// `transmit` (the frame and header it points into are borrowed for that call).
unsafe impl Send for Tap {}

impl Tap {
    /// Read the next frame into `buf`; its length after the header, or `None` if there is
    /// none now.
    fn read_frame(&mut self) -> Option<usize> {
        loop {
            match self.file.read(&mut self.buf) {
                // A frame after its header. A read too short for one is skipped; so is a
                // length past the buffer, which a read never returns but is not trusted.
                Ok(n) if n > HDR && n <= self.buf.len() => return Some(n - HDR),
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
}

impl NetBackend for Tap {
    /// One `writev` of the checked header and the guest's buffers: the frame is not copied.
    fn transmit(&mut self, header: NetHeader, frame: &Segments) -> bool {
        // The kernel refuses (EINVAL) a frame without a whole Ethernet header: drop it here.
        if frame.len() < ETHERNET_HEADER {
            return false;
        }
        self.tx_header = header.to_bytes();
        self.iov.clear();
        self.iov.push(libc::iovec {
            iov_base: self.tx_header.as_mut_ptr().cast(),
            iov_len: HDR,
        });
        self.iov.extend_from_slice(frame.iovecs());
        let count = libc::c_int::try_from(self.iov.len()).unwrap_or(libc::c_int::MAX);
        // SAFETY: the iovecs are the header in `self` (which the kernel only reads) and the
        // frame's pieces, mapped guest memory valid for this call.
        let written = unsafe { libc::writev(self.file.as_raw_fd(), self.iov.as_ptr(), count) };
        self.iov.clear();
        // One write is one frame; a full tap queue (EAGAIN), a tap whose link is down (EIO)
        // or more pieces than one call takes (EINVAL) drops it, as a wire would.
        usize::try_from(written).is_ok_and(|n| n == HDR + frame.len())
    }

    fn pending(&mut self) -> Option<usize> {
        if self.held.is_none() {
            self.held = self.read_frame();
        }
        self.held
    }

    fn deliver(&mut self, into: &Segments, at: usize) {
        if let Some(n) = self.held.take() {
            into.scatter(at, &self.buf[HDR..HDR + n]);
        }
    }

    /// The header the kernel read in front of the held frame.
    fn held_header(&self) -> NetHeader {
        let mut raw = [0; HDR];
        raw.copy_from_slice(&self.buf[..HDR]);
        NetHeader::from_bytes(&raw)
    }

    fn passes_headers(&self) -> bool {
        true
    }

    fn passes_uso(&self) -> bool {
        self.uso
    }

    /// TUNSETOFFLOAD on this queue's file (the setting is the tap's, for all its queues). A
    /// refusal leaves the kernel's setting as it was, which [`NetHeader::for_driver`] then
    /// guards: frames with offloads the driver did not take are dropped.
    fn set_offloads(&mut self, rx: Direction) {
        if let Err(e) = set_offload(&self.file, rx) {
            log::warn!("tap: cannot set its offloads to {rx:?} (TUNSETOFFLOAD): {e}");
        }
    }

    fn discard(&mut self) {
        self.held = None;
    }

    /// Frames queued in the kernel stay there for the next driver; the one held goes.
    fn reset(&mut self) {
        self.held = None;
    }

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
mod tests;
