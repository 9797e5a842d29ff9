//! What the command prints: aligned tables for people, JSON for scripts, ages as `1h 5m`.
//! Everything is gathered in a `String` and written once; control characters of
//! message data are escaped so a body cannot move the terminal's cursor.

use std::fmt::Write as _;

use chrono::{DateTime, Utc};
use serde::Serialize;

/// Output being built.
#[derive(Debug, Default)]
pub(crate) struct Out {
    text: String,
}

impl Out {
    /// Appends a line.
    pub(crate) fn line(&mut self, line: impl AsRef<str>) {
        self.text.push_str(line.as_ref());
        self.text.push('\n');
    }

    /// Appends `value` as pretty JSON.
    pub(crate) fn json<T: Serialize + ?Sized>(&mut self, value: &T) {
        match serde_json::to_string_pretty(value) {
            Ok(s) => self.line(s),
            Err(e) => self.line(format!("{{\"error\": \"cannot write JSON: {e}\"}}")),
        }
    }

    /// Appends a table: a header row and aligned columns.
    pub(crate) fn table(&mut self, headers: &[&str], rows: &[Vec<String>]) {
        let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
        for row in rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let format_row = |cells: &mut dyn Iterator<Item = &str>| {
            let mut line = String::new();
            for (i, (cell, w)) in cells.zip(&widths).enumerate() {
                if i > 0 {
                    line.push_str("  ");
                }
                let _ = write!(line, "{cell:<w$}");
            }
            line.trim_end().to_owned()
        };
        self.line(format_row(&mut headers.iter().copied()));
        for row in rows {
            self.line(format_row(&mut row.iter().map(String::as_str)));
        }
    }

    /// Writes everything to standard output.
    pub(crate) fn print(self) {
        use std::io::Write as _;
        let mut stdout = std::io::stdout().lock();
        let _ = stdout.write_all(self.text.as_bytes());
        let _ = stdout.flush();
    }
}

/// Text from message data, safe to print: control characters escaped, cut at `max`
/// characters (with `…`).
pub(crate) fn cell(text: &str, max: usize) -> String {
    let mut out = String::new();
    for (i, c) in text.chars().enumerate() {
        if i == max {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// An optional text cell (`-` when absent).
pub(crate) fn opt(text: Option<&str>, max: usize) -> String {
    text.map_or_else(|| "-".to_owned(), |t| cell(t, max))
}

/// Text of any length, control characters escaped except newlines (for `show`).
pub(crate) fn block(text: &str) -> String {
    text.lines().map(|l| cell(l, usize::MAX)).collect::<Vec<_>>().join("\n")
}

/// An age as `45s`, `12m 5s`, `3h 20m`, `2d 4h`.
pub(crate) fn age(d: chrono::Duration) -> String {
    let s = d.num_seconds().max(0);
    let (days, hours, minutes, seconds) = (s / 86_400, s % 86_400 / 3600, s % 3600 / 60, s % 60);
    if days > 0 {
        format!("{days}d {hours}h")
    } else if hours > 0 {
        format!("{hours}h {minutes}m")
    } else if minutes > 0 {
        format!("{minutes}m {seconds}s")
    } else {
        format!("{seconds}s")
    }
}

/// How long ago `t` was at `now`, as [`age`], or `in …` for a time to come.
pub(crate) fn since(t: DateTime<Utc>, now: DateTime<Utc>) -> String {
    if t > now {
        format!("in {}", age(t - now))
    } else {
        format!("{} ago", age(now - t))
    }
}

/// A time as RFC 3339 to the second.
pub(crate) fn time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Parses `90s`, `15m`, `2h`, `3d` (or a number of seconds).
pub(crate) fn parse_age(text: &str) -> Result<chrono::Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: i64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration: write 90s, 15m, 2h or 3d"))?;
    let seconds = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("unknown unit {unit:?} in {text:?}: use s, m, h or d")),
    };
    n.checked_mul(seconds)
        .and_then(chrono::Duration::try_seconds)
        .ok_or_else(|| format!("{text:?} is too long"))
}

/// A time as the history prints it: RFC 3339 to the millisecond.
pub(crate) fn time_ms(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Parses an RFC 3339 time (`2026-12-03T10:00:00Z`, `2026-12-03T11:00:00+01:00`).
pub(crate) fn parse_time(text: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(text.trim())
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("{text:?} is not an RFC 3339 time ({e}): write 2026-12-03T10:00:00Z"))
}

/// Parses an outcome of the history (`dead-lettered` is taken for `dead_lettered`).
pub(crate) fn parse_outcome(text: &str) -> Result<courier::HistoryKind, String> {
    courier::HistoryKind::parse(&text.trim().to_ascii_lowercase().replace('-', "_")).ok_or_else(|| {
        let names: Vec<&str> = courier::HistoryKind::ALL.iter().map(|k| k.as_str()).collect();
        format!("{text:?} is not an outcome: write one of {}", names.join(", "))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_like_a_person_writes_them() {
        assert_eq!(age(chrono::Duration::seconds(45)), "45s");
        assert_eq!(age(chrono::Duration::seconds(725)), "12m 5s");
        assert_eq!(age(chrono::Duration::seconds(3 * 3600 + 20 * 60)), "3h 20m");
        assert_eq!(age(chrono::Duration::seconds(2 * 86_400 + 4 * 3600)), "2d 4h");
        assert_eq!(parse_age("2h"), Ok(chrono::Duration::hours(2)));
        assert_eq!(parse_age("90"), Ok(chrono::Duration::seconds(90)));
        assert!(parse_age("2w").is_err());
        assert!(parse_age("h").is_err());
        assert_eq!(
            parse_time("2026-12-03T11:00:00+01:00").map(time_ms),
            Ok("2026-12-03T10:00:00.000Z".to_owned())
        );
        assert!(parse_time("yesterday").unwrap_err().contains("RFC 3339"));
        assert_eq!(parse_outcome("Dead-Lettered"), Ok(courier::HistoryKind::DeadLettered));
        assert!(parse_outcome("failed").is_err());
    }

    #[test]
    fn message_data_cannot_drive_the_terminal() {
        assert_eq!(cell("a\u{1b}[2Jb", 20), "a\\u{1b}[2Jb");
        assert_eq!(cell("abcdef", 3), "abc…");
        assert_eq!(block("one\ntwo\u{7}"), "one\ntwo\\u{7}");
    }

    #[test]
    fn tables_align_their_columns() {
        let mut out = Out::default();
        out.table(&["A", "LONG"], &[vec!["xyz".into(), "1".into()]]);
        assert_eq!(out.text, "A    LONG\nxyz  1\n");
    }
}
