#![no_main]
//! The snapshot reader (`machine::snapshot::Description::from_bytes`) on arbitrary files: a
//! snapshot's description is a file anyone may have edited, handed to `exitless run --restore`.
//! Beyond "no panic": every input is refused with a one-line error or accepted, and an accepted
//! description writes back to bytes that read back to the same description.

use exitless::machine::snapshot::Description;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match Description::from_bytes(data) {
        Err(e) => assert!(!e.to_string().contains('\n'), "one line: {e}"),
        Ok(description) => {
            let bytes = description
                .to_bytes()
                .expect("a description read writes back");
            let again = Description::from_bytes(&bytes).expect("and reads back");
            assert_eq!(again.to_bytes().expect("writes back"), bytes);
        }
    }
});
