//! Platform devices that are not PCI functions: the console UART, and the PC parts `exitless
//! run` guests expect (QEMU's test exit and fw_cfg, the ACPI power-management block, the RTC and
//! CMOS, the i8254 PIT where KVM has none, the two ways to reset a PC, and QEMU's panic port).

pub mod acpi_pm;
pub mod debug_exit;
pub mod floating_ports;
pub mod fw_cfg;
pub mod i8042;
pub mod pit;
pub mod pvpanic;
pub mod reset_control;
pub mod rtc;
pub mod serial;
pub mod timer;
