//! A table of MSI vectors with per-vector mask and pending bits, as MSI-X has them (PCI 3.0
//! §6.8.2) and as exitless's virtio-mmio MSI extension has them (docs/virtio-mmio-msi.md).
//!
//! Each vector owns a GSI and an irqfd bound to it. A message is sent by signalling the irqfd;
//! a message due while the vector (or the whole function) is masked, or while the table is
//! disabled, sets the vector's pending bit instead and is sent when it becomes deliverable.
//! The address/data pair reaches KVM only through [`MsiVectors::program`], which the transports
//! call with a complete pair, so no message can use a half-written one.

use std::sync::{Arc, Mutex};

use kvm_ioctls::VmFd;
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use super::regs::{MSI_ADDRESS_BASE, MSI_ADDRESS_MASK};
use super::{GsiRouting, IrqError};

#[derive(Clone, Copy, Default)]
struct Vector {
    address: u64,
    data: u32,
    /// The pair was valid and is in the routing table.
    routed: bool,
    masked: bool,
    pending: bool,
}

struct State {
    vectors: Vec<Vector>,
    enabled: bool,
    function_masked: bool,
}

/// A device's MSI vectors.
pub struct MsiVectors {
    vm: Arc<VmFd>,
    routing: Arc<GsiRouting>,
    gsis: Vec<u32>,
    irqfds: Vec<EventFd>,
    state: Mutex<State>,
}

/// Whether `address`/`data` is a message the x86 interrupt controller accepts: an address in
/// the 0xFEExxxxx window and a vector ≥ 16 (vectors 0..15 are reserved, Intel SDM §11.11.2).
pub fn is_valid_message(address: u64, data: u32) -> bool {
    address & MSI_ADDRESS_MASK == MSI_ADDRESS_BASE && address >> 32 == 0 && data & 0xff >= 16
}

impl MsiVectors {
    /// `count` vectors, all masked and disabled, each with a GSI and an irqfd.
    pub fn new(vm: Arc<VmFd>, routing: Arc<GsiRouting>, count: usize) -> Result<Self, IrqError> {
        let mut table = MsiVectors {
            vm,
            routing,
            gsis: Vec::with_capacity(count),
            irqfds: Vec::with_capacity(count),
            state: Mutex::new(State {
                vectors: vec![
                    Vector {
                        masked: true,
                        ..Default::default()
                    };
                    count
                ],
                enabled: false,
                function_masked: false,
            }),
        };
        // On an error, Drop releases what was taken so far.
        for _ in 0..count {
            let irqfd = EventFd::new(EFD_NONBLOCK).map_err(IrqError::EventFd)?;
            let gsi = table.routing.allocate()?;
            if let Err(source) = table.vm.register_irqfd(&irqfd, gsi) {
                table.routing.release(gsi)?;
                return Err(IrqError::Kvm {
                    what: "register an MSI irqfd",
                    source,
                });
            }
            table.gsis.push(gsi);
            table.irqfds.push(irqfd);
        }
        Ok(table)
    }

    /// Number of vectors.
    pub fn len(&self) -> usize {
        self.gsis.len()
    }

    /// Whether there are no vectors.
    pub fn is_empty(&self) -> bool {
        self.gsis.is_empty()
    }

    /// Set vector `index`'s message to a complete address/data pair. An invalid pair removes
    /// the route: messages on the vector are then dropped (a real bus would send them nowhere).
    pub fn program(&self, index: usize, address: u64, data: u32) {
        let mut st = self.state.lock().unwrap();
        let Some(v) = st.vectors.get_mut(index) else {
            warn_ratelimited!("MSI vector {index} does not exist; update ignored");
            return;
        };
        if v.routed && v.address == address && v.data == data {
            return;
        }
        v.address = address;
        v.data = data;
        let gsi = self.gsis[index];
        let result = if is_valid_message(address, data) {
            v.routed = true;
            self.routing.set_msi(gsi, address, data)
        } else {
            warn_ratelimited!(
                "MSI vector {index}: address {address:#x} data {data:#x} is not a valid \
                 message; its interrupts are dropped"
            );
            v.routed = false;
            self.routing.clear(gsi)
        };
        if let Err(e) = result {
            v.routed = false;
            warn_ratelimited!("MSI vector {index}: {e}");
        }
    }

    /// The message of vector `index`: (address, data).
    pub fn message(&self, index: usize) -> Option<(u64, u32)> {
        let st = self.state.lock().unwrap();
        st.vectors.get(index).map(|v| (v.address, v.data))
    }

    /// Mask or unmask vector `index`; unmasking sends a pending message.
    pub fn set_masked(&self, index: usize, masked: bool) {
        let mut st = self.state.lock().unwrap();
        match st.vectors.get_mut(index) {
            Some(v) => v.masked = masked,
            None => {
                warn_ratelimited!("MSI vector {index} does not exist; mask change ignored");
                return;
            }
        }
        self.flush_pending(&mut st);
    }

    /// Whether vector `index` is masked (absent vectors read as masked).
    pub fn is_masked(&self, index: usize) -> bool {
        let st = self.state.lock().unwrap();
        st.vectors.get(index).is_none_or(|v| v.masked)
    }

    /// Whether vector `index` has a pending message.
    pub fn is_pending(&self, index: usize) -> bool {
        let st = self.state.lock().unwrap();
        st.vectors.get(index).is_some_and(|v| v.pending)
    }

    /// Enable or disable the table (MSI-X Enable); enabling sends pending messages.
    pub fn set_enabled(&self, enabled: bool) {
        let mut st = self.state.lock().unwrap();
        st.enabled = enabled;
        self.flush_pending(&mut st);
    }

    /// Mask or unmask every vector at once (MSI-X Function Mask).
    pub fn set_function_masked(&self, masked: bool) {
        let mut st = self.state.lock().unwrap();
        st.function_masked = masked;
        self.flush_pending(&mut st);
    }

    /// Back to the reset state: disabled, every vector masked, no message, nothing pending.
    pub fn reset(&self) {
        let mut st = self.state.lock().unwrap();
        st.enabled = false;
        st.function_masked = false;
        for (i, v) in st.vectors.iter_mut().enumerate() {
            if v.routed
                && let Err(e) = self.routing.clear(self.gsis[i])
            {
                warn_ratelimited!("MSI vector {i}: {e}");
            }
            *v = Vector {
                masked: true,
                ..Default::default()
            };
        }
    }

    /// Send vector `index`'s message, or make it pending if it cannot be sent now.
    pub fn trigger(&self, index: usize) {
        let mut st = self.state.lock().unwrap();
        let blocked = !st.enabled || st.function_masked;
        let Some(v) = st.vectors.get_mut(index) else {
            warn_ratelimited!("MSI vector {index} does not exist; interrupt dropped");
            return;
        };
        if blocked || v.masked {
            v.pending = true;
        } else if v.routed {
            self.signal(index);
        }
    }

    fn flush_pending(&self, st: &mut State) {
        if !st.enabled || st.function_masked {
            return;
        }
        for (i, v) in st.vectors.iter_mut().enumerate() {
            if v.pending && !v.masked {
                v.pending = false;
                if v.routed {
                    self.signal(i);
                }
            }
        }
    }

    fn signal(&self, index: usize) {
        if let Err(e) = self.irqfds[index].write(1) {
            warn_ratelimited!("MSI vector {index}: irqfd write failed: {e}");
        }
    }
}

impl Drop for MsiVectors {
    fn drop(&mut self) {
        for (irqfd, &gsi) in self.irqfds.iter().zip(&self.gsis) {
            let _ = self.vm.unregister_irqfd(irqfd, gsi);
        }
        for &gsi in &self.gsis {
            let _ = self.routing.release(gsi);
        }
    }
}
