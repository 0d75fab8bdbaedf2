//! A stored record's version, for optimistic concurrency: an edit applies
//! only while the record is still the version its editor read.

use serde::Serialize;
use sha2::{Digest, Sha256};

/// The strong entity tag of a stored record: a digest of its JSON form,
/// so any change to any field changes it.
pub fn of<T: Serialize>(record: &T) -> String {
    let json = serde_json::to_vec(record).unwrap_or_default();
    let digest = Sha256::digest(&json);
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("\"{hex}\"")
}
