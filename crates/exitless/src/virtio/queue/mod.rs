//! The split virtqueue as a device reads it (virtio 1.2 §2.7): its rings through their host
//! mapping ([`split`]), translated again behind an IOMMU ([`rings`]), each descriptor chain
//! checked before a device touches it ([`chain`]); and the reference ring, a second reader on
//! virtio-queue's own walk that the tests and fuzz targets hold the first against
//! ([`reference`], under `test-utils`).

pub mod chain;
#[cfg(any(test, feature = "test-utils"))]
pub mod reference;
pub mod rings;
pub mod split;
