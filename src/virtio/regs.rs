// Virtio facts that the VMM's transports and the probe guest's drivers both use. `build.rs`
// `include!`s this file and puts every constant in the guest's `contract.h`, so a register
// offset is written down once. The standard values are checked against virtio-bindings by the
// tests of `src/virtio/mod.rs`. References: Virtual I/O Device (VIRTIO) Version 1.2 (virtio
// 1.2); the MMIO MSI / notify extension is ours, specified in docs/virtio-mmio-msi.md.

contract_consts! {
    VIRTIO_REGS;
    /// Device status: the guest noticed the device (virtio 1.2 §2.1).
    VIRTIO_STATUS_ACKNOWLEDGE: u32 = 1;
    /// Device status: the guest has a driver for it.
    VIRTIO_STATUS_DRIVER: u32 = 2;
    /// Device status: the driver is ready to drive the device.
    VIRTIO_STATUS_DRIVER_OK: u32 = 4;
    /// Device status: feature negotiation is complete.
    VIRTIO_STATUS_FEATURES_OK: u32 = 8;
    /// Device status: the device hit an error it cannot recover from without a reset.
    VIRTIO_STATUS_DEVICE_NEEDS_RESET: u32 = 0x40;
    /// Device status: the driver gave up on the device.
    VIRTIO_STATUS_FAILED: u32 = 0x80;
    /// Feature bit: used_event / avail_event notification suppression (virtio 1.2 §2.7.10).
    VIRTIO_F_EVENT_IDX: u32 = 29;
    /// Feature bit: a virtio 1.x (non-legacy) device.
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
    /// "No vector" in the queue → vector and config → vector registers (virtio 1.2 §4.1.5.1.2).
    VIRTIO_MSI_NO_VECTOR: u16 = 0xffff;
    /// Descriptor flag: the chain continues at `next` (virtio 1.2 §2.7.5).
    VIRTQ_DESC_F_NEXT: u32 = 1;
    /// Descriptor flag: the buffer is device-writable.
    VIRTQ_DESC_F_WRITE: u32 = 2;
    /// Size of `struct virtio_net_hdr` with VIRTIO_F_VERSION_1 (virtio 1.2 §5.1.6).
    VIRTIO_NET_HDR_SIZE: u32 = 12;
    /// virtio-net feature bit: the device has a MAC address in its config space (virtio 1.2
    /// §5.1.3), the first 6 bytes of `struct virtio_net_config`.
    VIRTIO_NET_F_MAC: u32 = 5;
    /// virtio-net receive queue index.
    VIRTIO_NET_RX_QUEUE: u32 = 0;
    /// virtio-net transmit queue index.
    VIRTIO_NET_TX_QUEUE: u32 = 1;

    /// virtio-mmio MagicValue: "virt" (virtio 1.2 §4.2.2).
    VIRTIO_MMIO_MAGIC: u32 = 0x7472_6976;
    /// virtio-mmio register offsets (virtio 1.2 §4.2.2, table "MMIO Device Register Layout").
    VIRTIO_MMIO_MAGIC_VALUE: u32 = 0x000;
    /// Version register: 2 for a virtio 1.x device.
    VIRTIO_MMIO_VERSION: u32 = 0x004;
    /// DeviceID.
    VIRTIO_MMIO_DEVICE_ID: u32 = 0x008;
    /// VendorID.
    VIRTIO_MMIO_VENDOR_ID: u32 = 0x00c;
    /// DeviceFeatures (32 bits selected by DeviceFeaturesSel).
    VIRTIO_MMIO_DEVICE_FEATURES: u32 = 0x010;
    /// DeviceFeaturesSel.
    VIRTIO_MMIO_DEVICE_FEATURES_SEL: u32 = 0x014;
    /// DriverFeatures.
    VIRTIO_MMIO_DRIVER_FEATURES: u32 = 0x020;
    /// DriverFeaturesSel.
    VIRTIO_MMIO_DRIVER_FEATURES_SEL: u32 = 0x024;
    /// QueueSel.
    VIRTIO_MMIO_QUEUE_SEL: u32 = 0x030;
    /// QueueNumMax.
    VIRTIO_MMIO_QUEUE_NUM_MAX: u32 = 0x034;
    /// QueueNum.
    VIRTIO_MMIO_QUEUE_NUM: u32 = 0x038;
    /// QueueReady.
    VIRTIO_MMIO_QUEUE_READY: u32 = 0x044;
    /// QueueNotify: the queue index written is the queue notified.
    VIRTIO_MMIO_QUEUE_NOTIFY: u32 = 0x050;
    /// InterruptStatus.
    VIRTIO_MMIO_INTERRUPT_STATUS: u32 = 0x060;
    /// InterruptACK.
    VIRTIO_MMIO_INTERRUPT_ACK: u32 = 0x064;
    /// Status.
    VIRTIO_MMIO_STATUS: u32 = 0x070;
    /// QueueDescLow.
    VIRTIO_MMIO_QUEUE_DESC_LOW: u32 = 0x080;
    /// QueueDescHigh.
    VIRTIO_MMIO_QUEUE_DESC_HIGH: u32 = 0x084;
    /// QueueDriverLow (the available ring).
    VIRTIO_MMIO_QUEUE_AVAIL_LOW: u32 = 0x090;
    /// QueueDriverHigh.
    VIRTIO_MMIO_QUEUE_AVAIL_HIGH: u32 = 0x094;
    /// QueueDeviceLow (the used ring).
    VIRTIO_MMIO_QUEUE_USED_LOW: u32 = 0x0a0;
    /// QueueDeviceHigh.
    VIRTIO_MMIO_QUEUE_USED_HIGH: u32 = 0x0a4;
    /// ConfigGeneration.
    VIRTIO_MMIO_CONFIG_GENERATION: u32 = 0x0fc;
    /// Device-specific configuration starts here.
    VIRTIO_MMIO_CONFIG: u32 = 0x100;
    /// InterruptStatus bit: a used buffer notification.
    VIRTIO_MMIO_INT_VRING: u32 = 1;
    /// InterruptStatus bit: a configuration change notification.
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
    /// cfg_type: notifications.
    VIRTIO_PCI_CAP_NOTIFY_CFG: u32 = 2;
    /// cfg_type: ISR status.
    VIRTIO_PCI_CAP_ISR_CFG: u32 = 3;
    /// cfg_type: device-specific configuration.
    VIRTIO_PCI_CAP_DEVICE_CFG: u32 = 4;
    /// cfg_type: PCI configuration access, a window into the BARs (virtio 1.2 §4.1.4.9).
    VIRTIO_PCI_CAP_PCI_CFG: u32 = 5;
    /// virtio_pci_cfg_cap.pci_cfg_data, from the capability ID byte (virtio 1.2 §4.1.4.9).
    VIRTIO_PCI_CAP_PCI_CFG_DATA: u32 = 16;
    /// Non-transitional devices have a PCI Subsystem ID of at least this (virtio 1.2
    /// §4.1.2.1); ours is this plus the virtio device ID.
    VIRTIO_PCI_SUBSYSTEM_ID_BASE: u32 = 0x40;
    /// Offsets inside a virtio_pci_cap, from the capability ID byte.
    VIRTIO_PCI_CAP_CFG_TYPE: u32 = 3;
    /// virtio_pci_cap.bar.
    VIRTIO_PCI_CAP_BAR: u32 = 4;
    /// virtio_pci_cap.offset.
    VIRTIO_PCI_CAP_OFFSET: u32 = 8;
    /// virtio_pci_cap.length.
    VIRTIO_PCI_CAP_LENGTH: u32 = 12;
    /// virtio_pci_notify_cap.notify_off_multiplier.
    VIRTIO_PCI_NOTIFY_CAP_MULT: u32 = 16;
    /// Common configuration structure offsets (virtio 1.2 §4.1.4.3).
    VIRTIO_PCI_COMMON_DFSELECT: u32 = 0;
    /// device_feature.
    VIRTIO_PCI_COMMON_DF: u32 = 4;
    /// driver_feature_select.
    VIRTIO_PCI_COMMON_GFSELECT: u32 = 8;
    /// driver_feature.
    VIRTIO_PCI_COMMON_GF: u32 = 12;
    /// config_msix_vector (16 bits).
    VIRTIO_PCI_COMMON_MSIX: u32 = 16;
    /// num_queues (16 bits).
    VIRTIO_PCI_COMMON_NUMQ: u32 = 18;
    /// device_status (8 bits).
    VIRTIO_PCI_COMMON_STATUS: u32 = 20;
    /// config_generation (8 bits).
    VIRTIO_PCI_COMMON_CFGGENERATION: u32 = 21;
    /// queue_select (16 bits).
    VIRTIO_PCI_COMMON_Q_SELECT: u32 = 22;
    /// queue_size (16 bits).
    VIRTIO_PCI_COMMON_Q_SIZE: u32 = 24;
    /// queue_msix_vector (16 bits).
    VIRTIO_PCI_COMMON_Q_MSIX: u32 = 26;
    /// queue_enable (16 bits).
    VIRTIO_PCI_COMMON_Q_ENABLE: u32 = 28;
    /// queue_notify_off (16 bits).
    VIRTIO_PCI_COMMON_Q_NOFF: u32 = 30;
    /// queue_desc (64 bits, as two dwords).
    VIRTIO_PCI_COMMON_Q_DESCLO: u32 = 32;
    /// queue_desc high dword.
    VIRTIO_PCI_COMMON_Q_DESCHI: u32 = 36;
    /// queue_driver (the available ring).
    VIRTIO_PCI_COMMON_Q_AVAILLO: u32 = 40;
    /// queue_driver high dword.
    VIRTIO_PCI_COMMON_Q_AVAILHI: u32 = 44;
    /// queue_device (the used ring).
    VIRTIO_PCI_COMMON_Q_USEDLO: u32 = 48;
    /// queue_device high dword.
    VIRTIO_PCI_COMMON_Q_USEDHI: u32 = 52;
    /// Size of the common configuration structure.
    VIRTIO_PCI_COMMON_SIZE: u32 = 56;
    /// Layout of exitless's virtio-pci BAR 0: common configuration here.
    VIRTIO_PCI_BAR_COMMON: u32 = 0x0000;
    /// ISR status byte.
    VIRTIO_PCI_BAR_ISR: u32 = 0x1000;
    /// Device-specific configuration.
    VIRTIO_PCI_BAR_DEVICE: u32 = 0x2000;
    /// Notification area: queue n at `n * VIRTIO_PCI_NOTIFY_MULTIPLIER`.
    VIRTIO_PCI_BAR_NOTIFY: u32 = 0x3000;
    /// MSI-X table (up to 256 vectors).
    VIRTIO_PCI_BAR_MSIX_TABLE: u32 = 0x4000;
    /// MSI-X pending bit array.
    VIRTIO_PCI_BAR_MSIX_PBA: u32 = 0x5000;
    /// BAR 0 size.
    VIRTIO_PCI_BAR_SIZE: u32 = 0x8000;
    /// notify_off_multiplier: every queue has its own doorbell address.
    VIRTIO_PCI_NOTIFY_MULTIPLIER: u32 = 4;
}
