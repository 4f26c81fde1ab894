//! KVM's state structs in a snapshot, each as its bytes in one hexadecimal string, read back
//! only at exactly the struct's size.
//!
//! kvm-bindings' own `serde` impls write the bytes too, but read back a shorter or longer array
//! zero-padded or cut: a snapshot is untrusted input, so a struct of the wrong size is refused
//! here instead (its zerocopy derives, from the same feature, do the conversion). Hexadecimal by
//! hand: ten lines, against a crate for them.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serializer};
use zerocopy::{FromBytes, Immutable, IntoBytes};

/// `value`'s bytes as lower-case hexadecimal.
pub fn serialize<T: IntoBytes + Immutable, S: Serializer>(
    value: &T,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    let hex: String = value
        .as_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    serializer.serialize_str(&hex)
}

/// A `T` from the hexadecimal string of exactly its size.
pub fn deserialize<'de, T: FromBytes, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<T, D::Error> {
    let hex = String::deserialize(deserializer)?;
    let bytes = decode(&hex).map_err(D::Error::custom)?;
    T::read_from_bytes(&bytes).map_err(|_| {
        D::Error::custom(format!(
            "{} bytes where {} are {} bytes",
            bytes.len(),
            std::any::type_name::<T>()
                .rsplit("::")
                .next()
                .unwrap_or("it"),
            size_of::<T>()
        ))
    })
}

fn decode(hex: &str) -> Result<Vec<u8>, String> {
    if !hex.len().is_multiple_of(2) {
        return Err(format!("odd number of hex digits ({})", hex.len()));
    }
    hex.as_bytes()
        .chunks(2)
        .map(|pair| {
            std::str::from_utf8(pair)
                .ok()
                .and_then(|p| u8::from_str_radix(p, 16).ok())
                .ok_or_else(|| format!("not hexadecimal: {:?}", String::from_utf8_lossy(pair)))
        })
        .collect()
}

/// The same for an optional struct (one this KVM may not offer): `null` where absent.
pub mod option {
    use super::*;
    use serde::Serialize;

    /// `Some` as [`super::serialize`] writes it, `None` as `null`.
    pub fn serialize<T: IntoBytes + Immutable, S: Serializer>(
        value: &Option<T>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        struct Hex<'a, T>(&'a T);
        impl<T: IntoBytes + Immutable> Serialize for Hex<'_, T> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                super::serialize(self.0, s)
            }
        }
        value.as_ref().map(Hex).serialize(serializer)
    }

    /// `null` as `None`, a string as [`super::deserialize`] reads it.
    pub fn deserialize<'de, T: FromBytes, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<T>, D::Error> {
        #[derive(Deserialize)]
        struct Hex<T: FromBytes>(#[serde(deserialize_with = "super::deserialize")] T);
        Ok(Option::<Hex<T>>::deserialize(deserializer)?.map(|h| h.0))
    }
}

#[cfg(test)]
mod tests {
    use kvm_bindings::kvm_regs;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Holder {
        #[serde(with = "super")]
        regs: kvm_regs,
        #[serde(with = "super::option")]
        maybe: Option<kvm_regs>,
    }

    #[test]
    fn a_struct_round_trips_and_one_of_the_wrong_size_is_refused() {
        let regs = kvm_regs {
            rip: 0x1234,
            rflags: 2,
            ..Default::default()
        };
        let held = Holder { regs, maybe: None };
        let json = serde_json::to_value(&held).unwrap();
        assert_eq!(json["maybe"], serde_json::Value::Null);
        let hex = json["regs"].as_str().unwrap().to_owned();
        assert_eq!(hex.len(), 2 * size_of::<kvm_regs>());
        assert_eq!(serde_json::from_value::<Holder>(json).unwrap(), held);
        let some = serde_json::json!({"regs": hex, "maybe": hex});
        assert_eq!(
            serde_json::from_value::<Holder>(some).unwrap().maybe,
            Some(regs)
        );
        let short = serde_json::json!({"regs": &hex[2..], "maybe": null});
        let e = serde_json::from_value::<Holder>(short).unwrap_err();
        assert!(e.to_string().contains("kvm_regs are 144 bytes"), "{e}");
        let bad = serde_json::json!({"regs": format!("zz{}", &hex[2..]), "maybe": null});
        let e = serde_json::from_value::<Holder>(bad).unwrap_err();
        assert!(e.to_string().contains("not hexadecimal"), "{e}");
    }
}
