//! Configuration errors: each names the key at fault (and the flag or variable that gave
//! it, and its line in the file), with what was most likely meant.

use super::locate;
use super::Overrides;
use std::path::{Path, PathBuf};

/// A configuration problem; its message names the key at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("config file {path}: {source}")]
    Read {
        /// The file named by `--config` / `LLMSLO_CONFIG`.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The config file is not valid YAML for the schema (serde names the key and line).
    #[error("config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What serde_yaml said, which names the key and its line.
        message: String,
    },
    /// A value in the config file is out of range or malformed, at this line.
    #[error("{}:{line}: config key `{key}`: {message}", path.display())]
    InvalidAt {
        /// The file.
        path: PathBuf,
        /// The 1-based line of the key.
        line: usize,
        /// The offending key.
        key: String,
        /// What is wrong with it.
        message: String,
    },
    /// A value given by a flag or an environment variable is out of range or malformed.
    #[error("{origin}: {message}")]
    InvalidGiven {
        /// `flag --listen` or `environment variable LLMSLO_LISTEN`.
        origin: String,
        /// The key the value stands for.
        key: String,
        /// What is wrong with it.
        message: String,
    },
    /// A value is out of range or malformed.
    #[error("config key `{key}`: {message}")]
    Invalid {
        /// The offending key.
        key: String,
        /// What is wrong with it.
        message: String,
    },
}

impl ConfigError {
    /// The key an invalid value was given for, when the error is about one.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { key, .. }
            | ConfigError::InvalidAt { key, .. }
            | ConfigError::InvalidGiven { key, .. } => Some(key),
            _ => None,
        }
    }

    /// Places an invalid value's key in the file it came from, when the key is written there.
    pub(super) fn located(self, path: &Path, text: &str) -> Self {
        match self {
            ConfigError::Invalid { key, message } => match locate::line_of(text, &key) {
                Some(line) => ConfigError::InvalidAt {
                    path: path.to_path_buf(),
                    line,
                    key,
                    message,
                },
                None => ConfigError::Invalid { key, message },
            },
            other => other,
        }
    }

    /// Names the flag or environment variable an invalid value came from, when one did.
    pub(super) fn given_by(self, overrides: &Overrides) -> Self {
        match self {
            ConfigError::Invalid { key, message } => match overrides.origin(&key) {
                Some(origin) => ConfigError::InvalidGiven { origin, key, message },
                None => ConfigError::Invalid { key, message },
            },
            other => other,
        }
    }

    pub(super) fn invalid(key: &str, message: impl Into<String>) -> Self {
        ConfigError::Invalid {
            key: key.to_string(),
            message: message.into(),
        }
    }
}

/// Keys of an SLO entry, to recognise one that slipped out of its entry.
const SLO_KEYS: [&str; 8] = [
    "name",
    "objective",
    "ttft",
    "answer_ttft",
    "tpot",
    "e2e",
    "availability",
    "runbook_url",
];

/// For an error that a mis-indented line causes, the line that is most likely wrong (YAML
/// often reports the line before it, or the block it broke). `line` is 1-based.
pub(super) fn indentation_hint(text: &str, message: &str, line: usize) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let indent = |l: &str| l.len() - l.trim_start().len();
    let key = |l: &str| {
        l.trim_start()
            .trim_start_matches("- ")
            .split(':')
            .next()
            .unwrap_or("")
            .trim()
            .to_string()
    };
    let at = lines.get(line.checked_sub(1)?)?;
    // A deeper line that looks like `key: value` right after a scalar continues that scalar.
    if message.contains("invalid type: string") {
        let next = lines.get(line)?;
        if indent(next) > indent(at) && next.contains(": ") {
            return Some(format!(
                "line {}: `{}:` is indented deeper than `{}:` on line {line}, so YAML read it as the rest of \
                 that value; give it the same indentation",
                line + 1,
                key(next),
                key(at)
            ));
        }
    }
    if message.contains("did not find expected") || message.contains("mapping values are not allowed") {
        return Some(format!(
            "line {line}: `{}:` is indented {} spaces, which lines up with no key of the block above; check its \
             indentation",
            key(at),
            indent(at)
        ));
    }
    let unknown = message.split_once("unknown field `")?.1.split('`').next()?;
    if indent(at) == 0 && SLO_KEYS.contains(&unknown) {
        return Some(format!(
            "line {line}: `{unknown}` is a key of an SLO; indent it to line up with the other keys of its entry under \
             `slos:`"
        ));
    }
    None
}

/// Most keys an unknown-key error lists; a longer list is left out.
const MAX_KEYS_LISTED: usize = 12;

/// A YAML error with what the user most likely meant: the closest known key for an unknown
/// one, a unit for a bare number where a duration goes.
pub(super) fn with_hint(message: &str) -> String {
    if let Some((before, rest)) = message.split_once("unknown field `") {
        let Some((unknown, after)) = rest.split_once('`') else {
            return message.to_string();
        };
        let known: Vec<&str> = after.split('`').skip(1).step_by(2).collect();
        let closest = known
            .iter()
            .map(|key| (strsim::damerau_levenshtein(unknown, key), *key))
            .min()
            .filter(|(distance, key)| *distance <= 2.max(key.len() / 4));
        // serde lists every key it knows; past a handful, the nearest is what helps.
        let location = after.find(" at line ").map_or("", |at| &after[at..]);
        return match closest {
            Some((_, key)) => format!("{before}unknown field `{unknown}` (did you mean `{key}`?){location}"),
            None if known.len() > MAX_KEYS_LISTED => format!(
                "{before}unknown field `{unknown}`: no key llmslo knows is near it (every key is in \
                 docs/configuration.md){location}"
            ),
            None => message.to_string(),
        };
    }
    if let Some((before, rest)) = message.split_once(", expected a duration") {
        let value = before.rsplit(' ').next().unwrap_or("").trim_matches('"');
        if value.parse::<f64>().is_ok() {
            return format!("{before}, expected a duration with a unit, like `{value}ms` or `{value}s`{rest}");
        }
    }
    message.to_string()
}
