#![no_main]
//! An MSI vector table and the routing owner alone: programs, masks, enables, function masks,
//! Bus Master changes, messages, resets and refused routing commits in any order, under every
//! commit strategy, on the in-memory routing table. Beyond "no panic", a model of PCI 3.0
//! §6.8.3.5 (masking and pending bits) must agree after every step: exactly the messages it
//! expects reach the guest (none from a masked or disabled vector, none while the function is
//! masked or may not master, none invalid), each through a committed route or injected, never
//! through an irqfd whose route is not committed; pending bits, masks and messages read back
//! as the model has them. Each input is at most 256 steps.

use std::sync::Arc;

use exitless::fakes::FakeRoutes;
use exitless::irq::msi::is_valid_message;
use exitless::irq::regs::MSI_ADDRESS_BASE;
use exitless::irq::{CommitStrategy, MsiChange, MsiVectors, Signaller};
use exitless::logging::DeviceLog;
use libfuzzer_sys::fuzz_target;

mod common;
use common::Input;

const STRATEGIES: [CommitStrategy; 4] = [
    CommitStrategy::PerVector,
    CommitStrategy::Batched,
    CommitStrategy::FirstUse,
    CommitStrategy::Direct,
];

#[derive(Clone, Copy, Default)]
struct Vector {
    message: (u64, u32),
    masked: bool,
    pending: bool,
}

/// What PCI says the table does.
struct Model {
    vectors: Vec<Vector>,
    enabled: bool,
    function_masked: bool,
    bus_master: bool,
    sent: Vec<(u64, u32)>,
}

impl Model {
    fn new(count: usize) -> Self {
        let mut m = Model {
            vectors: vec![Vector::default(); count],
            enabled: false,
            function_masked: false,
            bus_master: true,
            sent: Vec::new(),
        };
        m.reset();
        m
    }

    fn blocked(&self) -> bool {
        !self.enabled || self.function_masked || !self.bus_master
    }

    fn send(sent: &mut Vec<(u64, u32)>, (address, data): (u64, u32)) {
        if is_valid_message(address, data) {
            sent.push((address, data));
        }
    }

    fn apply(&mut self, change: MsiChange) {
        match change {
            MsiChange::Program {
                index,
                address,
                data,
            } => {
                if let Some(v) = self.vectors.get_mut(index) {
                    v.message = (address, data);
                }
            }
            MsiChange::Mask { index, masked } => {
                if let Some(v) = self.vectors.get_mut(index) {
                    v.masked = masked;
                }
            }
            MsiChange::Enable(on) => self.enabled = on,
            MsiChange::FunctionMask(on) => self.function_masked = on,
            MsiChange::BusMaster(on) => self.bus_master = on,
        }
    }

    fn flush(&mut self) {
        if self.blocked() {
            return;
        }
        for v in &mut self.vectors {
            if v.pending && !v.masked {
                v.pending = false;
                Self::send(&mut self.sent, v.message);
            }
        }
    }

    fn trigger(&mut self, index: usize) {
        let blocked = self.blocked();
        if let Some(v) = self.vectors.get_mut(index) {
            if blocked || v.masked {
                v.pending = true;
            } else {
                Self::send(&mut self.sent, v.message);
            }
        }
    }

    fn reset(&mut self) {
        self.enabled = false;
        self.function_masked = false;
        for v in &mut self.vectors {
            *v = Vector {
                masked: true,
                ..Vector::default()
            };
        }
    }
}

/// A change from the input; indexes reach one past the table.
fn change(input: &mut Input, count: usize) -> MsiChange {
    let [kind, index, flags] = input.bytes::<3>();
    let index = usize::from(index) % (count + 1);
    let on = flags & 1 != 0;
    match kind % 5 {
        0 => {
            let raw = u32::from_le_bytes(input.bytes::<4>());
            // Mostly addresses in the interrupt window, so messages are often valid.
            let address = if flags & 2 == 0 {
                MSI_ADDRESS_BASE | u64::from(raw & 0xf_fff0)
            } else {
                u64::from(raw) << (flags >> 5)
            };
            let data = u32::from_le_bytes(input.bytes::<4>());
            let data = if flags & 4 == 0 { data & 0x7ff } else { data };
            MsiChange::Program {
                index,
                address,
                data,
            }
        }
        1 => MsiChange::Mask { index, masked: on },
        2 => MsiChange::Enable(on),
        3 => MsiChange::FunctionMask(on),
        _ => MsiChange::BusMaster(on),
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let [strategy, count] = input.bytes::<2>();
    let strategy = STRATEGIES[usize::from(strategy) % STRATEGIES.len()];
    let count = 1 + usize::from(count) % 16;
    let routes = Arc::new(FakeRoutes::with_strategy(strategy));
    let table = MsiVectors::new(
        routes.clone(),
        count,
        DeviceLog::new("fuzz"),
        Signaller::Vmm,
    )
    .unwrap();
    let mut model = Model::new(count);
    for _ in 0..256 {
        if input.0.is_empty() {
            break;
        }
        let [op, arg] = input.bytes::<2>();
        match op % 6 {
            0 => {
                let changes: Vec<MsiChange> =
                    (0..=arg % 4).map(|_| change(&mut input, count)).collect();
                table.update(&changes);
                changes.iter().for_each(|&c| model.apply(c));
                model.flush();
            }
            1 => {
                let index = usize::from(arg) % (count + 1);
                table.trigger(index);
                model.trigger(index);
            }
            2 => {
                table.trigger_all();
                (0..count).for_each(|i| model.trigger(i));
            }
            3 => {
                table.reset();
                model.reset();
            }
            4 => {
                table.clear_pending();
                model.vectors.iter_mut().for_each(|v| v.pending = false);
            }
            _ => routes.refuse_commits(arg & 1 != 0),
        }
        let mut delivered: Vec<(u64, u32)> = routes
            .take_delivered()
            .into_iter()
            .map(|m| m.expect("a message went through an irqfd whose route is not committed"))
            .collect();
        let mut expected = std::mem::take(&mut model.sent);
        delivered.sort_unstable();
        expected.sort_unstable();
        assert_eq!(delivered, expected, "{strategy:?}: messages delivered");
        for (i, v) in model.vectors.iter().enumerate() {
            assert_eq!(table.is_pending(i), v.pending, "vector {i} pending");
            assert_eq!(table.is_masked(i), v.masked, "vector {i} mask");
            assert_eq!(table.message(i), Some(v.message), "vector {i} message");
        }
        assert_eq!(table.is_function_masked(), model.function_masked);
    }
});
