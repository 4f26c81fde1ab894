//! Builders for the ops the probe understands (the op half of the contract).

use crate::contract::*;
use crate::pci::PciAddress;

/// The ECAM-style address the contract uses for register `reg` of `function`.
pub fn config_address(function: PciAddress, reg: u16) -> u64 {
    function.ecam_offset() + u64::from(reg)
}

/// Read `size` bytes of config space.
pub fn cfg_read(method: u64, function: PciAddress, reg: u16, size: u64) -> Op {
    Op {
        kind: OP_CFG_READ,
        method,
        address: config_address(function, reg),
        size,
        ..Default::default()
    }
}

/// Write `size` bytes of config space.
pub fn cfg_write(method: u64, function: PciAddress, reg: u16, size: u64, value: u64) -> Op {
    Op {
        kind: OP_CFG_WRITE,
        method,
        address: config_address(function, reg),
        size,
        value,
        ..Default::default()
    }
}

/// Read one config dword `count` times.
pub fn cfg_read_loop(method: u64, function: PciAddress, reg: u16, count: u64) -> Op {
    Op {
        kind: OP_CFG_READ_LOOP,
        method,
        address: config_address(function, reg),
        size: 4,
        count,
        ..Default::default()
    }
}

/// Read a RAM dword `count` times.
pub fn ram_read_loop(count: u64) -> Op {
    Op {
        kind: OP_RAM_READ_LOOP,
        count,
        ..Default::default()
    }
}

/// Enumerate the bus.
pub fn enumerate(method: u64) -> Op {
    Op {
        kind: OP_ENUMERATE,
        method,
        ..Default::default()
    }
}

/// Guest-physical read (device MMIO).
pub fn mmio_read(address: u64, size: u64) -> Op {
    Op {
        kind: OP_MMIO_READ,
        address,
        size,
        ..Default::default()
    }
}

/// Bring up a virtio-net device: `transport` is `TRANSPORT_MMIO` (`address` = index among
/// the virtio-mmio devices) or `TRANSPORT_PCI` (`address` = ECAM-style function address).
pub fn virtio_init(transport: u64, address: u64, flags: u64) -> Op {
    Op {
        kind: OP_VIRTIO_INIT,
        method: transport,
        address,
        value: flags,
        ..Default::default()
    }
}

/// [`virtio_init`], with the stream buffers laid out for frames of up to `stream_payload`
/// bytes (`OP_VIRTIO_INIT`'s `size`).
pub fn virtio_init_streaming(transport: u64, address: u64, flags: u64, stream_payload: u64) -> Op {
    Op {
        size: stream_payload,
        ..virtio_init(transport, address, flags)
    }
}

/// `count` request/response transactions of `request_size`-byte requests.
pub fn virtio_rr(request_size: u64, count: u64) -> Op {
    Op {
        kind: OP_VIRTIO_RR,
        size: request_size,
        count,
        ..Default::default()
    }
}

/// `count` ICMP echo transactions with `data` bytes each, from `guest` to `host` (IPv4
/// addresses) whose MAC is `host_mac`, on the device of the last [`virtio_init`].
pub fn icmp_echo(
    host: std::net::Ipv4Addr,
    guest: std::net::Ipv4Addr,
    host_mac: [u8; 6],
    data: u64,
    count: u64,
) -> Op {
    let mut mac = [0; 8];
    mac[2..].copy_from_slice(&host_mac);
    Op {
        kind: OP_ICMP_ECHO,
        address: u64::from(host.to_bits()) | u64::from(guest.to_bits()) << 32,
        value: u64::from_be_bytes(mac),
        size: data,
        count,
        ..Default::default()
    }
}

/// Reset the device and bring it up again.
pub fn virtio_reset() -> Op {
    Op {
        kind: OP_VIRTIO_RESET,
        ..Default::default()
    }
}

/// One transaction with the receive vector masked, then unmasked.
pub fn virtio_mask_pending(request_size: u64) -> Op {
    Op {
        kind: OP_VIRTIO_MASK_PENDING,
        size: request_size,
        ..Default::default()
    }
}

/// Guest-physical write (device MMIO).
pub fn mmio_write(address: u64, size: u64, value: u64) -> Op {
    Op {
        kind: OP_MMIO_WRITE,
        address,
        size,
        value,
        ..Default::default()
    }
}

/// Program every MSI-X entry of `function` (data `first_vector + i`, message address
/// `address`, 0 for the interrupt window's base) with MSI-X disabled, unmasked or not.
pub fn msix_program(function: PciAddress, first_vector: u8, address: u32, unmask: bool) -> Op {
    Op {
        kind: OP_MSIX_PROGRAM,
        address: function.ecam_offset(),
        size: u64::from(address),
        value: u64::from(first_vector),
        count: u64::from(unmask),
        ..Default::default()
    }
}

/// Write MSI-X Message Control of `function` (`PCI_MSIX_FLAGS_*`), timed.
pub fn msix_control(function: PciAddress, control: u16) -> Op {
    Op {
        kind: OP_MSIX_CONTROL,
        address: function.ecam_offset(),
        value: u64::from(control),
        ..Default::default()
    }
}

/// Mask or unmask every MSI-X entry of `function`, one after the other.
pub fn msix_mask_each(function: PciAddress, masked: bool) -> Op {
    Op {
        kind: OP_MSIX_MASK_EACH,
        address: function.ecam_offset(),
        value: u64::from(masked),
        ..Default::default()
    }
}

/// Rewrite every MSI-X entry's data to `first_vector + i` without masking it.
pub fn msix_retarget(function: PciAddress, first_vector: u8) -> Op {
    Op {
        kind: OP_MSIX_RETARGET,
        address: function.ecam_offset(),
        value: u64::from(first_vector),
        ..Default::default()
    }
}

/// Check MSI-X delivery on `function`, after asking the VMM to send every vector if `send`.
pub fn msix_check(function: PciAddress, send: bool) -> Op {
    Op {
        kind: OP_MSIX_CHECK,
        address: function.ecam_offset(),
        count: u64::from(send),
        ..Default::default()
    }
}

/// Interrupt latency on `function`: `rounds` times, ask for entries `first..first + entries`
/// one at a time and wait for each.
pub fn msix_latency(function: PciAddress, first: u64, entries: u64, rounds: u64) -> Op {
    Op {
        kind: OP_MSIX_LATENCY,
        address: function.ecam_offset(),
        value: first,
        size: entries,
        count: rounds,
        ..Default::default()
    }
}

/// A hostile burst of `accesses` random accesses from `seed`.
pub fn hostile(seed: u64, accesses: u64) -> Op {
    Op {
        kind: OP_HOSTILE,
        value: seed,
        count: accesses,
        ..Default::default()
    }
}

/// Unmap as `mode` (`IOMMU_MODE_*`) says from now on, with high-water mark `hwm` (0 keeps it).
pub fn iommu_mode(mode: u64, hwm: u64) -> Op {
    Op {
        kind: OP_IOMMU_MODE,
        method: mode,
        value: hwm,
        ..Default::default()
    }
}

/// Interrupt remapping on, its entries delivering entry k on IDT vector k + `delta`
/// (`OP_IOMMU_INTREMAP`), from `function` only, or from the next device only if `foreign`.
pub fn iommu_intremap(function: PciAddress, delta: u8, foreign: bool) -> Op {
    Op {
        kind: OP_IOMMU_INTREMAP,
        address: function.ecam_offset(),
        value: u64::from(delta),
        count: u64::from(foreign),
        ..Default::default()
    }
}

/// Interrupt remapping on as [`iommu_intremap`] does, its entries level-triggered, for the
/// IOAPIC of a split irqchip at `ioapic` (FF:00.0): a virtio-mmio device brought up afterwards
/// on its line gets a remappable redirection entry.
pub fn iommu_intremap_level(ioapic: PciAddress, delta: u8) -> Op {
    Op {
        count: 2,
        ..iommu_intremap(ioapic, delta, false)
    }
}

/// Stream `count` frames of `payload` bytes, at most `in_flight` at once.
pub fn net_stream(payload: u64, count: u64, in_flight: u64) -> Op {
    Op {
        kind: OP_NET_STREAM,
        size: payload,
        count,
        value: in_flight,
        ..Default::default()
    }
}

/// Copy the IOMMU driver's counters into report slot `slot` and start them again.
pub fn iommu_report(slot: u64) -> Op {
    Op {
        kind: OP_IOMMU_REPORT,
        address: slot,
        ..Default::default()
    }
}
