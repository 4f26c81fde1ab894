//! Virtio facts that the VMM's transports and the probe guest's drivers both use. The guest's build
//! script puts every constant in its `contract.h`, so a register offset is written down once. The
//! standard values are checked against virtio-bindings by the tests of the VMM's `virtio` module.
//! References: Virtual I/O Device (VIRTIO) Version 1.2 (virtio 1.2); the MMIO MSI / notify
//! extension is ours, specified in docs/virtio-mmio-msi.md.

contract_consts! {
    VIRTIO_REGS;
    /// Device status: the guest noticed the device (virtio 1.2 §2.1).
    VIRTIO_STATUS_ACKNOWLEDGE: u32 = 1;
    /// Device status: the guest has a driver for the device (virtio 1.2 §2.1).
    VIRTIO_STATUS_DRIVER: u32 = 2;
    /// Device status: the driver is set up and ready to drive the device (virtio 1.2 §2.1).
    VIRTIO_STATUS_DRIVER_OK: u32 = 4;
    /// Device status: the driver accepted its features; the device clears it again if it
    /// refuses them (virtio 1.2 §2.1, §3.1.1).
    VIRTIO_STATUS_FEATURES_OK: u32 = 8;
    /// Device status: the device hit an error it cannot recover from without a reset (virtio
    /// 1.2 §2.1.2).
    VIRTIO_STATUS_DEVICE_NEEDS_RESET: u32 = 0x40;
    /// Device status: the driver gave up on the device (virtio 1.2 §2.1).
    VIRTIO_STATUS_FAILED: u32 = 0x80;
    /// Feature bit: used_event / avail_event notification suppression (virtio 1.2 §2.7.10).
    VIRTIO_F_EVENT_IDX: u32 = 29;
    /// Feature bit: a virtio 1.x (non-legacy) device; a driver that does not accept it is
    /// refused (virtio 1.2 §6).
    VIRTIO_F_VERSION_1: u32 = 32;
    /// Feature bit: the device's memory accesses go through the platform's IOMMU; ring and
    /// buffer addresses are bus addresses (virtio 1.2 §6). Offered by virtio-pci devices of a
    /// machine with an IOMMU.
    VIRTIO_F_ACCESS_PLATFORM: u32 = 33;
    /// Feature bit (ours, docs/virtio-mmio-msi.md): virtio-mmio MSI vectors.
    VIRTIO_F_MMIO_MSI: u32 = 42;
    /// Feature bit (ours, docs/virtio-mmio-msi.md): a doorbell address per virtio-mmio queue.
    VIRTIO_F_MMIO_NOTIFY: u32 = 43;
    /// Device ID of a network card (virtio 1.2 §5).
    VIRTIO_ID_NET: u32 = 1;
    /// "No vector" in the queue → vector and config → vector registers (virtio 1.2
    /// §4.1.5.1.2).
    VIRTIO_MSI_NO_VECTOR: u16 = 0xffff;
    /// Descriptor flag: the chain continues at `next` (virtio 1.2 §2.7.5).
    VIRTQ_DESC_F_NEXT: u32 = 1;
    /// Descriptor flag: the buffer is device-writable, not device-readable (virtio 1.2 §2.7.5).
    VIRTQ_DESC_F_WRITE: u32 = 2;
    /// Size of `struct virtio_net_hdr` with VIRTIO_F_VERSION_1 (virtio 1.2 §5.1.6).
    VIRTIO_NET_HDR_SIZE: u32 = 12;
    /// virtio-net feature bit: the device has a MAC address in its config space (virtio 1.2
    /// §5.1.3), the first 6 bytes of `struct virtio_net_config`.
    VIRTIO_NET_F_MAC: u32 = 5;
    /// Index of a virtio-net device's first receive queue, receiveq1 (virtio 1.2 §5.1.2).
    VIRTIO_NET_RX_QUEUE: u32 = 0;
    /// Index of a virtio-net device's first transmit queue, transmitq1 (virtio 1.2 §5.1.2).
    VIRTIO_NET_TX_QUEUE: u32 = 1;

    /// virtio-mmio MagicValue: "virt" (virtio 1.2 §4.2.2).
    VIRTIO_MMIO_MAGIC: u32 = 0x7472_6976;
    /// virtio-mmio MagicValue register, reads `VIRTIO_MMIO_MAGIC`. This and the offsets below
    /// are the table "MMIO Device Register Layout" of virtio 1.2 §4.2.2.
    VIRTIO_MMIO_MAGIC_VALUE: u32 = 0x000;
    /// virtio-mmio Version register: 2 for a virtio 1.x device (virtio 1.2 §4.2.2).
    VIRTIO_MMIO_VERSION: u32 = 0x004;
    /// virtio-mmio DeviceID: the virtio device ID, e.g. `VIRTIO_ID_NET` (virtio 1.2 §4.2.2, §5).
    VIRTIO_MMIO_DEVICE_ID: u32 = 0x008;
    /// virtio-mmio VendorID: the subsystem vendor ID (virtio 1.2 §4.2.2).
    VIRTIO_MMIO_VENDOR_ID: u32 = 0x00c;
    /// virtio-mmio DeviceFeatures: the 32 offered feature bits DeviceFeaturesSel picks
    /// (virtio 1.2 §4.2.2).
    VIRTIO_MMIO_DEVICE_FEATURES: u32 = 0x010;
    /// virtio-mmio DeviceFeaturesSel: which 32 bits DeviceFeatures shows, 0 for bits 0-31 and
    /// 1 for bits 32-63 (virtio 1.2 §4.2.2).
    VIRTIO_MMIO_DEVICE_FEATURES_SEL: u32 = 0x014;
    /// virtio-mmio DriverFeatures: the driver writes the 32 accepted feature bits
    /// DriverFeaturesSel picks (virtio 1.2 §4.2.2).
    VIRTIO_MMIO_DRIVER_FEATURES: u32 = 0x020;
    /// virtio-mmio DriverFeaturesSel: which 32 bits a DriverFeatures write sets (virtio 1.2
    /// §4.2.2).
    VIRTIO_MMIO_DRIVER_FEATURES_SEL: u32 = 0x024;
    /// virtio-mmio QueueSel: the queue the Queue* registers act on (virtio 1.2 §4.2.2).
    VIRTIO_MMIO_QUEUE_SEL: u32 = 0x030;
    /// virtio-mmio QueueNumMax: the largest size the selected queue may have (virtio 1.2
    /// §4.2.2).
    VIRTIO_MMIO_QUEUE_NUM_MAX: u32 = 0x034;
    /// virtio-mmio QueueNum: the size the driver gives the selected queue (virtio 1.2 §4.2.2).
    VIRTIO_MMIO_QUEUE_NUM: u32 = 0x038;
    /// virtio-mmio QueueReady: the driver enables (1) or stops (0) the selected queue; reads
    /// back whether the device uses it (virtio 1.2 §4.2.2).
    VIRTIO_MMIO_QUEUE_READY: u32 = 0x044;
    /// QueueNotify: the queue index written is the queue notified.
    VIRTIO_MMIO_QUEUE_NOTIFY: u32 = 0x050;
    /// virtio-mmio InterruptStatus: why the line is asserted, `VIRTIO_MMIO_INT_*` bits
    /// (virtio 1.2 §4.2.2).
    VIRTIO_MMIO_INTERRUPT_STATUS: u32 = 0x060;
    /// virtio-mmio InterruptACK: the driver clears the InterruptStatus bits it writes (virtio
    /// 1.2 §4.2.2).
    VIRTIO_MMIO_INTERRUPT_ACK: u32 = 0x064;
    /// virtio-mmio Status: the device status (`VIRTIO_STATUS_*`); writing 0 resets the device
    /// (virtio 1.2 §4.2.2, §2.1).
    VIRTIO_MMIO_STATUS: u32 = 0x070;
    /// virtio-mmio QueueDescLow: bits 31:0 of the selected queue's descriptor table address
    /// (virtio 1.2 §4.2.2).
    VIRTIO_MMIO_QUEUE_DESC_LOW: u32 = 0x080;
    /// virtio-mmio QueueDescHigh: bits 63:32 of the descriptor table address.
    VIRTIO_MMIO_QUEUE_DESC_HIGH: u32 = 0x084;
    /// virtio-mmio QueueDriverLow: bits 31:0 of the selected queue's driver area, the
    /// available ring (virtio 1.2 §4.2.2).
    VIRTIO_MMIO_QUEUE_AVAIL_LOW: u32 = 0x090;
    /// virtio-mmio QueueDriverHigh: bits 63:32 of the driver area address.
    VIRTIO_MMIO_QUEUE_AVAIL_HIGH: u32 = 0x094;
    /// virtio-mmio QueueDeviceLow: bits 31:0 of the selected queue's device area, the used
    /// ring (virtio 1.2 §4.2.2).
    VIRTIO_MMIO_QUEUE_USED_LOW: u32 = 0x0a0;
    /// virtio-mmio QueueDeviceHigh: bits 63:32 of the device area address.
    VIRTIO_MMIO_QUEUE_USED_HIGH: u32 = 0x0a4;
    /// virtio-mmio ConfigGeneration: changes whenever the configuration space may have, so a
    /// driver can tell a torn read (virtio 1.2 §4.2.2, §2.5.1).
    VIRTIO_MMIO_CONFIG_GENERATION: u32 = 0x0fc;
    /// virtio-mmio device-specific configuration space starts here (virtio 1.2 §4.2.2).
    VIRTIO_MMIO_CONFIG: u32 = 0x100;
    /// InterruptStatus bit: a used buffer notification (virtio 1.2 §4.2.2).
    VIRTIO_MMIO_INT_VRING: u32 = 1;
    /// InterruptStatus bit: a configuration change notification (virtio 1.2 §4.2.2).
    VIRTIO_MMIO_INT_CONFIG: u32 = 2;

    /// Extension (docs/virtio-mmio-msi.md): number of MSI vectors, read-only.
    VIRTIO_MMIO_MSI_VEC_NUM: u32 = 0x0c4;
    /// Extension: selects the vector that the address, data, command and state registers act on.
    VIRTIO_MMIO_MSI_SEL: u32 = 0x0c8;
    /// Extension: staged message address, bits 31:0.
    VIRTIO_MMIO_MSI_ADDRESS_LOW: u32 = 0x0cc;
    /// Extension: staged message address, bits 63:32.
    VIRTIO_MMIO_MSI_ADDRESS_HIGH: u32 = 0x0d0;
    /// Extension: staged message data.
    VIRTIO_MMIO_MSI_DATA: u32 = 0x0d4;
    /// Extension: write-only command register (`VIRTIO_MMIO_MSI_CMD_*`) for the selected vector.
    VIRTIO_MMIO_MSI_COMMAND: u32 = 0x0d8;
    /// Extension: read-only state of the selected vector (`VIRTIO_MMIO_MSI_STATE_*`).
    VIRTIO_MMIO_MSI_STATE: u32 = 0x0dc;
    /// Extension: vector of the queue selected by QueueSel, or `VIRTIO_MSI_NO_VECTOR`.
    VIRTIO_MMIO_QUEUE_MSI_VEC: u32 = 0x0e0;
    /// Extension: vector of configuration change notifications.
    VIRTIO_MMIO_CONFIG_MSI_VEC: u32 = 0x0e4;
    /// Extension: MSI control (`VIRTIO_MMIO_MSI_CTRL_*`).
    VIRTIO_MMIO_MSI_CONTROL: u32 = 0x0e8;
    /// Extension: doorbell offset (from the device base) of the queue selected by QueueSel.
    VIRTIO_MMIO_QUEUE_NOTIFY_OFF: u32 = 0x0ec;
    /// MSI command: copy the staged address and data into the selected vector, atomically.
    VIRTIO_MMIO_MSI_CMD_UPDATE: u32 = 1;
    /// MSI command: mask the selected vector.
    VIRTIO_MMIO_MSI_CMD_MASK: u32 = 2;
    /// MSI command: unmask the selected vector (a pending message is sent now).
    VIRTIO_MMIO_MSI_CMD_UNMASK: u32 = 3;
    /// MSI state bit: the vector is masked.
    VIRTIO_MMIO_MSI_STATE_MASKED: u32 = 1;
    /// MSI state bit: a message is pending (it was due while masked).
    VIRTIO_MMIO_MSI_STATE_PENDING: u32 = 2;
    /// MSI control bit: interrupts go through the vectors (not the line).
    VIRTIO_MMIO_MSI_CTRL_ENABLE: u32 = 1;
    /// Per-queue doorbells start here, `VIRTIO_MMIO_DOORBELL_STRIDE` bytes apart.
    VIRTIO_MMIO_DOORBELL_BASE: u32 = 0x1000;
    /// Distance between two queues' doorbells.
    VIRTIO_MMIO_DOORBELL_STRIDE: u32 = 4;
    /// Size of one virtio-mmio device's window: registers and config, then the doorbell page.
    VIRTIO_MMIO_WINDOW_SIZE: u32 = 0x2000;

    /// PCI vendor ID of virtio devices (virtio 1.2 §4.1.2).
    VIRTIO_PCI_VENDOR_ID: u32 = 0x1af4;
    /// PCI device ID of a modern virtio device is this plus the virtio device ID.
    VIRTIO_PCI_DEVICE_ID_BASE: u32 = 0x1040;
    /// PCI device ID of a transitional virtio network card (virtio 1.2 §4.1.2.3), such as
    /// QEMU's virtio-net-pci: its Subsystem Device ID is the virtio device ID.
    VIRTIO_PCI_TRANSITIONAL_NET_ID: u32 = 0x1000;
    /// virtio_pci_cap.cfg_type: common configuration (virtio 1.2 §4.1.4).
    VIRTIO_PCI_CAP_COMMON_CFG: u32 = 1;
    /// virtio_pci_cap.cfg_type: the notification (doorbell) area (virtio 1.2 §4.1.4.4).
    VIRTIO_PCI_CAP_NOTIFY_CFG: u32 = 2;
    /// virtio_pci_cap.cfg_type: the ISR status byte (virtio 1.2 §4.1.4.5).
    VIRTIO_PCI_CAP_ISR_CFG: u32 = 3;
    /// virtio_pci_cap.cfg_type: device-specific configuration (virtio 1.2 §4.1.4.6).
    VIRTIO_PCI_CAP_DEVICE_CFG: u32 = 4;
    /// virtio_pci_cap.cfg_type: PCI configuration access, a window into the BARs (virtio 1.2
    /// §4.1.4.9).
    VIRTIO_PCI_CAP_PCI_CFG: u32 = 5;
    /// virtio_pci_cfg_cap.pci_cfg_data, from the capability ID byte (virtio 1.2 §4.1.4.9).
    VIRTIO_PCI_CAP_PCI_CFG_DATA: u32 = 16;
    /// Non-transitional devices have a PCI Subsystem ID of at least this (virtio 1.2
    /// §4.1.2.1); ours is this plus the virtio device ID.
    VIRTIO_PCI_SUBSYSTEM_ID_BASE: u32 = 0x40;
    /// virtio_pci_cap.cfg_type's offset, from the capability ID byte; this and the offsets
    /// below are `struct virtio_pci_cap` (virtio 1.2 §4.1.4).
    VIRTIO_PCI_CAP_CFG_TYPE: u32 = 3;
    /// virtio_pci_cap.bar: which BAR the structure is in (virtio 1.2 §4.1.4).
    VIRTIO_PCI_CAP_BAR: u32 = 4;
    /// virtio_pci_cap.offset: where in the BAR the structure starts (virtio 1.2 §4.1.4).
    VIRTIO_PCI_CAP_OFFSET: u32 = 8;
    /// virtio_pci_cap.length: the structure's length in bytes (virtio 1.2 §4.1.4).
    VIRTIO_PCI_CAP_LENGTH: u32 = 12;
    /// virtio_pci_notify_cap.notify_off_multiplier: a queue's doorbell is at its
    /// queue_notify_off times this (virtio 1.2 §4.1.4.4).
    VIRTIO_PCI_NOTIFY_CAP_MULT: u32 = 16;
    /// device_feature_select: which 32 bits device_feature shows. This and the offsets below
    /// are `struct virtio_pci_common_cfg` (virtio 1.2 §4.1.4.3).
    VIRTIO_PCI_COMMON_DFSELECT: u32 = 0;
    /// device_feature: the 32 offered feature bits device_feature_select picks (read-only).
    VIRTIO_PCI_COMMON_DF: u32 = 4;
    /// driver_feature_select: which 32 bits a driver_feature write sets.
    VIRTIO_PCI_COMMON_GFSELECT: u32 = 8;
    /// driver_feature: the 32 accepted feature bits driver_feature_select picks.
    VIRTIO_PCI_COMMON_GF: u32 = 12;
    /// config_msix_vector (16 bits): the MSI-X vector of configuration change notifications.
    VIRTIO_PCI_COMMON_MSIX: u32 = 16;
    /// num_queues (16 bits): how many queues the device has (read-only).
    VIRTIO_PCI_COMMON_NUMQ: u32 = 18;
    /// device_status (8 bits): the device status (`VIRTIO_STATUS_*`); writing 0 resets it.
    VIRTIO_PCI_COMMON_STATUS: u32 = 20;
    /// config_generation (8 bits): changes whenever the configuration space may have
    /// (read-only, virtio 1.2 §2.5.1).
    VIRTIO_PCI_COMMON_CFGGENERATION: u32 = 21;
    /// queue_select (16 bits): the queue the queue_* fields act on.
    VIRTIO_PCI_COMMON_Q_SELECT: u32 = 22;
    /// queue_size (16 bits): the selected queue's size; reads its maximum until the driver
    /// writes a smaller one.
    VIRTIO_PCI_COMMON_Q_SIZE: u32 = 24;
    /// queue_msix_vector (16 bits): the selected queue's MSI-X vector, or
    /// `VIRTIO_MSI_NO_VECTOR`.
    VIRTIO_PCI_COMMON_Q_MSIX: u32 = 26;
    /// queue_enable (16 bits): the driver writes 1 to enable the selected queue.
    VIRTIO_PCI_COMMON_Q_ENABLE: u32 = 28;
    /// queue_notify_off (16 bits): the selected queue's doorbell, in units of
    /// notify_off_multiplier from the notification area (read-only).
    VIRTIO_PCI_COMMON_Q_NOFF: u32 = 30;
    /// queue_desc (64 bits, as two dwords): the low dword of the selected queue's descriptor
    /// table address.
    VIRTIO_PCI_COMMON_Q_DESCLO: u32 = 32;
    /// queue_desc's high dword.
    VIRTIO_PCI_COMMON_Q_DESCHI: u32 = 36;
    /// queue_driver's low dword: the selected queue's driver area, the available ring.
    VIRTIO_PCI_COMMON_Q_AVAILLO: u32 = 40;
    /// queue_driver's high dword.
    VIRTIO_PCI_COMMON_Q_AVAILHI: u32 = 44;
    /// queue_device's low dword: the selected queue's device area, the used ring.
    VIRTIO_PCI_COMMON_Q_USEDLO: u32 = 48;
    /// queue_device's high dword.
    VIRTIO_PCI_COMMON_Q_USEDHI: u32 = 52;
    /// Size of `struct virtio_pci_common_cfg` through queue_device (virtio 1.2 §4.1.4.3).
    VIRTIO_PCI_COMMON_SIZE: u32 = 56;
    /// exitless's virtio-pci BAR 0 (its own choice; the capabilities point the driver at each
    /// part, virtio 1.2 §4.1.4): the common configuration structure at this offset.
    VIRTIO_PCI_BAR_COMMON: u32 = 0x0000;
    /// BAR 0 offset of the ISR status byte (virtio 1.2 §4.1.4.5).
    VIRTIO_PCI_BAR_ISR: u32 = 0x1000;
    /// BAR 0 offset of the device-specific configuration (virtio 1.2 §4.1.4.6).
    VIRTIO_PCI_BAR_DEVICE: u32 = 0x2000;
    /// BAR 0 offset of the notification area: queue n's doorbell at
    /// `n * VIRTIO_PCI_NOTIFY_MULTIPLIER` (virtio 1.2 §4.1.4.4).
    VIRTIO_PCI_BAR_NOTIFY: u32 = 0x3000;
    /// BAR 0 offset of the MSI-X table, up to 256 vectors (PCI 3.0 §6.8.2).
    VIRTIO_PCI_BAR_MSIX_TABLE: u32 = 0x4000;
    /// BAR 0 offset of the MSI-X pending bit array (PCI 3.0 §6.8.2).
    VIRTIO_PCI_BAR_MSIX_PBA: u32 = 0x5000;
    /// Size of BAR 0, a power of two as a BAR's size must be.
    VIRTIO_PCI_BAR_SIZE: u32 = 0x8000;
    /// The notify_off_multiplier exitless offers: a non-zero one gives every queue its own
    /// doorbell address, so the address alone says which queue was notified (virtio 1.2
    /// §4.1.4.4).
    VIRTIO_PCI_NOTIFY_MULTIPLIER: u32 = 4;
}
