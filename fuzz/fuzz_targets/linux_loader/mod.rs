//! What the Linux loader targets (`bzimage`, `pvh`) share: their input's layout and the machine
//! the kernels load into.

use exitless::machine::MemoryLayout;
use vm_memory::{GuestAddress, GuestMemoryMmap};

/// RAM of the machine: enough for the firmware areas and a few MiB of kernel.
pub const RAM: usize = 8 << 20;
/// The command line every kernel gets.
pub const CMDLINE: &str = "console=ttyS0 fuzz";

thread_local! {
    /// The guest memory every input loads into, reused: one mapping per process.
    pub static MEMORY: GuestMemoryMmap =
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), RAM)]).expect("guest memory");
}

/// An input split into the initrd and the kernel: byte 0 is the initrd's length (0: no
/// initrd), that many bytes of initrd follow, then the kernel. `None` for an empty input.
pub fn split(data: &[u8]) -> Option<(Option<Vec<u8>>, &[u8])> {
    let (&initrd_len, rest) = data.split_first()?;
    let (initrd, kernel) = rest.split_at(usize::from(initrd_len).min(rest.len()));
    Some(((initrd_len > 0).then(|| initrd.to_vec()), kernel))
}

/// The layout of a machine with [`RAM`].
pub fn layout() -> MemoryLayout {
    MemoryLayout::new(RAM, true).expect("a valid layout")
}
