//! PCI configuration-space facts that the VMM's PCI model and the probe guest's driver both use.
//! The guest's build script puts every constant in its `contract.h` ([`crate::header`]), so a
//! register offset is written down once. References: PCI Local Bus Specification 3.0 (PCI 3.0), PCI
//! Express Base Specification 4.0 (PCIe 4.0).

contract_consts! {
    PCI_REGS;
    /// CONFIG_ADDRESS port of configuration mechanism #1 (PCI 3.0 §3.2.2.3.2).
    PCI_CONFIG_ADDRESS_PORT: u16 = 0xcf8;
    /// CONFIG_DATA ports 0xCFC..=0xCFF of configuration mechanism #1 (PCI 3.0 §3.2.2.3.2).
    PCI_CONFIG_DATA_PORT: u16 = 0xcfc;
    /// CONFIG_ADDRESS bit 31: the access is a configuration cycle.
    PCI_CONFIG_ADDRESS_ENABLE: u32 = 0x8000_0000;
    /// Size of the configuration space reachable by mechanism #1 (PCI 3.0 §6.1).
    PCI_CFG_SPACE_SIZE: u16 = 0x100;
    /// Size of a function's configuration space reachable through ECAM (PCIe 4.0 §7.2.2).
    PCI_CFG_SPACE_EXP_SIZE: u16 = 0x1000;
    /// ECAM address bits 27:20 hold the bus number (PCIe 4.0 §7.2.2, table 7-1).
    ECAM_BUS_SHIFT: u32 = 20;
    /// ECAM address bits 19:15 hold the device number.
    ECAM_DEVICE_SHIFT: u32 = 15;
    /// ECAM address bits 14:12 hold the function number.
    ECAM_FUNCTION_SHIFT: u32 = 12;
    /// Vendor ID register (PCI 3.0 §6.2.1); 0xFFFF reads mean "no function here".
    PCI_VENDOR_ID: u16 = 0x00;
    /// Device ID register.
    PCI_DEVICE_ID: u16 = 0x02;
    /// Command register (PCI 3.0 §6.2.2).
    PCI_COMMAND: u16 = 0x04;
    /// Status register (PCI 3.0 §6.2.3).
    PCI_STATUS: u16 = 0x06;
    /// Revision ID (byte 0) and class code (bytes 1..=3).
    PCI_CLASS_REVISION: u16 = 0x08;
    /// Header type register; bit 7 marks a multi-function device (PCI 3.0 §6.2.1).
    PCI_HEADER_TYPE: u16 = 0x0e;
    /// First Base Address Register of a type-0 header (PCI 3.0 §6.2.5.1).
    PCI_BAR0: u16 = 0x10;
    /// Number of BARs in a type-0 header.
    PCI_BAR_COUNT: usize = 6;
    /// Subsystem vendor ID register (PCI 3.0 §6.2.4).
    PCI_SUBSYSTEM_VENDOR_ID: u16 = 0x2c;
    /// Subsystem ID register (PCI 3.0 §6.2.4).
    PCI_SUBSYSTEM_ID: u16 = 0x2e;
    /// Capabilities pointer (PCI 3.0 §6.7).
    PCI_CAPABILITY_LIST: u16 = 0x34;
    /// Interrupt line register.
    PCI_INTERRUPT_LINE: u16 = 0x3c;
    /// Command bit 0: respond to I/O space accesses.
    PCI_COMMAND_IO: u16 = 0x1;
    /// Command bit 1: respond to memory space accesses.
    PCI_COMMAND_MEMORY: u16 = 0x2;
    /// Command bit 2: Bus Master Enable; while clear the function may not issue memory
    /// requests, so no DMA and no MSI/MSI-X messages (PCI 3.0 §6.2.2).
    PCI_COMMAND_MASTER: u16 = 0x4;
    /// Status bit 4: the capabilities pointer is valid.
    PCI_STATUS_CAP_LIST: u16 = 0x10;
    /// Status bit 11: Signaled Target Abort (RW1C).
    PCI_STATUS_SIG_TARGET_ABORT: u16 = 0x800;
    /// Header type bit 7: the device has more than one function.
    PCI_HEADER_TYPE_MULTIFUNCTION: u8 = 0x80;
    /// Header type bits 6:0 for an endpoint (type 0) header.
    PCI_HEADER_TYPE_NORMAL: u8 = 0x00;
    /// BAR bit 0: the BAR decodes I/O space.
    PCI_BAR_SPACE_IO: u32 = 0x1;
    /// Memory BAR bits 2:1 = 0b10: the BAR is 64 bits wide and spans two slots.
    PCI_BAR_MEM_TYPE_64: u32 = 0x4;
    /// Memory BAR bit 3: prefetchable.
    PCI_BAR_MEM_PREFETCH: u32 = 0x8;
    /// Extended capabilities start here (PCIe 4.0 §7.6).
    PCI_EXT_CAP_START: u16 = 0x100;
    /// Capability ID: power management (PCI PM 1.2 §3.2).
    PCI_CAP_ID_PM: u8 = 0x01;
    /// Capability ID: MSI (PCI 3.0 §6.8.1).
    PCI_CAP_ID_MSI: u8 = 0x05;
    /// Capability ID: PCI Express (PCIe 4.0 §7.5.3).
    PCI_CAP_ID_EXP: u8 = 0x10;
    /// PCI Express Capabilities bits 3:0: capability version 2 (PCIe 4.0 §7.5.3.2).
    PCI_EXP_FLAGS_VERSION_2: u16 = 0x2;
    /// PCI Express Capabilities bits 7:4: device/port type 0, a PCI Express Endpoint.
    PCI_EXP_TYPE_ENDPOINT: u16 = 0x0;
    /// Length of a version-2 PCI Express capability, header included (PCIe 4.0 §7.5.3).
    PCI_EXP_CAP_V2_SIZE: u16 = 0x3c;
    /// Capability ID: vendor specific (PCI 3.0 appendix H).
    PCI_CAP_ID_VNDR: u8 = 0x09;
    /// Capability ID: MSI-X (PCI 3.0 §6.8.2).
    PCI_CAP_ID_MSIX: u8 = 0x11;
    /// MSI-X capability: Message Control, from the capability ID byte (PCI 3.0 §6.8.2.3).
    PCI_MSIX_FLAGS: u16 = 2;
    /// MSI-X capability: Table Offset/BIR.
    PCI_MSIX_TABLE: u16 = 4;
    /// MSI-X capability: PBA Offset/BIR.
    PCI_MSIX_PBA: u16 = 8;
    /// Message Control bits 10:0: table size minus one.
    PCI_MSIX_FLAGS_QSIZE: u16 = 0x7ff;
    /// Message Control bit 15: MSI-X enable.
    PCI_MSIX_FLAGS_ENABLE: u16 = 0x8000;
    /// Message Control bit 14: function mask.
    PCI_MSIX_FLAGS_MASKALL: u16 = 0x4000;
    /// Size of one MSI-X table entry (PCI 3.0 §6.8.2.6).
    PCI_MSIX_ENTRY_SIZE: u32 = 16;
    /// Entry offset: message address, bits 31:0.
    PCI_MSIX_ENTRY_LOWER_ADDR: u32 = 0;
    /// Entry offset: message upper address.
    PCI_MSIX_ENTRY_UPPER_ADDR: u32 = 4;
    /// Entry offset: message data.
    PCI_MSIX_ENTRY_DATA: u32 = 8;
    /// Entry offset: vector control; bit 0 masks the vector.
    PCI_MSIX_ENTRY_VECTOR_CTRL: u32 = 12;
    /// Vector control bit 0: masked (set at reset).
    PCI_MSIX_ENTRY_CTRL_MASKBIT: u32 = 1;
    /// Table/PBA Offset/BIR bits 2:0: the BAR.
    PCI_MSIX_BIR_MASK: u32 = 0x7;
}
