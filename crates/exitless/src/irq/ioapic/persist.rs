//! The userspace IOAPIC in a snapshot: IOREGSEL, the ID, the 24 redirection entries with their
//! remote IRR (82093AA §3.2.4: set while a level-triggered interrupt awaits its EOI), and the
//! level-triggered lines asserted and not yet de-asserted. At restore every entry's route is
//! staged again and committed once (KVM reports the EOIs of level-triggered vectors only for
//! routed GSIs), then each asserted level line that may send, sends. With the VT-d unit the
//! routes go through interrupt remapping: restore the unit first.

use serde::{Deserialize, Serialize};

use super::rte::{READ_ONLY, REMOTE_IRR, Rte};
use super::{ENTRIES, ID_MASK, Ioapic, PINS, State};
use crate::persist::{Persist, StateError, from_state, to_state};

const ID: &str = "ioapic";
/// Delivery status (bit 12): this IOAPIC sends at once and never shows a message pending.
const DELIVERY_STATUS: u64 = READ_ONLY & !REMOTE_IRR;

#[derive(Serialize, Deserialize)]
struct Saved {
    select: u8,
    id: u32,
    /// The redirection entries, as the guest reads them (remote IRR included).
    rtes: Vec<u64>,
    /// Level-triggered lines asserted, by pin.
    asserted: u32,
}

fn check(s: &Saved) -> Result<[Rte; ENTRIES], StateError> {
    let bad = |field: String, why: String| Err(StateError::new(format!("{ID}.{field}"), why));
    if s.id & !ID_MASK != 0 {
        return bad("id".into(), format!("{:#x}: the ID is bits 27:24", s.id));
    }
    let Ok(rtes) = <[u64; ENTRIES]>::try_from(s.rtes.as_slice()) else {
        return bad(
            "rtes".into(),
            format!("{} entries, not {PINS}", s.rtes.len()),
        );
    };
    for (pin, &rte) in rtes.iter().enumerate() {
        if rte & DELIVERY_STATUS != 0 {
            return bad(
                format!("rtes[{pin}]"),
                "delivery status is never set".into(),
            );
        }
        if Rte(rte).remote_irr() && !Rte(rte).level() {
            return bad(format!("rtes[{pin}]"), "remote IRR on an edge entry".into());
        }
    }
    if s.asserted >> PINS != 0 {
        return bad(
            "asserted".into(),
            format!("{:#x}: pins past {PINS}", s.asserted),
        );
    }
    Ok(rtes.map(Rte))
}

impl Persist for Ioapic {
    fn save(&self) -> Result<serde_json::Value, StateError> {
        let s = self.state.lock().unwrap();
        let saved = Saved {
            select: s.select,
            id: s.id,
            rtes: s.rtes.iter().map(|r| r.0).collect(),
            asserted: s.asserted,
        };
        to_state(ID, &saved)
    }

    fn restore(&self, state: serde_json::Value) -> Result<(), StateError> {
        let saved: Saved = from_state(ID, state)?;
        let rtes = check(&saved)?;
        let mut s = self.state.lock().unwrap();
        *s = State {
            select: saved.select,
            id: saved.id,
            rtes,
            asserted: saved.asserted,
        };
        for pin in 0..PINS {
            self.stage_route(pin, s.rtes[usize::from(pin)])
                .map_err(|e| StateError::new(format!("{ID}.rtes[{pin}]"), e))?;
        }
        self.routes
            .commit()
            .map_err(|e| StateError::new(format!("{ID}.rtes"), e))?;
        for i in 0..ENTRIES {
            self.service(&mut s, i);
        }
        Ok(())
    }
}
