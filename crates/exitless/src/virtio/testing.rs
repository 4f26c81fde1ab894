//! Test fixtures the transports' tests share (`super::test_parts`).

use std::sync::Arc;

use vm_memory::GuestMemoryMmap;

use super::transport::TransportEnv;
use super::{DeviceParts, net};
use crate::logging::DeviceLog;

/// What the transport tests share: in-memory KVM stand-ins (no /dev/kvm needed), the
/// environment built on them, and a virtio-net device.
pub(crate) struct TestParts {
    pub ioevents: Arc<crate::fakes::FakeIoEvents>,
    pub routes: Arc<crate::fakes::FakeRoutes>,
    pub env: TransportEnv,
    pub net: DeviceParts,
}

/// Fresh stand-ins, 1 MiB of guest memory, and a one-pair virtio-net device answering
/// requests.
pub(crate) fn test_parts() -> TestParts {
    let ioevents = Arc::new(crate::fakes::FakeIoEvents::default());
    let routes = Arc::new(crate::fakes::FakeRoutes::default());
    TestParts {
        env: TransportEnv {
            ioevents: ioevents.clone(),
            routes: routes.clone(),
            mem: GuestMemoryMmap::from_ranges(&[(vm_memory::GuestAddress(0), 1 << 20)]).unwrap(),
            iommu: None,
            log: DeviceLog::new("test"),
        },
        ioevents,
        routes,
        net: net::VirtioNet::parts([0; 6], vec![Box::new(net::RequestResponse::new(8))]),
    }
}
