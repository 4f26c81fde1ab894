//! The console UART in a snapshot: vm-superio's own state (`SerialState`: the divisor latch,
//! IER, IIR, LCR, MCR, LSR, MSR, the scratch byte and the receive FIFO), restored with
//! `Serial::from_state`; an interrupt that was pending and enabled is raised again at resume.
//! What the console thread had not yet written out is the host's, not the guest's, and is not
//! saved.

use std::sync::PoisonError;
use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};
use vm_superio::serial::SerialState;
use vm_superio::{Serial, Trigger};

use super::{LSR_TEMT, LSR_THRE, SerialConsole};
use crate::persist::{Persist, StateError, from_state, to_state};

/// The receive FIFO's depth in vm-superio's 16550A.
const RX_FIFO_LEN: usize = 64;
/// IER bits a 16550A has (PC16550D Table II: RDA, THRE, RLS, MS); vm-superio keeps only these.
const IER_VALID: u8 = 0x0f;
/// IIR's "no interrupt pending" bit and the two causes vm-superio raises (THR empty, RDA).
const IIR_NONE: u8 = 0x01;
const IIR_CAUSES: u8 = 0x06;
/// LSR's data-ready bit: set exactly while the receive FIFO holds a byte.
const LSR_DR: u8 = 0x01;
/// MSR's delta bits (3..0), which vm-superio never sets.
const MSR_DELTAS: u8 = 0x0f;
/// The causes against the IER bits that enable them: THR empty (IIR 0x2, IER bit 1) and
/// received data (IIR 0x4, IER bit 0).
const ENABLED_BY: [(u8, u8); 2] = [(0x02, 0x02), (0x04, 0x01)];

/// serde's view of vm-superio's `SerialState`, which has no serde derives of its own.
#[derive(Serialize, Deserialize)]
#[serde(remote = "SerialState")]
struct SerialStateDef {
    baud_divisor_low: u8,
    baud_divisor_high: u8,
    interrupt_enable: u8,
    interrupt_identification: u8,
    line_control: u8,
    line_status: u8,
    modem_control: u8,
    modem_status: u8,
    scratch: u8,
    in_buffer: Vec<u8>,
}

#[derive(Serialize, Deserialize)]
struct Saved(#[serde(with = "SerialStateDef")] SerialState);

/// A state vm-superio could have reached, field by field: a wrong one names the field.
fn check(s: &SerialState) -> Result<(), StateError> {
    let bad = |field: &str, why: String| Err(StateError::new(format!("serial.{field}"), why));
    if s.in_buffer.len() > RX_FIFO_LEN {
        return bad(
            "in_buffer",
            format!("{} bytes, the FIFO holds {RX_FIFO_LEN}", s.in_buffer.len()),
        );
    }
    if s.interrupt_enable & !IER_VALID != 0 {
        return bad(
            "interrupt_enable",
            format!("{:#x} sets bits a 16550A lacks", s.interrupt_enable),
        );
    }
    let iir = s.interrupt_identification;
    if iir != IIR_NONE && (iir & !IIR_CAUSES != 0 || iir == 0) {
        return bad(
            "interrupt_identification",
            format!(
                "{iir:#x} is neither 0x1 (none pending) nor a set of causes in {IIR_CAUSES:#x}"
            ),
        );
    }
    let dr = if s.in_buffer.is_empty() { 0 } else { LSR_DR };
    if s.line_status != LSR_THRE | LSR_TEMT | dr {
        return bad(
            "line_status",
            format!(
                "{:#x}: the transmitter is always empty and data ready follows the FIFO ({:#x})",
                s.line_status,
                LSR_THRE | LSR_TEMT | dr
            ),
        );
    }
    if s.modem_status & MSR_DELTAS != 0 {
        return bad(
            "modem_status",
            format!("{:#x} sets delta bits", s.modem_status),
        );
    }
    Ok(())
}

impl Persist for SerialConsole {
    fn save(&self) -> Result<serde_json::Value, StateError> {
        to_state("serial", &Saved(self.lock().state()))
    }

    fn restore(&self, state: serde_json::Value) -> Result<(), StateError> {
        let Saved(state) = from_state("serial", state)?;
        check(&state)?;
        let mut uart = self.uart.lock().unwrap_or_else(PoisonError::into_inner);
        // The same interrupt line, input thread and output: only the registers change.
        let (irq, room, out) = (
            uart.interrupt_evt().clone(),
            uart.events().clone(),
            uart.writer().clone(),
        );
        *uart = Serial::from_state(&state, irq, room, out)
            .map_err(|e| StateError::new("serial", format!("cannot be restored: {e}")))?;
        self.restored.store(true, Ordering::Release);
        Ok(())
    }

    /// After a restore, raise the pending interrupt again: `from_state` raised it before the
    /// interrupt controller it goes through (the userspace IOAPIC, a Persist too) may have
    /// been restored. Before the vCPUs run, a second edge merges with the first.
    fn resume(&self) {
        if !self.restored.swap(false, Ordering::AcqRel) {
            return;
        }
        let uart = self.lock();
        let state = uart.state();
        let pending = ENABLED_BY.iter().any(|&(cause, enable)| {
            state.interrupt_identification & cause != 0 && state.interrupt_enable & enable != 0
        });
        if pending {
            // An interrupt that cannot be signalled is lost, as any other of this UART's.
            let _ = uart.interrupt_evt().trigger();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use serde_json::json;
    use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

    use super::*;
    use crate::bus::BusDevice;
    use crate::devices::serial::{ConsoleOutput, Overflow};
    use crate::logging::DeviceLog;

    fn console() -> (SerialConsole, EventFd) {
        let irq = EventFd::new(EFD_NONBLOCK).unwrap();
        let seen = irq.try_clone().unwrap();
        let out = ConsoleOutput::Buffer(Arc::new(Mutex::new(Vec::new())));
        let serial = SerialConsole::new(irq, out, Overflow::Hold, DeviceLog::new("serial"));
        (serial.unwrap(), seen)
    }

    fn read(serial: &SerialConsole, offset: u64) -> u8 {
        let mut b = [0];
        serial.read(offset, &mut b);
        b[0]
    }

    /// Every register a guest reads, the divisor latch and the FIFO's bytes (which reading
    /// consumes: call it last).
    fn registers(serial: &SerialConsole) -> Vec<u8> {
        serial.write(3, &[0x80 | read(serial, 3)]);
        let mut regs = vec![read(serial, 0), read(serial, 1)];
        serial.write(3, &[read(serial, 3) & 0x7f]);
        regs.extend([1, 3, 4, 5, 6, 7].map(|r| read(serial, r)));
        regs.extend((0..4).map(|_| read(serial, 0)));
        regs
    }

    #[test]
    fn the_registers_and_the_receive_fifo_come_back() {
        let (serial, _) = console();
        serial.write(3, &[0x80]); // DLAB
        serial.write(0, &[0x01]);
        serial.write(1, &[0x02]);
        serial.write(3, &[0x1b]); // 8 data bits, even parity
        serial.write(7, &[0x5a]);
        serial.write(4, &[0x1b]); // loopback, DTR, RTS, OUT2
        serial.write(1, &[0x01]); // RDA interrupt
        serial.write(0, b"h");
        serial.write(0, b"i");
        let state = serial.save().unwrap();

        let (restored, irq) = console();
        restored.restore(state).unwrap();
        assert_eq!(
            irq.read().unwrap(),
            1,
            "the pending RDA interrupt is raised again"
        );
        restored.resume();
        assert_eq!(irq.read().unwrap(), 1, "and again at resume");
        restored.resume();
        assert!(
            irq.read().is_err(),
            "once: a resume after a pause raises nothing"
        );
        let want = registers(&serial);
        assert_eq!(registers(&restored), want);
        assert_eq!(&want[8..10], b"hi", "the FIFO's bytes, in order");
        assert_eq!(want[0..2], [0x01, 0x02], "the divisor latch");
    }

    #[test]
    fn a_corrupted_state_is_refused_naming_the_field() {
        let (serial, _) = console();
        serial.write(7, &[0x33]);
        let good = serial.save().unwrap();
        let corrupt = |field: &str, value: serde_json::Value| {
            let mut state = good.clone();
            state[field] = value;
            serial.restore(state).unwrap_err().what
        };
        assert_eq!(corrupt("in_buffer", json!(vec![0; 65])), "serial.in_buffer");
        assert_eq!(corrupt("in_buffer", json!([7])), "serial.line_status");
        assert_eq!(
            corrupt("interrupt_enable", json!(0x10)),
            "serial.interrupt_enable"
        );
        assert_eq!(
            corrupt("interrupt_identification", json!(0x03)),
            "serial.interrupt_identification"
        );
        assert_eq!(corrupt("line_status", json!(0x00)), "serial.line_status");
        assert_eq!(corrupt("modem_status", json!(0xb1)), "serial.modem_status");
        assert_eq!(corrupt("scratch", json!(256)), "serial");
        assert_eq!(read(&serial, 7), 0x33, "a refused state changes nothing");
    }
}
