//! virtio-net backends: where the frames a driver transmits go and where the frames it
//! receives come from.

use std::collections::VecDeque;
use std::os::fd::RawFd;

use super::MAX_FRAME;
use super::header::{Direction, NetHeader};
use crate::dma::Segments;

/// Where frames go and come from. A tap device ([`super::tap::Tap`]) is one backend; the benchmark's
/// request/response responder is another. Frames are the guest's buffers, resolved to host
/// memory ([`Segments`]): a backend reads a transmitted frame and writes a received one in
/// place.
pub trait NetBackend: Send {
    /// The driver sent `frame` (after its virtio-net header, of which `header` is the checked
    /// copy: offloads only if [`NetBackend::passes_headers`]); returns false if the backend
    /// dropped it (no room, or no link).
    fn transmit(&mut self, header: NetHeader, frame: &Segments) -> bool;
    /// The length of the next frame for the driver, if there is one: taken in (and held) if
    /// none is held yet, so that its length is known before a receive buffer is taken.
    fn pending(&mut self) -> Option<usize>;
    /// Write the held frame into bytes `at..` of `into`, which has room for it, and let it go.
    fn deliver(&mut self, into: &Segments, at: usize);
    /// The virtio-net header of the held frame, as the backend got it: the device checks it
    /// against what the driver negotiated before the driver sees it. Only a backend that
    /// [passes headers](NetBackend::passes_headers) has one with offloads in it.
    fn held_header(&self) -> NetHeader {
        NetHeader::default()
    }
    /// Whether the backend takes and gives frames with offloads in their headers (a tap with
    /// IFF_VNET_HDR): the device then offers the offload features
    /// ([`super::header::OFFLOAD_FEATURES`]). Others get and give whole, checksummed frames.
    fn passes_headers(&self) -> bool {
        false
    }
    /// Whether, passing headers, it also takes and gives UDP segments (GSO UDP_L4): the
    /// device then offers [`super::header::USO_FEATURES`] too.
    fn passes_uso(&self) -> bool {
        false
    }
    /// The offloads the driver takes in received frames (at DRIVER_OK, a restore, or a reset
    /// with none): a backend that [passes headers](NetBackend::passes_headers) gives it
    /// no other.
    fn set_offloads(&mut self, _rx: Direction) {}
    /// Let the held frame go undelivered (no buffer fits it, or its pair was disabled).
    fn discard(&mut self);
    /// Drop anything queued or held (the device was reset).
    fn reset(&mut self);
    /// Frames transmitted since the last call whose payload the backend found wrong, for the
    /// device's log ([`crate::logging::DeviceLog::bad_frames`]): only a backend that knows
    /// what its frames must carry (the [`Sink`]) checks; the others count none.
    fn take_bad_frames(&mut self) -> u64 {
        0
    }
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
    /// What it holds for the driver that a snapshot must keep (`crate::persist`): None when
    /// it holds nothing of its own (a tap's frames wait in the kernel).
    fn save(&self) -> Option<serde_json::Value> {
        None
    }
    /// Take what [`NetBackend::save`] wrote; the error says what is wrong with it.
    fn restore(&mut self, _state: serde_json::Value) -> Result<(), String> {
        Err("state for a backend that keeps none".into())
    }
}

/// Answers every transmitted frame with one frame of `response_size` bytes, as netperf TCP_RR
/// `-r 32,1024` does: byte `i` of the response is the complement of request byte
/// `i % request length`, so the driver can check that both directions were intact.
///
/// The request is copied out of the guest's buffer (which the driver may reuse as soon as it
/// is used), complemented, into a buffer kept from a pool, so no frame allocates once the pool
/// has grown to the most requests queued at once; the response is generated straight into the
/// guest's receive buffer.
pub struct RequestResponse {
    response_size: usize,
    queued: VecDeque<Vec<u8>>,
    /// Request buffers to reuse.
    spare: Vec<Vec<u8>>,
}

/// Most responses the responder holds before it drops requests (a full receive queue).
const MAX_QUEUED: usize = 256;

/// Bytes of a response generated at a time before they are copied into guest memory.
const CHUNK: usize = 256;

impl RequestResponse {
    /// A responder that answers with `response_size`-byte frames.
    pub fn new(response_size: usize) -> Self {
        RequestResponse {
            response_size,
            queued: VecDeque::new(),
            spare: Vec::new(),
        }
    }

    /// The response to `request` (not empty), whole, as a driver checks it.
    pub fn response_to(request: &[u8], size: usize) -> Vec<u8> {
        (0..size).map(|i| !request[i % request.len()]).collect()
    }

    fn recycle(&mut self, mut request: Vec<u8>) {
        request.clear();
        self.spare.push(request);
    }
}

impl NetBackend for RequestResponse {
    fn transmit(&mut self, _header: NetHeader, frame: &Segments) -> bool {
        if frame.is_empty() {
            return true; // nothing to answer
        }
        if self.queued.len() >= MAX_QUEUED {
            return false;
        }
        // Kept complemented: the response is this, repeated.
        let mut pattern = self.spare.pop().unwrap_or_default();
        pattern.resize(frame.len(), 0);
        frame.gather(0, &mut pattern);
        pattern.iter_mut().for_each(|b| *b = !*b);
        self.queued.push_back(pattern);
        true
    }

    fn pending(&mut self) -> Option<usize> {
        self.queued.front().map(|_| self.response_size)
    }

    fn deliver(&mut self, into: &Segments, at: usize) {
        let Some(pattern) = self.queued.pop_front() else {
            return;
        };
        // The response, a chunk at a time: the complemented request repeated.
        let mut chunk = [0u8; CHUNK];
        let (mut done, mut from) = (0, 0);
        while done < self.response_size {
            let n = CHUNK.min(self.response_size - done);
            let mut filled = 0;
            while filled < n {
                let take = (pattern.len() - from).min(n - filled);
                chunk[filled..filled + take].copy_from_slice(&pattern[from..from + take]);
                filled += take;
                from = (from + take) % pattern.len();
            }
            into.scatter(at + done, &chunk[..n]);
            done += n;
        }
        self.recycle(pattern);
    }

    fn discard(&mut self) {
        if let Some(request) = self.queued.pop_front() {
            self.recycle(request);
        }
    }

    fn reset(&mut self) {
        while let Some(request) = self.queued.pop_front() {
            self.recycle(request);
        }
    }

    /// The responses not yet delivered: each a complemented request.
    fn save(&self) -> Option<serde_json::Value> {
        Some(serde_json::json!({ "queued": self.queued }))
    }

    fn restore(&mut self, state: serde_json::Value) -> Result<(), String> {
        #[derive(serde::Deserialize)]
        struct Saved {
            queued: VecDeque<Vec<u8>>,
        }
        let saved: Saved = serde_json::from_value(state).map_err(|e| e.to_string())?;
        // As `transmit` queues them: at most MAX_QUEUED, none empty, none past a frame.
        let bad = saved
            .queued
            .iter()
            .any(|r| r.is_empty() || r.len() > MAX_FRAME);
        if saved.queued.len() > MAX_QUEUED || bad {
            return Err(format!(
                "{} queued responses (at most {MAX_QUEUED}, each 1..={MAX_FRAME} bytes)",
                saved.queued.len()
            ));
        }
        self.queued = saved.queued;
        Ok(())
    }
}

/// Takes every transmitted frame and drops it, receives nothing: the far end of a transmit
/// stream (netperf UDP_STREAM's sink). It reads every byte of each frame, as a NIC's DMA read
/// does, in place in the guest's buffers, and checks it against the probe stream's pattern
/// (`OP_NET_STREAM` in `crate::contract`: byte `i` is byte 0 plus `i`, mod 256), counting
/// the frames that break it. A guest that sends other data (`exitless run` with this backend)
/// sees nothing of this: the count is a figure for the bench, not a guest error.
#[derive(Debug)]
pub struct Sink {
    /// Frames found with a wrong payload and not yet taken.
    bad: u64,
    /// Where a frame's bytes are read to, a chunk at a time (kept: no allocation, nor a
    /// fresh zeroed buffer, per frame).
    chunk: Vec<u8>,
}

/// Bytes of a frame read from guest memory at a time: copied out so the check runs on plain
/// memory (guest memory is volatile: the driver may write it meanwhile).
const SINK_CHUNK: usize = 512;

impl Default for Sink {
    fn default() -> Self {
        Sink {
            bad: 0,
            chunk: vec![0; SINK_CHUNK],
        }
    }
}

impl Sink {
    /// Whether `frame` carries the stream's pattern (an empty frame does).
    fn intact(&mut self, frame: &Segments) -> bool {
        let mut first = None;
        let mut at = 0usize;
        for piece in frame.slices() {
            let mut off = 0;
            while off < piece.len() {
                let n = SINK_CHUNK.min(piece.len() - off);
                let chunk = &mut self.chunk[..n];
                let got = piece.subslice(off, n).map_or(0, |s| s.copy_to(chunk));
                let base = *first.get_or_insert(chunk[0]);
                // The pattern is mod 256: the low byte of the offset.
                let expected = |k: usize| base.wrapping_add((at + k).to_le_bytes()[0]);
                if got < n || chunk.iter().enumerate().any(|(k, &b)| b != expected(k)) {
                    return false;
                }
                off += n;
                at += n;
            }
        }
        true
    }
}

impl NetBackend for Sink {
    fn transmit(&mut self, _header: NetHeader, frame: &Segments) -> bool {
        if !self.intact(frame) {
            self.bad += 1;
        }
        true
    }

    fn pending(&mut self) -> Option<usize> {
        None
    }

    fn deliver(&mut self, _into: &Segments, _at: usize) {}

    fn discard(&mut self) {}

    fn reset(&mut self) {}

    fn take_bad_frames(&mut self) -> u64 {
        std::mem::take(&mut self.bad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dma::{Access, DmaContext};
    use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryMmap};

    /// A response longer than a chunk, to a request whose length divides neither, lands in
    /// buffers split over two regions as `response_to` says it should.
    #[test]
    fn the_response_is_generated_in_place_as_the_reference_says() {
        let mem = GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0), 0x1000),
            (GuestAddress(0x1000), 0x1000),
        ])
        .unwrap();
        let request: Vec<u8> = (1..=7).collect();
        mem.write_slice(&request, GuestAddress(0x100)).unwrap();
        let dma = DmaContext::platform(mem.clone());
        let mut io = Segments::default();
        dma.resolve(GuestAddress(0x100), 7, Access::Read, &mut io)
            .unwrap();
        let mut rr = RequestResponse::new(1000);
        assert!(rr.transmit(NetHeader::default(), &io));
        assert_eq!(rr.pending(), Some(1000));
        io.clear();
        dma.resolve(GuestAddress(0xe00), 1012, Access::Write, &mut io)
            .unwrap();
        rr.deliver(&io, 12);
        let mut got = vec![0u8; 1000];
        mem.read_slice(&mut got, GuestAddress(0xe0c)).unwrap();
        assert_eq!(got, RequestResponse::response_to(&request, 1000));
        assert_eq!(rr.pending(), None);
    }

    /// The sink reads every byte of a frame split over two regions: a stream frame is
    /// intact, one wrong byte past the first chunk makes it a bad frame, counted once.
    #[test]
    fn the_sink_counts_a_frame_with_one_wrong_byte() {
        let mem = GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0), 0x1000),
            (GuestAddress(0x1000), 0x1000),
        ])
        .unwrap();
        let at = GuestAddress(0xa00);
        // Frame 7 of a stream: byte i is 7 + i.
        let frame: Vec<u8> = (0..1500usize).map(|i| (7 + i).to_le_bytes()[0]).collect();
        mem.write_slice(&frame, at).unwrap();
        let dma = DmaContext::platform(mem.clone());
        let mut io = Segments::default();
        let mut sink = Sink::default();
        let mut send = |sink: &mut Sink| {
            io.clear();
            dma.resolve(at, frame.len(), Access::Read, &mut io).unwrap();
            assert!(
                sink.transmit(NetHeader::default(), &io),
                "the sink takes every frame"
            );
            sink.take_bad_frames()
        };
        assert_eq!(send(&mut sink), 0, "the pattern is intact");
        mem.write_obj(0u8, at.unchecked_add(1200)).unwrap();
        assert_eq!(send(&mut sink), 1, "a wrong byte is counted");
        assert_eq!(sink.take_bad_frames(), 0, "and taken once");
        mem.write_obj(frame[1200], at.unchecked_add(1200)).unwrap();
        mem.write_obj(0u8, at).unwrap();
        assert_eq!(send(&mut sink), 1, "a wrong first byte too");
    }
}
