//! What serves a vhost device's rings: a vhost-user backend over its socket, or the kernel's
//! vhost-net on a tap ([`super::kernel`]). Both take the same ring set-up (the vhost-user
//! protocol is the kernel's ioctls carried over a socket); they differ in the memory table
//! (memfd regions a backend maps, or this process's mappings, which the kernel reaches
//! itself), how a ring is started and stopped, and whether they can hang up (only a socket
//! can).

use std::os::fd::{AsRawFd, RawFd};

use vhost::VhostBackend;
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

use super::connection::{Connection, VHOST_USER_F_PROTOCOL_FEATURES};
use super::device::OWN_FEATURES;
use super::kernel::KernelNet;
use super::memory;

/// The backend of a vhost device.
pub(super) enum Backend {
    /// A vhost-user backend's session.
    User(Connection),
    /// The kernel's vhost-net.
    Kernel(KernelNet),
}

impl Backend {
    /// The fd whose readability says the backend hung up: a vhost-user socket (the backend
    /// sends nothing unasked).
    pub fn hangup_fd(&self) -> Option<RawFd> {
        match self {
            Backend::User(c) => Some(c.frontend.as_raw_fd()),
            Backend::Kernel(_) => None,
        }
    }

    /// The first messages of DRIVER_OK: the driver's features (what the backend does of
    /// them) and guest RAM.
    pub fn set_features_and_memory(
        &mut self,
        negotiated: u64,
        mem: &GuestMemoryMmap,
    ) -> Result<(), String> {
        let err = |what: &'static str| move |e: vhost::Error| format!("{what} failed: {e}");
        match self {
            Backend::User(c) => {
                let protocol = c.features & VHOST_USER_F_PROTOCOL_FEATURES;
                c.frontend
                    .set_features(negotiated & c.features & !OWN_FEATURES | protocol)
                    .map_err(err("SET_FEATURES"))?;
                let regions = memory::regions(mem).map_err(|e| e.to_string())?;
                c.frontend
                    .set_mem_table(&regions)
                    .map(|_| ())
                    .map_err(err("SET_MEM_TABLE"))
            }
            Backend::Kernel(k) => {
                k.set_features(negotiated)
                    .map_err(err("VHOST_SET_FEATURES"))?;
                k.set_mem_table(mem).map_err(err("VHOST_SET_MEM_TABLE"))
            }
        }
    }

    /// Ring `q`'s size, addresses and base.
    pub fn set_ring(
        &mut self,
        q: usize,
        queue: &Queue,
        mem: &GuestMemoryMmap,
    ) -> Result<(), String> {
        match self {
            Backend::User(c) => {
                let err = |what: &'static str| move |e: vhost::Error| format!("{what} failed: {e}");
                let addrs = memory::ring_addresses(mem, queue)
                    .ok_or_else(|| format!("queue {q}'s rings are not in guest RAM"))?;
                let f = &mut c.frontend;
                f.set_vring_num(q, queue.size())
                    .map_err(err("SET_VRING_NUM"))?;
                f.set_vring_addr(q, &addrs).map_err(err("SET_VRING_ADDR"))?;
                f.set_vring_base(q, queue.next_avail())
                    .map_err(err("SET_VRING_BASE"))
            }
            Backend::Kernel(k) => k.set_ring(q, queue, mem),
        }
    }

    /// Ring `q`'s call fd (acknowledged before this returns, with REPLY_ACK).
    pub fn set_call(&mut self, q: usize, fd: &EventFd) -> vhost::Result<()> {
        match self {
            Backend::User(c) => c.frontend.set_vring_call(q, fd),
            Backend::Kernel(k) => k.set_call(q, fd),
        }
    }

    /// Ring `q`'s kick fd.
    pub fn set_kick(&mut self, q: usize, fd: &EventFd) -> vhost::Result<()> {
        match self {
            Backend::User(c) => c.frontend.set_vring_kick(q, fd),
            Backend::Kernel(k) => k.set_kick(q, fd),
        }
    }

    /// Let the backend use ring `q`, or not. A vhost-user backend without protocol features
    /// starts its rings enabled and has no message for it.
    pub fn enable(&mut self, q: usize, on: bool) -> vhost::Result<()> {
        match self {
            Backend::User(c) if c.features & VHOST_USER_F_PROTOCOL_FEATURES != 0 => {
                c.frontend.set_vring_enable(q, on)
            }
            Backend::User(_) => Ok(()),
            Backend::Kernel(k) => k.enable(q, on),
        }
    }

    /// The driver reset the device.
    pub fn reset(&mut self) {
        if let Backend::Kernel(k) = self {
            k.reset();
        }
    }

    /// Stop ring `q`; its base, once the backend no longer uses it.
    pub fn stop(&mut self, q: usize) -> vhost::Result<u16> {
        match self {
            Backend::User(c) => stop_user_ring(&mut c.frontend, q, c.features),
            Backend::Kernel(k) => k.stop(q),
        }
    }
}

/// Stop ring `q`: disabled first where rings are enabled by message, then its base asked for,
/// which the backend answers once it no longer uses the ring (vhost-user protocol, "Ring
/// states").
fn stop_user_ring(f: &mut Frontend, q: usize, features: u64) -> vhost::Result<u16> {
    if features & VHOST_USER_F_PROTOCOL_FEATURES != 0 {
        f.set_vring_enable(q, false)?;
    }
    let base = f.get_vring_base(q)?;
    // The base is a 16-bit ring index (virtio 1.2 §2.7.6); anything wider is nonsense.
    u16::try_from(base)
        .map_err(|_| vhost::Error::VhostUserProtocol(vhost::vhost_user::Error::InvalidMessage))
}
