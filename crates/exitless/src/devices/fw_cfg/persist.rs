//! fw_cfg in a snapshot: the selected item and how far the guest has read into it. The items
//! themselves come from the machine's configuration, which a restore builds again.

use serde::{Deserialize, Serialize};

use super::{Cursor, FwCfg, KEY_MASK};
use crate::persist::{Persist, StateError, from_state, to_state};

const ID: &str = "fw-cfg";

#[derive(Serialize, Deserialize)]
struct Saved {
    /// The selected key, none if the guest selected an architecture-local one (or none yet).
    key: Option<u16>,
    /// The next byte the data register returns (past the item's end it reads zeros).
    offset: u64,
}

impl Persist for FwCfg {
    fn save(&self) -> Result<serde_json::Value, StateError> {
        let cursor = self.cursor();
        let saved = Saved {
            key: cursor.key,
            offset: cursor.offset as u64,
        };
        to_state(ID, &saved)
    }

    fn restore(&self, state: serde_json::Value) -> Result<(), StateError> {
        let saved: Saved = from_state(ID, state)?;
        if let Some(key) = saved.key.filter(|&k| k > KEY_MASK) {
            let why = format!("{key:#x} has bits outside the key ({KEY_MASK:#x})");
            return Err(StateError::new(format!("{ID}.key"), why));
        }
        let offset = usize::try_from(saved.offset)
            .map_err(|_| StateError::new(format!("{ID}.offset"), "beyond this host's reach"))?;
        *self.cursor() = Cursor {
            key: saved.key,
            offset,
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::bus::BusDevice;
    use crate::devices::fw_cfg::{DATA_OFFSET, FW_CFG_SIGNATURE, FwCfgContents};

    fn device() -> FwCfg {
        FwCfg::new(FwCfgContents {
            ram_size: 1 << 30,
            cpus: 2,
            files: vec![("opt/exitless/cmdline".into(), b"rr=10".to_vec())],
        })
        .unwrap()
    }

    fn next(dev: &FwCfg) -> u8 {
        let mut b = [0];
        dev.read(DATA_OFFSET, &mut b);
        b[0]
    }

    #[test]
    fn the_guest_reads_on_where_it_stopped() {
        let dev = device();
        dev.write(0, &FW_CFG_SIGNATURE.to_le_bytes());
        assert_eq!([next(&dev), next(&dev)], *b"QE");
        let state = dev.save().unwrap();
        let restored = device();
        restored.restore(state).unwrap();
        assert_eq!(
            [next(&restored), next(&restored), next(&restored)],
            *b"MU\0"
        );
    }

    #[test]
    fn a_corrupted_state_is_refused_naming_the_field() {
        let dev = device();
        let err = dev
            .restore(json!({"key": 0x4000, "offset": 0}))
            .unwrap_err();
        assert_eq!(err.what, "fw-cfg.key");
        let err = dev.restore(json!({"key": 1, "offset": -1})).unwrap_err();
        assert_eq!(err.what, "fw-cfg");
    }
}
