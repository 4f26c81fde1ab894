//! What the Linux kernel targets (`bzimage`, `pvh`) share: their input's layout and the machine
//! the kernels load into.

use exitless::machine::{EntryState, Loader, MachineInfo, MemoryLayout};
use vm_memory::{ByteValued, Bytes, GuestAddress, GuestMemoryMmap};

/// RAM of the machine: enough for the firmware areas and a few MiB of kernel.
pub const RAM: usize = 8 << 20;
/// The command line every kernel gets.
pub const CMDLINE: &str = "console=ttyS0 fuzz";

thread_local! {
    /// The guest memory every input loads into, reused: one mapping per process.
    static MEMORY: GuestMemoryMmap =
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), RAM)]).expect("guest memory");
}

/// An input split into the initrd and the kernel: byte 0 is the initrd's length (0: no
/// initrd), that many bytes of initrd follow, then the kernel. `None` for an empty input.
pub fn split(data: &[u8]) -> Option<(Option<Vec<u8>>, &[u8])> {
    let (&initrd_len, rest) = data.split_first()?;
    let (initrd, kernel) = rest.split_at(usize::from(initrd_len).min(rest.len()));
    Some(((initrd_len > 0).then(|| initrd.to_vec()), kernel))
}

/// Load `kernel`, which said it fits [`RAM`], into the shared memory (it must load) and hand
/// the memory and its entry state to `check`.
pub fn load_and_check(kernel: &dyn Loader, check: impl FnOnce(&GuestMemoryMmap, EntryState)) {
    let layout = MemoryLayout::new(RAM, true).expect("a valid layout");
    let machine = MachineInfo::one_vcpu(&layout);
    MEMORY.with(|mem| {
        let entry = kernel
            .load(mem, &machine)
            .expect("a kernel that fits loads");
        check(mem, entry);
    });
}

/// A value of the boot protocol's structures, which must be inside RAM.
pub fn read<T: ByteValued>(mem: &GuestMemoryMmap, at: u64) -> T {
    mem.read_obj(GuestAddress(at)).expect("inside RAM")
}

/// The kernel was handed [`CMDLINE`], NUL-terminated, at `at`.
pub fn assert_cmdline(mem: &GuestMemoryMmap, at: u64) {
    let mut cmdline = vec![0u8; CMDLINE.len() + 1];
    mem.read_slice(&mut cmdline, GuestAddress(at))
        .expect("the command line in RAM");
    assert_eq!(&cmdline[..CMDLINE.len()], CMDLINE.as_bytes());
    assert_eq!(cmdline[CMDLINE.len()], 0, "NUL-terminated");
}

/// The initrd the kernel was told of (`size` bytes at `at`) holds `bytes`.
pub fn assert_initrd(mem: &GuestMemoryMmap, at: u64, size: u64, bytes: &[u8]) {
    assert_eq!(size, bytes.len() as u64);
    let mut there = vec![0u8; bytes.len()];
    mem.read_slice(&mut there, GuestAddress(at))
        .expect("the initrd in RAM");
    assert_eq!(there, bytes);
}
