//! The two ways exitless presents a virtio device to its driver (virtio 1.2 §4): [`mmio`], a
//! register window on the MMIO bus with exitless's MSI and per-queue doorbell extension, and
//! [`pci`], a modern virtio-pci function with MSI-X. Both are built on a [`TransportCore`]: the
//! common registers in a `VirtioState`, the queue work handed to the device thread.

pub mod mmio;
pub mod pci;
pub mod persist;
pub mod shared;

pub use shared::{TransportCore, TransportEnv};

use crate::virtio::Ring;

/// Distance from a queue address's low dword to its high dword: both transports give each
/// 64-bit ring address as two 32-bit registers, low first (virtio 1.2 §4.1.4.3, §4.2.2).
const HIGH_DWORD: u32 = 4;

/// The ring a queue-address register names and whether it is the high dword, from its offset
/// `rel` past the descriptor table's low dword; the three rings' registers lie `stride` bytes
/// apart, in the order descriptors, driver, device.
fn ring_dword(rel: u32, stride: u32) -> (Ring, bool) {
    let rings = [Ring::Descriptors, Ring::Driver, Ring::Device];
    (rings[(rel / stride) as usize], rel % stride == HIGH_DWORD)
}
