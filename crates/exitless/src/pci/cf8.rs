//! Configuration mechanism #1 (PCI 3.0 §3.2.2.3.2): CONFIG_ADDRESS at 0xCF8, CONFIG_DATA at
//! 0xCFC..=0xCFF. Only the first 256 bytes of a function are reachable, as on hardware.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::bus::BusDevice;
use crate::pci::PciAddress;
use crate::pci::root::PciRoot;

/// Length of the port range this device claims (0xCF8..=0xCFF).
pub const PCI_CONFIG_IO_LEN: u16 = 8;
/// Offset of CONFIG_DATA from 0xCF8.
const DATA_OFFSET: u64 = 4;
/// CONFIG_ADDRESS bits that hold state: enable (31), bus/device/function (23:8), register
/// (7:2). Reserved bits 30:24 and 1:0 read as zero.
const ADDRESS_MASK: u32 = 0x80ff_fffc;

/// Offset from 0xCF8 of the chipset's reset control register (0xCF9).
const RESET_CONTROL_OFFSET: u64 = 1;

/// The 0xCF8/0xCFC port pair.
pub struct PciConfigIo {
    root: Arc<PciRoot>,
    config_address: AtomicU32,
    /// The byte register at 0xCF9, if the machine has one: it shares these ports on a PC, where
    /// only a dword access to 0xCF8 reaches CONFIG_ADDRESS.
    reset_control: Option<Arc<dyn BusDevice>>,
}

impl PciConfigIo {
    /// Ports in front of `root`.
    pub fn new(root: Arc<PciRoot>) -> Self {
        PciConfigIo {
            root,
            config_address: AtomicU32::new(0),
            reset_control: None,
        }
    }

    /// The same, with byte accesses to 0xCF9 going to `reset_control` (offset 0).
    pub fn with_reset_control(self, reset_control: Arc<dyn BusDevice>) -> Self {
        PciConfigIo {
            reset_control: Some(reset_control),
            ..self
        }
    }

    /// The reset control register, if `offset` and `len` make an access to it.
    fn reset_control(&self, offset: u64, len: usize) -> Option<&Arc<dyn BusDevice>> {
        self.reset_control
            .as_ref()
            .filter(|_| offset == RESET_CONTROL_OFFSET && len == 1)
    }

    /// The function, register and data-lane range a CONFIG_DATA access at `offset` (from 0xCFC)
    /// of `len` bytes reaches: lanes past 0xCFF are not configuration data.
    fn target(&self, offset: u64, len: usize) -> Option<(PciAddress, u16, usize)> {
        let (address, reg) =
            PciAddress::from_config_address(self.config_address.load(Ordering::Acquire))?;
        let lane = u16::try_from(offset).ok().filter(|&l| l < 4)?;
        let lanes = len.min(usize::from(4 - lane));
        Some((address, reg + lane, lanes))
    }
}

impl BusDevice for PciConfigIo {
    fn read(&self, offset: u64, data: &mut [u8]) {
        if offset < DATA_OFFSET {
            // Only a dword access to 0xCF8 is CONFIG_ADDRESS; anything else there is not ours.
            if let Some(reset) = self.reset_control(offset, data.len()) {
                reset.read(0, data);
            } else if offset == 0 && data.len() == 4 {
                data.copy_from_slice(&self.config_address.load(Ordering::Acquire).to_le_bytes());
            } else {
                data.fill(0xff);
            }
            return;
        }
        data.fill(0xff);
        if let Some((address, reg, lanes)) = self.target(offset - DATA_OFFSET, data.len()) {
            self.root.config_read(address, reg, &mut data[..lanes]);
        }
    }

    fn write(&self, offset: u64, data: &[u8]) {
        if offset < DATA_OFFSET {
            if let Some(reset) = self.reset_control(offset, data.len()) {
                reset.write(0, data);
            } else if let (0, Ok(bytes)) = (offset, <[u8; 4]>::try_from(data)) {
                self.config_address
                    .store(u32::from_le_bytes(bytes) & ADDRESS_MASK, Ordering::Release);
            }
            return;
        }
        if let Some((address, reg, lanes)) = self.target(offset - DATA_OFFSET, data.len()) {
            self.root.config_write(address, reg, &data[..lanes]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pci::root::{BarBuses, BarWindows};

    fn ports() -> PciConfigIo {
        let windows = BarWindows {
            mmio: (0xc000_0000, 0xe000_0000),
            io: (0xc000, 0x1_0000),
        };
        let root = PciRoot::new(windows, BarBuses::detached()).unwrap();
        root.add_host_bridge().unwrap();
        root.add_test_endpoints().unwrap();
        PciConfigIo::new(Arc::new(root))
    }

    fn select(p: &PciConfigIo, value: u32) {
        p.write(0, &value.to_le_bytes());
    }

    fn read(p: &PciConfigIo, offset: u64, len: usize) -> Vec<u8> {
        let mut d = vec![0; len];
        p.read(offset, &mut d);
        d
    }

    #[test]
    fn config_address_is_a_dword_register_with_reserved_bits_zero() {
        let p = ports();
        select(&p, 0xffff_ffff);
        assert_eq!(read(&p, 0, 4), 0x80ff_fffcu32.to_le_bytes());
        p.write(0, &[0, 0]); // a word write to 0xCF8 is not CONFIG_ADDRESS
        p.write(1, &[0]);
        assert_eq!(read(&p, 0, 4), 0x80ff_fffcu32.to_le_bytes());
        assert_eq!(read(&p, 2, 2), [0xff, 0xff]);
    }

    #[test]
    fn byte_accesses_at_0xcf9_reach_the_reset_control_register() {
        use crate::vm::run_control::{RunControl, StopReason};
        let control = Arc::new(RunControl::default());
        let reset = crate::devices::reset_control::ResetControl::new(control.clone());
        let p = ports().with_reset_control(Arc::new(reset));
        select(&p, 0x8000_0800);
        p.write(1, &[0x02]); // SYS_RST alone: kept, no reset
        assert_eq!(read(&p, 1, 1), [0x02]);
        assert_eq!(
            read(&p, 0, 4),
            0x8000_0800u32.to_le_bytes(),
            "CONFIG_ADDRESS unchanged"
        );
        assert_eq!(control.wait(std::time::Duration::ZERO), None);
        p.write(1, &[0x06]);
        assert_eq!(
            control.wait(std::time::Duration::ZERO),
            Some(StopReason::Reset)
        );
    }

    #[test]
    fn data_lanes_select_bytes_of_the_dword() {
        let p = ports();
        select(&p, 0x8000_0800); // 00:01.0, register 0
        assert_eq!(read(&p, 4, 4), 0x0001_7e57u32.to_le_bytes());
        assert_eq!(read(&p, 6, 2), [0x01, 0x00]);
        assert_eq!(read(&p, 5, 1), [0x7e]);
        assert_eq!(
            read(&p, 7, 2),
            [0x00, 0xff],
            "the lane past 0xCFF is not config data"
        );
    }

    #[test]
    fn disabled_cycles_and_absent_functions_read_all_ones() {
        let p = ports();
        select(&p, 0x0000_0800); // enable bit clear
        assert_eq!(read(&p, 4, 4), [0xff; 4]);
        p.write(4, &[0; 4]); // dropped
        select(&p, 0x8000_f800); // 00:1f.0: absent
        assert_eq!(read(&p, 4, 4), [0xff; 4]);
        select(&p, 0x8001_0000); // bus 1: absent
        assert_eq!(read(&p, 4, 2), [0xff; 2]);
    }

    #[test]
    fn only_the_first_256_bytes_are_reachable() {
        let p = ports();
        // Bits 27:24 (AMD's extended register number) are reserved here: register 0x00.
        select(&p, 0x8f00_0800);
        assert_eq!(read(&p, 4, 4), 0x0001_7e57u32.to_le_bytes());
    }

    #[test]
    fn writes_go_through_the_masks() {
        let p = ports();
        select(&p, 0x8000_0854); // 00:01.0 MSI address low
        p.write(4, &0xfee0_0003u32.to_le_bytes());
        assert_eq!(
            read(&p, 4, 4),
            0xfee0_0000u32.to_le_bytes(),
            "bits 1:0 are reserved"
        );
        p.write(7, &[0x12]);
        assert_eq!(read(&p, 4, 4), 0x12e0_0000u32.to_le_bytes());
    }
}
