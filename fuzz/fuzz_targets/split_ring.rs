#![no_main]
//! The host-mapped split ring reader (`virtio::split`, issue 20) against virtio-queue's, the
//! reader it replaced: a queue of any size, with or without EVENT_IDX, translated or not, at
//! any positions, over a descriptor table and rings from the input, served in rounds after
//! driver writes (raw stores into the rings, or chains published), by a server that takes or
//! declines chains and completes them, pauses, faults or breaks. Every pass's result, the
//! chains served, the positions, the notification decisions and guest memory after must
//! agree (`exitless::virtio::queue::reference::ring`).

use exitless::virtio::queue::reference::ring::RingScenario;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(difference) = RingScenario::from_bytes(data).compare() {
        panic!("{difference}");
    }
});
