//! Durations in words for the messages people read, one style everywhere:
//! "3 hours 12 minutes", "2 days", "1 minute 30 seconds". Whole words, as
//! the messages around them are sentences.

/// The largest unit that is not zero and, unless it is zero, the next one
/// below it: "3 hours 12 minutes", "3 hours", "2 days 1 hour", "45
/// seconds". What is below the second unit is left out (a lateness of
/// 3 h 12 min 40 s reads "3 hours 12 minutes"). A negative duration reads
/// as "0 seconds".
pub fn duration_words(secs: i64) -> String {
    const UNITS: [(i64, &str); 4] = [
        (86_400, "day"),
        (3_600, "hour"),
        (60, "minute"),
        (1, "second"),
    ];
    let words = |n: i64, unit: &str| format!("{n} {unit}{}", if n == 1 { "" } else { "s" });
    let secs = secs.max(0);
    let Some(first) = UNITS.iter().position(|&(size, _)| secs >= size) else {
        return words(0, "second");
    };
    let (size, unit) = UNITS[first];
    let mut out = words(secs / size, unit);
    if let Some(&(next, next_unit)) = UNITS.get(first + 1) {
        let n = secs % size / next;
        if n > 0 {
            out.push(' ');
            out.push_str(&words(n, next_unit));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_units_at_most_the_second_only_when_not_zero() {
        for (secs, words) in [
            (-5, "0 seconds"),
            (0, "0 seconds"),
            (1, "1 second"),
            (45, "45 seconds"),
            (90, "1 minute 30 seconds"),
            (900, "15 minutes"),
            (3 * 3600, "3 hours"),
            (3 * 3600 + 12 * 60 + 40, "3 hours 12 minutes"),
            (2 * 86_400, "2 days"),
            (2 * 86_400 + 3600 + 59, "2 days 1 hour"),
        ] {
            assert_eq!(duration_words(secs), words, "{secs} s");
        }
    }
}
