//! Output for people and scripts: aligned tables, key/value blocks, CSV
//! fields, and the few JSON accessors every command uses.

use serde_json::Value;

/// Formats rows as aligned columns under a header.
pub fn table(headers: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let mut out = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                out.push_str(c);
            } else {
                out.push_str(&format!("{c:<w$}  ", w = widths[i]));
            }
        }
        out.trim_end().to_owned() + "\n"
    };
    let mut out = line(headers.iter().map(|h| h.to_uppercase()).collect());
    for row in rows {
        out.push_str(&line(row));
    }
    out
}

pub(crate) fn s(v: &Value, key: &str) -> String {
    match v.pointer(key).or_else(|| v.get(key)) {
        None | Some(Value::Null) => "-".into(),
        Some(Value::String(x)) => x.clone(),
        Some(other) => other.to_string(),
    }
}

pub(crate) fn items(v: &Value) -> Vec<Value> {
    v.get("items")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

pub(crate) fn key_values(v: &Value) -> String {
    let mut out = String::new();
    if let Value::Object(m) = v {
        for (k, val) in m {
            let text = match val {
                Value::String(x) => x.clone(),
                other => other.to_string(),
            };
            out.push_str(&format!("{k:<22} {text}\n"));
        }
    }
    out
}

/// One CSV row, without its line end: a field is quoted only when it holds
/// a comma, a quote or a line break (the csv crate's RFC 4180 writer).
pub(crate) fn csv_row<S: AsRef<str>>(fields: &[S]) -> String {
    let mut w = csv::WriterBuilder::new().from_writer(Vec::new());
    w.write_record(fields.iter().map(|f| f.as_ref().as_bytes()))
        .expect("writing to memory");
    let bytes = w.into_inner().expect("writing to memory");
    let line = String::from_utf8(bytes).expect("fields are UTF-8");
    line.strip_suffix('\n').unwrap_or(&line).to_owned()
}

/// What a path segment or query value keeps as itself: RFC 3986's
/// unreserved characters; everything else is `%XX` (UTF-8 bytes).
const UNRESERVED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

pub(crate) fn url_encode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, UNRESERVED).to_string()
}
