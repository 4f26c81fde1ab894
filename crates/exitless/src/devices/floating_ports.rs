//! Legacy ISA ports a PC decodes but this machine has no chip behind: Linux probes them at boot
//! (it reads the DMA controller's channel 0 page register, 0x87, looks for a Super I/O chip at
//! both LPC configuration pairs, 0x4e/0x4f and then 0x2e/0x2f, and for UARTs at COM2, COM3 and
//! COM4). On a board without those chips the bus floats,
//! so reads see all-ones and writes vanish, which is what an unclaimed port does here too; they
//! are claimed only so that these expected probes are not logged as a guest's stray accesses.

use crate::bus::BusDevice;

/// Channel 0's page register of the 8237 DMA controller's page block (0x81–0x8f).
pub const DMA_PAGE_CHANNEL0_PORT: u16 = 0x87;
/// The Super I/O configuration index and data ports: the LPC's two pairs.
pub const SUPER_IO_CONFIG_PORTS: [u16; 2] = [0x2e, 0x4e];
/// Ports of each Super I/O pair.
pub const SUPER_IO_CONFIG_LEN: u16 = 2;
/// The standard bases of COM2, COM3 and COM4, which have no UART here (the console is COM1).
/// Linux's 8250 driver writes each one's interrupt enable register and reads it back: all-ones
/// tells it no UART is there.
pub const ABSENT_UART_PORTS: [u16; 3] = [0x2f8, 0x3e8, 0x2e8];

/// Ports nothing answers: reads float high, writes are dropped.
pub struct FloatingPorts;

impl BusDevice for FloatingPorts {
    fn read(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0xff);
    }

    fn write(&self, _offset: u64, _data: &[u8]) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_float_high_and_writes_change_nothing() {
        let ports = FloatingPorts;
        ports.write(0, &[0x55]);
        let mut data = [0u8; 2];
        ports.read(0, &mut data);
        assert_eq!(data, [0xff, 0xff]);
    }
}
