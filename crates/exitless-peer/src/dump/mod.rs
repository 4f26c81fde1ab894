//! The probe's serial dump: how its results leave a VMM that cannot read guest memory for us.
//!
//! Under QEMU the probe prints, on COM1 and only after every op has run
//! (crates/exitless-guest/probe/qemu_boot.c, `dump_results`), lines of lowercase hex numbers separated by single
//! spaces:
//!
//! ```text
//! exitless-results TSC_KHZ OPS RECORDS
//! r STATUS VALUE CYCLES METHOD_USED IRQS STRAY_IRQS BYTES RESETS     (OPS lines: OpResult)
//! e ADDRESS HEADER×16 BAR_SIZES×6 CAPS×8 CAP_COUNT FLAGS             (RECORDS lines: EnumRecord)
//! exitless-end CHECKSUM
//! ```
//!
//! Each `r` and `e` line holds its contract block's `u64` fields in declaration order. The
//! records are those of the last `OP_ENUMERATE`, as exitless reads them from guest memory. The
//! checksum is FNV-1a 64 over every byte from the first line's first byte through the newline
//! before the last line, so a dump cut short or altered in transit is refused, never read as
//! results. Whatever the serial port carried before the first line (firmware banners) is
//! ignored.

use zerocopy::FromBytes;

use exitless_contract::{DUMP_BEGIN, DUMP_END, EnumRecord, MAX_ENUM_RECORDS, MAX_OPS, OpResult};

/// What the probe reported.
#[derive(Debug)]
pub struct Dump {
    /// The TSC frequency the probe measured against the ACPI PM timer.
    pub tsc_khz: u64,
    /// One per op, in op order.
    pub results: Vec<OpResult>,
    /// The last `OP_ENUMERATE`'s records.
    pub enum_records: Vec<EnumRecord>,
}

/// Why a serial dump was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DumpError {
    /// No first line: the probe never reported.
    #[error("has no `{DUMP_BEGIN}` line: the probe did not get to report its results")]
    NoBegin,
    /// The output stops before the last line is complete.
    #[error("is truncated: it stops in line {line}, before the `{DUMP_END}` line")]
    Truncated {
        /// The line (1-based) the output stops in or before.
        line: usize,
    },
    /// A line that is not what the format says.
    #[error("is garbled: line {line} {problem}: {text:?}")]
    Garbled {
        /// 1-based, from the first line.
        line: usize,
        /// What is wrong with it.
        problem: String,
        /// The line as received.
        text: String,
    },
    /// Every line well-formed, yet not the bytes the probe sent.
    #[error("is garbled: its checksum is {written:#018x} but its lines sum to {computed:#018x}")]
    Checksum {
        /// The checksum on the last line.
        written: u64,
        /// The checksum of the lines received.
        computed: u64,
    },
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a 64 of `bytes`, as the probe computes it.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(FNV_OFFSET, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(FNV_PRIME)
    })
}

/// `u64` words of a contract block.
fn words_of<T>() -> usize {
    size_of::<T>() / 8
}

/// The lines of the dump, each checked for its tag and field count.
struct Lines<'a> {
    lines: std::str::SplitInclusive<'a, char>,
    number: usize,
}

impl<'a> Lines<'a> {
    /// The next whole line without its newline, or `Truncated`.
    fn next_line(&mut self) -> Result<&'a str, DumpError> {
        self.number += 1;
        let truncated = DumpError::Truncated { line: self.number };
        let line = self.lines.next().ok_or(truncated.clone())?;
        line.strip_suffix('\n').ok_or(truncated)
    }

    /// The next line's numbers, which must follow `tag` and be `count`.
    fn fields(&mut self, tag: &str, count: usize) -> Result<Vec<u64>, DumpError> {
        let line = self.next_line()?;
        let number = self.number;
        let garbled = |problem: String| DumpError::Garbled {
            line: number,
            problem,
            text: line.to_owned(),
        };
        let mut parts = line.split(' ');
        if parts.next() != Some(tag) {
            return Err(garbled(format!("does not start with `{tag}`")));
        }
        let values = parts
            .map(|p| parse_hex(p).ok_or_else(|| garbled(format!("has {p:?}, not a hex number"))))
            .collect::<Result<Vec<u64>, DumpError>>()?;
        if values.len() != count {
            return Err(garbled(format!(
                "has {} numbers after `{tag}`, not {count}",
                values.len()
            )));
        }
        Ok(values)
    }
}

/// A number as the probe prints it: 1 to 16 lowercase hex digits.
fn parse_hex(s: &str) -> Option<u64> {
    let digits = s
        .bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    (digits && (1..=16).contains(&s.len()))
        .then(|| u64::from_str_radix(s, 16).ok())
        .flatten()
}

/// A contract block from its words.
fn block<T: FromBytes>(words: &[u64]) -> T {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    T::read_from_bytes(&bytes).expect("the word count was checked against the block's size")
}

/// Find the dump in everything the serial port carried and read it.
pub fn parse(serial: &str) -> Result<Dump, DumpError> {
    let marker = format!("{DUMP_BEGIN} ");
    let begin = serial
        .match_indices(&marker)
        .map(|(i, _)| i)
        .find(|&i| i == 0 || serial.as_bytes()[i - 1] == b'\n')
        .ok_or(DumpError::NoBegin)?;
    let text = &serial[begin..];
    let mut lines = Lines {
        lines: text.split_inclusive('\n'),
        number: 0,
    };
    let first = lines.fields(DUMP_BEGIN, 3)?;
    let (tsc_khz, ops, records) = (first[0], first[1], first[2]);
    if ops > MAX_OPS || records > MAX_ENUM_RECORDS {
        return Err(DumpError::Garbled {
            line: 1,
            problem: format!(
                "announces {ops} results and {records} records; the probe holds at most \
                 {MAX_OPS} and {MAX_ENUM_RECORDS}"
            ),
            text: text.lines().next().unwrap_or_default().to_owned(),
        });
    }
    let ops = usize::try_from(ops).expect("at most MAX_OPS");
    let records = usize::try_from(records).expect("at most MAX_ENUM_RECORDS");
    let results = (0..ops)
        .map(|_| lines.fields("r", words_of::<OpResult>()).map(|w| block(&w)))
        .collect::<Result<Vec<OpResult>, _>>()?;
    let enum_records = (0..records)
        .map(|_| {
            lines
                .fields("e", words_of::<EnumRecord>())
                .map(|w| block(&w))
        })
        .collect::<Result<Vec<EnumRecord>, _>>()?;
    let body_len: usize = text
        .split_inclusive('\n')
        .take(1 + ops + records)
        .map(str::len)
        .sum();
    let written = lines.fields(DUMP_END, 1)?[0];
    let computed = fnv1a(&text.as_bytes()[..body_len]);
    if written != computed {
        return Err(DumpError::Checksum { written, computed });
    }
    Ok(Dump {
        tsc_khz,
        results,
        enum_records,
    })
}

#[cfg(test)]
mod tests;
