//! The virtio facts shared with the probe guest, against the standard bindings.

use super::regs::*;
use virtio_bindings::virtio_mmio as std_mmio;

#[test]
fn shared_mmio_offsets_match_the_standard_bindings() {
    let pairs = [
        (VIRTIO_MMIO_MAGIC_VALUE, std_mmio::VIRTIO_MMIO_MAGIC_VALUE),
        (VIRTIO_MMIO_VERSION, std_mmio::VIRTIO_MMIO_VERSION),
        (VIRTIO_MMIO_DEVICE_ID, std_mmio::VIRTIO_MMIO_DEVICE_ID),
        (VIRTIO_MMIO_VENDOR_ID, std_mmio::VIRTIO_MMIO_VENDOR_ID),
        (
            VIRTIO_MMIO_DEVICE_FEATURES,
            std_mmio::VIRTIO_MMIO_DEVICE_FEATURES,
        ),
        (
            VIRTIO_MMIO_DEVICE_FEATURES_SEL,
            std_mmio::VIRTIO_MMIO_DEVICE_FEATURES_SEL,
        ),
        (
            VIRTIO_MMIO_DRIVER_FEATURES,
            std_mmio::VIRTIO_MMIO_DRIVER_FEATURES,
        ),
        (
            VIRTIO_MMIO_DRIVER_FEATURES_SEL,
            std_mmio::VIRTIO_MMIO_DRIVER_FEATURES_SEL,
        ),
        (VIRTIO_MMIO_QUEUE_SEL, std_mmio::VIRTIO_MMIO_QUEUE_SEL),
        (
            VIRTIO_MMIO_QUEUE_NUM_MAX,
            std_mmio::VIRTIO_MMIO_QUEUE_NUM_MAX,
        ),
        (VIRTIO_MMIO_QUEUE_NUM, std_mmio::VIRTIO_MMIO_QUEUE_NUM),
        (VIRTIO_MMIO_QUEUE_READY, std_mmio::VIRTIO_MMIO_QUEUE_READY),
        (VIRTIO_MMIO_QUEUE_NOTIFY, std_mmio::VIRTIO_MMIO_QUEUE_NOTIFY),
        (
            VIRTIO_MMIO_INTERRUPT_STATUS,
            std_mmio::VIRTIO_MMIO_INTERRUPT_STATUS,
        ),
        (
            VIRTIO_MMIO_INTERRUPT_ACK,
            std_mmio::VIRTIO_MMIO_INTERRUPT_ACK,
        ),
        (VIRTIO_MMIO_STATUS, std_mmio::VIRTIO_MMIO_STATUS),
        (
            VIRTIO_MMIO_QUEUE_DESC_LOW,
            std_mmio::VIRTIO_MMIO_QUEUE_DESC_LOW,
        ),
        (
            VIRTIO_MMIO_QUEUE_DESC_HIGH,
            std_mmio::VIRTIO_MMIO_QUEUE_DESC_HIGH,
        ),
        (
            VIRTIO_MMIO_QUEUE_AVAIL_LOW,
            std_mmio::VIRTIO_MMIO_QUEUE_AVAIL_LOW,
        ),
        (
            VIRTIO_MMIO_QUEUE_AVAIL_HIGH,
            std_mmio::VIRTIO_MMIO_QUEUE_AVAIL_HIGH,
        ),
        (
            VIRTIO_MMIO_QUEUE_USED_LOW,
            std_mmio::VIRTIO_MMIO_QUEUE_USED_LOW,
        ),
        (
            VIRTIO_MMIO_QUEUE_USED_HIGH,
            std_mmio::VIRTIO_MMIO_QUEUE_USED_HIGH,
        ),
        (
            VIRTIO_MMIO_CONFIG_GENERATION,
            std_mmio::VIRTIO_MMIO_CONFIG_GENERATION,
        ),
        (VIRTIO_MMIO_CONFIG, std_mmio::VIRTIO_MMIO_CONFIG),
        (VIRTIO_MMIO_INT_VRING, std_mmio::VIRTIO_MMIO_INT_VRING),
        (VIRTIO_MMIO_INT_CONFIG, std_mmio::VIRTIO_MMIO_INT_CONFIG),
    ];
    for (ours, standard) in pairs {
        assert_eq!(ours, standard);
    }
    assert_eq!(
        VIRTIO_NET_F_MAC,
        virtio_bindings::virtio_net::VIRTIO_NET_F_MAC
    );
    // The extension must not collide with a standard register.
    let standard_regs = [0xac, 0xb0, 0xb4, 0xb8, 0xbc, 0xc0];
    for reg in VIRTIO_MMIO_MSI_VEC_NUM..=VIRTIO_MMIO_QUEUE_NOTIFY_OFF {
        assert!(!standard_regs.contains(&reg) && reg < VIRTIO_MMIO_CONFIG_GENERATION);
    }
}

/// A queue set holds what was inserted, once each, in increasing order, across its words.
#[test]
fn a_queue_set_iterates_its_queues_in_order() {
    let mut set = super::device::QueueSet::default();
    for q in [200, 3, 64, 3, 0, 255, 63] {
        set.insert(q);
    }
    assert_eq!(set.iter().collect::<Vec<_>>(), [0, 3, 63, 64, 200, 255]);
    assert_eq!(super::device::QueueSet::default().iter().count(), 0);
}
