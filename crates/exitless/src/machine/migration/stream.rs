//! The migration stream: what a source sends and a target answers, record by record.
//!
//! The stream opens with [`MAGIC`] and the format's version (a little-endian u32); then every
//! record is its kind (one byte), its payload's length and the payload's CRC-32 (IEEE; each a
//! little-endian u32), and the payload. The source sends `Config` first and waits for the
//! target's `Accepted` (its guest RAM made: a target's VM takes milliseconds to create, which
//! would otherwise fall into a live update's pause), then `Pages` and `Zeros` in passes,
//! `State` once the machine is paused, and `End`; the target answers `Ready` (the machine is
//! built and its state set) or `Refused`, and the source's `Go` hands the machine over. A record is believed only once it is whole and its checksum matches: a
//! stream cut short or changed on the way is refused before any vCPU runs. Every value read
//! is checked as a guest's would be: a length past [`MAX_PAYLOAD`] is refused before anything
//! is allocated, and where pages go is the target's to check against its RAM.

use std::io::{self, Read, Write};

/// What a migration stream begins with.
pub const MAGIC: [u8; 8] = *b"EXLMIGR\n";
/// The stream's format; a target takes this one only.
pub const FORMAT_VERSION: u32 = 2;
/// Bytes of [`write_preface`]'s preface: the magic and the version.
pub const PREFACE_LEN: usize = MAGIC.len() + 4;
/// The base page, the unit pages are sent in (Intel SDM Vol. 3A §4.3).
pub const PAGE: usize = 4096;
/// Most pages one `Pages` record carries: a run of them is cut into records of this many.
pub const MAX_RUN: usize = 256;
/// Largest payload read: the state of 64 vCPUs and every device is well under it (as a
/// snapshot's description is), and a `Pages` record is far under.
pub const MAX_PAYLOAD: u32 = 64 << 20;

/// One record of the stream.
#[derive(Debug, PartialEq, Eq)]
pub enum Record {
    /// The machine's configuration and the exitless that sends it (JSON).
    Config(Vec<u8>),
    /// Pages at `gpa` (page-aligned), one after another: `data` is a whole number of pages.
    Pages {
        /// The first page's guest-physical address.
        gpa: u64,
        /// The pages' bytes.
        data: Vec<u8>,
    },
    /// `pages` pages at `gpa` that are all zero now.
    Zeros {
        /// The first page's guest-physical address.
        gpa: u64,
        /// How many.
        pages: u64,
    },
    /// The paused machine's vCPUs', VM's and devices' states (JSON).
    State(Vec<u8>),
    /// Nothing more comes: the target builds the machine and answers.
    End,
    /// The target's answer to `End`: the machine is built and its state set; on `Go` it runs.
    Ready,
    /// The target's answer: it will not run the machine, and why (one line).
    Refused(String),
    /// The source's last word: the machine is the target's.
    Go,
    /// The target's answer to `Config`: it takes the machine, its guest RAM is made.
    Accepted,
}

/// Why a stream cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// The connection failed, or ended.
    #[error("the migration stream broke: {0}")]
    Io(#[from] io::Error),
    /// It does not begin as exitless's do.
    #[error("the peer does not speak exitless's migration stream")]
    NotOne,
    /// Another format.
    #[error(
        "the migration stream's format is version {0}; this exitless reads version \
         {FORMAT_VERSION} only (migrate between the same exitless)"
    )]
    FormatVersion(u32),
    /// A record whose kind, length or contents no exitless writes.
    #[error("the migration stream is corrupt: {0}")]
    Corrupt(String),
}

/// Record kinds, as the first byte of each record says.
const CONFIG: u8 = 1;
const PAGES: u8 = 2;
const ZEROS: u8 = 3;
const STATE: u8 = 4;
const END: u8 = 5;
const READY: u8 = 6;
const REFUSED: u8 = 7;
const GO: u8 = 8;
const ACCEPTED: u8 = 9;

/// Begin a stream: the magic and the format's version.
pub fn write_preface(out: &mut impl Write) -> io::Result<()> {
    out.write_all(&MAGIC)?;
    out.write_all(&FORMAT_VERSION.to_le_bytes())
}

/// Read a stream's beginning: an exitless migration stream of this format, or why not.
pub fn read_preface(input: &mut impl Read) -> Result<(), StreamError> {
    let mut magic = [0; MAGIC.len()];
    input.read_exact(&mut magic)?;
    if magic != MAGIC {
        return Err(StreamError::NotOne);
    }
    let version = u32::from_le_bytes(read_array(input)?);
    if version != FORMAT_VERSION {
        return Err(StreamError::FormatVersion(version));
    }
    Ok(())
}

fn read_array<const N: usize>(input: &mut impl Read) -> io::Result<[u8; N]> {
    let mut bytes = [0; N];
    input.read_exact(&mut bytes)?;
    Ok(bytes)
}

/// A reader or writer that counts the bytes that go through it: what a side of the stream
/// sent or took.
pub struct Counted<T> {
    inner: T,
    /// Bytes so far.
    pub bytes: u64,
}

impl<T> Counted<T> {
    /// Count what goes through `inner`, from zero.
    pub fn new(inner: T) -> Self {
        Counted { inner, bytes: 0 }
    }
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }
}

impl<W: Write> Write for Counted<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Longest refusal a source repeats: a target's reason is one line, and the target is not
/// trusted to keep it short.
const MAX_REASON: usize = 500;

/// `bytes` as one line a source can log and answer with: UTF-8 (bad bytes replaced), control
/// characters (a line break among them) as spaces, at most [`MAX_REASON`] characters.
fn one_line(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(MAX_REASON)
        .collect()
}

fn corrupt(why: impl Into<String>) -> StreamError {
    StreamError::Corrupt(why.into())
}

impl Record {
    /// Write the record to `out` (buffered by the caller).
    pub fn write_to(&self, out: &mut impl Write) -> io::Result<()> {
        let mut head = Vec::new();
        let (kind, payload): (u8, &[u8]) = match self {
            Record::Config(json) => (CONFIG, json),
            Record::Pages { gpa, data } => {
                head.extend_from_slice(&gpa.to_le_bytes());
                (PAGES, data)
            }
            Record::Zeros { gpa, pages } => {
                head.extend_from_slice(&gpa.to_le_bytes());
                head.extend_from_slice(&pages.to_le_bytes());
                (ZEROS, &[])
            }
            Record::State(json) => (STATE, json),
            Record::End => (END, &[]),
            Record::Ready => (READY, &[]),
            Record::Refused(why) => (REFUSED, why.as_bytes()),
            Record::Go => (GO, &[]),
            Record::Accepted => (ACCEPTED, &[]),
        };
        let length = u32::try_from(head.len() + payload.len())
            .ok()
            .filter(|&n| n <= MAX_PAYLOAD)
            .ok_or_else(|| io::Error::other("a migration record past the stream's limit"))?;
        let mut crc = crc32fast::Hasher::new();
        crc.update(&head);
        crc.update(payload);
        out.write_all(&[kind])?;
        out.write_all(&length.to_le_bytes())?;
        out.write_all(&crc.finalize().to_le_bytes())?;
        out.write_all(&head)?;
        out.write_all(payload)
    }

    /// Read one whole record from `input`, its length and checksum checked before it is
    /// believed.
    pub fn read_from(input: &mut impl Read) -> Result<Record, StreamError> {
        let [kind] = read_array(input)?;
        let length = u32::from_le_bytes(read_array(input)?);
        let crc = u32::from_le_bytes(read_array(input)?);
        if !(CONFIG..=ACCEPTED).contains(&kind) {
            return Err(corrupt(format!("a record of kind {kind}")));
        }
        if length > MAX_PAYLOAD {
            return Err(corrupt(format!("a record of {length} bytes")));
        }
        let mut payload = Vec::new();
        input.take(u64::from(length)).read_to_end(&mut payload)?;
        if payload.len() != length as usize {
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
        }
        if crc32fast::hash(&payload) != crc {
            return Err(corrupt("a record does not match its checksum"));
        }
        Self::parse(kind, payload)
    }

    fn parse(kind: u8, mut payload: Vec<u8>) -> Result<Record, StreamError> {
        let empty = |record: Record, payload: &[u8]| {
            if payload.is_empty() {
                Ok(record)
            } else {
                Err(corrupt(format!("{record:?} with a payload")))
            }
        };
        let gpa = |payload: &[u8]| -> Result<u64, StreamError> {
            let bytes = payload
                .get(..8)
                .ok_or_else(|| corrupt("pages with no address"))?;
            let gpa = u64::from_le_bytes(bytes.try_into().expect("8 bytes"));
            if !gpa.is_multiple_of(PAGE as u64) {
                return Err(corrupt(format!("pages at {gpa:#x}, not a page's start")));
            }
            Ok(gpa)
        };
        match kind {
            CONFIG => Ok(Record::Config(payload)),
            PAGES => {
                let at = gpa(&payload)?;
                let data = payload.split_off(8);
                if data.is_empty()
                    || !data.len().is_multiple_of(PAGE)
                    || data.len() > MAX_RUN * PAGE
                {
                    return Err(corrupt(format!("pages of {} bytes", data.len())));
                }
                Ok(Record::Pages { gpa: at, data })
            }
            ZEROS => {
                let at = gpa(&payload)?;
                let count = payload
                    .get(8..)
                    .and_then(|rest| <[u8; 8]>::try_from(rest).ok())
                    .map(u64::from_le_bytes)
                    .ok_or_else(|| corrupt("zero pages with no count"))?;
                Ok(Record::Zeros {
                    gpa: at,
                    pages: count,
                })
            }
            STATE => Ok(Record::State(payload)),
            END => empty(Record::End, &payload),
            READY => empty(Record::Ready, &payload),
            REFUSED => Ok(Record::Refused(one_line(&payload))),
            GO => empty(Record::Go, &payload),
            ACCEPTED => empty(Record::Accepted, &payload),
            _ => unreachable!("kinds checked above"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(records: &[Record]) -> Vec<u8> {
        let mut bytes = Vec::new();
        write_preface(&mut bytes).unwrap();
        for record in records {
            record.write_to(&mut bytes).unwrap();
        }
        bytes
    }

    fn every_record() -> Vec<Record> {
        vec![
            Record::Config(br#"{"a":1}"#.to_vec()),
            Record::Pages {
                gpa: 0x3000,
                data: vec![7; 2 * PAGE],
            },
            Record::Zeros {
                gpa: 0x1000,
                pages: 3,
            },
            Record::State(b"{}".to_vec()),
            Record::End,
            Record::Ready,
            Record::Refused("no room".into()),
            Record::Go,
            Record::Accepted,
        ]
    }

    #[test]
    fn every_record_reads_back_as_written() {
        let records = every_record();
        let bytes = written(&records);
        let mut input = &bytes[..];
        read_preface(&mut input).unwrap();
        for record in records {
            assert_eq!(Record::read_from(&mut input).unwrap(), record);
        }
        assert!(input.is_empty());
    }

    #[test]
    fn a_stream_cut_anywhere_is_an_error_not_a_record() {
        let bytes = written(&every_record());
        for cut in 0..bytes.len() {
            let mut input = &bytes[..cut];
            let read = read_preface(&mut input).and_then(|()| {
                loop {
                    if Record::read_from(&mut input)? == Record::Accepted {
                        break Ok(());
                    }
                }
            });
            assert!(read.is_err(), "cut at {cut} read whole");
        }
    }

    #[test]
    fn a_refusal_is_read_as_one_short_line() {
        let mut bytes = Vec::new();
        let long = format!("no\nroom\x1b[2J{}", "x".repeat(2000));
        Record::Refused(long).write_to(&mut bytes).unwrap();
        let Record::Refused(why) = Record::read_from(&mut &bytes[..]).unwrap() else {
            panic!("a refusal");
        };
        assert!(why.starts_with("no room [2Jxxx"), "{why}");
        assert_eq!(why.chars().count(), MAX_REASON);
    }

    #[test]
    fn a_changed_byte_is_caught() {
        let bytes = written(&every_record()[..2]);
        // Each byte of the page data changed in turn is a checksum mismatch.
        for at in [bytes.len() - 1, bytes.len() - PAGE] {
            let mut changed = bytes.clone();
            changed[at] ^= 1;
            let mut input = &changed[..];
            read_preface(&mut input).unwrap();
            Record::read_from(&mut input).unwrap();
            let err = Record::read_from(&mut input).unwrap_err();
            assert!(err.to_string().contains("checksum"), "{err}");
        }
    }

    #[test]
    fn what_no_exitless_writes_is_refused() {
        let mut other = written(&[]);
        other[0] = b'X';
        assert!(matches!(
            read_preface(&mut &other[..]),
            Err(StreamError::NotOne)
        ));
        let mut newer = written(&[]);
        newer[MAGIC.len()] = 9;
        assert!(matches!(
            read_preface(&mut &newer[..]),
            Err(StreamError::FormatVersion(9))
        ));
        let record = |kind: u8, payload: &[u8]| {
            let mut bytes = vec![kind];
            bytes.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_le_bytes());
            bytes.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
            bytes.extend_from_slice(payload);
            Record::read_from(&mut &bytes[..])
        };
        let misaligned = [0x1001_u64.to_le_bytes().to_vec(), vec![0; PAGE]].concat();
        let partial = [0x1000_u64.to_le_bytes().to_vec(), vec![0; 100]].concat();
        let too_many = [0_u64.to_le_bytes().to_vec(), vec![0; (MAX_RUN + 1) * PAGE]].concat();
        for (kind, payload, says) in [
            (0, &[][..], "kind 0"),
            (99, &[][..], "kind 99"),
            (PAGES, &misaligned[..], "not a page's start"),
            (PAGES, &partial[..], "pages of 100 bytes"),
            (PAGES, &too_many[..], "pages of"),
            (PAGES, &[1, 2][..], "no address"),
            (ZEROS, &[0; 12][..], "no count"),
            (END, &[1][..], "with a payload"),
        ] {
            let err = record(kind, payload).unwrap_err();
            assert!(err.to_string().contains(says), "{says}: {err}");
        }
        // A length past the limit is refused before anything is read or allocated.
        let mut huge = vec![STATE];
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        huge.extend_from_slice(&[0; 4]);
        let err = Record::read_from(&mut &huge[..]).unwrap_err();
        assert!(err.to_string().contains("4294967295 bytes"), "{err}");
    }
}
