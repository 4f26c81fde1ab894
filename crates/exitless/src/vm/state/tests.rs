//! The memory file and the VM state against bad input: holes where the guest wrote nothing,
//! the bytes back in both backings, and a file or a state that does not fit refused.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

use crate::vm::state::memory::SavedMemory;
use crate::vm::{Irqchip, RamBacking, Vm, VmError};

/// RAM below 4 GiB and above it, as a machine with a PCI hole has.
const RAM: [(u64, usize); 2] = [(0, 16 << 20), (1 << 32, 8 << 20)];

/// A file under the temporary directory, removed when dropped.
pub(crate) struct TempFile(pub(crate) PathBuf);

impl TempFile {
    pub(crate) fn new(name: &str) -> Self {
        TempFile(std::env::temp_dir().join(format!("exitless-{}-{name}", std::process::id())))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A VM whose RAM is made of `backing`, where the guest wrote a word at the start of RAM, one
/// at the end of the low region and one in the high region, saved to `file`; and the file's
/// checksum.
fn saved(file: &TempFile, backing: RamBacking) -> (Vm, u32) {
    let vm = Vm::with_irqchip(&RAM, false, Irqchip::InKernel, backing).unwrap();
    let mem = vm.memory();
    mem.write_obj(0x1122_3344u32, GuestAddress(0x10)).unwrap();
    mem.write_obj(0x5566u16, GuestAddress((16 << 20) - 2))
        .unwrap();
    mem.write_obj(0x7788_99aau32, GuestAddress((1 << 32) + 0x30_0000))
        .unwrap();
    let mut out = std::fs::File::create(&file.0).unwrap();
    let checksum = vm.save_memory(&mut out).unwrap();
    (vm, checksum)
}

/// The file at `file`, as a restore takes it with `checksum`.
fn saved_memory(file: &TempFile, checksum: u32) -> SavedMemory {
    SavedMemory {
        file: std::fs::File::open(&file.0).unwrap(),
        checksum,
    }
}

fn words(vm: &Vm) -> (u32, u16, u32) {
    let mem = vm.memory();
    (
        mem.read_obj(GuestAddress(0x10)).unwrap(),
        mem.read_obj(GuestAddress((16 << 20) - 2)).unwrap(),
        mem.read_obj(GuestAddress((1 << 32) + 0x30_0000)).unwrap(),
    )
}

#[test]
fn a_mostly_empty_guest_leaves_a_sparse_file_that_both_backings_load() {
    let file = TempFile::new("sparse");
    let (_, checksum) = saved(&file, RamBacking::Private);
    let meta = std::fs::metadata(&file.0).unwrap();
    assert_eq!(meta.len(), 24 << 20, "as long as the RAM");
    // Three pages written (a filesystem may allocate a little more around them).
    assert!(
        meta.blocks() * 512 <= 64 << 10,
        "{} bytes on disk",
        meta.blocks() * 512
    );

    let open = || saved_memory(&file, checksum);
    let private =
        Vm::restored(&RAM, false, Irqchip::InKernel, RamBacking::Private, open()).unwrap();
    assert_eq!(words(&private), (0x1122_3344, 0x5566, 0x7788_99aa));
    // The guest's writes stay in the VM: the file is only read.
    private
        .memory()
        .write_obj(0u32, GuestAddress(0x10))
        .unwrap();
    let again = Vm::restored(&RAM, false, Irqchip::InKernel, RamBacking::Private, open()).unwrap();
    assert_eq!(words(&again).0, 0x1122_3344);

    let shared = Vm::restored(
        &RAM,
        false,
        Irqchip::InKernel,
        RamBacking::SharedMemfd,
        open(),
    )
    .unwrap();
    assert_eq!(words(&shared), (0x1122_3344, 0x5566, 0x7788_99aa));
    let memfd = shared
        .memory()
        .iter()
        .next()
        .unwrap()
        .file_offset()
        .unwrap();
    assert_eq!(
        memfd.file().metadata().unwrap().len(),
        24 << 20,
        "one memfd"
    );
}

#[test]
fn a_memory_file_of_another_size_is_refused() {
    let file = TempFile::new("truncated");
    let (_, checksum) = saved(&file, RamBacking::Private);
    let short = std::fs::OpenOptions::new()
        .write(true)
        .open(&file.0)
        .unwrap();
    short.set_len((24 << 20) - 4096).unwrap();
    let short = SavedMemory {
        file: short,
        checksum,
    };
    let e = Vm::restored(&RAM, false, Irqchip::InKernel, RamBacking::Private, short)
        .err()
        .expect("refused");
    assert!(matches!(e, VmError::StateMismatch(_)), "{e:?}");
    assert_eq!(
        e.to_string(),
        "the snapshot does not fit this VM: the memory file is 25161728 bytes, the machine's RAM 25165824"
    );
}

#[test]
fn a_vm_state_of_another_irqchip_or_with_a_swapped_chip_is_refused() {
    let in_kernel = Vm::new(&[(0, 1 << 20)], false).unwrap();
    let split = Vm::with_irqchip(
        &[(0, 1 << 20)],
        false,
        Irqchip::Split { pins: 24 },
        RamBacking::Private,
    )
    .unwrap();
    let full = in_kernel.save_state().unwrap();
    let offers_pit = kvm_ioctls::Kvm::new()
        .unwrap()
        .check_extension(kvm_ioctls::Cap::Pit2);
    assert!(full.irqchip.is_some());
    assert_eq!(
        full.pit.is_some(),
        offers_pit,
        "KVM's PIT where it offers one"
    );
    let bare = split.save_state().unwrap();
    assert!(bare.irqchip.is_none());
    assert!(bare.pit.is_none(), "a split irqchip has no PIT");
    for (vm, state) in [(&split, &full), (&in_kernel, &bare)] {
        let e = vm.restore_state(state).unwrap_err();
        assert!(e.to_string().contains("irqchip"), "{e}");
    }
    let mut swapped = in_kernel.save_state().unwrap();
    let chips = swapped.irqchip.as_mut().unwrap();
    std::mem::swap(&mut chips.pic_slave, &mut chips.ioapic);
    let e = in_kernel.restore_state(&swapped).unwrap_err();
    assert!(
        e.to_string()
            .contains("irqchip.pic_slave has chip id 2, not 1"),
        "{e}"
    );
    in_kernel.restore_state(&full).unwrap();
    split.restore_state(&bare).unwrap();
}

#[test]
fn saving_shared_ram_reads_only_the_pages_the_guest_wrote() {
    let file = TempFile::new("shared");
    let (vm, checksum) = saved(&file, RamBacking::SharedMemfd);
    let memfd = vm.memory().iter().next().unwrap().file_offset().unwrap();
    let allocated = memfd.file().metadata().unwrap().blocks() * 512;
    // Reading a memfd's hole through its mapping would allocate the page: all 24 MiB.
    assert!(
        allocated <= 64 << 10,
        "{allocated} bytes of the memfd allocated"
    );
    // The memfd's allocated zero pages and the file's holes sum the same.
    let open = saved_memory(&file, checksum);
    let back = Vm::restored(&RAM, false, Irqchip::InKernel, RamBacking::Private, open).unwrap();
    assert_eq!(words(&back), (0x1122_3344, 0x5566, 0x7788_99aa));
}

#[test]
fn a_memory_file_changed_since_it_was_saved_is_refused() {
    let file = TempFile::new("changed");
    let (_, checksum) = saved(&file, RamBacking::Private);
    // Restored with each backing: whether the file still matches its checksum.
    let matches = || {
        [RamBacking::Private, RamBacking::SharedMemfd].map(|backing| {
            let memory = saved_memory(&file, checksum);
            match Vm::restored(&RAM, false, Irqchip::InKernel, backing, memory) {
                Ok(_) => true,
                Err(VmError::MemoryChecksum) => false,
                Err(e) => panic!("{e}"),
            }
        })
    };
    let write = |bytes: &[u8], at: u64| {
        let out = std::fs::OpenOptions::new()
            .write(true)
            .open(&file.0)
            .unwrap();
        std::os::unix::fs::FileExt::write_all_at(&out, bytes, at).unwrap();
    };
    // A byte of a page the guest wrote, then a page it never wrote.
    write(&[0x45], 0x10);
    assert_eq!(matches(), [false; 2], "a byte changed");
    write(&[0x44], 0x10);
    assert_eq!(matches(), [true; 2], "as saved again");
    write(&[1], 8 << 20);
    assert_eq!(matches(), [false; 2], "a page added");
    // A zero page written where a hole was counts for nothing.
    write(&[0], 8 << 20);
    assert_eq!(matches(), [true; 2], "zeros are holes");
}
