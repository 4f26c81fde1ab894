use super::*;
use crate::machine::config::{DiskConfig, VirtioNetConfig};

fn description() -> Description {
    let mut config = MachineConfig {
        ram_size: 64 << 20,
        vcpus: 2,
        cpu: "baseline,-avx".parse().unwrap(),
        ..MachineConfig::default()
    };
    config.disks.push(DiskConfig::new("/images/a,b.img"));
    config
        .virtio
        .push("tap=tap7,queues=2".parse::<VirtioNetConfig>().unwrap());
    Description {
        exitless_version: env!("CARGO_PKG_VERSION").into(),
        config,
        vcpus: vec![serde_json::json!({"regs": {"rip": 4096}}); 2],
        vm: serde_json::json!({"clock": 12}),
        devices: [("serial".to_string(), serde_json::json!({"ier": 1}))].into(),
        memory: MemoryFile {
            file: "memory-1-2".into(),
            length: 64 << 20,
            crc32: 0x1234_5678,
        },
    }
}

/// The description's file with its content replaced by `content`, checksum made to match.
fn sealed(content: &serde_json::Value) -> Vec<u8> {
    let content = serde_json::to_string(content).unwrap();
    serde_json::to_vec(&serde_json::json!({
        "format_version": FORMAT_VERSION,
        "crc32": crc32fast::hash(content.as_bytes()),
        "content": serde_json::from_str::<serde_json::Value>(&content).unwrap(),
    }))
    .unwrap()
}

/// The content of `bytes` (a description's file), as JSON.
fn content_of(bytes: &[u8]) -> serde_json::Value {
    let file: serde_json::Value = serde_json::from_slice(bytes).unwrap();
    file["content"].clone()
}

#[test]
fn a_description_reads_back_as_written() {
    let written = description();
    let bytes = written.to_bytes().unwrap();
    let read = Description::from_bytes(&bytes).unwrap();
    assert_eq!(read.config.disks, written.config.disks);
    assert_eq!(read.config.virtio, written.config.virtio);
    assert_eq!(read.config.cpu.to_string(), "baseline,-avx");
    assert_eq!(read.config.ram_size, 64 << 20);
    assert_eq!(read.vcpus, written.vcpus);
    assert_eq!(read.devices, written.devices);
    // And once more through the whole round: nothing is lost or added.
    assert_eq!(read.to_bytes().unwrap(), bytes);
}

#[test]
fn another_format_version_is_named_before_the_checksum() {
    let bytes = description().to_bytes().unwrap();
    let text = String::from_utf8(bytes).unwrap();
    let other = text.replacen("\"format_version\":2", "\"format_version\":1", 1);
    let e = Description::from_bytes(other.as_bytes()).unwrap_err();
    assert!(matches!(e, SnapshotError::FormatVersion(1)), "{e}");
    assert!(e.to_string().contains("version 1"), "{e}");
}

#[test]
fn any_byte_changed_in_the_content_breaks_the_checksum() {
    let bytes = description().to_bytes().unwrap();
    let text = String::from_utf8(bytes).unwrap();
    let start = text.find("\"content\"").unwrap();
    // Every digit of the content changed in turn: each is caught.
    let digits: Vec<usize> = text[start..]
        .char_indices()
        .filter(|(_, c)| c.is_ascii_digit())
        .map(|(i, _)| start + i)
        .collect();
    assert!(digits.len() > 10);
    for i in digits {
        let mut bad = text.clone().into_bytes();
        bad[i] = if bad[i] == b'9' { b'8' } else { bad[i] + 1 };
        let e = Description::from_bytes(&bad).unwrap_err();
        assert!(matches!(e, SnapshotError::Checksum), "byte {i}: {e}");
    }
}

#[test]
fn a_cut_or_foreign_file_is_not_a_description() {
    let bytes = description().to_bytes().unwrap();
    for cut in [0, 1, 20, bytes.len() / 2, bytes.len() - 3] {
        let e = Description::from_bytes(&bytes[..cut]).unwrap_err();
        assert!(matches!(e, SnapshotError::NotOne(_)), "cut at {cut}: {e}");
    }
    let e = Description::from_bytes(b"{\"format_version\": 2}").unwrap_err();
    assert!(matches!(e, SnapshotError::NotOne(_)), "{e}");
}

#[test]
fn a_resealed_content_is_still_checked_field_by_field() {
    let good = content_of(&description().to_bytes().unwrap());
    let cases: [(&str, serde_json::Value, &str); 7] = [
        (
            "/exitless_version",
            "0.0.1-other".into(),
            "exitless 0.0.1-other",
        ),
        ("/config/vcpus", 3.into(), "2 states for 3 vCPUs"),
        ("/config/vcpus", 0.into(), "config.vcpus"),
        ("/config/ram_size", 12345.into(), "config.ram_size"),
        ("/memory/length", 4096.into(), "memory.length"),
        ("/memory/file", "../../etc/passwd".into(), "memory.file"),
        ("/config/cpu", "host,+nosuchfeature".into(), "nosuchfeature"),
    ];
    for (pointer, value, says) in cases {
        let mut content = good.clone();
        *content.pointer_mut(pointer).unwrap() = value;
        let e = Description::from_bytes(&sealed(&content)).unwrap_err();
        let line = e.to_string();
        assert!(
            line.contains(says) && !line.contains('\n'),
            "{pointer}: {line}"
        );
    }
    let mut content = good.clone();
    content["extra"] = 1.into();
    let e = Description::from_bytes(&sealed(&content)).unwrap_err();
    assert!(matches!(e, SnapshotError::Content(_)), "{e}");
    assert!(Description::from_bytes(&sealed(&good)).is_ok());
}

#[test]
fn the_description_is_written_whole_and_read_back() {
    let dir = std::env::temp_dir().join(format!("exitless-desc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    description().write(&dir).unwrap();
    let read = Description::read(&dir);
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(read.unwrap().config.vcpus, 2);
    assert_eq!(left, [DESCRIPTION_FILE], "no temporary file left");
    let e = Description::read(&dir).unwrap_err();
    assert!(e.to_string().starts_with("cannot open "), "{e}");
}
