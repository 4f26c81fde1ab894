//! PCI function addresses and their two encodings: configuration mechanism #1's
//! CONFIG_ADDRESS register and the ECAM offset. Both carry the same 16-bit bus/device/function
//! field; they differ only in where it sits and how wide the register number is.

use crate::pci::regs::{
    ECAM_BUS_SHIFT, ECAM_FUNCTION_SHIFT, PCI_CFG_SPACE_EXP_SIZE, PCI_CONFIG_ADDRESS_ENABLE,
};

/// Bus, device and function of one PCI function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddress {
    /// Bus number.
    pub bus: u8,
    /// Device number, 0..32.
    pub device: u8,
    /// Function number, 0..8.
    pub function: u8,
}

impl PciAddress {
    /// An address, if `device` < 32 and `function` < 8.
    pub fn new(bus: u8, device: u8, function: u8) -> Option<Self> {
        (device < 32 && function < 8).then_some(PciAddress {
            bus,
            device,
            function,
        })
    }

    /// From the 16-bit bus:8 device:5 function:3 field both encodings share.
    fn from_bdf(bdf: u16) -> Self {
        let [bus, devfn] = bdf.to_be_bytes();
        PciAddress {
            bus,
            device: devfn >> 3,
            function: devfn & 7,
        }
    }

    /// Device and function in one byte, as on the wire.
    pub fn devfn(&self) -> u8 {
        (self.device << 3) | self.function
    }

    /// The requester ID its memory requests carry: bus << 8 | devfn (PCIe 4.0 §2.2.6.2).
    pub fn requester_id(&self) -> u16 {
        u16::from(self.bus) << 8 | u16::from(self.devfn())
    }

    /// Decode CONFIG_ADDRESS (PCI 3.0 §3.2.2.3.2): bit 31 enable, bits 23:8 bus/device/function,
    /// bits 7:2 dword register. `None` when the enable bit is clear (not a config cycle).
    ///
    /// ```
    /// # use exitless::pci::PciAddress;
    /// let (a, reg) = PciAddress::from_config_address(0x8001_0a3c).unwrap();
    /// assert_eq!((a.bus, a.device, a.function, reg), (1, 1, 2, 0x3c));
    /// assert!(PciAddress::from_config_address(0x0001_0a3c).is_none());
    /// ```
    pub fn from_config_address(value: u32) -> Option<(Self, u16)> {
        if value & PCI_CONFIG_ADDRESS_ENABLE == 0 {
            return None;
        }
        let [reg, dev_fn, bus, _reserved] = value.to_le_bytes(); // bits 30:24 are ignored
        Some((
            Self::from_bdf(u16::from_be_bytes([bus, dev_fn])),
            u16::from(reg & 0xfc),
        ))
    }

    /// Decode an offset into an ECAM window whose first bus is 0 (PCIe 4.0 §7.2.2):
    /// bits 27:12 bus/device/function, bits 11:0 register.
    ///
    /// ```
    /// # use exitless::pci::PciAddress;
    /// let (a, reg) = PciAddress::from_ecam_offset(0x0011_1104);
    /// assert_eq!((a.bus, a.device, a.function, reg), (1, 2, 1, 0x104));
    /// ```
    pub fn from_ecam_offset(offset: u64) -> (Self, u16) {
        // Masked to 16 and 12 bits, so the narrowing casts cannot lose anything.
        let bdf = ((offset >> ECAM_FUNCTION_SHIFT) & 0xffff) as u16;
        let reg = u16::try_from(offset & u64::from(PCI_CFG_SPACE_EXP_SIZE - 1))
            .expect("masked to 12 bits");
        (Self::from_bdf(bdf), reg)
    }

    /// The ECAM offset of register 0 of this function (window starting at bus 0).
    pub fn ecam_offset(&self) -> u64 {
        (u64::from(self.bus) << ECAM_BUS_SHIFT) | (u64::from(self.devfn()) << ECAM_FUNCTION_SHIFT)
    }
}

impl std::fmt::Display for PciAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:02x}:{:02x}.{}", self.bus, self.device, self.function)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_encodings_agree() {
        for (bus, dev, func) in [(0, 0, 0), (0, 31, 7), (255, 17, 3)] {
            let a = PciAddress::new(bus, dev, func).unwrap();
            let cf8 = 0x8000_0000 | (u32::from(bus) << 16) | (u32::from(a.devfn()) << 8) | 0x40;
            assert_eq!(PciAddress::from_config_address(cf8), Some((a, 0x40)));
            assert_eq!(
                PciAddress::from_ecam_offset(a.ecam_offset() + 0x40),
                (a, 0x40)
            );
        }
    }

    #[test]
    fn config_address_ignores_reserved_and_low_bits() {
        let (a, reg) = PciAddress::from_config_address(0xff00_0803).unwrap();
        assert_eq!((a.bus, a.device, a.function, reg), (0, 1, 0, 0));
    }

    #[test]
    fn rejects_out_of_range_device_and_function() {
        assert!(PciAddress::new(0, 32, 0).is_none());
        assert!(PciAddress::new(0, 0, 8).is_none());
    }
}
