//! What the command line and the tools share: the parsers of flag values and the exit status
//! of a bad configuration. The tools use these, not the CLI, which sits above them.

use std::time::Duration;

/// Exit status for a bad configuration (EX_USAGE).
pub const EXIT_CONFIG: u8 = 64;

/// Exit status when a second interrupt cut the stop short (128 + SIGINT, as shells report it).
pub const EXIT_INTERRUPTED: u8 = 130;

/// The longest duration a flag takes: a longer one is a slip of the keyboard, and would
/// never finish.
pub const MAX_DURATION: Duration = Duration::from_secs(30 * 24 * 3600);

/// A duration flag: `1m30s`, `250ms`, or a bare number of seconds (`2`, `0.5`), at most
/// [`MAX_DURATION`].
pub fn duration(text: &str) -> Result<Duration, String> {
    let parsed = match text.parse::<f64>() {
        Ok(seconds) if seconds.is_finite() && seconds >= 0.0 => {
            Duration::try_from_secs_f64(seconds).map_err(|_| format!("`{text}` is longer than 30 days"))?
        }
        Ok(_) => return Err(format!("`{text}` is not a duration")),
        Err(_) => {
            humantime::parse_duration(text).map_err(|e| format!("`{text}` is not a duration like 5s or 250ms: {e}"))?
        }
    };
    if parsed > MAX_DURATION {
        return Err(format!("`{text}` is longer than 30 days"));
    }
    Ok(parsed)
}

/// `text` made safe to print on a terminal: control characters (escape sequences, carriage
/// returns, the C1 set) and the bidirectional overrides, which could rewrite or hide what
/// is shown, are written as `\u{..}` escapes. Newlines and tabs stay.
pub fn terminal_safe(text: &str) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| {
        (c.is_control() && c != '\n' && c != '\t') || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !text.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut safe = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if unsafe_char(c) {
            safe.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            safe.push(c);
        }
    }
    std::borrow::Cow::Owned(safe)
}

/// The text of the file at `path`, when it holds at most `limit` bytes.
pub fn read_bounded(path: &std::path::Path, limit: u64) -> Result<String, String> {
    let size = std::fs::metadata(path).map_err(|e| e.to_string())?.len();
    if size > limit {
        return Err(format!("{size} bytes; at most {limit} are read"));
    }
    std::fs::read_to_string(path).map_err(|e| e.to_string())
}

/// A probability flag: a number from 0 to 1.
pub fn probability(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
        _ => Err(format!("`{text}` is not a probability between 0 and 1")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_units_or_seconds() {
        assert_eq!(duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(duration("0.5"), Ok(Duration::from_millis(500)));
        assert!(duration("-1").unwrap_err().contains("not a duration"));
        assert!(duration("soon").unwrap_err().contains("like 5s or 250ms"));
        for endless in ["1e30", "18446744073709551616", "31d", "584542046090years"] {
            assert!(
                duration(endless).unwrap_err().contains("longer than 30 days"),
                "{endless}"
            );
        }
        assert_eq!(duration("30d"), Ok(MAX_DURATION));
    }

    #[test]
    fn what_reaches_a_terminal_cannot_steer_it() {
        assert_eq!(terminal_safe("plain\ttext\n"), "plain\ttext\n");
        assert_eq!(terminal_safe("a\u{1b}[2Jb\rc"), "a\\u{1b}[2Jb\\u{d}c");
        assert_eq!(terminal_safe("\u{9b}x\u{202e}y\u{7f}"), "\\u{9b}x\\u{202e}y\\u{7f}");
    }

    #[test]
    fn probabilities_lie_between_zero_and_one() {
        assert_eq!(probability("0.25"), Ok(0.25));
        assert!(probability("1.5").is_err() && probability("x").is_err());
    }
}
