//! Range dispatch, unclaimed accesses, overlap refusal, ranges moved at run time, device ids.

use super::*;
use std::sync::Mutex;

#[derive(Default)]
struct Recorder(Mutex<Vec<(u64, Vec<u8>)>>);

impl BusDevice for Recorder {
    fn read(&self, offset: u64, data: &mut [u8]) {
        data.fill(u8::try_from(offset).unwrap());
    }
    fn write(&self, offset: u64, data: &[u8]) {
        self.0.lock().unwrap().push((offset, data.to_vec()));
    }
}

#[test]
fn dispatches_by_range_with_offsets() {
    let mut io = IoBuses::default();
    let dev = Arc::new(Recorder::default());
    let id = io.add_mmio("rec", 0x1000, 0x10, dev.clone()).unwrap();
    let mut b = [0u8; 2];
    assert_eq!(io.mmio.device_at(0x1003), Some(id));
    io.mmio.read(0x1003, &mut b);
    assert_eq!(b, [3, 3]);
    io.mmio.write(0x100f, &[7]);
    assert_eq!(io.mmio.device_at(0x1010), None);
    assert_eq!(dev.0.lock().unwrap()[0], (0xf, vec![7]));
}

#[test]
fn unclaimed_reads_all_ones_and_drops_writes() {
    let io = IoBuses::default();
    let mut b = [0u8; 4];
    io.pio.read(0x80, &mut b);
    assert_eq!(b, [0xff; 4]);
    io.pio.write(0x80, &[1]);
}

#[test]
fn overlapping_and_empty_ranges_are_refused() {
    let mut io = IoBuses::default();
    let dev = Arc::new(Recorder::default());
    io.add_pio("a", 0x10, 8, dev.clone()).unwrap();
    assert!(matches!(
        io.add_pio("b", 0x17, 1, dev.clone()),
        Err(BusError::Overlap { .. })
    ));
    assert!(matches!(
        io.add_pio("c", 0x0c, 5, dev.clone()),
        Err(BusError::Overlap { .. })
    ));
    assert!(matches!(
        io.add_pio("d", 0x40, 0, dev.clone()),
        Err(BusError::BadRange { .. })
    ));
    io.add_pio("e", 0x18, 1, dev).unwrap();
}

#[test]
fn ranges_move_and_go_at_run_time_and_clones_see_it() {
    let mut io = IoBuses::default();
    let dev: Arc<dyn BusDevice> = Arc::new(Recorder::default());
    let other: Arc<dyn BusDevice> = Arc::new(Recorder::default());
    io.add_mmio("fixed", 0x2000, 0x100, other.clone()).unwrap();
    let id = io.id_for("bar");
    let vcpu_view = io.mmio.clone();
    let range = |base| BusRange {
        base,
        len: 0x10,
        id,
        name: "bar".into(),
        device: dev.clone(),
    };
    io.mmio.insert(range(0x1000)).unwrap();
    assert_eq!(vcpu_view.device_at(0x1008), Some(id));
    io.mmio
        .update_range(Some((0x1000, &dev)), Some(range(0x3000)))
        .unwrap();
    assert_eq!(vcpu_view.device_at(0x1008), None, "moved away");
    assert_eq!(vcpu_view.device_at(0x3008), Some(id));
    // Moved onto another range: refused, and decoded nowhere.
    let err = io
        .mmio
        .update_range(Some((0x3000, &dev)), Some(range(0x20f8)));
    assert!(matches!(err, Err(BusError::Overlap { ref other, .. }) if other == "fixed"));
    assert_eq!(vcpu_view.device_at(0x3008), None);
    assert_eq!(
        vcpu_view.device_at(0x20f8),
        Some(0),
        "the fixed device keeps its range"
    );
    // Another device's range is not removed by a stale base.
    io.mmio
        .update_range(Some((0x2000, &dev)), Some(range(0x4000)))
        .unwrap();
    assert_eq!(vcpu_view.device_at(0x2000), Some(0));
    io.mmio.update_range(Some((0x4000, &dev)), None).unwrap();
    assert_eq!(vcpu_view.device_at(0x4000), None, "decoding off");
    let weak = io.mmio.downgrade();
    assert!(weak.upgrade().is_some());
    drop((io, vcpu_view));
    assert!(
        weak.upgrade().is_none(),
        "a weak handle does not keep the bus"
    );
}

#[test]
fn a_device_on_both_buses_keeps_one_id() {
    let mut io = IoBuses::default();
    let dev = Arc::new(Recorder::default());
    let a = io.add_pio("pci", 0xcf8, 8, dev.clone()).unwrap();
    let b = io.add_mmio("pci", 0xe000_0000, 0x10_0000, dev).unwrap();
    assert_eq!(a, b);
}
