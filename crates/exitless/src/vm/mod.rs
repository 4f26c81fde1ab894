//! The virtual machine: KVM handles, guest memory, extra memslots, vCPUs.

pub mod boot;
pub mod cpuid;
mod dirty_log;
pub mod kvm_run;
pub mod pause;
pub mod run_control;
pub mod shadow;
pub mod sleep;
pub mod state;
pub mod vcpu;

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use kvm_bindings::{
    KVM_API_VERSION, KVM_CAP_SPLIT_IRQCHIP, KVM_PIT_SPEAKER_DUMMY, kvm_enable_cap, kvm_pit_config,
    kvm_userspace_memory_region,
};
use kvm_ioctls::{Cap, Kvm, VmFd};
use vm_memory::{
    FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, MmapRegion,
};

use shadow::ShadowRegion;

/// Errors creating or configuring a VM. Each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    /// /dev/kvm is missing.
    #[error(
        "/dev/kvm does not exist: load the kvm module (modprobe kvm_intel or kvm_amd) or run on a host with virtualization"
    )]
    NoKvm,
    /// /dev/kvm cannot be opened.
    #[error(
        "cannot open /dev/kvm: permission denied; add yourself to the kvm group or run as root"
    )]
    KvmPermission,
    /// /dev/kvm opened, but what answers is not KVM's device (of the API version every KVM
    /// since Linux 2.6.22 has).
    #[error(
        "/dev/kvm is not the KVM device (KVM_GET_API_VERSION: {0}): it should be the character device 10:232 that the kvm module creates"
    )]
    NotKvm(String),
    /// Another KVM failure.
    #[error("KVM {what} failed: {source}")]
    Kvm {
        /// The ioctl that failed, as the message names it.
        what: &'static str,
        /// The errno KVM returned.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// A capability the VMM needs is missing.
    #[error("this KVM lacks {0}, which exitless needs")]
    MissingCap(&'static str),
    /// A shadow page outside its region.
    #[error("page {0} is outside the read-only shadow")]
    ShadowPage(u64),
    /// A `--cpu` template this host cannot give.
    #[error(transparent)]
    Cpu(#[from] cpuid::CpuError),
    /// Guest memory allocation failed.
    #[error("cannot allocate {size} bytes of guest memory: {reason}")]
    Memory {
        /// The guest RAM size asked for.
        size: usize,
        /// The host's reason, from the mmap failure.
        reason: String,
    },
    /// A snapshot's memory file could not be written or read.
    #[error("cannot {what}: {source}")]
    MemoryFile {
        /// What failed, as the message names it.
        what: &'static str,
        /// The host's error.
        #[source]
        source: std::io::Error,
    },
    /// A snapshot's memory file is not the one its description names.
    #[error(
        "the snapshot's memory file does not match its description's checksum (changed since \
         the snapshot was taken, or another snapshot's)"
    )]
    MemoryChecksum,
    /// A snapshot's state does not fit this VM (another vCPU count, another irqchip, another
    /// RAM size), or holds a value no VM has.
    #[error("the snapshot does not fit this VM: {0}")]
    StateMismatch(String),
    /// KVM no longer reads an MSR it read when the vCPU was created.
    #[error("KVM did not read MSR {0:#x}, which it read when the vCPU was created")]
    MsrUnreadable(u32),
    /// KVM refused one of a snapshot's MSRs: the state is of another host or corrupt.
    #[error("KVM did not take MSR {index:#x} (value {data:#x}) of the snapshot")]
    MsrNotSet {
        /// The MSR's index.
        index: u32,
        /// The value refused.
        data: u64,
    },
}

pub(crate) fn kvm_err(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> VmError {
    move |source| VmError::Kvm { what, source }
}

/// Open the KVM device at `path`, turning the common failures into advice. What answers must
/// be KVM (api.rst §4.1: KVM_GET_API_VERSION is 12): any other device would refuse every
/// capability check, and the first one would be blamed.
fn open_kvm(path: &std::ffi::CStr) -> Result<Kvm, VmError> {
    let kvm = Kvm::new_with_path(path).map_err(|e| match e.errno() {
        libc::ENOENT => VmError::NoKvm,
        libc::EACCES | libc::EPERM => VmError::KvmPermission,
        _ => VmError::Kvm {
            what: "open /dev/kvm",
            source: e,
        },
    })?;
    match kvm.get_api_version() {
        version if u32::try_from(version) == Ok(KVM_API_VERSION) => Ok(kvm),
        -1 => Err(VmError::NotKvm(std::io::Error::last_os_error().to_string())),
        version => Err(VmError::NotKvm(format!(
            "version {version}, not {KVM_API_VERSION}"
        ))),
    }
}

/// What guest RAM is made of.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RamBacking {
    /// Anonymous private memory: only exitless and KVM map it. Cheaper to fault in and to free
    /// than the memfd (docs/run.md), and it gets transparent huge pages where the host gives
    /// them to anonymous memory unasked (`transparent_hugepage/enabled` = `always`).
    #[default]
    Private,
    /// One memfd, mapped shared: every region is a [`FileOffset`] into it, at consecutive
    /// offsets, so another process (a vhost-user backend, `VHOST_USER_SET_MEM_TABLE`) can map
    /// the same pages. Huge pages here follow `transparent_hugepage/shmem_enabled` instead.
    SharedMemfd,
}

/// The seals guest RAM's memfd carries: its size fixed, so that an exitless it is handed to
/// (`migrate local:`) can map it without fearing a SIGBUS from a source that shrinks it.
const RAM_SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// A memfd of `size` bytes for guest RAM (memfd_create(2), close-on-exec), sealed at that size.
/// By hand: one call libc has, and no crate in the tree wraps it.
fn ram_memfd(size: usize) -> Result<File, String> {
    // SAFETY: the name is a NUL-terminated string literal; the call reads nothing else.
    let fd = unsafe {
        libc::memfd_create(
            c"exitless-guest-ram".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if fd < 0 {
        return Err(format!("memfd_create: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` is a descriptor memfd_create just opened, owned by nothing else.
    let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    file.set_len(size as u64)
        .map_err(|e| format!("size the guest RAM memfd (ftruncate): {e}"))?;
    // SAFETY: F_ADD_SEALS takes an int and reads nothing else.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, RAM_SEALS) } < 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!("seal the guest RAM memfd (F_ADD_SEALS): {e}"));
    }
    Ok(file)
}

/// Check that `memfd`, handed over by another exitless, can be guest RAM of `size` bytes: a
/// memfd of that size whose size is sealed (a file that shrank under the mapping would kill
/// this process with SIGBUS on the guest's next access).
fn check_handed_memfd(memfd: &File, size: usize) -> Result<(), String> {
    // SAFETY: F_GET_SEALS takes no argument.
    let seals = unsafe { libc::fcntl(memfd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!(
            "the guest RAM handed over is not a memfd (F_GET_SEALS: {e})"
        ));
    }
    if seals & RAM_SEALS != RAM_SEALS {
        return Err("the guest RAM handed over can change size (its memfd is not sealed)".into());
    }
    let len = memfd.metadata().map_err(|e| format!("fstat: {e}"))?.len();
    if len != size as u64 {
        return Err(format!(
            "the guest RAM handed over is {len} bytes, not the machine's {size}"
        ));
    }
    Ok(())
}

/// Map guest RAM in `ram`, `(guest-physical base, bytes)` regions in address order, backed as
/// `backing` says.
fn map_ram(ram: &[(u64, usize)], backing: RamBacking) -> Result<GuestMemoryMmap, VmError> {
    let size = ram.iter().map(|r| r.1).sum();
    let memfd = match backing {
        RamBacking::Private => None,
        RamBacking::SharedMemfd => {
            Some(ram_memfd(size).map_err(|reason| VmError::Memory { size, reason })?)
        }
    };
    map_ram_in(ram, memfd)
}

/// Map guest RAM in `ram` from `memfd` (its regions at consecutive offsets), or private.
fn map_ram_in(ram: &[(u64, usize)], memfd: Option<File>) -> Result<GuestMemoryMmap, VmError> {
    let size = ram.iter().map(|r| r.1).sum();
    let memfd = memfd.map(Arc::new);
    let mut offset = 0;
    let ranges: Vec<(GuestAddress, usize, Option<FileOffset>)> = ram
        .iter()
        .map(|&(base, len)| {
            let file = memfd
                .as_ref()
                .map(|f| FileOffset::from_arc(f.clone(), offset));
            offset += len as u64;
            (GuestAddress(base), len, file)
        })
        .collect();
    GuestMemoryMmap::<()>::from_ranges_with_files(&ranges).map_err(|e| VmError::Memory {
        size,
        reason: e.to_string(),
    })
}

/// Leave guest RAM out of the VMM's core dumps (madvise(2) MADV_DONTDUMP): it is the guest's
/// data, not the VMM's state, and as large as the guest's memory.
fn exclude_from_core_dumps(memory: &GuestMemoryMmap) -> Result<(), VmError> {
    for region in memory.iter() {
        // SAFETY: the range is one whole mapping `memory` owns; MADV_DONTDUMP changes only
        // whether a core dump includes it, not its contents.
        let r =
            unsafe { libc::madvise(region.as_ptr().cast(), region.size(), libc::MADV_DONTDUMP) };
        if r != 0 {
            return Err(VmError::Memory {
                size: region.size(),
                reason: format!("madvise MADV_DONTDUMP: {}", std::io::Error::last_os_error()),
            });
        }
    }
    Ok(())
}

/// Memory that a memslot maps: kept alive until the slot is deleted.
type SlotOwner = Arc<dyn Send + Sync>;

/// Slot numbers each read-only shadow reserves: it can have one hole fewer at once.
pub const SHADOW_SLOTS: u32 = 16;

/// A VM with an in-kernel irqchip and guest RAM in one or more regions (from 0, and from 4 GiB
/// on a machine with more RAM than fits below the PCI hole), one memslot each.
///
/// Every memslot's memory is owned by whoever deletes the slot, and the slot is deleted before
/// that memory can be unmapped: guest RAM by the `Vm` when it is dropped, each read-only
/// shadow by its [`ShadowRegion`] when the last holder drops it. The `VmFd` is shared (irqfds,
/// ioeventfds, routes) and may outlive both, and KVM would keep mapping a slot's host range for
/// as long as the VM file is open.
pub struct Vm {
    kvm: Kvm,
    fd: Arc<VmFd>,
    memory: GuestMemoryMmap,
    /// The RAM slots registered, in slot order.
    slots: Vec<kvm_userspace_memory_region>,
    /// Read-only shadows; each deletes its own slots when the last holder drops it.
    shadows: Vec<Arc<ShadowRegion>>,
    next_slot: u32,
    /// Where the interrupt controllers are: which a snapshot holds (`state`).
    irqchip: Irqchip,
    /// KVM's i8254 PIT was created (in-kernel irqchip, `KVM_CAP_PIT2`).
    kernel_pit: bool,
}

/// Where the interrupt controllers are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Irqchip {
    /// KVM's local APICs, IOAPIC and PICs (`KVM_CREATE_IRQCHIP`).
    InKernel,
    /// KVM's local APICs only, with an IOAPIC of `pins` pins in userspace
    /// (`KVM_CAP_SPLIT_IRQCHIP`): no PIC, and no PIT either.
    Split {
        /// The userspace IOAPIC's pins.
        pins: u8,
    },
}

impl Vm {
    /// Open KVM and create a VM with private RAM in `ram`, `(guest-physical base, bytes)`
    /// regions in address order, left out of core dumps unless `in_core_dumps`.
    pub fn new(ram: &[(u64, usize)], in_core_dumps: bool) -> Result<Self, VmError> {
        Self::with_irqchip(ram, in_core_dumps, Irqchip::InKernel, RamBacking::Private)
    }

    /// As [`Vm::new`], with the interrupt controllers `irqchip` puts in the kernel and RAM
    /// made of `backing`.
    pub fn with_irqchip(
        ram: &[(u64, usize)],
        in_core_dumps: bool,
        irqchip: Irqchip,
        backing: RamBacking,
    ) -> Result<Self, VmError> {
        Self::build(in_core_dumps, irqchip, || map_ram(ram, backing))
    }

    /// As [`Vm::with_irqchip`], guest RAM the memfd another exitless handed over
    /// (`migrate local:`), checked first.
    pub fn on_memfd(
        ram: &[(u64, usize)],
        in_core_dumps: bool,
        irqchip: Irqchip,
        memfd: File,
    ) -> Result<Self, VmError> {
        let size = ram.iter().map(|r| r.1).sum();
        check_handed_memfd(&memfd, size).map_err(|reason| VmError::Memory { size, reason })?;
        Self::build(in_core_dumps, irqchip, || map_ram_in(ram, Some(memfd)))
    }

    /// Open KVM, create the VM and its `irqchip`, then guest RAM (`memory`), one memslot per
    /// region.
    fn build(
        in_core_dumps: bool,
        irqchip: Irqchip,
        memory: impl FnOnce() -> Result<GuestMemoryMmap, VmError>,
    ) -> Result<Self, VmError> {
        let kvm = open_kvm(c"/dev/kvm")?;
        for (cap, name) in [
            (Cap::Irqchip, "an in-kernel irqchip"),
            (Cap::UserMemory, "user memory slots"),
            (Cap::ReadonlyMem, "read-only memory slots"),
            (Cap::Ioeventfd, "ioeventfd"),
        ] {
            if !kvm.check_extension(cap) {
                return Err(VmError::MissingCap(name));
            }
        }
        let fd = kvm.create_vm().map_err(kvm_err("create VM"))?;
        // The irqchip must exist before any vCPU (docs/host-kvm.md).
        let mut kernel_pit = false;
        match irqchip {
            Irqchip::InKernel => {
                fd.create_irq_chip().map_err(kvm_err("create irqchip"))?;
                // A PC's i8254 PIT, KVM's own where it offers one (as Firecracker does): Linux
                // programs it at boot (ports 0x40-0x43) and some kernels wait for its tick on
                // IRQ 0. The dummy speaker port (0x61) keeps its channel 2 gate readable.
                if kvm.check_extension(Cap::Pit2) {
                    let config = kvm_pit_config {
                        flags: KVM_PIT_SPEAKER_DUMMY,
                        ..Default::default()
                    };
                    fd.create_pit2(config).map_err(kvm_err("create the PIT"))?;
                    kernel_pit = true;
                }
            }
            Irqchip::Split { pins } => {
                if !kvm.check_extension(Cap::SplitIrqchip) {
                    return Err(VmError::MissingCap("a split irqchip"));
                }
                // api.rst §7.4: args[0] is the number of IOAPIC pins (GSIs below it are the
                // userspace IOAPIC's, and their level-triggered routes' EOIs exit).
                let cap = kvm_enable_cap {
                    cap: KVM_CAP_SPLIT_IRQCHIP,
                    args: [pins.into(), 0, 0, 0],
                    ..Default::default()
                };
                fd.enable_cap(&cap).map_err(kvm_err("split the irqchip"))?;
            }
        }
        let memory = memory()?;
        if !in_core_dumps {
            exclude_from_core_dumps(&memory)?;
        }
        let mut vm = Vm {
            kvm,
            fd: Arc::new(fd),
            memory,
            slots: Vec::new(),
            shadows: Vec::new(),
            next_slot: 0,
            irqchip,
            kernel_pit,
        };
        let regions: Vec<(u64, u64, u64)> = vm
            .memory
            .iter()
            .map(|r| {
                let host = vm
                    .memory
                    .get_host_address(r.start_addr())
                    .expect("region start is mapped");
                (r.start_addr().0, r.len(), host as u64)
            })
            .collect();
        for (gpa, len, host) in regions {
            vm.add_ram_slot(gpa, len, host)?;
        }
        Ok(vm)
    }

    /// Reserve `n` slot numbers. KVM rejects one past its limit (EINVAL) when it is used.
    fn reserve_slots(&mut self, n: u32) -> std::ops::Range<u32> {
        let start = self.next_slot;
        self.next_slot = self.next_slot.saturating_add(n);
        start..self.next_slot
    }

    fn add_ram_slot(&mut self, gpa: u64, len: u64, host: u64) -> Result<(), VmError> {
        let region = kvm_userspace_memory_region {
            slot: self.reserve_slots(1).start,
            flags: 0,
            guest_phys_addr: gpa,
            memory_size: len,
            userspace_addr: host,
        };
        // SAFETY: `host..host+len` is a live mapping owned by `self.memory`, kept by `self`
        // until `Drop` deletes the slot; KVM checks overlaps.
        unsafe { self.fd.set_user_memory_region(region) }.map_err(kvm_err("set memory region"))?;
        self.slots.push(region);
        Ok(())
    }

    /// Map the region `region(&owner)` read-only at `gpa`: guest reads are plain memory
    /// accesses, writes exit as MMIO. The shadow keeps `owner`, and so the region (which
    /// `region` borrows from it), until it has deleted its slots: when the VM and every other
    /// holder of the returned handle (which can take pages out of the mapping) have dropped it.
    pub fn add_readonly_region<T: Send + Sync + 'static>(
        &mut self,
        gpa: u64,
        owner: Arc<T>,
        region: fn(&T) -> &MmapRegion,
    ) -> Result<Arc<ShadowRegion>, VmError> {
        let (len, host) = {
            let r = region(&owner);
            (r.size() as u64, r.as_ptr() as u64)
        };
        let slots = self.reserve_slots(SHADOW_SLOTS);
        let shadow = Arc::new(ShadowRegion::new(
            self.fd.clone(),
            gpa,
            host,
            len,
            slots,
            owner,
        )?);
        self.shadows.push(shadow.clone());
        Ok(shadow)
    }

    /// The KVM system handle.
    pub fn kvm(&self) -> &Kvm {
        &self.kvm
    }

    /// The VM's file descriptor, for VM ioctls.
    pub fn fd(&self) -> &VmFd {
        &self.fd
    }

    /// The VM handle, for devices that register irqfds, ioeventfds and routes.
    pub fn shared_fd(&self) -> Arc<VmFd> {
        self.fd.clone()
    }

    /// Whether KVM models the machine's i8254 PIT; where it does not, the machine needs one of
    /// its own (`devices::pit`).
    pub fn has_kernel_pit(&self) -> bool {
        self.kernel_pit
    }

    /// Guest RAM, as mapped into the VM's memslots.
    pub fn memory(&self) -> &GuestMemoryMmap {
        &self.memory
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        for region in self.slots.drain(..) {
            let delete = kvm_userspace_memory_region {
                memory_size: 0,
                ..region
            };
            // SAFETY: a zero `memory_size` deletes the slot (api.rst §4.35,
            // KVM_SET_USER_MEMORY_REGION); no memory is mapped.
            if unsafe { self.fd.set_user_memory_region(delete) }.is_err() {
                // KVM may still map the range: leaking it is the only safe outcome, by keeping
                // a clone of guest RAM's (shared) regions alive.
                std::mem::forget(self.memory.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvm_bindings::KVM_MEM_READONLY;
    use vm_memory::Bytes;

    #[test]
    fn ram_in_two_regions_is_two_memslots_and_one_guest_memory() {
        let (low, high) = ((0, 1 << 20), (1 << 32, 1 << 20));
        let vm = Vm::new(&[low, high], false).unwrap();
        let slots: Vec<(u64, u64)> = vm
            .slots
            .iter()
            .map(|s| (s.guest_phys_addr, s.memory_size))
            .collect();
        assert_eq!(slots, vec![(0, 1 << 20), (1 << 32, 1 << 20)]);
        let mem = vm.memory();
        mem.write_obj(0xa5u8, GuestAddress((1 << 32) + 5)).unwrap();
        assert_eq!(
            mem.read_obj::<u8>(GuestAddress((1 << 32) + 5)).unwrap(),
            0xa5
        );
        assert!(
            !mem.check_range(GuestAddress((1 << 20) - 8), 16),
            "the hole between the regions is no memory"
        );
    }

    #[test]
    fn shared_ram_is_one_memfd_that_a_second_mapping_sees() {
        let (low, high) = ((0, 1 << 20), (1 << 32, 2 << 20));
        let vm = Vm::with_irqchip(
            &[low, high],
            false,
            Irqchip::InKernel,
            RamBacking::SharedMemfd,
        )
        .unwrap();
        let mem = vm.memory();
        let files: Vec<&FileOffset> = mem.iter().map(|r| r.file_offset().unwrap()).collect();
        assert!(Arc::ptr_eq(files[0].arc(), files[1].arc()), "one memfd");
        assert_eq!(
            files.iter().map(|f| f.start()).collect::<Vec<_>>(),
            vec![0, 1 << 20],
            "consecutive offsets"
        );
        let memfd = files[0].file().try_clone().unwrap();
        assert_eq!(memfd.metadata().unwrap().len(), 3 << 20, "sized to the RAM");
        // What another process would do with the fd SET_MEM_TABLE sends.
        let other = MmapRegion::<()>::from_file(FileOffset::new(memfd, 0), 3 << 20).unwrap();
        mem.write_obj(0x1234_5678u32, GuestAddress((1 << 32) + 0x10))
            .unwrap();
        mem.write_obj(0xa5u8, GuestAddress(0x20)).unwrap();
        // SAFETY: both offsets lie inside the 3 MiB mapping `other` owns.
        let (high_word, low_byte) = unsafe {
            (
                other.as_ptr().add((1 << 20) + 0x10).cast::<u32>().read(),
                other.as_ptr().add(0x20).read(),
            )
        };
        assert_eq!((high_word, low_byte), (0x1234_5678, 0xa5));
        let private = Vm::new(&[low], false).unwrap();
        assert!(
            private.memory().iter().all(|r| r.file_offset().is_none()),
            "private RAM is anonymous"
        );
    }

    #[test]
    fn a_missing_kvm_device_says_what_to_do() {
        let e = open_kvm(c"/nonexistent/kvm").expect_err("no such device");
        assert!(matches!(e, VmError::NoKvm));
        assert!(e.to_string().contains("modprobe"));
    }

    #[test]
    fn a_device_that_is_not_kvm_is_named_so() {
        // Opens like /dev/kvm, answers no KVM ioctl: before the check, "lacks an in-kernel
        // irqchip".
        let e = open_kvm(c"/dev/null").expect_err("not KVM");
        assert_eq!(
            e.to_string(),
            "/dev/kvm is not the KVM device (KVM_GET_API_VERSION: Inappropriate ioctl for device \
             (os error 25)): it should be the character device 10:232 that the kvm module creates"
        );
    }

    #[test]
    fn a_readonly_region_lives_until_its_slot_is_deleted_with_the_vm() {
        const GPA: u64 = 0x1000_0000;
        let mut vm = Vm::new(&[(0, 1 << 20)], false).unwrap();
        let region = Arc::new(MmapRegion::<()>::new(0x1000).unwrap());
        let weak = Arc::downgrade(&region);
        vm.add_readonly_region(GPA, region, |r| r)
            .expect("map the window");
        assert!(weak.upgrade().is_some(), "the VM owns the window");
        let shared = vm.shared_fd();
        let overlapping = kvm_userspace_memory_region {
            slot: 100,
            flags: KVM_MEM_READONLY,
            guest_phys_addr: GPA,
            memory_size: 0x1000,
            userspace_addr: vm.memory().get_host_address(GuestAddress(0)).unwrap() as u64,
        };
        // SAFETY: KVM refuses the overlapping slot; nothing is mapped.
        assert!(unsafe { shared.set_user_memory_region(overlapping) }.is_err());
        drop(vm);
        assert!(weak.upgrade().is_none(), "freed with the VM");
        // The VM file is still open through `shared`: the window's slot must be gone, or KVM
        // would still map freed memory. A new slot over the same range proves it.
        let scratch = MmapRegion::<()>::new(0x1000).unwrap();
        let replacement = kvm_userspace_memory_region {
            userspace_addr: scratch.as_ptr() as u64,
            ..overlapping
        };
        // SAFETY: `scratch` outlives the slot, which is deleted before it is dropped.
        unsafe { shared.set_user_memory_region(replacement) }.expect("the range is free");
        let delete = kvm_userspace_memory_region {
            memory_size: 0,
            ..replacement
        };
        // SAFETY: deleting the slot maps nothing.
        unsafe { shared.set_user_memory_region(delete) }.unwrap();
    }
}
