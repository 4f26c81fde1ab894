use std::sync::atomic::{AtomicU32, Ordering};

use super::*;
use crate::fakes::FakeRoutes;

/// Remaps a message whose address has bit 4 set to vector `base + handle` (the handle in
/// address bits 19:5), blocks handle 7 and any other source than 0x18, and counts reports.
struct Remapper {
    base: AtomicU32,
    reports: AtomicU32,
}

impl MessageRemapper for Remapper {
    fn is_remappable(&self, address: u64) -> bool {
        address & 0x10 != 0
    }

    fn remap(&self, source: u16, (address, data): Message, report: bool) -> Option<Message> {
        if !self.is_remappable(address) {
            return Some((address, data));
        }
        let handle = u32::try_from((address >> 5) & 0x7fff).unwrap();
        if handle == 7 || source != 0x18 {
            self.reports.fetch_add(u32::from(report), Ordering::Relaxed);
            return None;
        }
        Some((0xfee0_0000, self.base.load(Ordering::Relaxed) + handle))
    }
}

fn setup(
    strategy: CommitStrategy,
    source: u16,
) -> (Arc<FakeRoutes>, Arc<Remapper>, RemappedRoutes) {
    let inner = Arc::new(FakeRoutes::with_strategy(strategy));
    let remapper = Arc::new(Remapper {
        base: AtomicU32::new(0x40),
        reports: AtomicU32::new(0),
    });
    let routes = RemappedRoutes::new(inner.clone(), remapper.clone(), source);
    (inner, remapper, routes)
}

const fn remappable(handle: u64) -> u64 {
    0xfee0_0010 | handle << 5
}

#[test]
fn direct_messages_are_remapped_as_sent_and_blocked_ones_go_nowhere() {
    let (inner, remapper, routes) = setup(CommitStrategy::Direct, 0x18);
    assert!(
        routes.accepts(remappable(3), 0),
        "remappable: the unit decides"
    );
    assert!(
        !routes.accepts(0xfee0_0000, 0),
        "compatibility vector 0: invalid"
    );
    routes.signal_msi(remappable(3), 0).unwrap();
    routes.signal_msi(remappable(7), 0).unwrap();
    routes.signal_msi(0xfee0_0000, 0x31).unwrap();
    assert_eq!(inner.injected(), [(0xfee0_0000, 0x43), (0xfee0_0000, 0x31)]);
    assert_eq!(remapper.reports.load(Ordering::Relaxed), 1);
}

#[test]
fn a_message_from_the_wrong_source_is_blocked() {
    let (inner, remapper, routes) = setup(CommitStrategy::Direct, 0x20);
    routes.signal_msi(remappable(3), 0).unwrap();
    assert!(inner.injected().is_empty());
    assert_eq!(remapper.reports.load(Ordering::Relaxed), 1);
}

#[test]
fn routes_carry_the_remapped_message_and_a_refresh_stages_only_what_changed() {
    let (inner, remapper, routes) = setup(CommitStrategy::Batched, 0x18);
    let a = routes.allocate_msi().unwrap().gsi;
    let b = routes.allocate_msi().unwrap().gsi;
    let c = routes.allocate_msi().unwrap().gsi;
    routes.set_msi(a, remappable(1), 0).unwrap();
    routes.set_msi(b, remappable(7), 0).unwrap();
    routes.set_msi(c, 0xfee0_0000, 0x30).unwrap();
    routes.commit().unwrap();
    assert_eq!(inner.route(a), Some((0xfee0_0000, 0x41)));
    assert_eq!(inner.route(b), None, "blocked: no route");
    assert!(
        routes.delivers(a) && !routes.delivers(b),
        "b's irqfd is not written"
    );
    assert_eq!(inner.route(c), Some((0xfee0_0000, 0x30)));
    assert_eq!(remapper.reports.load(Ordering::Relaxed), 1);
    // Nothing changed: nothing staged.
    assert_eq!(routes.refresh(), 0);
    remapper.base.store(0x80, Ordering::Relaxed);
    assert_eq!(routes.refresh(), 1, "only the remapped route changes");
    assert_eq!(
        remapper.reports.load(Ordering::Relaxed),
        1,
        "still blocked: reported once"
    );
    let commits = inner.commits();
    routes.commit().unwrap();
    assert_eq!(inner.commits(), commits + 1);
    assert_eq!(inner.route(a), Some((0xfee0_0000, 0x81)));
    routes.clear(a).unwrap();
    assert_eq!(routes.refresh(), 0, "a cleared route is not remapped again");
}
