//! What a probe resumed under QEMU reported, checked.

use exitless::contract::STATUS_OK;
use exitless_peer::{PeerError, QemuResume};

/// `resumed`, if every op of the resumed probe but those in `skip` ended OK.
pub(super) fn checked(resumed: QemuResume, skip: &[usize]) -> Result<QemuResume, PeerError> {
    let mut results = resumed.run.results.iter().enumerate();
    match results.find(|&(i, r)| !skip.contains(&i) && r.status != STATUS_OK) {
        Some((i, r)) => Err(resume_failed(format!(
            "probe op {i} ended with status {}",
            r.status
        ))),
        None => Ok(resumed),
    }
}

/// The error of a resumed probe whose results say `why` it is not right.
pub(super) fn resume_failed(why: String) -> PeerError {
    PeerError::Io {
        what: "resume the probe under QEMU".into(),
        source: std::io::Error::other(why),
    }
}
