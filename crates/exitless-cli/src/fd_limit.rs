//! The process's descriptor table, made ready before the first thread starts.

/// Descriptors the table is made ready for at start: a machine of 8 virtio-net functions × 65
/// vectors holds some 1,600 (an eventfd per vector and doorbell, and their duplicates).
const RESERVED_DESCRIPTORS: libc::rlim_t = 4096;

/// Raise the soft open-file limit to the hard one: every MSI vector and doorbell holds an
/// eventfd, and 8 devices × 65 vectors alone pass the usual soft limit of 1024. Then grow the
/// descriptor table to that many (at most [`RESERVED_DESCRIPTORS`]) while this is the only
/// thread: Linux grows it by doubling as descriptors are made, and while threads share it each
/// growth waits for an RCU grace period (fs/file.c, `expand_fdtable`: `synchronize_rcu`), some
/// milliseconds each on a busy host: five growths, 30 ms, in a new process restoring 8 × 65
/// vectors (`bench restore`'s new-process rows).
pub fn raise_open_file_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed; fcntl(F_DUPFD_CLOEXEC)
    // makes a new descriptor of stderr's file (failing if stderr is closed), which close then
    // closes: no descriptor of anyone else's is touched.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                ..limit
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
        let Ok(reserve) = libc::c_int::try_from(limit.rlim_cur.min(RESERVED_DESCRIPTORS)) else {
            return;
        };
        // A descriptor numbered at least reserve - 1 makes the table that long.
        let fd = libc::fcntl(libc::STDERR_FILENO, libc::F_DUPFD_CLOEXEC, reserve - 1);
        if fd >= 0 {
            libc::close(fd);
        }
    }
}
