//! virtio-net backends: where the frames a driver transmits go and where the frames it
//! receives come from.

use std::collections::VecDeque;
use std::os::fd::RawFd;

/// Where frames go and come from. A tap device ([`super::tap::Tap`]) is one backend; the benchmark's
/// request/response responder is another.
pub trait NetBackend: Send {
    /// The driver sent `frame` (without the virtio-net header); returns false if the
    /// backend dropped it (no room, or no link).
    fn transmit(&mut self, frame: &[u8]) -> bool;
    /// The next frame for the driver, if any.
    fn receive(&mut self) -> Option<Vec<u8>>;
    /// Drop anything queued (the device was reset).
    fn reset(&mut self);
    /// A file that becomes readable when frames arrive from outside (a tap), for the device
    /// thread to wait on, edge-triggered. Frames are taken only while the driver has receive
    /// buffers (one ahead, held for the next buffer): the rest stay in the backend (the
    /// kernel's queue for a tap, which drops frames past its length) until the driver adds
    /// buffers and kicks, and the device thread does not spin on a readable file meanwhile.
    /// Backends that only answer transmitted frames have none.
    fn wake_fd(&self) -> Option<RawFd> {
        None
    }
    /// The driver enabled (`true`) or disabled this backend's queue pair: VQ_PAIRS_SET, or a
    /// reset, after which only the first pair is enabled (virtio 1.2 §5.1.6.5.5). A backend
    /// fed from outside (a multiqueue tap) must then stop taking frames for a disabled pair,
    /// or they are lost: no driver fills its receive queue. Others need do nothing.
    fn set_enabled(&mut self, _enabled: bool) {}
}

/// Answers every transmitted frame with one frame of `response_size` bytes, as netperf TCP_RR
/// `-r 32,1024` does: byte `i` of the response is the complement of request byte
/// `i % request length`, so the driver can check that both directions were intact.
pub struct RequestResponse {
    response_size: usize,
    queued: VecDeque<Vec<u8>>,
}

/// Most responses the responder holds before it drops requests (a full receive queue).
const MAX_QUEUED: usize = 256;

impl RequestResponse {
    /// A responder that answers with `response_size`-byte frames.
    pub fn new(response_size: usize) -> Self {
        RequestResponse {
            response_size,
            queued: VecDeque::new(),
        }
    }

    /// The response to `request`.
    pub fn response_to(request: &[u8], size: usize) -> Vec<u8> {
        (0..size).map(|i| !request[i % request.len()]).collect()
    }
}

impl NetBackend for RequestResponse {
    fn transmit(&mut self, frame: &[u8]) -> bool {
        if frame.is_empty() {
            return true; // nothing to answer
        }
        if self.queued.len() >= MAX_QUEUED {
            return false;
        }
        self.queued
            .push_back(Self::response_to(frame, self.response_size));
        true
    }

    fn receive(&mut self) -> Option<Vec<u8>> {
        self.queued.pop_front()
    }

    fn reset(&mut self) {
        self.queued.clear();
    }
}

/// Takes every transmitted frame and drops it; receives nothing: the far end of a transmit
/// stream (netperf UDP_STREAM's sink).
#[derive(Debug, Default)]
pub struct Sink;

impl NetBackend for Sink {
    fn transmit(&mut self, _frame: &[u8]) -> bool {
        true
    }

    fn receive(&mut self) -> Option<Vec<u8>> {
        None
    }

    fn reset(&mut self) {}
}
