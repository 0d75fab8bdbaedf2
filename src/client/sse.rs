//! A server-sent events reader for the CLI (the WHATWG `EventSource`
//! rules the CLI needs): bytes are buffered until a whole line has come,
//! so a character split across network chunks is decoded whole; an
//! event's `data:` lines are joined with `\n`; the last `id:` is kept, for
//! the `Last-Event-ID` header of a reconnect.

use std::time::Duration;

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SseEvent {
    /// The `event:` field; `message` when none was given.
    pub kind: String,
    /// The `data:` lines, joined with `\n`.
    pub data: String,
}

/// Feeds on the stream's bytes as they come and answers the events that
/// are complete.
#[derive(Debug, Default)]
pub(crate) struct SseParser {
    /// Bytes of a line not yet ended.
    pending: Vec<u8>,
    /// The event being read: its kind and data lines so far.
    kind: String,
    data: Vec<String>,
    /// The last id the stream gave, kept across events and reconnects.
    last_id: Option<String>,
    /// The previous chunk ended in CR: an LF opening this one ends
    /// nothing more (CRLF split across chunks).
    after_cr: bool,
}

impl SseParser {
    /// The id to send as `Last-Event-ID` when reconnecting.
    pub fn last_id(&self) -> Option<&str> {
        self.last_id.as_deref()
    }

    /// Reads one network chunk; answers the events it completed.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        let mut events = Vec::new();
        let mut chunk = chunk;
        if self.after_cr {
            self.after_cr = false;
            chunk = chunk.strip_prefix(b"\n").unwrap_or(chunk);
        }
        let mut start = 0;
        let mut i = 0;
        while i < chunk.len() {
            let b = chunk[i];
            if b == b'\n' || b == b'\r' {
                self.pending.extend_from_slice(&chunk[start..i]);
                let line = std::mem::take(&mut self.pending);
                if let Some(ev) = self.line(&line) {
                    events.push(ev);
                }
                if b == b'\r' {
                    match chunk.get(i + 1) {
                        Some(b'\n') => i += 1,
                        None => self.after_cr = true,
                        Some(_) => {}
                    }
                }
                start = i + 1;
            }
            i += 1;
        }
        self.pending.extend_from_slice(&chunk[start..]);
        events
    }

    /// One whole line: a field, a comment, or the blank line that ends an
    /// event.
    fn line(&mut self, line: &[u8]) -> Option<SseEvent> {
        if line.is_empty() {
            return self.dispatch();
        }
        // A whole line ends in an ASCII byte, so it never splits a
        // character; invalid UTF-8 is replaced, as EventSource does.
        let line = String::from_utf8_lossy(line);
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line.as_ref(), ""),
        };
        match field {
            "data" => self.data.push(value.to_owned()),
            "event" => self.kind = value.to_owned(),
            // An id holding NUL is ignored (the standard's rule).
            "id" if !value.contains('\0') => self.last_id = Some(value.to_owned()),
            _ => {}
        }
        None
    }

    fn dispatch(&mut self) -> Option<SseEvent> {
        let kind = std::mem::take(&mut self.kind);
        if self.data.is_empty() {
            return None;
        }
        let data = std::mem::take(&mut self.data).join("\n");
        Some(SseEvent {
            kind: if kind.is_empty() {
                "message".into()
            } else {
                kind
            },
            data,
        })
    }

    /// Forgets a half-read event: a dropped connection ends it unsent
    /// (the standard's rule); the last id is kept.
    pub fn reset(&mut self) {
        self.pending.clear();
        self.kind.clear();
        self.data.clear();
        self.after_cr = false;
    }
}

/// How a dropped stream is opened again: the first wait, doubled after
/// each failure up to `max`, and how many failures in a row end the watch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reconnect {
    pub first: Duration,
    pub max: Duration,
    pub attempts: u32,
}

impl Reconnect {
    /// About three minutes of trying (1, 2, 4, 8, 16, then 30 s) covers a
    /// daemon's restart.
    pub const DEFAULT: Self = Self {
        first: Duration::from_secs(1),
        max: Duration::from_secs(30),
        attempts: 10,
    };

    /// The wait before reconnect number `n` (1 for the first), or `None`
    /// once `attempts` have failed.
    pub fn delay(&self, n: u32) -> Option<Duration> {
        if n == 0 || n > self.attempts {
            return None;
        }
        let factor = 2u32.saturating_pow(n - 1);
        Some(self.first.saturating_mul(factor).min(self.max))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(kind: &str, data: &str) -> SseEvent {
        SseEvent {
            kind: kind.into(),
            data: data.into(),
        }
    }

    #[test]
    fn a_character_split_across_chunks_is_read_whole() {
        let text = "id: 4\nevent: run_progress\ndata: {\"summary\":\"Grüße 🎉\"}\n\n";
        let bytes = text.as_bytes();
        // Every split point, including inside the two-byte ü and the
        // four-byte emoji.
        for cut in 0..=bytes.len() {
            let mut p = SseParser::default();
            let mut got = p.push(&bytes[..cut]);
            got.extend(p.push(&bytes[cut..]));
            assert_eq!(
                got,
                vec![ev("run_progress", "{\"summary\":\"Grüße 🎉\"}")],
                "cut at {cut}"
            );
            assert_eq!(p.last_id(), Some("4"));
        }
    }

    #[test]
    fn data_lines_are_joined_and_comments_skipped() {
        let mut p = SseParser::default();
        let got = p.push(b": connected\n\ndata: one\ndata:two\ndata\n\nevent: x\n\n");
        // The comment and the event with no data dispatch nothing.
        assert_eq!(got, vec![ev("message", "one\ntwo\n")]);
    }

    #[test]
    fn the_last_id_is_kept_across_events_and_line_ends_may_be_crlf_or_cr() {
        let mut p = SseParser::default();
        assert_eq!(p.push(b"id: 7\r"), vec![]);
        assert_eq!(p.push(b"\ndata: a\r\n\r"), vec![ev("message", "a")]);
        assert_eq!(p.push(b"\ndata: b\r\r"), vec![ev("message", "b")]);
        assert_eq!(p.last_id(), Some("7"));
        assert_eq!(p.push(b"id: 8\ndata: c\n"), vec![]);
        // A dropped connection loses the half-read event, not the id.
        p.reset();
        assert_eq!(p.push(b"\n"), vec![]);
        assert_eq!(p.last_id(), Some("8"));
    }

    #[test]
    fn reconnects_wait_longer_each_time_up_to_a_bound() {
        let r = Reconnect::DEFAULT;
        let waits: Vec<u64> = (1..=10).map(|n| r.delay(n).unwrap().as_secs()).collect();
        assert_eq!(waits, vec![1, 2, 4, 8, 16, 30, 30, 30, 30, 30]);
        assert_eq!(r.delay(11), None);
    }
}
