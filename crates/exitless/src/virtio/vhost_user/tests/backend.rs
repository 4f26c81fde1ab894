//! An in-process vhost-user backend for the frontend's tests (the `vhost` crate's backend
//! side): it records what it is told, holds the fds it gets, and can be told to refuse a
//! message or to offer less.

use std::fs::File;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::thread;

use vhost::vhost_user::message::*;
use vhost::vhost_user::{
    Backend, BackendReqHandler, Error, GpuBackend, Listener, Result, VhostUserBackendReqHandlerMut,
};

use crate::virtio::regs::{VIRTIO_F_EVENT_IDX, VIRTIO_F_VERSION_1};

/// What the backend was told, in order, and the fds it holds.
#[derive(Default)]
pub struct Record {
    /// One line per message.
    pub log: Vec<String>,
    /// SET_FEATURES's value.
    pub features: u64,
    /// Memory regions with an fd each: (guest address, size, user address).
    pub regions: Vec<(u64, u64, u64)>,
    /// Ring addresses by queue: (descriptors, used, available).
    pub addrs: Vec<(u64, u64, u64)>,
    /// The kick fd of queue 0.
    pub kick: Option<File>,
    /// The call fd of queue 0, the latest.
    pub call: Option<File>,
    /// Connections accepted.
    pub connections: usize,
    /// The end of the current connection, for the test to hang up.
    pub stream: Option<UnixStream>,
    /// What GET_VRING_BASE answers: where the backend stopped each ring.
    pub base: u32,
}

/// How the backend behaves.
#[derive(Clone, Copy, Default)]
pub struct Quirks {
    /// Offer no VIRTIO_F_VERSION_1.
    pub no_version_1: bool,
    /// Refuse SET_VRING_ENABLE (an answer the frontend cannot use).
    pub refuse_enable: bool,
    /// Offer no checksum offload (a backend with less than the first one offered).
    pub no_csum: bool,
    /// Offer no VHOST_USER_PROTOCOL_F_MQ (one queue pair only).
    pub no_mq: bool,
    /// Refuse SET_VRING_ENABLE for the second pair's rings (2 and 3) only.
    pub refuse_pair_2: bool,
    /// Never answer SET_VRING_ENABLE: a backend gone silent mid-run.
    pub silent_enable: bool,
}

struct FakeBackend {
    record: Arc<Mutex<Record>>,
    quirks: Quirks,
}

/// Serve `path` on a thread, one connection after another; what it is told goes to the
/// returned record.
pub fn serve(path: &Path, quirks: Quirks) -> Arc<Mutex<Record>> {
    let record = Arc::new(Mutex::new(Record::default()));
    let backend = Arc::new(Mutex::new(FakeBackend {
        record: record.clone(),
        quirks,
    }));
    let listener = Listener::new(path, true).unwrap();
    let r = record.clone();
    thread::spawn(move || {
        while let Ok(Some(stream)) = listener.accept() {
            let mut handler = BackendReqHandler::from_stream(stream, backend.clone());
            {
                let mut rec = r.lock().unwrap();
                rec.connections += 1;
                rec.stream = handler.try_clone_connection().ok();
            }
            while handler.handle_request().is_ok() {}
        }
    });
    record
}

impl FakeBackend {
    fn note(&self, line: String) {
        self.record.lock().unwrap().log.push(line);
    }
}

fn unsupported<T>() -> Result<T> {
    Err(Error::InvalidOperation("not in the fake"))
}

impl VhostUserBackendReqHandlerMut for FakeBackend {
    fn set_owner(&mut self) -> Result<()> {
        self.note("SET_OWNER".into());
        Ok(())
    }
    fn reset_owner(&mut self) -> Result<()> {
        unsupported()
    }
    fn reset_device(&mut self) -> Result<()> {
        unsupported()
    }
    fn get_features(&mut self) -> Result<u64> {
        let version = u64::from(!self.quirks.no_version_1) << VIRTIO_F_VERSION_1;
        // Protocol features, event index, a virtio-net checksum offload (bit 0), and MQ (22)
        // and the control queue (17) as DPDK offers them.
        let mq = 1 << 22 | 1 << 17;
        Ok(1 << 30 | 1 << VIRTIO_F_EVENT_IDX | version | u64::from(!self.quirks.no_csum) | mq)
    }
    fn set_features(&mut self, features: u64) -> Result<()> {
        self.note(format!("SET_FEATURES {features:#x}"));
        self.record.lock().unwrap().features = features;
        Ok(())
    }
    fn set_mem_table(
        &mut self,
        ctx: &[VhostUserMemoryRegion],
        files: Vec<File>,
        _postcopy: Option<bool>,
    ) -> Result<Option<Vec<u64>>> {
        self.note(format!(
            "SET_MEM_TABLE {} regions {} fds",
            ctx.len(),
            files.len()
        ));
        let regions = ctx
            .iter()
            .map(|r| (r.guest_phys_addr, r.memory_size, r.user_addr))
            .collect();
        self.record.lock().unwrap().regions = regions;
        Ok(None)
    }
    fn set_vring_num(&mut self, index: u32, num: u32) -> Result<()> {
        self.note(format!("SET_VRING_NUM {index} {num}"));
        Ok(())
    }
    fn set_vring_addr(
        &mut self,
        index: u32,
        _flags: VhostUserVringAddrFlags,
        descriptor: u64,
        used: u64,
        available: u64,
        _log: u64,
    ) -> Result<()> {
        self.note(format!("SET_VRING_ADDR {index}"));
        self.record
            .lock()
            .unwrap()
            .addrs
            .push((descriptor, used, available));
        Ok(())
    }
    fn set_vring_base(&mut self, index: u32, base: u32) -> Result<()> {
        self.note(format!("SET_VRING_BASE {index} {base}"));
        Ok(())
    }
    fn get_vring_base(&mut self, index: u32) -> Result<VhostUserVringState> {
        self.note(format!("GET_VRING_BASE {index}"));
        let base = self.record.lock().unwrap().base;
        Ok(VhostUserVringState::new(index, base))
    }
    fn set_vring_kick(&mut self, index: u8, fd: Option<File>) -> Result<()> {
        self.note(format!("SET_VRING_KICK {index}"));
        if index == 0 {
            self.record.lock().unwrap().kick = fd;
        }
        Ok(())
    }
    fn set_vring_call(&mut self, index: u8, fd: Option<File>) -> Result<()> {
        self.note(format!("SET_VRING_CALL {index}"));
        if index == 0 {
            self.record.lock().unwrap().call = fd;
        }
        Ok(())
    }
    fn set_vring_err(&mut self, _index: u8, _fd: Option<File>) -> Result<()> {
        unsupported()
    }
    fn get_protocol_features(&mut self) -> Result<VhostUserProtocolFeatures> {
        let mut offered = VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::CONFIG;
        if self.quirks.no_mq {
            offered.remove(VhostUserProtocolFeatures::MQ);
        }
        Ok(offered)
    }
    fn set_protocol_features(&mut self, features: u64) -> Result<()> {
        self.note(format!("SET_PROTOCOL_FEATURES {features:#x}"));
        Ok(())
    }
    fn get_queue_num(&mut self) -> Result<u64> {
        Ok(4)
    }
    fn set_vring_enable(&mut self, index: u32, enable: bool) -> Result<()> {
        if self.quirks.refuse_enable || (self.quirks.refuse_pair_2 && index >= 2) {
            return unsupported();
        }
        if self.quirks.silent_enable {
            // Longer than any test waits: the frontend must give up on its own.
            thread::sleep(std::time::Duration::from_secs(600));
        }
        self.note(format!("SET_VRING_ENABLE {index} {enable}"));
        Ok(())
    }
    fn get_config(
        &mut self,
        _offset: u32,
        size: u32,
        _flags: VhostUserConfigFlags,
    ) -> Result<Vec<u8>> {
        // A disk of 32 sectors: `capacity` first (virtio 1.2 §5.2.4).
        let mut c = vec![0u8; size as usize];
        c[..8].copy_from_slice(&32u64.to_le_bytes());
        Ok(c)
    }
    fn set_config(
        &mut self,
        _offset: u32,
        _buf: &[u8],
        _flags: VhostUserConfigFlags,
    ) -> Result<()> {
        unsupported()
    }
    fn set_backend_req_fd(&mut self, _backend: Backend) {}
    fn set_gpu_socket(&mut self, _gpu_backend: GpuBackend) -> Result<()> {
        unsupported()
    }
    fn get_shared_object(&mut self, _uuid: VhostUserSharedMsg) -> Result<File> {
        unsupported()
    }
    fn get_inflight_fd(
        &mut self,
        _inflight: &VhostUserInflight,
    ) -> Result<(VhostUserInflight, File)> {
        unsupported()
    }
    fn set_inflight_fd(&mut self, _inflight: &VhostUserInflight, _file: File) -> Result<()> {
        unsupported()
    }
    fn get_max_mem_slots(&mut self) -> Result<u64> {
        unsupported()
    }
    fn add_mem_region(
        &mut self,
        _region: &VhostUserSingleMemoryRegion,
        _fd: File,
        _postcopy: Option<bool>,
    ) -> Result<Option<u64>> {
        unsupported()
    }
    fn remove_mem_region(&mut self, _region: &VhostUserSingleMemoryRegion) -> Result<()> {
        unsupported()
    }
    fn set_device_state_fd(
        &mut self,
        _direction: VhostTransferStateDirection,
        _phase: VhostTransferStatePhase,
        _fd: File,
    ) -> Result<Option<File>> {
        unsupported()
    }
    fn check_device_state(&mut self) -> Result<()> {
        unsupported()
    }
    fn get_shmem_config(&mut self) -> Result<VhostUserShMemConfig> {
        unsupported()
    }
    fn set_log_base(&mut self, _log: &VhostUserLog, _file: File) -> Result<()> {
        unsupported()
    }
}
