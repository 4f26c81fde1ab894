use zerocopy::IntoBytes;

use super::*;

/// A dump as the probe writes it (crates/exitless-guest/probe/qemu_boot.c, `dump_results`).
fn render(tsc_khz: u64, results: &[OpResult], records: &[EnumRecord]) -> String {
    fn line(tag: &str, words: &[u8]) -> String {
        let mut l = tag.to_owned();
        for w in words.chunks_exact(8) {
            let v = u64::from_le_bytes(w.try_into().expect("8 bytes"));
            l += &format!(" {v:x}");
        }
        l + "\n"
    }
    let mut body = format!(
        "{DUMP_BEGIN} {tsc_khz:x} {:x} {:x}\n",
        results.len(),
        records.len()
    );
    for r in results {
        body += &line("r", r.as_bytes());
    }
    for e in records {
        body += &line("e", e.as_bytes());
    }
    let sum = fnv1a(body.as_bytes());
    format!("{body}{DUMP_END} {sum:x}\n")
}

fn sample() -> (Vec<OpResult>, Vec<EnumRecord>) {
    let results = vec![
        OpResult {
            value: 0x0010_78f2_b4de,
            cycles: 0xd9_76b3,
            method_used: 1,
            ..Default::default()
        },
        OpResult {
            status: 1,
            method_used: 2,
            ..Default::default()
        },
    ];
    let mut record = EnumRecord {
        address: 0x18000,
        cap_count: 2,
        ..Default::default()
    };
    record.header[0] = 0x1000_1af4;
    record.bar_sizes[1] = 0x1000;
    record.caps[..2].copy_from_slice(&[0x11, 0x09]);
    (results, vec![record, EnumRecord::default()])
}

const BANNER: &str = "\x1bcSeaBIOS (version 1.16.2)\r\nBooting from ROM..exitless probe: \
                      running\nexitless probe: done\n";

#[test]
fn a_whole_dump_reads_back_what_the_probe_wrote_after_the_firmware_banner() {
    let (results, records) = sample();
    let serial = format!("{BANNER}{}", render(2_445_302, &results, &records));
    let dump = parse(&serial).unwrap();
    assert_eq!(dump.tsc_khz, 2_445_302);
    assert_eq!(dump.results, results);
    assert_eq!(dump.enum_records, records);
}

#[test]
fn the_fnv1a_is_the_published_one() {
    // FNV-1a 64 test vectors (draft-eastlake-fnv, §6 / Appendix C).
    assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
}

#[test]
fn every_truncation_is_refused() {
    let (results, records) = sample();
    let dump = render(1_000_000, &results, &records);
    let serial = format!("{BANNER}{dump}");
    let marker_end = BANNER.len() + DUMP_BEGIN.len() + 1;
    for cut in BANNER.len()..serial.len() {
        let e = parse(&serial[..cut]).expect_err("a truncated dump");
        if cut < marker_end {
            assert_eq!(e, DumpError::NoBegin, "cut at {cut}");
        } else {
            assert!(
                matches!(e, DumpError::Truncated { .. }),
                "cut at {cut}: {e}"
            );
        }
    }
    let e = parse(&serial[..serial.len() - 1]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "is truncated: it stops in line 6, before the `exitless-end` line"
    );
}

#[test]
fn garbled_lines_are_refused_with_the_line_and_what_is_wrong() {
    let (results, records) = sample();
    let dump = render(1_000_000, &results, &records);
    let garble = |from: &str, to: &str| parse(&dump.replacen(from, to, 1)).unwrap_err();
    // A digit changed in transit: every line well-formed, the checksum catches it.
    assert!(matches!(
        garble("1078f2b4de", "1078f2b4df"),
        DumpError::Checksum { .. }
    ));
    // A byte that is not a hex digit.
    let e = garble("1078f2b4de", "1078f2b4dé");
    assert_eq!(
        e.to_string(),
        "is garbled: line 2 has \"1078f2b4dé\", not a hex number: \
         \"r 0 1078f2b4dé d976b3 1 0 0 0 0\""
    );
    // A lost field, a doubled space, a lost newline, a wrong tag, an upper-case digit.
    for (from, to) in [
        (" d976b3", ""),
        (" d976b3", "  d976b3"),
        ("0 0\nr 1", "0 0r 1"),
        ("\ne ", "\nx "),
        ("1af4", "1AF4"),
    ] {
        assert!(
            matches!(garble(from, to), DumpError::Garbled { .. }),
            "{from:?} -> {to:?}"
        );
    }
    // A first line announcing more than the probe can hold.
    let e = garble(" 2 2\n", " 201 2\n");
    assert!(e.to_string().contains("at most 512 and 256"), "{e}");
}

#[test]
fn no_dump_at_all_says_the_probe_never_reported() {
    assert_eq!(parse(BANNER).unwrap_err(), DumpError::NoBegin);
    // The marker must start a line: the same words inside another line are not a dump.
    let (results, records) = sample();
    let inline = format!("echo {}", render(1, &results, &records));
    assert_eq!(parse(&inline).unwrap_err(), DumpError::NoBegin);
}
