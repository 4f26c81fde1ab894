#![allow(clippy::cast_possible_truncation)] // fixtures

use super::*;
use crate::virtio::net::{RequestResponse, VirtioNet};
use vm_memory::GuestAddress;

fn memory() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x1_0000)]).unwrap()
}

fn device() -> VirtioState {
    let (net, _) = VirtioNet::new([0; 6], vec![Box::new(RequestResponse::new(8))]);
    VirtioState::new(Box::new(net), 0, memory(), DeviceLog::new("test"))
}

const UP_TO_DRIVER: u32 = VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER;
const FEATURES_OK: u32 = UP_TO_DRIVER | VIRTIO_STATUS_FEATURES_OK;

fn accept(st: &mut VirtioState, features: u64) {
    for sel in 0..2 {
        st.driver_features_select = sel;
        st.write_driver_features((features >> (32 * sel)) as u32);
    }
}

#[test]
fn features_the_device_did_not_offer_are_refused() {
    let mut st = device();
    st.write_status(UP_TO_DRIVER);
    accept(&mut st, 1 << VIRTIO_F_VERSION_1 | 1 << 40);
    st.write_status(FEATURES_OK);
    assert_eq!(st.status() & VIRTIO_STATUS_FEATURES_OK, 0);
    st.write_status(FEATURES_OK | VIRTIO_STATUS_DRIVER_OK);
    assert_eq!(
        st.status() & VIRTIO_STATUS_DRIVER_OK,
        0,
        "no DRIVER_OK without FEATURES_OK"
    );
}

#[test]
fn a_legacy_driver_without_version_1_is_refused() {
    let mut st = device();
    st.write_status(UP_TO_DRIVER);
    accept(&mut st, 1 << VIRTIO_F_EVENT_IDX);
    st.write_status(FEATURES_OK);
    assert_eq!(st.status() & VIRTIO_STATUS_FEATURES_OK, 0);
}

#[test]
fn negotiated_features_are_fixed_after_features_ok() {
    let mut st = device();
    st.write_status(UP_TO_DRIVER);
    accept(&mut st, 1 << VIRTIO_F_VERSION_1 | 1 << VIRTIO_F_EVENT_IDX);
    st.write_status(FEATURES_OK);
    assert!(st.negotiated(VIRTIO_F_EVENT_IDX));
    accept(&mut st, 1 << VIRTIO_F_VERSION_1);
    assert!(st.negotiated(VIRTIO_F_EVENT_IDX));
    assert_eq!(
        st.device_features_word() & (1 << VIRTIO_F_EVENT_IDX),
        1 << VIRTIO_F_EVENT_IDX
    );
}

#[test]
fn queue_sizes_must_be_powers_of_two_within_the_maximum() {
    for bad in [0u32, 3, 100, 512, 0x1_0000] {
        let mut st = device();
        st.set_queue_size(bad);
        assert_ne!(
            st.status() & VIRTIO_STATUS_DEVICE_NEEDS_RESET,
            0,
            "size {bad}"
        );
        st.write_status(0);
        assert_eq!(st.status(), 0, "reset clears DEVICE_NEEDS_RESET");
    }
    let mut st = device();
    st.set_queue_size(64);
    assert_eq!(st.status(), 0);
    assert_eq!(st.selected_queue().map(|q| q.size()), Some(64));
}

#[test]
fn queues_that_do_not_exist_or_are_live_cannot_be_changed() {
    let mut st = device();
    st.queue_select = 9;
    assert!(!st.configure_queue("size", |_| panic!("must not run")));
    assert!(st.selected_queue().is_none());
    assert_eq!(st.stop_queue(), None);
}

#[test]
fn rings_outside_guest_memory_break_the_device() {
    let mut st = device();
    st.set_queue_address(Ring::Device, false, 0xffff_f000);
    st.set_queue_ready();
    assert_ne!(st.status() & VIRTIO_STATUS_DEVICE_NEEDS_RESET, 0);
    assert_eq!(st.selected_queue().map(|q| q.ready()), Some(false));
}

/// virtio-queue takes an available ring at 0 for "not set up" and would refuse the queue
/// at its first use; the device says so when the driver enables it.
#[test]
fn an_available_ring_at_address_zero_is_refused_when_enabled() {
    let mut st = device();
    st.set_queue_size(16);
    st.set_queue_address(Ring::Descriptors, false, 0x1000);
    st.set_queue_address(Ring::Device, false, 0x3000);
    st.set_queue_ready();
    assert_ne!(st.status() & VIRTIO_STATUS_DEVICE_NEEDS_RESET, 0);
    assert_eq!(st.selected_queue().map(|q| q.ready()), Some(false));
}

#[test]
fn misaligned_ring_addresses_are_refused() {
    let mut st = device();
    st.set_queue_address(Ring::Descriptors, false, 0x1008);
    assert_eq!(st.selected_queue().map(|q| q.desc_table()), Some(0));
    st.set_queue_address(Ring::Descriptors, false, 0x1010);
    st.set_queue_address(Ring::Descriptors, true, 0x1);
    assert_eq!(
        st.selected_queue().map(|q| q.desc_table()),
        Some(0x1_0000_1010)
    );
}
