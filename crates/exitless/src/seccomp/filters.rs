//! What each kind of thread may call, and how the lists become BPF.
//!
//! The lists were taken from what the threads do (`strace -ff` of `exitless bench` and
//! `exitless probe --console`) and from the code paths that a short run may miss: error and
//! teardown paths, logging, panics (the message goes to stderr with `write`), `abort`. Each
//! entry says why it is there. The targets are x86-64 Linux and glibc (`x86_64-unknown-linux-gnu`):
//! another libc makes other calls for the same work.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use vhost::vhost_kern::vhost_binding::{
    VHOST_GET_FEATURES, VHOST_GET_VRING_BASE, VHOST_NET_SET_BACKEND, VHOST_SET_FEATURES,
    VHOST_SET_MEM_TABLE, VHOST_SET_OWNER, VHOST_SET_VRING_ADDR, VHOST_SET_VRING_BASE,
    VHOST_SET_VRING_CALL, VHOST_SET_VRING_KICK, VHOST_SET_VRING_NUM,
};

use super::ThreadKind;
use super::kvm::*;

/// The signal that kicks a vCPU thread out of `KVM_RUN` (its handler does nothing; the
/// interrupted ioctl returns EINTR). Defined here, below the vCPU code, because the main
/// thread's filter pins it: the only signal whose handler it may install.
pub fn kick_signal() -> libc::c_int {
    vmm_sys_util::signal::SIGRTMIN()
}

/// The size of a block device in bytes (linux/fs.h: `_IOR(0x12, 114, size_t)`, a `size_t`
/// being 8 bytes on x86-64), which libc lacks: a disk image on a block device is sized with
/// it (`virtio::block::image`).
pub const BLKGETSIZE64: libc::c_ulong =
    vmm_sys_util::ioctl::ioctl_expr(vmm_sys_util::ioctl::_IOC_READ, 0x12, 114, 8);

/// A block device's alignment offset in bytes (linux/fs.h: `_IO(0x12, 122)`), which libc
/// lacks beside its `BLKPBSZGET`, `BLKIOMIN` and `BLKIOOPT`: a disk image's topology
/// (`virtio::block::image`).
pub const BLKALIGNOFF: libc::c_ulong =
    vmm_sys_util::ioctl::ioctl_expr(vmm_sys_util::ioctl::_IOC_NONE, 0x12, 122, 0);

/// Discard a byte range of a block device (linux/fs.h: `_IO(0x12, 119)`, two u64s: offset and
/// length): virtio-blk's VIRTIO_BLK_T_DISCARD on a disk that is one (`virtio::block`).
pub const BLKDISCARD: libc::c_ulong =
    vmm_sys_util::ioctl::ioctl_expr(vmm_sys_util::ioctl::_IOC_NONE, 0x12, 119, 0);

/// A system call a kind of thread may make, and with which arguments.
#[derive(Clone, Debug)]
pub(crate) struct Allowed {
    /// Its number (`SYS_*`).
    pub(crate) nr: libc::c_long,
    /// The arguments it may take.
    pub(crate) args: Args,
}

/// The arguments a system call may take.
#[derive(Clone, Debug)]
pub(crate) enum Args {
    /// Any arguments: the call itself is what is allowed.
    Any,
    /// Argument `arg` is one of `values`. Compared as 32 bits: every argument checked so is an
    /// `int` or `unsigned int` to the kernel (an ioctl's request, `prctl`'s option, a signal, a
    /// pid, an `fcntl` command), which ignores the upper half.
    OneOf {
        /// Which argument, from 0.
        arg: u8,
        /// The values it may have.
        values: Vec<u64>,
    },
    /// Argument `arg` has none of the bits of `mask`.
    Without {
        /// Which argument, from 0.
        arg: u8,
        /// The bits it must not have.
        mask: u64,
    },
}

impl Allowed {
    fn only(self, arg: u8, values: impl IntoIterator<Item = u64>) -> Self {
        Allowed {
            args: Args::OneOf {
                arg,
                values: values.into_iter().collect(),
            },
            ..self
        }
    }

    fn without(self, arg: u8, mask: u64) -> Self {
        Allowed {
            args: Args::Without { arg, mask },
            ..self
        }
    }
}

/// `sys!(SYS_futex)`: the system call, with any arguments.
macro_rules! sys {
    ($nr:ident) => {
        Allowed {
            nr: libc::$nr,
            args: Args::Any,
        }
    };
}

/// A non-negative C constant as a filter value.
fn value(v: libc::c_int) -> u64 {
    u64::try_from(v).expect("a non-negative constant")
}

/// What any thread does, whatever its work: the Rust standard library and glibc under it.
fn runtime() -> Vec<Allowed> {
    vec![
        // Mutexes, condition variables, channels, once-cells and joins.
        sys!(SYS_futex),
        // std's channels back off by yielding when contended.
        sys!(SYS_sched_yield),
        // The allocator: glibc's thread arenas are mapped heaps, grown with mprotect and
        // trimmed with madvise or munmap; big blocks are mapped alone (and grown with mremap);
        // a thread that shares the main arena moves the break. Nothing here maps code.
        sys!(SYS_mmap).without(2, value(libc::PROT_EXEC)),
        sys!(SYS_mprotect).without(2, value(libc::PROT_EXEC)),
        sys!(SYS_munmap),
        sys!(SYS_madvise),
        sys!(SYS_mremap),
        sys!(SYS_brk),
        // `Instant::now` and timed waits, on clock sources the vDSO cannot read.
        sys!(SYS_clock_gettime),
        // Output: log lines, console bytes, eventfd signals, a panic's message (which names the
        // thread's id: gettid), the report of a forbidden call.
        sys!(SYS_write),
        sys!(SYS_gettid),
        // Dropping a file descriptor; with debug assertions std first checks that it is open
        // (fcntl F_GETFD), to catch a descriptor closed twice.
        sys!(SYS_close),
        sys!(SYS_fcntl).only(1, [value(libc::F_GETFD)]),
        // Back from a signal handler (the vCPU kick).
        sys!(SYS_rt_sigreturn),
        // A sleep interrupted by SIGSTOP (Ctrl-Z) or a debugger attaching is resumed on
        // SIGCONT by the kernel's restart_syscall(2), in whichever thread was sleeping.
        sys!(SYS_restart_syscall),
        // The end of a thread: glibc blocks signals and releases the stack (madvise, above);
        // std takes down the alternate signal stack it reports stack overflows on.
        sys!(SYS_rt_sigprocmask),
        sys!(SYS_sigaltstack),
        // A crash (SIGSEGV, SIGBUS): std's handler, finding no stack overflow, puts the
        // default action back and returns, so the fault ends the process as a crash, by its
        // signal, and not as a violation of the filter.
        sys!(SYS_rt_sigaction).only(0, [value(libc::SIGSEGV), value(libc::SIGBUS)]),
        sys!(SYS_exit),
        // The end of the process from any thread: exit(), and the violation report's _exit.
        sys!(SYS_exit_group),
        // abort() (a failed allocation, a panic while panicking) raises SIGABRT with
        // tgkill(getpid(), tid, SIGABRT), so the process ends as it would without seccomp.
        // Signals go to this process's threads only (the main thread's kicks too).
        sys!(SYS_getpid),
        sys!(SYS_tgkill).only(0, [u64::from(std::process::id())]),
    ]
}

/// A vCPU thread: runs the guest and, on an exit, the device model code the access reaches.
fn vcpu() -> Vec<Allowed> {
    vec![sys!(SYS_ioctl).only(
        1,
        [
            KVM_RUN(),
            // The guest's register writes reach devices that place and remove doorbells
            // (ioeventfds), bind and unbind MSI irqfds and commit their routes, send MSIs
            // directly, and start or stop trapping a function's page of the ECAM shadow (a
            // memslot change).
            KVM_IOEVENTFD(),
            KVM_IRQFD(),
            KVM_SET_GSI_ROUTING(),
            KVM_SIGNAL_MSI(),
            KVM_SET_USER_MEMORY_REGION(),
            // Read once to report an instruction KVM cannot emulate: the guest's rip and code
            // segment, and where that address lies in guest RAM (to show the bytes there).
            KVM_GET_REGS(),
            KVM_GET_SREGS(),
            KVM_TRANSLATE(),
            // Waking from S3 (`vm::sleep`): the boot vCPU restarts at the waking vector, the
            // others wait for INIT/SIPI.
            KVM_SET_REGS(),
            KVM_SET_SREGS(),
            KVM_SET_MP_STATE(),
            // A snapshot's vCPU state, taken by the parked vCPU itself (`Pause::save_vcpus`),
            // with KVM_GET_REGS and KVM_GET_SREGS above.
            KVM_GET_MP_STATE(),
            KVM_GET_XSAVE(),
            KVM_GET_XCRS(),
            KVM_GET_DEBUGREGS(),
            KVM_GET_LAPIC(),
            KVM_GET_MSRS(),
            KVM_GET_VCPU_EVENTS(),
            KVM_GET_TSC_KHZ(),
            // After a pause, the guest is told its vCPU was stopped (`vcpu::pause`).
            KVM_KVMCLOCK_CTRL(),
        ],
    )]
}

/// A device thread: sleeps on its eventfds, works on the queues in guest memory (plain memory
/// accesses) and sends interrupts; a virtio-blk device's thread also reads and writes its disk
/// file, a tap-backed virtio-net device's its tap.
fn device() -> Vec<Allowed> {
    vec![
        // Wait for queue, resample, command and stop events, then consume them; wait for a
        // tap's frames and read them; send a frame from the guest's buffers in place.
        sys!(SYS_epoll_wait),
        sys!(SYS_read),
        sys!(SYS_writev),
        // virtio-blk requests (`virtio::block`): reads and writes at offsets of the disk file
        // opened by the main thread (never moving its position), straight into and out of
        // the guest's buffers, and VIRTIO_BLK_T_FLUSH's fsync. The thread opens nothing: it
        // reaches only the file it was given.
        sys!(SYS_preadv),
        sys!(SYS_pwritev),
        sys!(SYS_fsync),
        // VIRTIO_BLK_T_DISCARD on a file and VIRTIO_BLK_T_WRITE_ZEROES on a file or a block
        // device: holes punched and ranges zeroed, never growing it (both modes the device
        // uses keep the size).
        sys!(SYS_fallocate).only(
            1,
            [
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
            ]
            .map(value),
        ),
        // ... or on the disk's io_uring, made by the main thread and narrowed to vectored
        // reads and writes of that one file (`virtio::block::io`): submitting and waiting.
        sys!(SYS_io_uring_enter),
        sys!(SYS_ioctl).only(
            1,
            [
                // MSIs sent directly; a first-use route commit and the irqfd binds after it; a
                // function's vectors released when the thread drops the last reference to
                // them as the machine is torn down.
                KVM_SIGNAL_MSI(),
                KVM_SET_GSI_ROUTING(),
                KVM_IRQFD(),
                // A multiqueue tap's queues attached and detached as the driver enables its
                // pairs (VQ_PAIRS_SET, reset); the main thread detaches all but the first as
                // it builds the device.
                libc::TUNSETQUEUE,
                // The tap's offloads set to what the driver takes, at DRIVER_OK, a restore
                // and a reset (`virtio::net::tap`).
                libc::TUNSETOFFLOAD,
                // VIRTIO_BLK_T_DISCARD on a disk that is a block device.
                BLKDISCARD,
            ],
        ),
    ]
}

/// A vhost-user device's thread (`virtio::vhost_user`): it sends the backend its messages on
/// the socket and reads the replies, watches the call fds of masked vectors, and connects
/// again after the backend went away; and its deadline's watchdog thread. The same thread of
/// a NIC on the kernel's vhost-net makes the ioctls those messages were modelled on.
fn vhost_user() -> Vec<Allowed> {
    vec![
        // Wait for commands, the watch fds and the socket's hangup, and consume them; a
        // socket connected again joins the epoll set.
        sys!(SYS_epoll_wait),
        sys!(SYS_epoll_ctl),
        sys!(SYS_read),
        // vhost-user messages, with the fds they carry (SCM_RIGHTS).
        sys!(SYS_sendmsg),
        sys!(SYS_recvmsg),
        // Connecting again after a hangup: a new socket (AF_UNIX only), its connect, and the
        // read and write timeouts that keep a hung backend from holding a vCPU.
        sys!(SYS_socket).only(0, [value(libc::AF_UNIX)]),
        sys!(SYS_connect),
        sys!(SYS_setsockopt).only(1, [value(libc::SOL_SOCKET)]),
        // The watchdog's end of an exchange past its deadline (`virtio::vhost_user::deadline`).
        sys!(SYS_shutdown),
        sys!(SYS_ioctl).only(
            1,
            [
                // A watch fd's signal sent as the vector's message (a first-use commit first).
                KVM_SIGNAL_MSI(),
                KVM_SET_GSI_ROUTING(),
                KVM_IRQFD(),
                // The kernel's vhost-net (`virtio::vhost_user::kernel`), on the files the main
                // thread opened and owns: the driver's features and guest RAM at DRIVER_OK,
                // each ring's set-up, call fd swaps, the tap as a ring's backend (none to stop
                // it) and where a stopped ring is.
                VHOST_SET_FEATURES(),
                VHOST_SET_MEM_TABLE(),
                VHOST_SET_VRING_NUM(),
                VHOST_SET_VRING_ADDR(),
                VHOST_SET_VRING_BASE(),
                VHOST_GET_VRING_BASE(),
                VHOST_SET_VRING_CALL(),
                VHOST_SET_VRING_KICK(),
                VHOST_NET_SET_BACKEND(),
                // Its tap: the offloads the driver took, and a multiqueue tap's queues
                // attached and detached with their pairs.
                libc::TUNSETOFFLOAD,
                libc::TUNSETQUEUE,
            ],
        ),
    ]
}

/// The console input thread: waits for stdin or its stop event, reads stdin, puts bytes into
/// the UART (plain memory, and an eventfd write for the receive interrupt, in runtime()).
fn console_input() -> Vec<Allowed> {
    vec![
        // Wait for input, room in the receive FIFO, or the stop event.
        sys!(SYS_poll),
        // Read stdin, and consume the room event.
        sys!(SYS_read),
    ]
}

/// The control socket's thread (`api`): waits for a client or its stop event, takes one
/// connection at a time with a deadline on each, and removes the socket's file at the end.
fn api() -> Vec<Allowed> {
    let own = vec![
        // Wait for a client on the listening socket, the stop eventfd, or the migration's end
        // (its eventfd read, below).
        sys!(SYS_poll),
        // std's UnixListener::accept (SOCK_CLOEXEC).
        sys!(SYS_accept4),
        // The socket's file, when the run ends.
        sys!(SYS_unlink),
        // `vm.snapshot` (machine::snapshot): the directory, made if absent, opened, its owner
        // and mode checked against this user (statx, geteuid) and locked (flock); guest
        // memory's file (emptied, its pages written where they are not zero, then sized), the
        // description's temporary file renamed into place, each synced, the older snapshot's
        // memory file removed, each relative to the directory (openat, renameat, unlinkat).
        sys!(SYS_mkdir),
        // DirBuilder::recursive's look at what is there when mkdir fails (statx).
        sys!(SYS_statx),
        sys!(SYS_geteuid),
        sys!(SYS_flock),
        sys!(SYS_openat),
        sys!(SYS_renameat),
        sys!(SYS_unlinkat),
        sys!(SYS_ftruncate),
        sys!(SYS_pwrite64),
        // Where guest RAM is the shared memfd, only its data is read: lseek SEEK_DATA and
        // SEEK_HOLE find it (vm::state::memory).
        sys!(SYS_lseek),
        sys!(SYS_fsync),
    ];
    [talking_on_sockets(), saving_state(), own].concat()
}

/// A stream socket's reads and writes under deadlines: std's UnixStream and TcpStream read
/// with recv(2) (recvfrom) and write with send(2) (sendto, MSG_NOSIGNAL: a peer gone is an
/// error, not a SIGPIPE); the deadlines are SO_RCVTIMEO and SO_SNDTIMEO.
fn talking_on_sockets() -> Vec<Allowed> {
    vec![
        sys!(SYS_setsockopt).only(1, [value(libc::SOL_SOCKET)]),
        sys!(SYS_recvfrom),
        sys!(SYS_sendto),
    ]
}

/// The paused machine's state, as a snapshot and a migration take it: the devices stopped and
/// resumed, the VM's own state read (each vCPU gives its own).
fn saving_state() -> Vec<Allowed> {
    vec![
        // A virtio-mmio transport's pause waits for its device thread's answer on an eventfd;
        // the VT-d unit's drains the doorbells already rung (epoll_wait, no timeout).
        sys!(SYS_read),
        sys!(SYS_epoll_wait),
        sys!(SYS_ioctl).only(1, [KVM_GET_IRQCHIP(), KVM_GET_CLOCK(), KVM_GET_PIT2()]),
    ]
}

/// `vm.send-migration` (machine::migration), on its own thread.
fn migration() -> Vec<Allowed> {
    let own = vec![
        // A socket to the target (TCP or Unix, Nagle off).
        sys!(SYS_socket).only(
            0,
            [
                value(libc::AF_UNIX),
                value(libc::AF_INET),
                value(libc::AF_INET6),
            ],
        ),
        sys!(SYS_connect),
        sys!(SYS_setsockopt).only(1, [value(libc::IPPROTO_TCP)]),
        // A live update's files (SCM_RIGHTS), with the stream's first bytes.
        sys!(SYS_sendmsg),
        // Which pages of guest RAM were ever touched: /proc/self/pagemap opened and read at
        // offsets.
        sys!(SYS_openat),
        sys!(SYS_pread64),
        // The wait between tries to take the disk images' locks back from a target that
        // holds them until it sees the stream end.
        sys!(SYS_clock_nanosleep),
        // The connection duplicated: one handle writes the stream, one reads the answers; the
        // disk images' locks given up at the switch-over and taken back if it fails.
        sys!(SYS_fcntl).only(
            1,
            [
                value(libc::F_DUPFD_CLOEXEC),
                value(libc::F_OFD_SETLK),
                value(libc::F_OFD_GETLK),
            ],
        ),
        // KVM's dirty log turned on and off on guest RAM's slots, and read.
        sys!(SYS_ioctl).only(1, [KVM_SET_USER_MEMORY_REGION(), KVM_GET_DIRTY_LOG()]),
    ];
    [talking_on_sockets(), saving_state(), own].concat()
}

/// What the main thread does itself. Its filter also holds every other kind's list: the
/// threads it starts inherit its filter.
fn main_thread() -> Vec<Allowed> {
    [
        starting_threads(),
        building_machines(),
        running_and_reporting(),
    ]
    .concat()
}

/// Starting the other threads, and what each does before its own filter is installed.
fn starting_threads() -> Vec<Allowed> {
    vec![
        // Starting threads. glibc's pthread_create uses clone3, whose flags are in a struct a
        // filter cannot read.
        sys!(SYS_clone3),
        // What a new thread does before it installs its own filter, under the one it inherits:
        // glibc registers rseq and its robust futex list; std names the thread, finds its stack
        // (pthread_getattr_np reads the affinity) and maps its alternate signal stack (in
        // runtime()); then the thread sets no_new_privs and installs its filter.
        sys!(SYS_rseq),
        sys!(SYS_set_robust_list),
        sys!(SYS_sched_getaffinity),
        sys!(SYS_prctl).only(
            0,
            [value(libc::PR_SET_NAME), value(libc::PR_SET_NO_NEW_PRIVS)],
        ),
        sys!(SYS_seccomp).only(0, [u64::from(libc::SECCOMP_SET_MODE_FILTER)]),
    ]
}

/// Building a machine: KVM, its devices' files and the wiring between them.
fn building_machines() -> Vec<Allowed> {
    vec![
        // Building machines: /dev/kvm (and /dev/net/tun for a tap); eventfds for interrupts, doorbells and device wake-ups
        // (and duplicates of them, of the vCPU file for its kvm_run page, and of stdout for the
        // console); the device threads' epoll sets.
        sys!(SYS_openat),
        sys!(SYS_eventfd2),
        // Kernel and initrd files read at offsets (`machine::loader::file`), and a snapshot's
        // memory file (`vm::state::memory`).
        sys!(SYS_pread64),
        // A restore's snapshot directory: its owner checked against this user, and locked
        // shared while its description is read and its memory file opened (machine::snapshot).
        sys!(SYS_geteuid),
        sys!(SYS_flock),
        // Disk images (`virtio::block::image`) and the console file (`machine::console`):
        // opened with O_NONBLOCK, which is then cleared; images locked as QEMU locks them.
        sys!(SYS_fcntl).only(
            1,
            [
                value(libc::F_DUPFD_CLOEXEC),
                value(libc::F_GETFL),
                value(libc::F_SETFL),
                // Guest RAM's memfd sealed at its size, and one a live update's source
                // handed over checked to be.
                value(libc::F_ADD_SEALS),
                value(libc::F_GET_SEALS),
                value(libc::F_OFD_SETLK),
                value(libc::F_OFD_GETLK),
            ],
        ),
        sys!(SYS_epoll_create1),
        sys!(SYS_epoll_ctl),
        // A disk's io_uring (`virtio::block::io`): made (its rings mapped, in runtime()), its
        // one file registered, narrowed to vectored reads and writes, and enabled.
        sys!(SYS_io_uring_setup),
        sys!(SYS_io_uring_register),
        // Guest RAM a vhost-user backend can map (`vm::RamBacking::SharedMemfd`): one memfd,
        // close-on-exec, sized with ftruncate (below), its size sealed, and mapped shared.
        sys!(SYS_memfd_create).only(1, [u64::from(libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)]),
        // A socket to name a tap to the kernel by (netdevice(7)): whether it exists, and
        // bringing up one the run created (`virtio::net::tap`).
        sys!(SYS_socket).only(0, [value(libc::AF_UNIX)]),
        sys!(SYS_ioctl).only(
            1,
            [
                // That /dev/kvm is KVM (`vm::open_kvm`), then what it offers.
                KVM_GET_API_VERSION(),
                KVM_CHECK_EXTENSION(),
                KVM_CREATE_VM(),
                KVM_GET_VCPU_MMAP_SIZE(),
                KVM_GET_SUPPORTED_CPUID(),
                KVM_CREATE_IRQCHIP(),
                KVM_CREATE_PIT2(),
                // A split irqchip instead, on machines with the VT-d unit (`irq::ioapic`).
                KVM_ENABLE_CAP(),
                KVM_SET_USER_MEMORY_REGION(),
                KVM_CREATE_VCPU(),
                KVM_SET_CPUID2(),
                KVM_GET_SREGS(),
                KVM_SET_SREGS(),
                KVM_SET_REGS(),
                KVM_SET_MP_STATE(),
                KVM_GET_TSC_KHZ(),
                // The MSRs a snapshot holds: KVM's list, and which of it each vCPU reads.
                KVM_GET_MSR_INDEX_LIST(),
                KVM_GET_MSRS(),
                // A restore (`--restore`): the vCPUs' state (with the KVM_SET_* above) and the
                // VM's interrupt controllers, PIT and clock.
                KVM_SET_XSAVE(),
                KVM_SET_XCRS(),
                KVM_SET_DEBUGREGS(),
                KVM_SET_LAPIC(),
                KVM_SET_MSRS(),
                KVM_SET_VCPU_EVENTS(),
                KVM_SET_TSC_KHZ(),
                KVM_SET_IRQCHIP(),
                KVM_SET_PIT2(),
                KVM_SET_CLOCK(),
                // Wiring devices: doorbells, interrupt lines and routes.
                KVM_IOEVENTFD(),
                KVM_IRQFD(),
                KVM_SET_GSI_ROUTING(),
                // A virtio-net device's tap (`virtio::net::tap`), on the /dev/net/tun file it
                // opens: attach to the interface, the vnet header's size, no bound on its send
                // buffer, no offloads until a driver takes some. Its device thread then reads and writes the file and sets
                // the offloads.
                libc::TUNSETIFF,
                libc::TUNSETVNETHDRSZ,
                libc::TUNSETSNDBUF,
                libc::TUNSETOFFLOAD,
                // A tap queue a live update's source handed over, checked to be the tap's
                // (and whether its device had detached it).
                libc::TUNGETIFF,
                // The tap's flags, on that socket: whether it exists, and IFF_UP for one the
                // run created.
                libc::SIOCGIFFLAGS,
                libc::SIOCSIFFLAGS,
                // The kernel's vhost-net for a tap (`virtio::vhost_user::kernel`): a file per
                // queue pair, owned by this process, and what it offers.
                VHOST_SET_OWNER(),
                VHOST_GET_FEATURES(),
                // A disk image's size and blocks, if it is a block device.
                BLKGETSIZE64,
                libc::BLKPBSZGET,
                BLKALIGNOFF,
                libc::BLKIOMIN,
                libc::BLKIOOPT,
            ],
        ),
    ]
}

/// Running a machine, and the report after it.
fn running_and_reporting() -> Vec<Allowed> {
    vec![
        // `exitless run --migrate-from` (machine::migration): the source accepted on the
        // bound socket (Nagle off, deadlines on reads and writes), its stream read and
        // answered, the socket's file removed at the end.
        sys!(SYS_accept4),
        sys!(SYS_setsockopt).only(1, [value(libc::SOL_SOCKET), value(libc::IPPROTO_TCP)]),
        sys!(SYS_recvfrom),
        sys!(SYS_sendto),
        // A Unix socket's first bytes, with the files a live update's source hands over.
        sys!(SYS_recvmsg),
        sys!(SYS_unlink),
        // Running: the vCPU kick's handler, installed at the first run (the kicks themselves
        // are tgkill, in runtime()), and the short sleeps while threads stop.
        sys!(SYS_rt_sigaction).only(0, [value(kick_signal())]),
        sys!(SYS_clock_nanosleep),
        // The report: the host's description (/proc, /sys/module, the CPU count from the
        // affinity and cgroup files) and the --svg charts (their folder made before confinement).
        sys!(SYS_read),
        sys!(SYS_lseek),
        sys!(SYS_statx),
        // The console file (`machine::console`): opened with O_NONBLOCK, which F_SETFL (above)
        // clears once it is known writable, and emptied once every other option is checked.
        sys!(SYS_ftruncate),
        // `bench restore`'s snapshot folder removed once its restores are done (its two files
        // by `unlink`, above).
        sys!(SYS_rmdir),
        // `bench`'s testpmd stopped between the boots that use its ports and continued for
        // them (`bench::vhost_net`): those two signals only.
        sys!(SYS_kill).only(1, [value(libc::SIGSTOP), value(libc::SIGCONT)]),
    ]
}

/// Everything a thread of `kind` may call.
pub(crate) fn allowed(kind: ThreadKind) -> Vec<Allowed> {
    let own = match kind {
        // The children's entries first: a call's argument checks run in list order, and theirs
        // are the hot ones (KVM_RUN at every exit).
        ThreadKind::Main => ThreadKind::ALL
            .into_iter()
            .filter(|&k| k != ThreadKind::Main)
            .flat_map(allowed)
            .chain(main_thread())
            .collect(),
        ThreadKind::Vcpu => vcpu(),
        ThreadKind::Device => device(),
        ThreadKind::VhostUser => vhost_user(),
        // Writing to stderr or stdout, waiting for more; the RTC's timed waits on a condition
        // variable and its IRQ eventfd's write: runtime() is all they do.
        ThreadKind::LogWriter | ThreadKind::Console | ThreadKind::Timer => Vec::new(),
        ThreadKind::ConsoleInput => console_input(),
        ThreadKind::Api => api(),
        ThreadKind::Migration => migration(),
    };
    runtime().into_iter().chain(own).collect()
}

/// The rules of one entry: none for any arguments (seccompiler's "match on the number alone").
fn rules(args: &Args) -> Result<Vec<SeccompRule>, seccompiler::Error> {
    let rule = |arg, op, value| {
        let condition = SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value)?;
        Ok(SeccompRule::new(vec![condition])?)
    };
    match args {
        Args::Any => Ok(Vec::new()),
        Args::OneOf { arg, values } => values
            .iter()
            .map(|&v| rule(*arg, SeccompCmpOp::Eq, v))
            .collect(),
        Args::Without { arg, mask } => Ok(vec![rule(*arg, SeccompCmpOp::MaskedEq(*mask), 0)?]),
    }
}

/// Compile `list` into a filter that allows its calls and traps every other. A call listed
/// more than once may take the arguments of any of its entries.
pub(crate) fn compile(list: &[Allowed]) -> Result<BpfProgram, seccompiler::Error> {
    // `None`: any arguments.
    let mut by_nr: BTreeMap<i64, Option<Vec<SeccompRule>>> = BTreeMap::new();
    for a in list {
        let new = match a.args {
            Args::Any => None,
            ref args => Some(rules(args)?),
        };
        let merged = match (by_nr.remove(&a.nr), new) {
            (None, new) => new,
            (Some(None), _) | (Some(_), None) => None,
            (Some(Some(mut old)), Some(new)) => {
                for rule in new {
                    if !old.contains(&rule) {
                        old.push(rule);
                    }
                }
                Some(old)
            }
        };
        by_nr.insert(a.nr, merged);
    }
    let rules = by_nr
        .into_iter()
        .map(|(nr, rules)| (nr, rules.unwrap_or_default()))
        .collect();
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Trap,
        SeccompAction::Allow,
        TargetArch::x86_64,
    )?;
    Ok(filter.try_into()?)
}

/// Make glibc's allocator need nothing a filter forbids. When a process passes 8 arenas, glibc
/// counts the CPUs (reading /sys/devices/system/cpu/online) to cap them at 8 per CPU: a file
/// open that would trap in whichever thread got there first. Setting that same cap now, before
/// any thread is confined, skips the count.
pub(crate) fn prepare_allocator() {
    // SAFETY: sysconf and mallopt only read and set the C library's own settings.
    unsafe {
        let cpus = libc::sysconf(libc::_SC_NPROCESSORS_ONLN).max(1);
        // NARENAS_FROM_NCORES in glibc's malloc/arena.c, for 64-bit.
        let arenas = libc::c_int::try_from(cpus.saturating_mul(8)).unwrap_or(libc::c_int::MAX);
        libc::mallopt(libc::M_ARENA_MAX, arenas);
    }
}

#[cfg(test)]
mod tests;
