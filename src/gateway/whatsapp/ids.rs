//! Message ids on the wire.
//!
//! The engine derives one id per (run, group, part) — "3EB0" plus 20
//! uppercase hex digits — and resends a part with the same id. whatsapp-rust
//! generates WA Web's shape, "3EB0" plus 18 uppercase hex digits (22
//! characters), and only refuses an empty id. We send the crate's shape so
//! our messages look like every other WA Web message: an id already in that
//! shape is kept, Herald's is cut to 22 characters (a prefix of the stored
//! id, so logs still match), and anything else is hashed into the shape.
//! The mapping is a pure function, so a resend always carries the same id.

use herald_actors::ports::GatewayError;
use sha2::{Digest, Sha256};

/// WA Web's message id prefix.
pub const PREFIX: &str = "3EB0";
/// Length of a WA Web message id: the prefix and 18 hex digits.
pub const WIRE_LEN: usize = 22;
/// Length of the ids `herald_actors::delivery::outcome::message_id` derives.
pub const HERALD_LEN: usize = 24;

fn upper_hex(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(&b))
}

/// True for an id in the shape whatsapp-rust itself generates.
pub fn is_wire_id(id: &str) -> bool {
    id.len() == WIRE_LEN && id.starts_with(PREFIX) && upper_hex(&id[PREFIX.len()..])
}

/// The id sent to WhatsApp for an engine message id. Deterministic: the
/// same engine id always maps to the same wire id.
pub fn wire_id(engine_id: &str) -> Result<String, GatewayError> {
    if engine_id.is_empty() {
        // The crate refuses it too; nothing a retry could fix, but the
        // engine never passes one.
        return Err(GatewayError::Transient("empty message id".into()));
    }
    if is_wire_id(engine_id) {
        return Ok(engine_id.to_owned());
    }
    if engine_id.len() == HERALD_LEN
        && engine_id.starts_with(PREFIX)
        && upper_hex(&engine_id[PREFIX.len()..])
    {
        return Ok(engine_id[..WIRE_LEN].to_owned());
    }
    let digest = Sha256::digest(format!("herald:wire:{engine_id}"));
    let hex = hex::encode_upper(&digest[..9]);
    Ok(format!("{PREFIX}{hex}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_actors::delivery::outcome::message_id;
    use herald_actors::domain::{GroupJid, RunId};

    #[test]
    fn herald_ids_become_a_prefix_in_the_crates_shape() {
        let g = GroupJid::parse("120363000000000001@g.us").unwrap();
        let engine = message_id(RunId(42), &g, 1);
        let wire = wire_id(&engine).unwrap();
        assert!(is_wire_id(&wire), "{wire}");
        assert_eq!(wire.len(), WIRE_LEN);
        assert!(
            engine.starts_with(&wire),
            "the wire id is a prefix of {engine}"
        );
        // A resend after a crash carries the same id.
        assert_eq!(wire, wire_id(&message_id(RunId(42), &g, 1)).unwrap());
    }

    #[test]
    fn distinct_parts_groups_and_runs_stay_distinct() {
        let g = GroupJid::parse("120363000000000001@g.us").unwrap();
        let h = GroupJid::parse("120363000000000002@g.us").unwrap();
        let ids: std::collections::HashSet<String> = [
            message_id(RunId(1), &g, 0),
            message_id(RunId(1), &g, 1),
            message_id(RunId(1), &h, 0),
            message_id(RunId(2), &g, 0),
        ]
        .iter()
        .map(|id| wire_id(id).unwrap())
        .collect();
        assert_eq!(ids.len(), 4);
    }

    #[test]
    fn crate_shaped_ids_pass_unchanged() {
        // The shape RequestUtils::message_id_at produces.
        let id = "3EB0E0E5F2D4F618589C0B";
        assert!(is_wire_id(id));
        assert_eq!(wire_id(id).unwrap(), id);
    }

    #[test]
    fn other_ids_are_hashed_into_the_shape() {
        for id in ["c1-text", "3eb0abcdef", "3EB0XYZ", "x"] {
            let wire = wire_id(id).unwrap();
            assert!(is_wire_id(&wire), "{id} -> {wire}");
            assert_eq!(wire, wire_id(id).unwrap());
        }
        assert_ne!(wire_id("c1-text").unwrap(), wire_id("c1-media").unwrap());
    }

    #[test]
    fn shape_checks() {
        assert!(!is_wire_id("3EB0E0E5F2D4F618589C0"), "too short");
        assert!(!is_wire_id("3EB0E0E5F2D4F618589C0BB"), "too long");
        assert!(!is_wire_id("3EB0e0e5f2d4f618589c0b"), "lowercase");
        assert!(!is_wire_id("4EB0E0E5F2D4F618589C0B"), "prefix");
        assert!(wire_id("").is_err(), "the crate refuses an empty id");
    }
}
