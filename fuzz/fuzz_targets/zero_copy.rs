#![no_main]
//! The zero-copy data path against the copy path it replaced (issue 20): guest memory of one
//! to three regions (adjacent or with holes), a chain of readable and writable buffers, and
//! maybe an IOMMU mapping with scattered, unmapped, read-only and write-only pages, contiguous
//! runs translated at once, and Bus Master Enable closing after some translations. The chain
//! is read and written through `Chain::read_all`/`write_all` (copies) and through
//! `Chain::resolve` (host segments, used in place): the bytes read, the outcome of the write,
//! guest memory after a write that went through and the faults recorded must all agree
//! (`exitless::virtio::queue::reference`).

use exitless::virtio::queue::reference::Scenario;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(difference) = Scenario::from_bytes(data).compare() {
        panic!("{difference}");
    }
});
