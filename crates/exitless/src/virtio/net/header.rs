//! The virtio-net header in front of every frame (virtio 1.2 §5.1.6, `struct virtio_net_hdr`:
//! 12 bytes with VIRTIO_F_VERSION_1, little-endian), and the offloads it carries: a checksum
//! left for the other side to fill in (NEEDS_CSUM at `csum_start` + `csum_offset`) and a
//! segment larger than the MTU to be cut into `gso_size` pieces (TCP over IPv4 or IPv6,
//! optionally with ECN; UDP datagrams, USO, where the tap takes them). Which of them may
//! appear each way is what the driver negotiated ([`Offloads`]).
//!
//! A header from the driver is read once into a copy ([`NetHeader::from_bytes`]) and checked
//! against the frame after it and the features ([`NetHeader::for_backend`]); the copy, never
//! the guest's buffer, goes to the backend, so the driver cannot change it after the check.
//! A header from the backend (a tap's kernel) is checked against what the driver can take
//! ([`NetHeader::for_driver`]) before the driver sees it.

use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_CSUM, VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_ECN, VIRTIO_NET_F_GUEST_TSO4,
    VIRTIO_NET_F_GUEST_TSO6, VIRTIO_NET_F_GUEST_USO4, VIRTIO_NET_F_GUEST_USO6,
    VIRTIO_NET_F_HOST_ECN, VIRTIO_NET_F_HOST_TSO4, VIRTIO_NET_F_HOST_TSO6, VIRTIO_NET_F_HOST_USO,
    VIRTIO_NET_HDR_F_DATA_VALID, VIRTIO_NET_HDR_F_NEEDS_CSUM, VIRTIO_NET_HDR_GSO_ECN,
    VIRTIO_NET_HDR_GSO_NONE, VIRTIO_NET_HDR_GSO_TCPV4, VIRTIO_NET_HDR_GSO_TCPV6,
    VIRTIO_NET_HDR_GSO_UDP_L4,
};

use super::HDR;

/// The offload features a device offers when its backend carries headers through (a tap):
/// checksums and TCP segmentation both ways, with ECN. UDP fragmentation (HOST_UFO/GUEST_UFO)
/// is left out, as Linux drivers since 4.14 never use it; UDP segmentation is
/// [`USO_FEATURES`].
pub const OFFLOAD_FEATURES: u64 = (1 << VIRTIO_NET_F_CSUM)
    | (1 << VIRTIO_NET_F_GUEST_CSUM)
    | (1 << VIRTIO_NET_F_GUEST_TSO4)
    | (1 << VIRTIO_NET_F_GUEST_TSO6)
    | (1 << VIRTIO_NET_F_GUEST_ECN)
    | (1 << VIRTIO_NET_F_HOST_TSO4)
    | (1 << VIRTIO_NET_F_HOST_TSO6)
    | (1 << VIRTIO_NET_F_HOST_ECN);

/// UDP segmentation both ways (virtio 1.2 §5.1.3: HOST_USO, GUEST_USO4, GUEST_USO6), offered
/// beside [`OFFLOAD_FEATURES`] only where the tap takes such segments (TUN_F_USO4/6, Linux
/// 6.2; `Tap::open` asks the kernel), as QEMU offers them.
pub const USO_FEATURES: u64 =
    (1 << VIRTIO_NET_F_HOST_USO) | (1 << VIRTIO_NET_F_GUEST_USO4) | (1 << VIRTIO_NET_F_GUEST_USO6);

/// The offload features a device offers on backends that carry headers through, `uso` where
/// they all take UDP segments too ([`super::NetBackend::passes_uso`]).
pub fn offload_features(uso: bool) -> u64 {
    OFFLOAD_FEATURES | if uso { USO_FEATURES } else { 0 }
}

#[allow(clippy::cast_possible_truncation)] // the header's one-byte values
mod bits {
    use super::*;
    pub const NEEDS_CSUM: u8 = VIRTIO_NET_HDR_F_NEEDS_CSUM as u8;
    pub const DATA_VALID: u8 = VIRTIO_NET_HDR_F_DATA_VALID as u8;
    pub const GSO_NONE: u8 = VIRTIO_NET_HDR_GSO_NONE as u8;
    pub const GSO_TCPV4: u8 = VIRTIO_NET_HDR_GSO_TCPV4 as u8;
    pub const GSO_TCPV6: u8 = VIRTIO_NET_HDR_GSO_TCPV6 as u8;
    pub const GSO_ECN: u8 = VIRTIO_NET_HDR_GSO_ECN as u8;
    pub const GSO_UDP_L4: u8 = VIRTIO_NET_HDR_GSO_UDP_L4 as u8;
}
use bits::*;

/// What may travel one way: a checksum left to fill in, TCP segments over IPv4 or IPv6, ECN
/// on them, UDP segments over IPv4 or IPv6.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Direction {
    /// NEEDS_CSUM (a partial checksum); DATA_VALID too, toward the driver.
    pub csum: bool,
    /// GSO TCPV4.
    pub tso4: bool,
    /// GSO TCPV6.
    pub tso6: bool,
    /// The ECN bit on a TCP segment.
    pub ecn: bool,
    /// GSO UDP_L4 over IPv4.
    pub uso4: bool,
    /// GSO UDP_L4 over IPv6 (the header's type is the same: the tap is told which it may
    /// hand over, `TUN_F_USO4`/`TUN_F_USO6`; toward the backend HOST_USO gives both).
    pub uso6: bool,
}

impl Direction {
    /// The one way's features: `csum`, `tso4`, `tso6`, `ecn`, `uso4`, `uso6` bits of
    /// `features`. A feature is taken only with those it needs (§5.1.3.1: segmentation needs
    /// the checksum, ECN needs TCP segmentation), whatever else the driver accepted.
    fn from(features: u64, [csum, tso4, tso6, ecn, uso4, uso6]: [u32; 6]) -> Self {
        let has = |bit: u32| features & (1 << bit) != 0;
        let csum = has(csum);
        let (tso4, tso6) = (csum && has(tso4), csum && has(tso6));
        Direction {
            csum,
            tso4,
            tso6,
            ecn: (tso4 || tso6) && has(ecn),
            uso4: csum && has(uso4),
            uso6: csum && has(uso6),
        }
    }

    fn allows_gso(self, gso_type: u8) -> bool {
        let ecn = gso_type & GSO_ECN != 0;
        match gso_type & !GSO_ECN {
            GSO_TCPV4 => self.tso4 && (!ecn || self.ecn),
            GSO_TCPV6 => self.tso6 && (!ecn || self.ecn),
            // ECN is TCP's (§5.1.6.2.1).
            GSO_UDP_L4 => (self.uso4 || self.uso6) && !ecn,
            _ => false,
        }
    }
}

/// The offloads a driver negotiated: `tx` in the frames it sends (VIRTIO_NET_F_CSUM,
/// HOST_TSO4/6, HOST_ECN, HOST_USO), `rx` in those it takes (GUEST_CSUM, GUEST_TSO4/6,
/// GUEST_ECN, GUEST_USO4/6).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Offloads {
    /// Toward the backend.
    pub tx: Direction,
    /// Toward the driver.
    pub rx: Direction,
}

impl Offloads {
    /// The offloads in the driver's `features`.
    pub fn negotiated(features: u64) -> Self {
        Offloads {
            tx: Direction::from(
                features,
                [
                    VIRTIO_NET_F_CSUM,
                    VIRTIO_NET_F_HOST_TSO4,
                    VIRTIO_NET_F_HOST_TSO6,
                    VIRTIO_NET_F_HOST_ECN,
                    VIRTIO_NET_F_HOST_USO,
                    VIRTIO_NET_F_HOST_USO,
                ],
            ),
            rx: Direction::from(
                features,
                [
                    VIRTIO_NET_F_GUEST_CSUM,
                    VIRTIO_NET_F_GUEST_TSO4,
                    VIRTIO_NET_F_GUEST_TSO6,
                    VIRTIO_NET_F_GUEST_ECN,
                    VIRTIO_NET_F_GUEST_USO4,
                    VIRTIO_NET_F_GUEST_USO6,
                ],
            ),
        }
    }
}

/// A header a side sent against what was negotiated or against its frame. Each names the
/// field, for the device's rate-limited log line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadHeader {
    /// NEEDS_CSUM without the checksum offload (or, toward the driver, DATA_VALID).
    #[error("flags {0:#x} without the checksum offload negotiated")]
    Flags(u8),
    /// The checksum's place is not inside the frame.
    #[error("checksum at csum_start {start} + csum_offset {offset} past the {len}-byte frame")]
    Checksum {
        /// csum_start.
        start: u16,
        /// csum_offset.
        offset: u16,
        /// The frame's length.
        len: usize,
    },
    /// A segmentation kind not negotiated (UDP fragments; TCP or UDP segments without their
    /// feature), or ECN without it or on UDP.
    #[error("gso_type {0:#x} not negotiated")]
    GsoType(u8),
    /// Segmentation without a segment size, or from the driver without a checksum to fill in.
    #[error("gso_type {gso_type:#x} with gso_size {gso_size} and flags {flags:#x}")]
    Gso {
        /// gso_type.
        gso_type: u8,
        /// gso_size.
        gso_size: u16,
        /// flags.
        flags: u8,
    },
    /// The headers' length is past the frame.
    #[error("hdr_len {hdr_len} past the {len}-byte frame")]
    HdrLen {
        /// hdr_len.
        hdr_len: u16,
        /// The frame's length.
        len: usize,
    },
}

/// `struct virtio_net_hdr` (§5.1.6), its fields in host order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetHeader {
    /// NEEDS_CSUM, DATA_VALID.
    pub flags: u8,
    /// GSO_NONE, GSO_TCPV4, GSO_TCPV6 (with GSO_ECN), GSO_UDP_L4 (GSO_UDP: never negotiated).
    pub gso_type: u8,
    /// The length of the headers before the payload, a hint to the segmenting side.
    pub hdr_len: u16,
    /// The segment size (the MSS) with GSO.
    pub gso_size: u16,
    /// Where the checksummed part starts, with NEEDS_CSUM.
    pub csum_start: u16,
    /// Where the checksum is, after `csum_start`.
    pub csum_offset: u16,
    /// How many receive buffers the frame fills (toward the driver; 0 from it).
    pub num_buffers: u16,
}

impl NetHeader {
    /// The header in `bytes` (little-endian, §5.1.6).
    pub fn from_bytes(bytes: &[u8; HDR]) -> Self {
        let le = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]);
        NetHeader {
            flags: bytes[0],
            gso_type: bytes[1],
            hdr_len: le(2),
            gso_size: le(4),
            csum_start: le(6),
            csum_offset: le(8),
            num_buffers: le(10),
        }
    }

    /// The header as it goes in front of a frame.
    pub fn to_bytes(self) -> [u8; HDR] {
        let mut bytes = [0; HDR];
        bytes[0] = self.flags;
        bytes[1] = self.gso_type;
        for (at, value) in [
            (2, self.hdr_len),
            (4, self.gso_size),
            (6, self.csum_start),
            (8, self.csum_offset),
            (10, self.num_buffers),
        ] {
            bytes[at..at + 2].copy_from_slice(&value.to_le_bytes());
        }
        bytes
    }

    /// The header the driver put before a transmitted frame of `len` bytes, as the backend is
    /// to get it, or why the frame must be dropped. Flags the device does not act on are
    /// ignored (§5.1.6.2.2: DATA_VALID and RSC_INFO are the device's to set), `num_buffers`
    /// is zero (§5.1.6.2.1), and without NEEDS_CSUM the checksum fields are not used.
    pub fn for_backend(self, len: usize, offloads: Direction) -> Result<Self, BadHeader> {
        self.kept(NEEDS_CSUM, 0).checked(len, offloads, true)
    }

    /// A header from the backend for a received frame of `len` bytes, as the driver is to
    /// get it (one receive buffer: `num_buffers` 1), or why the frame must be dropped: only
    /// what the driver negotiated may reach it (§5.1.6.3.1: without GUEST_CSUM, flags are
    /// zero; a GSO type only with its GUEST_ feature).
    pub fn for_driver(self, len: usize, offloads: Direction) -> Result<Self, BadHeader> {
        self.kept(NEEDS_CSUM | DATA_VALID, 1)
            .checked(len, offloads, false)
    }

    /// The header with only the `flags` a side acts on, `num_buffers` set, and the checksum
    /// fields cleared where NEEDS_CSUM is not set (they are not used then).
    fn kept(self, flags: u8, num_buffers: u16) -> Self {
        let flags = self.flags & flags;
        let partial = flags & NEEDS_CSUM != 0;
        NetHeader {
            flags,
            num_buffers,
            csum_start: if partial { self.csum_start } else { 0 },
            csum_offset: if partial { self.csum_offset } else { 0 },
            ..self
        }
    }

    /// The header itself if it passes [`NetHeader::check`].
    fn checked(
        self,
        len: usize,
        offloads: Direction,
        gso_needs_csum: bool,
    ) -> Result<Self, BadHeader> {
        self.check(len, offloads, gso_needs_csum).map(|()| self)
    }

    /// The checks both ways: the flags, the checksum's place, the headers' length and the
    /// segmentation against `offloads` and a frame of `len` bytes. A segment needs a size
    /// (Linux's virtio_net_hdr_to_skb() refuses 0) and, from the driver, NEEDS_CSUM
    /// (`gso_needs_csum`, §5.1.6.2.1); toward the driver the kernel marks a segment it has
    /// checksummed DATA_VALID instead, or neither.
    fn check(
        &self,
        len: usize,
        offloads: Direction,
        gso_needs_csum: bool,
    ) -> Result<(), BadHeader> {
        if self.flags != 0 && !offloads.csum {
            return Err(BadHeader::Flags(self.flags));
        }
        if self.flags & NEEDS_CSUM != 0 {
            let end = usize::from(self.csum_start) + usize::from(self.csum_offset) + 2;
            if end > len {
                return Err(BadHeader::Checksum {
                    start: self.csum_start,
                    offset: self.csum_offset,
                    len,
                });
            }
        }
        if usize::from(self.hdr_len) > len {
            return Err(BadHeader::HdrLen {
                hdr_len: self.hdr_len,
                len,
            });
        }
        if self.gso_type == GSO_NONE {
            return Ok(());
        }
        if !offloads.allows_gso(self.gso_type) {
            return Err(BadHeader::GsoType(self.gso_type));
        }
        if self.gso_size == 0 || (gso_needs_csum && self.flags & NEEDS_CSUM == 0) {
            return Err(BadHeader::Gso {
                gso_type: self.gso_type,
                gso_size: self.gso_size,
                flags: self.flags,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
pub(super) mod tests;
