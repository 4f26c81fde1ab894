use super::*;

fn select(dev: &FwCfg, key: u16) {
    dev.write(0, &key.to_le_bytes());
}

fn read(dev: &FwCfg, len: usize) -> Vec<u8> {
    (0..len)
        .map(|_| {
            let mut b = [0];
            dev.read(DATA_OFFSET, &mut b);
            b[0]
        })
        .collect()
}

fn device() -> FwCfg {
    FwCfg::new(FwCfgContents {
        ram_size: 64 << 20,
        cpus: 3,
        files: vec![
            ("opt/exitless/cmdline".into(), b"cpus=3".to_vec()),
            ("etc/a".into(), vec![7]),
        ],
    })
    .unwrap()
}

#[test]
fn the_fixed_items_read_as_qemu_lays_them_out() {
    let dev = device();
    select(&dev, FW_CFG_SIGNATURE);
    assert_eq!(read(&dev, 6), b"QEMU\0\0", "zeros past the end");
    select(&dev, FW_CFG_ID);
    assert_eq!(read(&dev, 4), [1, 0, 0, 0], "no DMA");
    select(&dev, FW_CFG_RAM_SIZE);
    assert_eq!(read(&dev, 8), (64u64 << 20).to_le_bytes());
    select(&dev, FW_CFG_NB_CPUS | 0x4000);
    assert_eq!(
        read(&dev, 2),
        [3, 0],
        "the write bit does not change the key"
    );
    select(&dev, FW_CFG_NB_CPUS | ARCH_LOCAL);
    assert_eq!(read(&dev, 2), [0, 0], "no architecture items");
}

#[test]
fn the_directory_lists_files_by_name_and_selects_them() {
    let dev = device();
    select(&dev, FW_CFG_FILE_DIR);
    let dir = read(&dev, 4 + 2 * FILE_ENTRY_LEN);
    assert_eq!(dir[..4], 2u32.to_be_bytes());
    let entry = |i: usize| &dir[4 + i * FILE_ENTRY_LEN..4 + (i + 1) * FILE_ENTRY_LEN];
    let (a, cmdline) = (entry(0), entry(1));
    assert_eq!(&a[8..14], b"etc/a\0", "sorted by name");
    assert_eq!(a[..4], 1u32.to_be_bytes());
    assert_eq!(&cmdline[8..29], b"opt/exitless/cmdline\0");
    assert_eq!(cmdline[..4], 6u32.to_be_bytes());
    let key = u16::from_be_bytes([cmdline[4], cmdline[5]]);
    assert_eq!(key, FW_CFG_FILE_FIRST + 1);
    select(&dev, key);
    assert_eq!(read(&dev, 6), b"cpus=3");
}

#[test]
fn other_widths_and_writes_change_nothing() {
    let dev = device();
    select(&dev, FW_CFG_SIGNATURE);
    dev.write(DATA_OFFSET, &[0x55]);
    dev.write(0, &[FW_CFG_NB_CPUS.to_le_bytes()[0]]);
    let mut wide = [0u8; 2];
    dev.read(DATA_OFFSET, &mut wide);
    assert_eq!(wide, [0xff; 2]);
    assert_eq!(read(&dev, 4), b"QEMU");
}

#[test]
fn bad_file_lists_are_refused() {
    let long = "opt/".to_owned() + &"x".repeat(MAX_FILE_NAME);
    let files = vec![(long.clone(), Vec::new())];
    let e = FwCfg::new(FwCfgContents {
        files,
        ..Default::default()
    });
    assert_eq!(e.err(), Some(FwCfgError::NameTooLong(long)));
    let files = vec![("opt/a".into(), Vec::new()), ("opt/a".into(), Vec::new())];
    let e = FwCfg::new(FwCfgContents {
        files,
        ..Default::default()
    });
    assert_eq!(e.err(), Some(FwCfgError::Duplicate("opt/a".into())));
}
