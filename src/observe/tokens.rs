//! Counting output tokens with the model's own tokenizer (a `tokenizer.json`), for streams
//! that state no counts: no usage, no `token_ids`, no logprobs.

use std::path::{Path, PathBuf};

/// A loaded tokenizer that counts the tokens of generated text.
pub struct TokenCounter {
    tokenizer: tokenizers::Tokenizer,
    path: PathBuf,
}

impl std::fmt::Debug for TokenCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenCounter")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl TokenCounter {
    /// Loads `path`: a `tokenizer.json`, or a model directory that holds one.
    pub fn load(path: &Path) -> Result<Self, String> {
        let file = if path.is_dir() {
            path.join("tokenizer.json")
        } else {
            path.to_path_buf()
        };
        let tokenizer = tokenizers::Tokenizer::from_file(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        Ok(Self { tokenizer, path: file })
    }

    /// The file it was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Tokens in `text` as the model encodes it, without special tokens; `None` when the
    /// tokenizer fails on it.
    pub fn count(&self, text: &str) -> Option<u64> {
        let encoding = self.tokenizer.encode(text, false).ok()?;
        Some(encoding.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_word_level_tokenizer_counts_words() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer");
        let counter = TokenCounter::load(&dir).unwrap();
        assert_eq!(counter.path(), dir.join("tokenizer.json"));
        assert_eq!(counter.count(" tok en tok unknown"), Some(4));
        assert_eq!(counter.count(""), Some(0));
        let missing = TokenCounter::load(Path::new("/nonexistent/tokenizer.json")).unwrap_err();
        assert!(missing.contains("/nonexistent/tokenizer.json"), "{missing}");
    }
}
