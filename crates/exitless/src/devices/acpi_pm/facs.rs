//! Where the OS asks to resume after S3: the waking vectors in the FACS (ACPI 6.5 §5.2.10,
//! table 5.14), read from guest memory at the sleep request.

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::vm::sleep::WakeEntry;

/// The FACS's signature, at offset 0.
const SIGNATURE: [u8; 4] = *b"FACS";
/// Offset of Firmware_Waking_Vector (32 bits: a real-mode entry below 1 MiB).
const WAKING_VECTOR: u64 = 12;
/// Offset of X_Firmware_Waking_Vector (64 bits: a protected-mode entry).
const X_WAKING_VECTOR: u64 = 24;
/// Offset of OSPM Flags (32 bits).
const OSPM_FLAGS: u64 = 36;
/// OSPM Flags bit 0, 64BIT_WAKE_F: resume in 64-bit mode. The FACS's flags do not offer it
/// (64BIT_WAKE_SUPPORTED_F clear), so an OS must not set it.
const WAKE_64BIT: u32 = 1 << 0;
/// The real-mode vector is a segment:offset pair: below 1 MiB.
const REAL_MODE_LIMIT: u32 = 0x10_0000;

/// Why no waking vector could be found.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum FacsError {
    /// The FACS is not in guest memory, or its signature is gone.
    #[error("no FACS at {0:#x}")]
    Missing(u64),
    /// The OS set no waking vector.
    #[error("the FACS has no waking vector")]
    NoVector,
    /// The vector cannot be entered as the spec says.
    #[error(
        "waking vector {0:#x} cannot be entered (real mode: below 1 MiB; X_: 32 bits, 64BIT_WAKE_F clear)"
    )]
    Unreachable(u64),
}

fn read<T: vm_memory::ByteValued>(mem: &GuestMemoryMmap, at: u64) -> Result<T, FacsError> {
    mem.read_obj(GuestAddress(at))
        .map_err(|_| FacsError::Missing(at))
}

/// The entry the boot vCPU resumes at, from the FACS at `at` (§5.2.10): the X_ vector when the
/// OS set it (32-bit protected mode), else the real-mode vector (CS = vector >> 4, IP = vector &
/// 0xF).
pub fn waking_entry(mem: &GuestMemoryMmap, at: u64) -> Result<WakeEntry, FacsError> {
    if read::<[u8; 4]>(mem, at)? != SIGNATURE {
        return Err(FacsError::Missing(at));
    }
    let vector: u32 = read(mem, at + WAKING_VECTOR)?;
    let x_vector: u64 = read(mem, at + X_WAKING_VECTOR)?;
    let flags: u32 = read(mem, at + OSPM_FLAGS)?;
    if x_vector != 0 {
        return match u32::try_from(x_vector) {
            Ok(eip) if flags & WAKE_64BIT == 0 => Ok(WakeEntry::Protected32(eip)),
            _ => Err(FacsError::Unreachable(x_vector)),
        };
    }
    match vector {
        0 => Err(FacsError::NoVector),
        v if v >= REAL_MODE_LIMIT => Err(FacsError::Unreachable(v.into())),
        v => Ok(WakeEntry::Real {
            cs: u16::try_from(v >> 4).expect("below 1 MiB"),
            ip: u16::try_from(v & 0xf).expect("4 bits"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facs(vector: u32, x_vector: u64, flags: u32) -> (GuestMemoryMmap, u64) {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x2000)]).unwrap();
        let at = 0x1000;
        mem.write_slice(&SIGNATURE, GuestAddress(at)).unwrap();
        mem.write_obj(vector, GuestAddress(at + WAKING_VECTOR))
            .unwrap();
        mem.write_obj(x_vector, GuestAddress(at + X_WAKING_VECTOR))
            .unwrap();
        mem.write_obj(flags, GuestAddress(at + OSPM_FLAGS)).unwrap();
        (mem, at)
    }

    #[test]
    fn the_real_mode_vector_is_a_segment_and_offset() {
        let (mem, at) = facs(0x9_1234, 0, 0);
        let entry = waking_entry(&mem, at);
        assert_eq!(entry, Ok(WakeEntry::Real { cs: 0x9123, ip: 4 }));
    }

    #[test]
    fn the_x_vector_wins_in_protected_mode_unless_64_bit_is_asked() {
        let (mem, at) = facs(0x9000, 0x10_0000, 0);
        assert_eq!(
            waking_entry(&mem, at),
            Ok(WakeEntry::Protected32(0x10_0000))
        );
        let (mem, at) = facs(0x9000, 0x10_0000, WAKE_64BIT);
        assert_eq!(
            waking_entry(&mem, at),
            Err(FacsError::Unreachable(0x10_0000))
        );
    }

    #[test]
    fn bad_vectors_and_a_missing_facs_are_refused() {
        let (mem, at) = facs(0, 0, 0);
        assert_eq!(waking_entry(&mem, at), Err(FacsError::NoVector));
        let (mem, at) = facs(0x10_0000, 0, 0);
        assert_eq!(
            waking_entry(&mem, at),
            Err(FacsError::Unreachable(0x10_0000))
        );
        assert_eq!(waking_entry(&mem, 0x1ffe), Err(FacsError::Missing(0x1ffe)));
        assert_eq!(waking_entry(&mem, 0x100), Err(FacsError::Missing(0x100)));
    }
}
