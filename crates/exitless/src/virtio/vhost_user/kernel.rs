//! The kernel's vhost-net (`--net tap=NAME,vhost=on`): one `/dev/vhost-net` file per queue
//! pair, each with the pair's receive (its ring 0) and transmit (ring 1) rings, on that pair's
//! tap queue (VHOST_NET_SET_BACKEND). The kernel moves the frames between the rings and the tap
//! in its own worker: the guest's doorbell is the queue's KVM ioeventfd and its interrupt the
//! vector's irqfd, as for a vhost-user backend, so nothing reaches exitless on the data path.
//!
//! The tap carries the virtio-net header (IFF_VNET_HDR, 12 bytes): the kernel is not asked for
//! VHOST_NET_F_VIRTIO_NET_HDR, as QEMU does not ask it of a tap with a header, and the
//! offloads the driver takes are the tap's (TUNSETOFFLOAD at DRIVER_OK), as for the in-process
//! NIC. The trade-off (docs/vhost-user.md): the guest's rings are parsed by the host kernel,
//! which Cloud Hypervisor and Firecracker refuse for its attack surface, for the throughput of
//! a worker that never leaves the kernel.

use std::sync::Arc;

use vhost::net::VhostNet;
use vhost::vhost_kern::net::Net;
use vhost::vhost_kern::vhost_binding::{VHOST_SET_VRING_ADDR, vhost_vring_addr};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryBackend as _;
use vm_memory::{GuestMemoryMmap, GuestMemoryRegion};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::ioctl::ioctl_with_ref;

use super::{lacking_ring_feature, memory};
use crate::virtio::net::NetBackend as _;
use crate::virtio::net::header::{Direction, Offloads, offload_features};
use crate::virtio::net::tap::{Tap, TapError};

/// A pair's receive ring in its vhost-net file (its transmit ring is 1).
const RECEIVE: usize = 0;

/// The kernel's vhost-net device file.
pub const VHOST_NET_PATH: &str = "/dev/vhost-net";

/// Why vhost-net could not be set up: the one line the user sees.
#[derive(Debug, thiserror::Error)]
pub enum VhostNetError {
    /// No /dev/vhost-net, or it cannot be opened.
    #[error(
        "cannot open {VHOST_NET_PATH}: {0}; load the vhost_net module (modprobe vhost_net) \
         and give exitless access to it, or drop vhost=on"
    )]
    Open(#[source] std::io::Error),
    /// An ioctl of the set-up failed.
    #[error("vhost-net: {what} failed: {source}")]
    Setup {
        /// The ioctl.
        what: &'static str,
        /// What the kernel said.
        #[source]
        source: vhost::Error,
    },
    /// The kernel's vhost-net lacks a feature exitless needs.
    #[error("the kernel's vhost-net does not offer {0}, which exitless needs; drop vhost=on")]
    Lacks(&'static str),
    /// The tap could not be opened.
    #[error(transparent)]
    Tap(#[from] TapError),
}

/// One queue pair: its vhost-net file and its tap queue.
struct Pair {
    vhost: Net<Arc<GuestMemoryMmap>>,
    tap: Tap,
}

/// The vhost-net files of a NIC's queue pairs.
pub(super) struct KernelNet {
    pairs: Vec<Pair>,
    /// What the kernel's vhost-net offers (each file offers the same).
    pub features: u64,
}

impl KernelNet {
    /// `pairs` tap queues, as `taps` opens them, each with a vhost-net file owned by this
    /// process (VHOST_SET_OWNER starts the kernel's worker for it). The files first: a host
    /// without vhost-net is refused before a tap is made.
    pub fn open(
        taps: impl FnOnce() -> Result<Vec<Tap>, TapError>,
        pairs: usize,
        mem: &GuestMemoryMmap,
    ) -> Result<Self, VhostNetError> {
        let mem = Arc::new(mem.clone());
        let setup = |what| move |source| VhostNetError::Setup { what, source };
        let files = (0..pairs)
            .map(|_| {
                let vhost = Net::new(mem.clone()).map_err(|e| match e {
                    vhost::Error::VhostOpen(e) => VhostNetError::Open(e),
                    e => setup("open")(e),
                })?;
                vhost.set_owner().map_err(setup("VHOST_SET_OWNER"))?;
                Ok(vhost)
            })
            .collect::<Result<Vec<_>, VhostNetError>>()?;
        let opened: Vec<Pair> = files
            .into_iter()
            .zip(taps()?)
            .map(|(vhost, tap)| Pair { vhost, tap })
            .collect();
        let features = opened[0]
            .vhost
            .get_features()
            .map_err(setup("VHOST_GET_FEATURES"))?;
        if let Some(feature) = lacking_ring_feature(features) {
            return Err(VhostNetError::Lacks(feature));
        }
        let mut net = KernelNet {
            pairs: opened,
            features,
        };
        net.reset();
        Ok(net)
    }

    /// The offload features the device offers: the taps' (the kernel's vhost-net passes the
    /// headers through to them).
    pub fn offloads(&self) -> u64 {
        offload_features(self.pairs.iter().all(|p| p.tap.passes_uso()))
    }

    /// The pair of ring `q` and the ring's index in its file: virtio 1.2 §5.1.2, receiveq`k`
    /// is queue 2k and transmitq`k` 2k+1, and vhost-net's rings are receive 0, transmit 1.
    fn ring(&self, q: usize) -> (&Pair, usize) {
        (&self.pairs[q / 2], q % 2)
    }

    /// The negotiated features: the ring's to each file (the kernel refuses any it did not
    /// offer), the offloads to the tap.
    pub fn set_features(&mut self, negotiated: u64) -> vhost::Result<()> {
        for p in &self.pairs {
            p.vhost.set_features(negotiated & self.features)?;
        }
        // The setting is the tap's, for all its queues.
        self.pairs[0]
            .tap
            .set_offloads(Offloads::negotiated(negotiated).rx);
        Ok(())
    }

    /// Guest RAM as this process maps it: the kernel reaches it through our mappings, so any
    /// RAM will do (no memfd needed).
    pub fn set_mem_table(&self, mem: &GuestMemoryMmap) -> vhost::Result<()> {
        let regions: Vec<VhostUserMemoryRegionInfo> = mem
            .iter()
            .map(|r| VhostUserMemoryRegionInfo {
                guest_phys_addr: r.start_addr().0,
                memory_size: r.len(),
                userspace_addr: r.as_ptr() as u64,
                mmap_offset: 0,
                mmap_handle: -1,
            })
            .collect();
        for p in &self.pairs {
            p.vhost.set_mem_table(&regions)?;
        }
        Ok(())
    }

    /// Ring `q`'s size, addresses and base. The addresses are this process's, each ring
    /// checked to lie within one region of guest RAM ([`memory::ring_addresses`]), as the
    /// kernel takes them (`struct vhost_vring_addr`'s user addresses).
    pub fn set_ring(&self, q: usize, queue: &Queue, mem: &GuestMemoryMmap) -> Result<(), String> {
        let addrs = memory::ring_addresses(mem, queue)
            .ok_or_else(|| format!("queue {q}'s rings are not in guest RAM"))?;
        let (p, i) = self.ring(q);
        let err = |what: &'static str| move |e: vhost::Error| format!("{what} failed: {e}");
        p.vhost
            .set_vring_num(i, queue.size())
            .map_err(err("VHOST_SET_VRING_NUM"))?;
        set_vring_addr(&p.vhost, i, &addrs).map_err(err("VHOST_SET_VRING_ADDR"))?;
        p.vhost
            .set_vring_base(i, queue.next_avail())
            .map_err(err("VHOST_SET_VRING_BASE"))
    }

    /// Ring `q`'s call fd.
    pub fn set_call(&self, q: usize, fd: &EventFd) -> vhost::Result<()> {
        let (p, i) = self.ring(q);
        p.vhost.set_vring_call(i, fd)
    }

    /// Ring `q`'s kick fd.
    pub fn set_kick(&self, q: usize, fd: &EventFd) -> vhost::Result<()> {
        let (p, i) = self.ring(q);
        p.vhost.set_vring_kick(i, fd)
    }

    /// Start (the tap as the ring's backend) or stop (none) ring `q` as the driver enables or
    /// disables its pair; the kernel flushes the ring's work before a stop returns. A
    /// multiqueue tap's queue is attached with its receive ring and detached without it, or
    /// the tap would hash flows to a queue nobody reads (TUNSETQUEUE, as for the in-process
    /// NIC).
    pub fn enable(&mut self, q: usize, on: bool) -> vhost::Result<()> {
        if q % 2 == RECEIVE {
            self.pairs[q / 2].tap.set_enabled(on);
        }
        self.set_backend(q, on)
    }

    /// The tap as ring `q`'s backend, or none.
    fn set_backend(&self, q: usize, on: bool) -> vhost::Result<()> {
        let (p, i) = self.ring(q);
        p.vhost.set_backend(i, on.then(|| p.tap.file()))
    }

    /// The driver reset the device: only the first pair's tap queue stays attached, as the
    /// first pair is the only active one until the driver sets more (virtio 1.2 §5.1.6.5.5),
    /// and the tap leaves no offloads in the frames it queues until a driver takes some.
    pub fn reset(&mut self) {
        for (k, p) in self.pairs.iter_mut().enumerate() {
            p.tap.set_enabled(k == 0);
        }
        self.pairs[0].tap.set_offloads(Direction::default());
    }

    /// Stop ring `q` and read where the kernel stopped in it (VHOST_GET_VRING_BASE). The tap
    /// queue stays attached, as QEMU leaves it at a vhost stop: a pause or Bus Master clear
    /// keeps the frames that arrive meanwhile in it for the rings' restart.
    pub fn stop(&mut self, q: usize) -> vhost::Result<u16> {
        self.set_backend(q, false)?;
        let (p, i) = self.ring(q);
        let base = p.vhost.get_vring_base(i)?;
        // A 16-bit ring index (virtio 1.2 §2.7.6); the kernel's is that.
        Ok(u16::try_from(base & 0xffff).expect("masked to 16 bits"))
    }

    /// Stop every ring, on the way to a device that needs a reset; errors are ignored, the
    /// rings being of no use any more.
    pub fn release(&mut self) {
        for q in 0..2 * self.pairs.len() {
            let _ = self.set_backend(q, false);
        }
    }
}

/// VHOST_SET_VRING_ADDR with this process's addresses of ring `index`'s parts. By hand: the
/// `vhost` crate's own call takes guest addresses and refuses a ring that ends exactly where
/// guest RAM does (its range check counts the end as inside), which a driver may place there.
fn set_vring_addr(
    file: &Net<Arc<GuestMemoryMmap>>,
    index: usize,
    addrs: &VringConfigData,
) -> vhost::Result<()> {
    let addr = vhost_vring_addr {
        index: u32::try_from(index).map_err(|_| vhost::Error::InvalidQueue)?,
        flags: 0,
        desc_user_addr: addrs.desc_table_addr,
        used_user_addr: addrs.used_ring_addr,
        avail_user_addr: addrs.avail_ring_addr,
        log_guest_addr: 0,
    };
    // SAFETY: VHOST_SET_VRING_ADDR reads a `struct vhost_vring_addr`, which `addr` is; the
    // addresses are mappings of guest RAM this process keeps for the machine's life.
    let ret = unsafe { ioctl_with_ref(file, VHOST_SET_VRING_ADDR(), &addr) };
    if ret < 0 {
        Err(vhost::Error::IoctlError(std::io::Error::last_os_error()))
    } else {
        Ok(())
    }
}
