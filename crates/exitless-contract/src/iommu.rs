//! Intel VT-d facts that the VMM's remapping unit and the probe guest's driver both use: the
//! register page, the translation structures in guest memory, the invalidation descriptors and the
//! fault reasons. The guest's build script puts every constant in its `contract.h`. References:
//! Intel Virtualization Technology for Directed I/O, Architecture Specification, rev. 4.x (VT-d):
//! chapter 9 (translation structures), 10 (registers), 6.5 (invalidation), 7 (fault reporting).
//! What the unit offers is the legacy-mode subset that docs/iommu.md describes.

contract_consts! {
    IOMMU_REGS;
    /// Size of the register page (VT-d §10.4).
    VTD_REG_SIZE: u64 = 0x1000;

    /// Version register, 32 bits (§10.4.1).
    VTD_VER_REG: u64 = 0x00;
    /// VER value: architecture version 1.0.
    VTD_VER_VALUE: u32 = 0x10;
    /// Capability register, 64 bits, read-only (§10.4.2).
    VTD_CAP_REG: u64 = 0x08;
    /// Extended capability register, 64 bits, read-only (§10.4.3).
    VTD_ECAP_REG: u64 = 0x10;
    /// Global command register, 32 bits, write-only (§10.4.4).
    VTD_GCMD_REG: u64 = 0x18;
    /// Global status register, 32 bits, read-only (§10.4.5).
    VTD_GSTS_REG: u64 = 0x1c;
    /// Root table address register, 64 bits (§10.4.6): the table's address in 63:12.
    VTD_RTADDR_REG: u64 = 0x20;
    /// Context command register, 64 bits (§10.4.7): register-based context invalidation.
    VTD_CCMD_REG: u64 = 0x28;
    /// Fault status register, 32 bits (§10.4.9).
    VTD_FSTS_REG: u64 = 0x34;
    /// Fault event control register, 32 bits (§10.4.10).
    VTD_FECTL_REG: u64 = 0x38;
    /// Fault event data register, 32 bits (§10.4.11).
    VTD_FEDATA_REG: u64 = 0x3c;
    /// Fault event address register, 32 bits (§10.4.12).
    VTD_FEADDR_REG: u64 = 0x40;
    /// Fault event upper address register, 32 bits (§10.4.13).
    VTD_FEUADDR_REG: u64 = 0x44;
    /// Invalidation queue head register, 64 bits, read-only (§10.4.22).
    VTD_IQH_REG: u64 = 0x80;
    /// Invalidation queue tail register, 64 bits (§10.4.23): a write runs the queue.
    VTD_IQT_REG: u64 = 0x88;
    /// Invalidation queue address register, 64 bits (§10.4.24).
    VTD_IQA_REG: u64 = 0x90;
    /// Invalidation completion status register, 32 bits (§10.4.25).
    VTD_ICS_REG: u64 = 0x9c;
    /// Invalidation event control register, 32 bits (§10.4.26).
    VTD_IECTL_REG: u64 = 0xa0;
    /// Invalidation event data register, 32 bits (§10.4.27).
    VTD_IEDATA_REG: u64 = 0xa4;
    /// Invalidation event address register, 32 bits (§10.4.28).
    VTD_IEADDR_REG: u64 = 0xa8;
    /// Invalidation event upper address register, 32 bits (§10.4.29).
    VTD_IEUADDR_REG: u64 = 0xac;
    /// Invalidate address register, 64 bits (§10.4.8.2); ECAP.IRO points here.
    VTD_IVA_REG: u64 = 0xf0;
    /// IOTLB invalidate register, 64 bits (§10.4.8.1), right after IVA.
    VTD_IOTLB_REG: u64 = 0xf8;
    /// Interrupt remapping table address register, 64 bits (§10.4.29): the table in 63:12,
    /// EIME (11), S (3:0).
    VTD_IRTA_REG: u64 = 0xb8;
    /// Fault recording register 0, 128 bits (§10.4.14); CAP.FRO points here. Low qword: fault
    /// info (the page, 63:12); high qword at +8: source-id, reason, type, F.
    VTD_FRCD_REG: u64 = 0x220;

    /// CAP.ND (2:0) = 6: 16-bit domain IDs.
    VTD_CAP_ND_16BIT: u64 = 6;
    /// CAP.SAGAW (12:8) bit 2: 4-level second-level tables (48-bit AGAW) only.
    VTD_CAP_SAGAW_4LEVEL: u64 = 1 << 10;
    /// CAP.MGAW (21:16): maximum guest address width minus one.
    VTD_CAP_MGAW_SHIFT: u64 = 16;
    /// CAP.FRO (33:24): offset of FRCD0 in 16-byte units.
    VTD_CAP_FRO_SHIFT: u64 = 24;
    /// CAP.SLLPS (37:34) bit 0: second-level 2 MiB pages (a PDE with PS set maps one).
    VTD_CAP_SLLPS_2M: u64 = 1 << 34;
    /// CAP.PSI (39): page-selective IOTLB invalidation is supported.
    VTD_CAP_PSI: u64 = 1 << 39;
    /// CAP.NFR (47:40): number of fault recording registers minus one (0: one register).
    VTD_CAP_NFR_SHIFT: u64 = 40;
    /// CAP.MAMV (53:48): largest address mask of a page-selective invalidation.
    VTD_CAP_MAMV_SHIFT: u64 = 48;
    /// The MAMV offered: 2^18 pages (1 GiB) per page-selective invalidation.
    VTD_MAMV: u64 = 18;
    /// Input address width of a 4-level table (AGAW 48 bits); addresses from 2^48 fault.
    VTD_ADDRESS_WIDTH: u64 = 48;
    /// ECAP.C (0): page-walks are coherent (no CPU cache flushes needed).
    VTD_ECAP_C: u64 = 1;
    /// ECAP.QI (1): queued invalidation is supported.
    VTD_ECAP_QI: u64 = 2;
    /// ECAP.IR (3): interrupt remapping is supported (§5.1).
    VTD_ECAP_IR: u64 = 1 << 3;
    /// ECAP.EIM (4): extended interrupt mode, 32-bit x2APIC destinations in IRTEs.
    VTD_ECAP_EIM: u64 = 1 << 4;
    /// ECAP.IRO (17:8): offset of IVA in 16-byte units.
    VTD_ECAP_IRO_SHIFT: u64 = 8;

    /// GCMD.TE / GSTS.TES (bit 31): translation enable / status.
    VTD_GCMD_TE: u32 = 1 << 31;
    /// GCMD.SRTP / GSTS.RTPS (bit 30): latch RTADDR / root table pointer latched.
    VTD_GCMD_SRTP: u32 = 1 << 30;
    /// GCMD.WBF / GSTS.WBFS (bit 27): write buffer flush (nothing to flush: CAP.RWBF = 0).
    VTD_GCMD_WBF: u32 = 1 << 27;
    /// GCMD.QIE / GSTS.QIES (bit 26): queued invalidation enable / status.
    VTD_GCMD_QIE: u32 = 1 << 26;

    /// GCMD.IRE / GSTS.IRES (bit 25): interrupt remapping enable / status.
    VTD_GCMD_IRE: u32 = 1 << 25;
    /// GCMD.SIRTP / GSTS.IRTPS (bit 24): latch IRTA / interrupt remapping table pointer latched.
    VTD_GCMD_SIRTP: u32 = 1 << 24;
    /// GCMD.CFI / GSTS.CFIS (bit 23): compatibility-format interrupts pass through while
    /// remapping is on (§5.1.4.1).
    VTD_GCMD_CFI: u32 = 1 << 23;

    /// IRTA.EIME (11): extended interrupt mode (x2APIC): IRTE destinations are 32 bits.
    VTD_IRTA_EIME: u64 = 1 << 11;
    /// IRTA.S (3:0): the table has 2^(S + 1) entries.
    VTD_IRTA_S_MASK: u64 = 0xf;
    /// Interrupt remapping table entries are 128 bits (§9.10).
    VTD_IRTE_SIZE: u64 = 16;
    /// IRTE low qword: present (0).
    VTD_IRTE_P: u64 = 1;
    /// IRTE: fault processing disable (1): faults on this entry are not recorded.
    VTD_IRTE_FPD: u64 = 1 << 1;
    /// IRTE: destination mode (2), 1 = logical.
    VTD_IRTE_DM: u64 = 1 << 2;
    /// IRTE: redirection hint (3).
    VTD_IRTE_RH: u64 = 1 << 3;
    /// IRTE: trigger mode (4), 1 = level.
    VTD_IRTE_TM: u64 = 1 << 4;
    /// IRTE: delivery mode (7:5), as MSI data bits 10:8.
    VTD_IRTE_DLM_SHIFT: u64 = 5;
    /// IRTE: IRTE mode (15), 1 = posted (not offered: ECAP.PI = 0, so reserved).
    VTD_IRTE_IM: u64 = 1 << 15;
    /// IRTE: vector (23:16).
    VTD_IRTE_VECTOR_SHIFT: u64 = 16;
    /// IRTE: destination ID (63:32); in xAPIC mode the APIC ID is in 47:40.
    VTD_IRTE_DST_SHIFT: u64 = 32;
    /// IRTE low qword bits that are reserved (14:12, 31:24) or unsupported (IM).
    VTD_IRTE_RESERVED: u64 = 0xff00_f000;
    /// IRTE high qword: source-id (15:0), source-id qualifier (17:16), source validation type
    /// (19:18); bits 63:20 are reserved.
    VTD_IRTE_SQ_SHIFT: u64 = 16;
    /// IRTE high qword: source validation type (19:18).
    VTD_IRTE_SVT_SHIFT: u64 = 18;
    /// SVT 1: verify the requester's source-id against SID under the SQ mask.
    VTD_IRTE_SVT_SID: u64 = 1;
    /// SVT 2: verify that the requester's bus is within SID's bus range (15:8 to 7:0).
    VTD_IRTE_SVT_BUS: u64 = 2;

    /// Remappable-format MSI address (§5.1.2.2): interrupt format (4), 1 = remappable.
    VTD_MSI_REMAPPABLE: u64 = 1 << 4;
    /// Remappable MSI address: subhandle valid (3): data bits 15:0 are added to the handle.
    VTD_MSI_SHV: u64 = 1 << 3;
    /// Remappable MSI address: handle bits 14:0 in address bits 19:5.
    VTD_MSI_HANDLE_SHIFT: u64 = 5;
    /// Remappable MSI address: handle bit 15 in address bit 2.
    VTD_MSI_HANDLE_15: u64 = 1 << 2;

    /// CCMD.ICC (63): set to invalidate; reads 0 once done.
    VTD_CCMD_ICC: u64 = 1 << 63;
    /// CCMD.CIRG (62:61): requested granularity (`VTD_GRAN_*`).
    VTD_CCMD_CIRG_SHIFT: u64 = 61;
    /// CCMD.CAIG (60:59): granularity actually performed.
    VTD_CCMD_CAIG_SHIFT: u64 = 59;
    /// CCMD.FM (33:32): function mask of a device-selective invalidation.
    VTD_CCMD_FM_SHIFT: u64 = 32;
    /// CCMD.SID (31:16): source-id of a device-selective invalidation.
    VTD_CCMD_SID_SHIFT: u64 = 16;
    /// Invalidation granularity: global (CCMD, IOTLB register and descriptors).
    VTD_GRAN_GLOBAL: u64 = 1;
    /// Invalidation granularity: one domain.
    VTD_GRAN_DOMAIN: u64 = 2;
    /// Context-cache granularity: one device (source-id under a function mask).
    VTD_GRAN_DEVICE: u64 = 3;
    /// IOTLB granularity: pages of one domain (address and address mask).
    VTD_GRAN_PAGE: u64 = 3;

    /// FSTS.PFO (0): a fault arrived while FRCD0 was full (RW1C).
    VTD_FSTS_PFO: u32 = 1;
    /// FSTS.PPF (1): a fault is recorded (FRCD0.F set; read-only).
    VTD_FSTS_PPF: u32 = 2;
    /// FSTS.IQE (4): invalidation queue error; the queue stopped at IQH (RW1C).
    VTD_FSTS_IQE: u32 = 0x10;
    /// FSTS.FRI (15:8): index of the first pending fault record (always 0 here).
    VTD_FSTS_FRI_SHIFT: u32 = 8;
    /// FECTL/IECTL.IM (31): the event interrupt is masked (set at reset).
    VTD_EVENT_IM: u32 = 1 << 31;
    /// FECTL/IECTL.IP (30): an event came while masked; sent at unmask (read-only).
    VTD_EVENT_IP: u32 = 1 << 30;

    /// IQH/IQT: the descriptor offset is in bits 18:4.
    VTD_IQ_OFFSET_MASK: u64 = 0x7_fff0;
    /// IQA.QS (2:0): the queue has 2^(QS + 8) descriptors (2^QS pages).
    VTD_IQA_QS_MASK: u64 = 7;
    /// IQA.DW (11): 256-bit descriptors (scalable mode only; an error here).
    VTD_IQA_DW: u64 = 1 << 11;
    /// ICS.IWC (0): a wait descriptor with IF completed (RW1C).
    VTD_ICS_IWC: u32 = 1;

    /// IOTLB.IVT (63): set to invalidate; reads 0 once done.
    VTD_IOTLB_IVT: u64 = 1 << 63;
    /// IOTLB.IIRG (61:60): requested granularity (`VTD_GRAN_*`).
    VTD_IOTLB_IIRG_SHIFT: u64 = 60;
    /// IOTLB.IAIG (58:57): granularity actually performed.
    VTD_IOTLB_IAIG_SHIFT: u64 = 57;
    /// IOTLB.DID (47:32): domain of a domain- or page-selective invalidation.
    VTD_IOTLB_DID_SHIFT: u64 = 32;
    /// IVA.AM (5:0): address mask: 2^AM pages from the address (aligned to it).
    VTD_IVA_AM_MASK: u64 = 0x3f;
    /// IVA.IH (6), the same bit in an IOTLB descriptor's high qword: the invalidation hint,
    /// set when only last-level entries changed, so the paging-structure caches may stay
    /// (§6.5.1.2, §6.5.2.3).
    VTD_IVA_IH: u64 = 1 << 6;

    /// FRCD high qword: F (63), the record holds a fault (RW1C).
    VTD_FRCD_F: u64 = 1 << 63;
    /// FRCD high qword: T (62), 0 for a write request, 1 for a read.
    VTD_FRCD_T: u64 = 1 << 62;
    /// FRCD high qword: fault reason (39:32, `VTD_FR_*`).
    VTD_FRCD_FR_SHIFT: u64 = 32;

    /// Root entry (§9.1, 16 bytes per bus): present (0); context table in 63:12.
    VTD_ROOT_P: u64 = 1;
    /// Context entry (§9.3, 16 bytes per devfn), low qword: present (0).
    VTD_CTX_P: u64 = 1;
    /// Context entry low qword: translation type (3:2); 0 = through the page table, the
    /// only one offered; second-level page table in 63:12.
    VTD_CTX_TT_MASK: u64 = 0xc;
    /// Context entry high qword: address width (2:0); 2 = 4-level, the only one offered.
    VTD_CTX_AW_4LEVEL: u64 = 2;
    /// Context entry high qword: domain ID (23:8).
    VTD_CTX_DID_SHIFT: u64 = 8;
    /// Second-level paging entry (§9.8): read (0).
    VTD_PTE_R: u64 = 1;
    /// Second-level paging entry: write (1).
    VTD_PTE_W: u64 = 2;
    /// Second-level paging entry: page size (7): in a PDE, a 2 MiB page (CAP.SLLPS bit 0);
    /// reserved in a PDPTE or PML4E (no 1 GiB pages).
    VTD_PTE_PS: u64 = 0x80;
    /// Second-level paging entry: address of the next table or the page (51:12).
    VTD_PTE_ADDR_MASK: u64 = 0x000f_ffff_ffff_f000;

    /// Invalidation descriptors are 128 bits (§6.5.2).
    VTD_QI_DESC_SIZE: u64 = 16;
    /// Descriptor type (3:0): context-cache invalidate (§6.5.2.1).
    VTD_QI_CC_TYPE: u64 = 1;
    /// Descriptor type: IOTLB invalidate (§6.5.2.3).
    VTD_QI_IOTLB_TYPE: u64 = 2;
    /// Descriptor type: interrupt entry cache invalidate (§6.5.2.7).
    VTD_QI_IEC_TYPE: u64 = 4;
    /// Interrupt entry cache descriptor: granularity (4), 1 = index-selective, 0 = global.
    VTD_QI_IEC_INDEXED: u64 = 1 << 4;
    /// Interrupt entry cache descriptor: index mask (31:27), 2^IM entries from the index.
    VTD_QI_IEC_IM_SHIFT: u64 = 27;
    /// Interrupt entry cache descriptor: interrupt index (47:32).
    VTD_QI_IEC_IIDX_SHIFT: u64 = 32;
    /// Descriptor type: invalidation wait (§6.5.2.8).
    VTD_QI_WAIT_TYPE: u64 = 5;
    /// Context-cache and IOTLB descriptors: granularity (5:4, `VTD_GRAN_*`).
    VTD_QI_GRAN_SHIFT: u64 = 4;
    /// Context-cache and IOTLB descriptors: domain ID (31:16).
    VTD_QI_DID_SHIFT: u64 = 16;
    /// Context-cache descriptor: source-id (47:32).
    VTD_QI_CC_SID_SHIFT: u64 = 32;
    /// Context-cache descriptor: function mask (49:48).
    VTD_QI_CC_FM_SHIFT: u64 = 48;
    /// IOTLB descriptor, high qword: address mask (5:0); the address is in 63:12.
    VTD_QI_IOTLB_AM_MASK: u64 = 0x3f;
    /// Wait descriptor: interrupt flag (4): set ICS.IWC, invalidation event.
    VTD_QI_WAIT_IF: u64 = 1 << 4;
    /// Wait descriptor: status write (5): write the status data to the status address.
    VTD_QI_WAIT_SW: u64 = 1 << 5;
    /// Wait descriptor: status data (63:32); the high qword is the status address (63:2).
    VTD_QI_WAIT_DATA_SHIFT: u64 = 32;

    /// Fault reason (§7.1.3, names as Linux's dmar.c): root entry not present.
    VTD_FR_ROOT_NOT_PRESENT: u8 = 1;
    /// Fault reason: context entry not present.
    VTD_FR_CONTEXT_NOT_PRESENT: u8 = 2;
    /// Fault reason: invalid context entry (translation type or address width not offered).
    VTD_FR_CONTEXT_INVALID: u8 = 3;
    /// Fault reason: address beyond the address width (2^48).
    VTD_FR_ADDRESS_WIDTH: u8 = 4;
    /// Fault reason: write to a page without W (or not present).
    VTD_FR_WRITE: u8 = 5;
    /// Fault reason: read from a page without R (or not present).
    VTD_FR_READ: u8 = 6;
    /// Fault reason: a paging entry points outside guest RAM.
    VTD_FR_PTE: u8 = 7;
    /// Fault reason: the root table is outside guest RAM.
    VTD_FR_ROOT_TABLE: u8 = 8;
    /// Fault reason: a context table is outside guest RAM.
    VTD_FR_CONTEXT_TABLE: u8 = 9;
    /// Fault reason: a reserved bit is set in a paging entry (PS: no superpages).
    VTD_FR_PTE_RESERVED: u8 = 0xc;
    /// Interrupt fault reason (§7.1.3, FRCD holds the interrupt index in 63:48): reserved
    /// fields set in a remappable-format request.
    VTD_FR_IR_REQUEST_RESERVED: u8 = 0x20;
    /// Interrupt fault reason: the interrupt index is beyond the table (IRTA.S).
    VTD_FR_IR_INDEX: u8 = 0x21;
    /// Interrupt fault reason: the IRTE is not present.
    VTD_FR_IR_NOT_PRESENT: u8 = 0x22;
    /// Interrupt fault reason: the IRTE could not be read (outside guest RAM).
    VTD_FR_IR_TABLE: u8 = 0x23;
    /// Interrupt fault reason: reserved fields set in a present IRTE.
    VTD_FR_IR_ENTRY_RESERVED: u8 = 0x24;
    /// Interrupt fault reason: a compatibility-format interrupt blocked (IRE set, CFI clear).
    VTD_FR_IR_COMPATIBILITY: u8 = 0x25;
    /// Interrupt fault reason: source-id validation failed (SVT, SQ, SID).
    VTD_FR_IR_SOURCE: u8 = 0x26;
    /// FRCD low qword for an interrupt fault: the interrupt index in 63:48.
    VTD_FRCD_IR_INDEX_SHIFT: u64 = 48;
}
