//! A userspace IOAPIC for a split irqchip (KVM_CAP_SPLIT_IRQCHIP: local APICs in the kernel,
//! no PIC or IOAPIC there), compatible with the 82093AA at version 0x20: IOREGSEL and IOWIN,
//! the ID, version and arbitration registers, 24 redirection entries, and the EOI register of
//! version 0x20 IOAPICs. Only machines with the VT-d unit have it: KVM's own IOAPIC cannot
//! decode remappable entries (VT-d 3.x §5.1.5.1), and its RTE writes never reach the VMM.
//!
//! Each entry is an MSI ([`rte::Rte::message`]) sent through the routes it is given (the
//! unit's, for the IOAPIC's source-id, so a remappable entry goes through its IRTE). Pins are
//! asserted by the devices' eventfds ([`pins::PinInputs`], watched by one thread); a
//! level-triggered interrupt sets remote IRR until the EOI with its vector, which KVM reports
//! as `KVM_EXIT_IOAPIC_EOI` for the vectors of level-triggered MSI routes on GSIs below the
//! pin count (api.rst §5), so each unmasked entry's message is also routed on its pin's GSI.
//! The EOI de-asserts the line and tells its device, which asserts it again while its
//! condition holds (a line asserted while masked or awaiting EOI is kept, and delivered once
//! it can be).

mod persist;
pub mod pins;
pub mod rte;

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use self::pins::PinInputs;
use self::rte::{REMOTE_IRR, Rte};
use super::InterruptRoutes;
use super::regs::{IOAPIC_EOI, IOAPIC_REDTBL, IOAPIC_REGSEL, IOAPIC_WINDOW};
use crate::bus::BusDevice;
use crate::guest_error;
use crate::logging::DeviceLog;
use crate::seccomp::{self, ThreadKind};

/// Bytes of the IOAPIC's MMIO range at `IOAPIC_BASE` (one page, as QEMU maps it).
pub const MMIO_LEN: u64 = 0x1000;
/// Redirection entries (and pins): the 82093AA's 24.
pub const PINS: u8 = 24;
/// The same, for indexing.
const ENTRIES: usize = PINS as usize;
/// The version register: version 0x20 (with the EOI register), entries - 1 in bits 23:16.
const VERSION: u32 = 0x20 | ((PINS as u32 - 1) << 16);
/// The ID and arbitration registers' ID field: bits 27:24.
const ID_MASK: u32 = 0x0f00_0000;
/// Register indexes behind IOWIN.
const REG_ID: u8 = 0x00;
const REG_VERSION: u8 = 0x01;
const REG_ARBITRATION: u8 = 0x02;
/// The IOAPIC's ID at reset, which the MADT describes (KVM's IOAPIC resets to 0 too, and
/// QEMU describes it so).
pub const IOAPIC_ID: u8 = 0;
/// The source-id of the IOAPIC's messages for interrupt remapping: bus 0xFF, device 0,
/// function 0, where its DMAR device scope puts it (QEMU's q35 puts it there too).
pub const IOAPIC_SOURCE_ID: u16 = 0xff00;

/// The registers and the pins' input state.
struct State {
    select: u8,
    id: u32,
    rtes: [Rte; ENTRIES],
    /// Level-triggered lines asserted and not yet de-asserted by an EOI.
    asserted: u32,
}

/// The IOAPIC: a bus device at `IOAPIC_BASE`.
pub struct Ioapic {
    state: Mutex<State>,
    routes: Arc<dyn InterruptRoutes>,
    inputs: Arc<PinInputs>,
    log: Arc<DeviceLog>,
}

impl Ioapic {
    /// An IOAPIC with ID [`IOAPIC_ID`], every entry masked, sending through
    /// `routes` and asserted through `inputs`.
    pub fn new(
        routes: Arc<dyn InterruptRoutes>,
        inputs: Arc<PinInputs>,
        log: Arc<DeviceLog>,
    ) -> Self {
        Ioapic {
            state: Mutex::new(State {
                select: 0,
                id: u32::from(IOAPIC_ID) << 24,
                rtes: [Rte::RESET; ENTRIES],
                asserted: 0,
            }),
            routes,
            inputs,
            log,
        }
    }

    /// The guest-visible log (errors counted for the exit report).
    pub fn log(&self) -> &Arc<DeviceLog> {
        &self.log
    }

    /// Start the thread that turns the devices' assertions into interrupts; it stops when
    /// the returned handle is dropped.
    pub fn spawn(self: &Arc<Self>) -> std::io::Result<PinWatcher> {
        let ioapic = self.clone();
        let thread = seccomp::spawn(ThreadKind::Device, "ioapic".into(), move || {
            let mut asserted = Vec::new();
            while let Ok(true) = ioapic.inputs.wait(&mut asserted) {
                for pin in asserted.drain(..) {
                    ioapic.assert(pin);
                }
            }
        })?;
        Ok(PinWatcher {
            inputs: self.inputs.clone(),
            thread: Some(thread),
        })
    }

    /// Pin `pin` was asserted: an edge sends its entry's interrupt unless masked; a level
    /// line stays asserted until an EOI de-asserts it, and sends when it can.
    pub fn assert(&self, pin: u32) {
        let Some(i) = usize::try_from(pin).ok().filter(|&i| i < ENTRIES) else {
            return;
        };
        let mut s = self.state.lock().unwrap();
        let rte = s.rtes[i];
        if rte.level() {
            s.asserted |= 1 << i;
            self.service(&mut s, i);
        } else if !rte.masked() {
            self.send(rte);
        }
    }

    /// The EOI of `vector` (the EOI register, or KVM's EOI exit): every level-triggered
    /// entry of that vector awaiting it is released, its line de-asserted and its device
    /// told, so that it asserts the line again if its condition still holds (82093AA §3.2.4,
    /// remote IRR).
    pub fn eoi(&self, vector: u8) {
        let mut s = self.state.lock().unwrap();
        for pin in 0..PINS {
            let i = usize::from(pin);
            let rte = s.rtes[i];
            if rte.level() && rte.remote_irr() && rte.vector() == vector {
                let released = Rte(rte.0 & !REMOTE_IRR);
                s.rtes[i] = released;
                s.asserted &= !(1 << i);
                if released.masked() {
                    self.route(pin, released);
                }
                self.inputs.resample(pin.into());
            }
        }
    }

    /// Send a level line's interrupt if it is asserted, unmasked and not awaiting an EOI.
    fn service(&self, s: &mut State, i: usize) {
        let rte = s.rtes[i];
        if s.asserted & (1 << i) != 0 && rte.level() && !rte.masked() && !rte.remote_irr() {
            s.rtes[i] = Rte(rte.0 | REMOTE_IRR);
            self.send(rte);
        }
    }

    /// Send `rte`'s message through the routes (remapped there if the unit is on).
    fn send(&self, rte: Rte) {
        let (address, data) = rte.message();
        if !self.routes.accepts(address, data) {
            guest_error!(self.log, "redirection entry {:#x} is no valid MSI", rte.0);
            return;
        }
        if let Err(e) = self.routes.signal_msi(address, data) {
            guest_error!(self.log, "cannot send redirection entry {:#x}: {e}", rte.0);
        }
    }

    /// Route pin `i`'s GSI to its entry's message while it is unmasked or awaits an EOI, so
    /// that KVM reports the EOIs of its vector if level-triggered; otherwise remove the route,
    /// so that the unit does not judge (and fault) a message the pin cannot send.
    fn route(&self, pin: u8, rte: Rte) {
        if let Err(e) = self
            .stage_route(pin, rte)
            .and_then(|()| self.routes.commit())
        {
            guest_error!(self.log, "cannot route redirection entry {pin}: {e}");
        }
    }

    /// [`Ioapic::route`] without the commit.
    fn stage_route(&self, pin: u8, rte: Rte) -> Result<(), super::IrqError> {
        let (address, data) = rte.message();
        let gsi = u32::from(pin);
        let live = !rte.masked() || rte.remote_irr();
        if live && self.routes.accepts(address, data) {
            self.routes.set_msi(gsi, address, data)
        } else {
            self.routes.clear(gsi)
        }
    }

    fn read_window(&self, s: &State) -> u32 {
        match s.select {
            REG_ID | REG_ARBITRATION => s.id,
            REG_VERSION => VERSION,
            r => match redirection(r) {
                Some((pin, high)) => s.rtes[usize::from(pin)].half(high),
                None => 0,
            },
        }
    }

    fn write_window(&self, s: &mut State, value: u32) {
        match s.select {
            REG_ID => s.id = value & ID_MASK,
            r => match redirection(r) {
                Some((pin, high)) => {
                    let i = usize::from(pin);
                    let rte = s.rtes[i].written(high, value);
                    s.rtes[i] = rte;
                    self.route(pin, rte);
                    self.service(s, i);
                }
                None => guest_error!(self.log, "write to read-only register {r:#x}"),
            },
        }
    }
}

/// The entry and half that register `reg` holds, if it is a redirection register.
fn redirection(reg: u8) -> Option<(u8, bool)> {
    let at = u32::from(reg).checked_sub(IOAPIC_REDTBL)?;
    let at = u8::try_from(at).ok().filter(|&at| at < 2 * PINS)?;
    Some((at / 2, at % 2 == 1))
}

impl BusDevice for Ioapic {
    fn read(&self, offset: u64, data: &mut [u8]) {
        let s = self.state.lock().unwrap();
        let value = match offset {
            IOAPIC_REGSEL => u32::from(s.select),
            IOAPIC_WINDOW => self.read_window(&s),
            // The EOI register is write-only; other offsets decode nothing.
            _ => 0,
        };
        let bytes = value.to_le_bytes();
        for (i, b) in data.iter_mut().enumerate() {
            *b = bytes.get(i).copied().unwrap_or(0);
        }
    }

    fn write(&self, offset: u64, data: &[u8]) {
        let mut bytes = [0u8; 4];
        let n = data.len().min(4);
        bytes[..n].copy_from_slice(&data[..n]);
        let value = u32::from_le_bytes(bytes);
        match offset {
            IOAPIC_REGSEL => self.state.lock().unwrap().select = bytes[0],
            IOAPIC_WINDOW if data.len() == 4 => {
                let mut s = self.state.lock().unwrap();
                self.write_window(&mut s, value);
            }
            IOAPIC_EOI => self.eoi(bytes[0]),
            _ => guest_error!(
                self.log,
                "{}-byte write at offset {offset:#x}: not a register",
                data.len()
            ),
        }
    }
}

/// The IOAPIC's input thread; dropping it stops the thread.
pub struct PinWatcher {
    inputs: Arc<PinInputs>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for PinWatcher {
    fn drop(&mut self) {
        self.inputs.stop();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests;
