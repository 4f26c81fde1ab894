#![no_main]
//! A migration target's reader (`machine::migration::receive::read_stream`) on arbitrary
//! streams: what `exitless run --migrate-from` takes from whoever connects. Half the inputs are
//! the stream as is; the other half are records framed with the right lengths and checksums
//! after a valid preface and configuration (a 2 MiB machine), so that the fuzzer reaches what
//! comes after the framing: pages, zeros, states, records out of place. Beyond "no panic":
//! - every stream is refused with a one-line error, or read whole;
//! - a stream read whole held a state for the machine, and its RAM is exactly what its `Pages`
//!   and `Zeros` records, replayed in order on zeroed memory, make it: nothing written outside
//!   what a record named, nothing a record named left out.

use exitless::machine::MachineConfig;
use exitless::machine::migration::MigrationError;
use exitless::machine::migration::receive::read_stream;
use exitless::machine::migration::stream::{PAGE, Record, write_preface};
use libfuzzer_sys::fuzz_target;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// The machine's RAM.
const RAM: usize = 2 << 20;

/// The structured half's stream: the preface and a configuration, then each of the input's
/// records (a kind byte, a 16-bit length, the payload) framed as a writer frames them.
fn framed(data: &[u8]) -> Vec<u8> {
    let mut stream = Vec::new();
    write_preface(&mut stream).unwrap();
    let config = serde_json::json!({
        "exitless_version": env!("CARGO_PKG_VERSION"),
        "config": MachineConfig { ram_size: RAM, ..Default::default() },
    });
    Record::Config(config.to_string().into_bytes())
        .write_to(&mut stream)
        .unwrap();
    let mut rest = data;
    while let [kind, lo, hi, tail @ ..] = rest {
        let len = usize::from(u16::from_le_bytes([*lo, *hi])).min(tail.len());
        let (payload, next) = tail.split_at(len);
        stream.push(*kind);
        stream.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_le_bytes());
        stream.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
        stream.extend_from_slice(payload);
        rest = next;
    }
    stream
}

/// RAM as the stream's page records, read one by one after its preface, make it.
fn replayed(stream: &[u8]) -> Vec<u8> {
    let mut ram = vec![0; RAM];
    let mut input = &stream[12..];
    while let Ok(record) = Record::read_from(&mut input) {
        match record {
            Record::Pages { gpa, data } => {
                let at = usize::try_from(gpa).unwrap();
                ram[at..at + data.len()].copy_from_slice(&data);
            }
            Record::Zeros { gpa, pages } => {
                let at = usize::try_from(gpa).unwrap();
                let len = usize::try_from(pages).unwrap() * PAGE;
                ram[at..at + len].fill(0);
            }
            Record::End => break,
            _ => {}
        }
    }
    ram
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let stream = if mode & 1 == 0 { rest.to_vec() } else { framed(rest) };
    let read = read_stream(&mut &stream[..], |cfg| {
        if cfg.ram_size != RAM {
            return Err(MigrationError::Order("not the fuzzer's machine".into()));
        }
        Ok(GuestMemoryMmap::from_ranges(&[(GuestAddress(0), RAM)]).unwrap())
    });
    match read {
        Err(e) => assert!(!e.to_string().contains('\n'), "one line: {e}"),
        Ok(received) => {
            assert_eq!(received.state.state.vcpus.len(), usize::from(received.config.vcpus));
            let mut ram = vec![0; RAM];
            received
                .ram
                .read_slice(&mut ram, GuestAddress(0))
                .unwrap();
            assert!(ram == replayed(&stream), "RAM is what the records made it");
        }
    }
});
