//! What the sweep sends: synthetic prompts of a requested length, or prompts from a JSONL
//! dataset (`{"prompt": …}`, `{"messages": […]}` or ShareGPT's `{"conversations": […]}`).

use serde_json::Value;
use std::path::Path;

/// Short common words; with a leading space each is one token for BPE tokenizers and four
/// characters for engines that estimate a token per four characters.
const WORDS: [&str; 16] = [
    "the", "cat", "sat", "red", "box", "sun", "map", "dog", "big", "car", "hot", "tea", "new", "day", "old", "way",
];

/// One prompt to send.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Plain text, sent as one user message (chat) or as `prompt` (completions).
    Text(String),
    /// Chat messages as the dataset wrote them.
    Messages(Value),
    /// `words` short words, written when sent: a replayed or drawn request, each with its own
    /// words (from `salt`) so that no two share more than a chance prefix.
    Sized {
        /// Its length in words (one token each for BPE tokenizers; see `calibrate`).
        words: u32,
        /// Picks its words.
        salt: u64,
    },
}

impl Prompt {
    /// The prompt as plain text, for the completions endpoint: message contents joined.
    pub fn text(&self) -> String {
        match self {
            Prompt::Text(text) => text.clone(),
            Prompt::Sized { words: count, salt } => words(*count, *salt),
            Prompt::Messages(messages) => messages
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|m| m.get("content").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }

    /// The prompt as chat messages.
    pub fn messages(&self) -> Value {
        match self {
            Prompt::Text(text) => serde_json::json!([{"role": "user", "content": text}]),
            Prompt::Sized { .. } => serde_json::json!([{"role": "user", "content": self.text()}]),
            Prompt::Messages(messages) => messages.clone(),
        }
    }
}

/// One line of a dataset: its prompt and, when the line says, its own output length.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// What to send.
    pub prompt: Prompt,
    /// `output_tokens` (or `max_tokens`) of the line; `None` takes `--output-tokens`.
    pub output_tokens: Option<u32>,
}

/// A prompt of `words` short common words (a token each on the common BPE tokenizers; the
/// sweep scales the count to the target's tokenizer).
pub fn synthetic(words: u32) -> Prompt {
    let words: Vec<&str> = (0..words.max(1) as usize)
        .map(|i| WORDS[(i * 7 + i / 16) % WORDS.len()])
        .collect();
    Prompt::Text(words.join(" "))
}

/// `tokens` short words picked by `salt` (a splitmix64 sequence), each after a space: one
/// token each for BPE tokenizers, and exactly four characters a token.
fn words(tokens: u32, salt: u64) -> String {
    let mut state = salt;
    let mut text = String::with_capacity(tokens as usize * 4);
    for _ in 0..tokens.max(1) {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        text.push(' ');
        text.push_str(WORDS[(z % WORDS.len() as u64) as usize]);
    }
    text
}

/// Reads a JSONL dataset: one prompt per non-empty line.
pub fn load_dataset(path: &Path) -> Result<Vec<Entry>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut prompts = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = |message: &str| format!("{}:{}: {message}", path.display(), index + 1);
        let value: Value = serde_json::from_str(line).map_err(|e| at(&format!("not JSON ({e})")))?;
        let prompt = parse_line(&value).ok_or_else(|| {
            at(r#"expected {"prompt": "…"}, {"messages": [{"role": …, "content": …}]} or {"conversations": […]}"#)
        })?;
        let output_tokens = match value.get("output_tokens").or_else(|| value.get("max_tokens")) {
            None | Some(Value::Null) => None,
            Some(n) => match n.as_u64() {
                Some(n @ 1..=1_000_000) => Some(n as u32),
                _ => return Err(at("output_tokens must be a whole number from 1 to 1000000")),
            },
        };
        prompts.push(Entry { prompt, output_tokens });
    }
    if prompts.is_empty() {
        return Err(format!("{}: no prompts in the file", path.display()));
    }
    Ok(prompts)
}

fn parse_line(value: &Value) -> Option<Prompt> {
    if let Some(prompt) = value.get("prompt").and_then(Value::as_str) {
        return Some(Prompt::Text(prompt.to_string()));
    }
    if let Some(messages) = value.get("messages").and_then(Value::as_array) {
        let valid = !messages.is_empty()
            && messages
                .iter()
                .all(|m| m.get("role").is_some_and(Value::is_string) && m.get("content").is_some());
        return valid.then(|| Prompt::Messages(Value::Array(messages.clone())));
    }
    // ShareGPT: the first human turn is the prompt.
    let turns = value.get("conversations").and_then(Value::as_array)?;
    turns
        .iter()
        .find(|t| matches!(t.get("from").and_then(Value::as_str), Some("human" | "user")))
        .and_then(|t| t.get("value").and_then(Value::as_str))
        .map(|text| Prompt::Text(text.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_synthetic_prompt_has_one_short_word_per_token() {
        let Prompt::Text(text) = synthetic(100) else { panic!() };
        assert_eq!(text.split(' ').count(), 100);
        // Engines that estimate a token per four characters see about the same length.
        assert!((text.len() + 1) / 4 == 100, "{}", text.len());
        assert_eq!(synthetic(0), synthetic(1));
    }

    #[test]
    fn a_sized_prompt_has_its_length_and_its_own_words() {
        let one = Prompt::Sized { words: 300, salt: 1 };
        let two = Prompt::Sized { words: 300, salt: 2 };
        assert_eq!(one.text().split_whitespace().count(), 300);
        assert_eq!(one.text().len(), 4 * 300);
        assert_eq!(one.text(), one.text(), "the same salt, the same words");
        let shared = one
            .text()
            .chars()
            .zip(two.text().chars())
            .take_while(|(a, b)| a == b)
            .count();
        assert!(shared < 40, "{shared} characters in common");
        assert_eq!(one.messages()[0]["content"], one.text());
    }

    #[test]
    fn every_dataset_shape_is_read() {
        let mut file = tempfile();
        writeln!(file.1, r#"{{"prompt": "plain", "output_tokens": 12}}"#).unwrap();
        writeln!(file.1).unwrap();
        writeln!(file.1, r#"{{"messages": [{{"role": "user", "content": "chat"}}]}}"#).unwrap();
        writeln!(
            file.1,
            r#"{{"conversations": [{{"from": "system", "value": "s"}}, {{"from": "human", "value": "share"}}]}}"#
        )
        .unwrap();
        let entries = load_dataset(&file.0).unwrap();
        assert_eq!(entries.len(), 3);
        assert_eq!(entries[0].prompt, Prompt::Text("plain".into()));
        assert_eq!(entries[0].output_tokens, Some(12));
        assert_eq!(entries[1].prompt.text(), "chat");
        assert_eq!(entries[1].prompt.messages()[0]["role"], "user");
        assert_eq!(entries[1].output_tokens, None);
        assert_eq!(entries[2].prompt, Prompt::Text("share".into()));
    }

    #[test]
    fn a_bad_line_is_named() {
        let mut file = tempfile();
        writeln!(file.1, r#"{{"prompt": "fine"}}"#).unwrap();
        writeln!(file.1, r#"{{"text": "not a prompt"}}"#).unwrap();
        let error = load_dataset(&file.0).unwrap_err();
        assert!(
            error.ends_with(
                r#":2: expected {"prompt": "…"}, {"messages": [{"role": …, "content": …}]} or {"conversations": […]}"#
            ),
            "{error}"
        );
        let mut zero = tempfile();
        writeln!(zero.1, r#"{{"prompt": "p", "max_tokens": 0}}"#).unwrap();
        assert!(load_dataset(&zero.0)
            .unwrap_err()
            .contains(":1: output_tokens must be a whole number"));
        let mut broken = tempfile();
        writeln!(broken.1, "{{oops").unwrap();
        assert!(load_dataset(&broken.0).unwrap_err().contains(":1: not JSON"));
        let empty = tempfile();
        assert!(load_dataset(&empty.0).unwrap_err().ends_with("no prompts in the file"));
        assert!(load_dataset(Path::new("/nonexistent/prompts.jsonl"))
            .unwrap_err()
            .contains("No such file"));
    }

    fn tempfile() -> (std::path::PathBuf, std::fs::File) {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("llmslo-prompts-{}-{n}.jsonl", std::process::id()));
        let file = std::fs::File::create(&path).unwrap();
        (path, file)
    }
}
