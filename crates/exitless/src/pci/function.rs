//! PCI functions: what a device model adds to its configuration space. The function knows
//! nothing of buses or exits; the root calls it after guest config writes and for accesses that
//! land in its BARs.

use std::ops::Range;

use crate::pci::config::{Capability, ConfigSpace, ExtCapability, FunctionLayout};
use crate::pci::regs::{
    PCI_CAP_ID_EXP, PCI_CAP_ID_MSI, PCI_CAP_ID_PM, PCI_CAP_ID_VNDR, PCI_EXP_CAP_V2_SIZE,
    PCI_EXP_FLAGS_VERSION_2, PCI_EXP_TYPE_ENDPOINT, PCI_STATUS, PCI_STATUS_SIG_TARGET_ABORT,
};
use crate::persist::{StateError, from_state, to_state};

/// Vendor ID used by exitless's own functions. It is not a PCI-SIG assignment; guests other
/// than the probe should not bind drivers to it.
pub const EXITLESS_VENDOR_ID: u16 = 0x7e57;

/// Behaviour of one PCI function beyond plain configuration registers.
pub trait PciFunction: Send {
    /// The root placed the function: its BARs are assigned and decoding is enabled.
    fn attached(&mut self, _config: &ConfigSpace) {}
    /// The guest changed `len` bytes of configuration space at `offset` (after masking).
    fn config_written(&mut self, _config: &ConfigSpace, _offset: u16, _len: usize) {}
    /// Configuration bytes whose value the function produces when the guest reads them now (a
    /// read with side effects, such as virtio's `pci_cfg_data` while its window is set up),
    /// asked after [`PciFunction::attached`] and after every configuration write. Reads of
    /// other bytes never reach the function; while there are any, the function's reads do
    /// not go through the ECAM shadow.
    fn read_hooked(&self) -> Option<Range<u16>> {
        None
    }
    /// A guest read of `len` bytes at `offset` touches the read-hooked bytes: put their value
    /// in `config` now; the read returns what is there afterwards.
    fn config_read(&mut self, _config: &ConfigSpace, _offset: u16, _len: usize) {}
    /// BAR slot `bar` now decodes at `at` on the bus, or no longer decodes (`None`: decoding
    /// off, or the range was refused for a conflict): what the guest's accesses really reach,
    /// for anything the function registers by address (ioeventfds).
    fn bar_decoded(&mut self, _config: &ConfigSpace, _bar: usize, _at: Option<u64>) {}
    /// A guest read `data.len()` bytes at `offset` of BAR slot `bar`.
    fn bar_read(&mut self, _config: &ConfigSpace, _bar: usize, _offset: u64, data: &mut [u8]) {
        data.fill(0xff);
    }
    /// A guest wrote `data` at `offset` of BAR slot `bar`.
    fn bar_write(&mut self, _config: &ConfigSpace, _bar: usize, _offset: u64, _data: &[u8]) {}
    /// A snapshot is about to be taken (`crate::persist::Persist::pause`): finish the work in
    /// flight and stop touching guest memory and raising interrupts until
    /// [`PciFunction::resume`]. A function without threads has nothing to stop.
    fn pause(&mut self) -> Result<(), StateError> {
        Ok(())
    }
    /// Its state beyond configuration space, for a snapshot; None when it has none.
    fn save(&self) -> Result<Option<serde_json::Value>, StateError> {
        Ok(None)
    }
    /// Take `state`, which [`PciFunction::save`] wrote, into this freshly built function whose
    /// configuration space `config` is restored already; errors name `what`'s fields.
    fn restore(
        &mut self,
        what: &str,
        _config: &ConfigSpace,
        state: Option<serde_json::Value>,
    ) -> Result<(), StateError> {
        match state {
            None => Ok(()),
            Some(_) => Err(StateError::new(what, "state for a function that has none")),
        }
    }
    /// Work again after [`PciFunction::pause`] or [`PciFunction::restore`].
    fn resume(&mut self) {}
}

/// The host bridge at 00:00.0 (class 06/00): configuration registers only.
pub struct HostBridge;

impl HostBridge {
    /// Its configuration layout.
    pub fn layout() -> FunctionLayout {
        FunctionLayout {
            vendor_id: EXITLESS_VENDOR_ID,
            device_id: 0x0000,
            class_code: 0x06_00_00,
            ..Default::default()
        }
    }
}

impl PciFunction for HostBridge {}

/// Registers of [`TestDevice`] BAR 0.
pub mod test_regs {
    /// Read/write scratch dword.
    pub const SCRATCH: u64 = 0x0;
    /// Write: the device sets Status.Signaled Target Abort, as if it had aborted a request.
    pub const RAISE_TARGET_ABORT: u64 = 0x4;
    /// Write: the device stores the value in its vendor capability's data dword.
    pub const SET_CAP_DATA: u64 = 0x8;
}

/// Offset of the [`TestDevice`] vendor capability's data dword (first capability, at 0x40,
/// after its 4-byte header).
pub const TEST_CAP_DATA: u16 = 0x44;

/// A minimal PCI Express capability (PCIe 4.0 §7.5.3): version 2, an Endpoint, every other
/// register zero (no optional feature, link or slot) and read-only. It is what makes the
/// extended configuration space valid to look at.
pub fn pcie_endpoint_capability() -> Capability {
    let mut body = vec![0; usize::from(PCI_EXP_CAP_V2_SIZE) - 2];
    let flags = PCI_EXP_FLAGS_VERSION_2 | (PCI_EXP_TYPE_ENDPOINT << 4);
    body[..2].copy_from_slice(&flags.to_le_bytes());
    Capability {
        id: PCI_CAP_ID_EXP,
        body,
        body_wmask: vec![],
    }
}

/// A simple endpoint whose BAR 0 lets the guest make the *device* change its own configuration
/// space, so shadow coherence for device-side updates can be tested; BARs of every kind, a
/// vendor, power-management, MSI and PCI Express capability, and an extended capability.
#[derive(Default)]
pub struct TestDevice {
    scratch: u32,
}

impl TestDevice {
    /// Configuration layout for device ID `device_id`.
    pub fn layout(device_id: u16) -> FunctionLayout {
        use crate::pci::config::Bar;
        FunctionLayout {
            vendor_id: EXITLESS_VENDOR_ID,
            device_id,
            class_code: 0xff_00_00, // "device does not fit any defined class"
            revision: 1,
            subsystem_vendor_id: EXITLESS_VENDOR_ID,
            subsystem_id: device_id,
            bars: vec![
                Bar::Memory32 {
                    size: 0x1000,
                    prefetchable: false,
                },
                Bar::Io { size: 0x20 },
                Bar::Memory64 {
                    size: 0x10_0000,
                    prefetchable: true,
                },
            ],
            capabilities: vec![
                // Vendor-specific (PCI 3.0 §H): length byte, pad, one device-written dword.
                Capability {
                    id: PCI_CAP_ID_VNDR,
                    body: vec![8, 0, 0, 0, 0, 0],
                    body_wmask: vec![],
                },
                // Power management (PCI PM 1.2 §3.2): PMC (version 3, D1 and D2 supported, so every
                // PowerState value is valid), then PMCSR with PowerState RW.
                Capability {
                    id: PCI_CAP_ID_PM,
                    body: vec![0x03, 0x06, 0, 0, 0, 0],
                    body_wmask: vec![0, 0, 0x03],
                },
                // MSI, 64-bit capable (PCI 3.0 §6.8.1): enable RW, address and data RW.
                Capability {
                    id: PCI_CAP_ID_MSI,
                    body: vec![0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                    body_wmask: vec![
                        0x71, 0, 0xfc, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                    ],
                },
                pcie_endpoint_capability(),
            ],
            ext_capabilities: vec![ExtCapability {
                id: 0x000b, // vendor-specific extended capability (PCIe 4.0 §7.9.5)
                version: 1,
                // VSEC ID 1, revision 1, length 0x00C (PCIe 4.0 §7.9.5.2), then a RW dword.
                body: vec![0x01, 0x00, 0xc1, 0x00, 0, 0, 0, 0],
                body_wmask: vec![0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff],
            }],
        }
    }
}

impl PciFunction for TestDevice {
    fn save(&self) -> Result<Option<serde_json::Value>, StateError> {
        to_state("scratch", &self.scratch).map(Some)
    }

    fn restore(
        &mut self,
        what: &str,
        _config: &ConfigSpace,
        state: Option<serde_json::Value>,
    ) -> Result<(), StateError> {
        let what = format!("{what}.scratch");
        let state = state.ok_or_else(|| StateError::new(&what, "missing"))?;
        self.scratch = from_state(&what, state)?;
        Ok(())
    }

    fn bar_read(&mut self, _config: &ConfigSpace, bar: usize, offset: u64, data: &mut [u8]) {
        let bytes = self.scratch.to_le_bytes();
        for (i, b) in data.iter_mut().enumerate() {
            let off = usize::try_from(offset).ok().and_then(|o| o.checked_add(i));
            *b = match off {
                Some(o) if bar == 0 && o < bytes.len() => bytes[o],
                _ => 0xff,
            };
        }
    }

    fn bar_write(&mut self, config: &ConfigSpace, bar: usize, offset: u64, data: &[u8]) {
        if bar != 0 || data.len() != 4 {
            return;
        }
        let value = u32::from_le_bytes(data.try_into().expect("length checked"));
        match offset {
            test_regs::SCRATCH => self.scratch = value,
            test_regs::RAISE_TARGET_ABORT => {
                let status = config.get_u16(PCI_STATUS) | PCI_STATUS_SIG_TARGET_ABORT;
                config.set_u16(PCI_STATUS, status);
            }
            test_regs::SET_CAP_DATA => config.set_u32(TEST_CAP_DATA, value),
            _ => {}
        }
    }
}
