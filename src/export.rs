//! A run's groups as a spreadsheet reads them: CSV after RFC 4180 (a
//! header row, a field quoted when it holds a comma, a quote or a line
//! break, CRLF line ends) in UTF-8 behind a byte-order mark, which
//! spreadsheets need to read group names in any script as they are. Built
//! from the API's JSON for a run's groups, so the console's download and
//! `herald runs targets --csv` write the same file.

use serde_json::Value;

/// Each column's header and where its value sits in a run target.
pub const TARGET_COLUMNS: [(&str, &str); 16] = [
    ("position", "/position"),
    ("group", "/group"),
    ("group_name", "/group_name"),
    ("chosen_by", "/chosen_by"),
    ("status", "/status"),
    ("error", "/error"),
    ("parts_sent", "/parts_sent"),
    ("attempts", "/attempts"),
    ("sent_at", "/sent_at"),
    ("latency_ms", "/latency_ms"),
    ("reached", "/receipts/delivered"),
    ("read", "/receipts/read"),
    ("first_receipt_at", "/receipts/first_receipt_at"),
    ("last_receipt_at", "/receipts/last_receipt_at"),
    ("first_read_at", "/receipts/first_read_at"),
    ("message_id", "/message_id"),
];

/// UTF-8's byte-order mark: without it a spreadsheet guesses a legacy
/// code page and garbles names outside ASCII.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// A CSV file of run targets, written row by row into memory.
pub struct TargetsCsv(csv::Writer<Vec<u8>>);

impl Default for TargetsCsv {
    fn default() -> Self {
        Self::new()
    }
}

impl TargetsCsv {
    /// The mark and the header row.
    pub fn new() -> Self {
        let mut w = csv::WriterBuilder::new()
            .terminator(csv::Terminator::CRLF)
            .from_writer(BOM.to_vec());
        w.write_record(TARGET_COLUMNS.iter().map(|(name, _)| name))
            .expect("writing to memory");
        Self(w)
    }

    /// One row: a missing or null value is an empty field.
    pub fn push(&mut self, target: &Value) {
        let row = TARGET_COLUMNS
            .iter()
            .map(|(_, at)| cell(target.pointer(at)));
        self.0.write_record(row).expect("writing to memory");
    }

    pub fn finish(self) -> Vec<u8> {
        self.0.into_inner().expect("writing to memory")
    }
}

/// One poll's answer per group as CSV: position, group, name, voters,
/// then a column per option (its text as the header) with its votes.
pub fn poll_csv(options: &[String], groups: &[Value]) -> Vec<u8> {
    let mut w = csv::WriterBuilder::new()
        .terminator(csv::Terminator::CRLF)
        .from_writer(BOM.to_vec());
    let head = ["position", "group", "group_name", "voters"];
    w.write_record(
        head.iter()
            .map(|h| h.to_string())
            .chain(options.iter().cloned()),
    )
    .expect("writing to memory");
    for g in groups {
        let fixed = ["/position", "/group", "/group_name", "/voters"].map(|at| cell(g.pointer(at)));
        let votes = (0..options.len()).map(|i| cell(g.pointer(&format!("/options/{i}/votes"))));
        w.write_record(fixed.into_iter().chain(votes))
            .expect("writing to memory");
    }
    w.into_inner().expect("writing to memory")
}

fn cell(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_with_commas_quotes_and_line_breaks_are_quoted_and_nulls_are_empty() {
        let mut csv = TargetsCsv::new();
        csv.push(&json!({
            "position": 0, "group": "120363000000000001@g.us", "group_name": "Team, \"East\"\nKL",
            "status": "sent", "error": null, "receipts": { "delivered": 12, "read": 3 },
        }));
        let text = String::from_utf8(csv.finish()).unwrap();
        let text = text
            .strip_prefix('\u{feff}')
            .expect("a byte-order mark first");
        let mut lines = text.split("\r\n");
        assert_eq!(
            lines.next().unwrap(),
            TARGET_COLUMNS.map(|(n, _)| n).join(",")
        );
        assert_eq!(
            lines.next().unwrap(),
            "0,120363000000000001@g.us,\"Team, \"\"East\"\"\nKL\",,sent,,,,,,12,3,,,,"
        );
    }
}
