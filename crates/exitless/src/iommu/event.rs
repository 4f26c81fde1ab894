//! An interrupt event of the unit: four dwords in a row, control (IM, IP), data, address and
//! upper address. The fault event (FECTL..FEUADDR, VT-d §7.3, §10.4.10-13) and the
//! invalidation event (IECTL..IEUADDR, §6.5.2.8, §10.4.26-29) are two of them.
//!
//! An event condition sends the message at once while the event is unmasked; while masked it
//! sets IP, and clearing IM then sends it. Software clearing the condition's status clears
//! IP. The unit's state never sends anything itself: each change returns the message due, for
//! the unit to send once its locks are released.

use super::regs::{VTD_EVENT_IM, VTD_EVENT_IP};

/// An MSI message (address, data) due to the guest.
pub type Message = (u64, u32);

/// Index of the control dword (IM, IP).
pub const EVENT_CONTROL: usize = 0;
/// Index of the data dword.
pub const EVENT_DATA: usize = 1;
/// Index of the address dword.
pub const EVENT_ADDRESS: usize = 2;
/// Index of the upper address dword.
pub const EVENT_UPPER_ADDRESS: usize = 3;

/// One event's registers (and its state in a snapshot).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct EventInterrupt {
    /// IM.
    pub(super) masked: bool,
    /// IP.
    pub(super) pending: bool,
    pub(super) data: u32,
    pub(super) address: u32,
    pub(super) upper_address: u32,
}

impl Default for EventInterrupt {
    /// IM is set at reset (§10.4.10, §10.4.26).
    fn default() -> Self {
        EventInterrupt {
            masked: true,
            pending: false,
            data: 0,
            address: 0,
            upper_address: 0,
        }
    }
}

impl EventInterrupt {
    fn message(&self) -> Message {
        (
            u64::from(self.upper_address) << 32 | u64::from(self.address),
            self.data,
        )
    }

    /// Dword `index` (`EVENT_*`).
    pub fn read(&self, index: usize) -> u32 {
        match index {
            EVENT_CONTROL => {
                let im = if self.masked { VTD_EVENT_IM } else { 0 };
                let ip = if self.pending { VTD_EVENT_IP } else { 0 };
                im | ip
            }
            EVENT_DATA => self.data,
            EVENT_ADDRESS => self.address,
            EVENT_UPPER_ADDRESS => self.upper_address,
            _ => 0,
        }
    }

    /// Write dword `index`; clearing IM with IP set returns the message held.
    pub fn write(&mut self, index: usize, value: u32) -> Option<Message> {
        match index {
            EVENT_CONTROL => {
                self.masked = value & VTD_EVENT_IM != 0;
                if !self.masked && std::mem::take(&mut self.pending) {
                    return Some(self.message());
                }
            }
            EVENT_DATA => self.data = value,
            // The address is dword-aligned (bits 1:0 reserved).
            EVENT_ADDRESS => self.address = value & !3,
            EVENT_UPPER_ADDRESS => self.upper_address = value,
            _ => {}
        }
        None
    }

    /// An event condition arose: the message to send now, or none while masked (IP set).
    pub fn raise(&mut self) -> Option<Message> {
        if self.masked {
            self.pending = true;
            None
        } else {
            Some(self.message())
        }
    }

    /// Software cleared every status the event reports: nothing is pending any more.
    pub fn clear_pending(&mut self) {
        self.pending = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masked_at_reset_pending_while_masked_and_sent_at_unmask() {
        let mut e = EventInterrupt::default();
        assert_eq!(e.read(EVENT_CONTROL), VTD_EVENT_IM);
        e.write(EVENT_DATA, 0x41);
        e.write(EVENT_ADDRESS, 0xfee0_0003);
        assert_eq!(e.read(EVENT_ADDRESS), 0xfee0_0000);
        assert_eq!(e.raise(), None);
        assert_eq!(e.read(EVENT_CONTROL), VTD_EVENT_IM | VTD_EVENT_IP);
        assert_eq!(e.write(EVENT_CONTROL, 0), Some((0xfee0_0000, 0x41)));
        assert_eq!(e.read(EVENT_CONTROL), 0, "IP cleared once sent");
        assert_eq!(
            e.raise(),
            Some((0xfee0_0000, 0x41)),
            "unmasked: sent at once"
        );
        e.write(EVENT_CONTROL, VTD_EVENT_IM);
        e.raise();
        e.clear_pending();
        assert_eq!(e.write(EVENT_CONTROL, 0), None, "cleared by software first");
    }
}
