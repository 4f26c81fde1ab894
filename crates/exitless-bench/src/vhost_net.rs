//! The bench's vhost-user network backend (issue 21): one DPDK testpmd (`peer::backends`) in
//! `icmpecho` forwarding, started before exitless confines itself (a confined process starts
//! no program) and kept until the run ends, as `rr`'s host tap is. Both VMMs connect to its
//! ports in turn, so both drive the same backend and the same responder.
//!
//! testpmd's icmpecho answers an ICMP echo request on the port it came in on whatever its
//! addresses (it swaps them, DPDK's `icmpecho.c`), so the probe's ICMP echo op works against
//! it unchanged: the addresses below only have to be the request's.

use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use vmm_sys_util::tempdir::TempDir;

use exitless_peer::backends::{Backend, BackendError};

/// The responder's address, as the guest's requests name it.
pub const BACKEND_IP: Ipv4Addr = Ipv4Addr::new(10, 212, 0, 1);
/// The guest's address.
pub const GUEST_IP: Ipv4Addr = Ipv4Addr::new(10, 212, 0, 2);
/// Where the guest sends its requests: DPDK's vhost PMD's first port MAC
/// (`56:48:4f:53:54:00`, "VHOST" and the port number; icmpecho does not check it).
pub const BACKEND_MAC: [u8; 6] = [0x56, 0x48, 0x4f, 0x53, 0x54, 0x00];

/// Queue pairs of every port: enough for QEMU's 32-pair functions beside `bench msix`'s
/// exitless devices (one pair each, their 65 vectors sized apart with `vectors=`); a device
/// with fewer pairs uses the first ones (a vhost-user frontend sets up only its own rings).
pub const PORT_QUEUE_PAIRS: u16 = 32;

/// Which of testpmd's sockets serve whom, and testpmd itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VhostPorts {
    /// testpmd's process: stopped (SIGSTOP) except while a boot uses its ports
    /// ([`VhostPorts::polling`]), so that its busy-polling core does not slow the other
    /// variants of the run on a small host.
    pub pid: u32,
    /// `rr`'s virtio-pci device (and QEMU's function after it).
    pub rr_pci: PathBuf,
    /// `rr`'s virtio-mmio device.
    pub rr_mmio: PathBuf,
    /// `msix`'s devices, one each (QEMU's functions after them).
    pub msix: Vec<PathBuf>,
}

/// A running testpmd with the bench's ports; stopped and its sockets removed when dropped
/// (unconfined), or at exitless's exit after [`VhostNet::leave`] (confined).
pub struct VhostNet {
    ports: VhostPorts,
    /// Dropped first: testpmd stops before its directory goes.
    _backend: Backend,
    _dir: TempDir,
    /// Removes testpmd's files and the socket folder once its stdin closes (as
    /// `host_tap`'s helper deletes the tap): at exitless's exit, however it ends.
    cleaner: Child,
}

impl VhostNet {
    /// Start testpmd with `rr`'s two ports and `msix_devices` more for `msix`. Not installed:
    /// the error's message is the reason the report prints in place of the vhost-user variants.
    pub fn start(msix_devices: usize) -> Result<VhostNet, String> {
        let dir = TempDir::new_with_prefix("/tmp/exitless-vhost-")
            .map_err(|e| format!("cannot make a socket folder: {e}"))?;
        let mut ports = VhostPorts {
            pid: 0,
            rr_pci: dir.as_path().join("rr-pci.sock"),
            rr_mmio: dir.as_path().join("rr-mmio.sock"),
            msix: (0..msix_devices)
                .map(|d| dir.as_path().join(format!("msix-{d}.sock")))
                .collect(),
        };
        let mut sockets = vec![ports.rr_pci.clone(), ports.rr_mmio.clone()];
        sockets.extend(ports.msix.iter().cloned());
        let backend = Backend::testpmd(&sockets, PORT_QUEUE_PAIRS).map_err(|e| match e {
            BackendError::Start(e) => e.to_string(),
            e => format!("testpmd did not start: {e}"),
        })?;
        ports.pid = backend.pid();
        // Nothing uses its ports until a boot asks for them.
        signal(ports.pid, libc::SIGSTOP);
        let mut files = backend.files();
        files.push(dir.as_path().to_owned());
        // In a process group of its own, so that a ^C that ends the bench leaves it to clean
        // up; `sleep` gives testpmd, which ends at the same EOF, time to go first.
        let cleaner = Command::new("sh")
            .args(["-c", "cat >/dev/null; sleep 2; exec rm -rf -- \"$@\"", "sh"])
            .args(&files)
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start sh to clean up after testpmd: {e}"))?;
        Ok(VhostNet {
            ports,
            _backend: backend,
            _dir: dir,
            cleaner,
        })
    }

    /// Leave testpmd running until exitless exits, for a process that may no longer wait for
    /// a child (the bench's confined main thread): at exit its stdin reaches EOF (testpmd
    /// ends, and `PR_SET_PDEATHSIG` kills it otherwise) and the cleaner removes its files.
    pub fn leave(self) {
        // Running, so that it sees the EOF.
        signal(self.ports.pid, libc::SIGCONT);
        std::mem::forget(self);
    }

    /// Its ports.
    pub fn ports(&self) -> &VhostPorts {
        &self.ports
    }
}

impl VhostPorts {
    /// testpmd polls its ports until the guard drops: around a boot whose devices use them.
    pub fn polling(&self) -> Polling {
        signal(self.pid, libc::SIGCONT);
        Polling(self.pid)
    }
}

/// testpmd runs; it stops again when this drops (see [`VhostPorts::polling`]).
#[must_use = "testpmd stops again when the guard drops"]
pub struct Polling(u32);

impl Drop for Polling {
    fn drop(&mut self) {
        signal(self.0, libc::SIGSTOP);
    }
}

/// Send testpmd `sig` (SIGSTOP or SIGCONT, the two the main thread's seccomp filter allows).
/// A testpmd that has gone is no error here: the boot that needs it reports that.
fn signal(pid: u32, sig: libc::c_int) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    if pid > 0 {
        // SAFETY: kill(2) takes plain integers and touches no memory of ours.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

impl Drop for VhostNet {
    fn drop(&mut self) {
        // testpmd stops when `backend` drops after this (running: it must see its stdin's
        // EOF); the cleaner finds nothing left.
        signal(self.ports.pid, libc::SIGCONT);
        drop(self.cleaner.stdin.take());
    }
}
