//! Label values that requests share: a model's, a tenant's, an SLO's name. Each is made once,
//! where the bounded set of values is kept, and every record and series that carries it holds
//! the same text, so that labelling a request copies a pointer instead of a string.

use prometheus_client::encoding::{EncodeLabelValue, LabelValueEncoder};
use std::borrow::Borrow;
use std::fmt::{self, Write};
use std::ops::Deref;
use std::sync::Arc;

/// One label value, shared: cloning it copies a pointer.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LabelText(Arc<str>);

impl LabelText {
    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Deref for LabelText {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for LabelText {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for LabelText {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl From<&str> for LabelText {
    fn from(text: &str) -> Self {
        Self(Arc::from(text))
    }
}

impl From<String> for LabelText {
    fn from(text: String) -> Self {
        Self(Arc::from(text))
    }
}

impl From<&String> for LabelText {
    fn from(text: &String) -> Self {
        Self::from(text.as_str())
    }
}

impl From<LabelText> for Arc<str> {
    fn from(text: LabelText) -> Self {
        text.0
    }
}

impl From<LabelText> for String {
    fn from(text: LabelText) -> Self {
        text.0.to_string()
    }
}

impl PartialEq<str> for LabelText {
    fn eq(&self, other: &str) -> bool {
        *self.0 == *other
    }
}

impl PartialEq<&str> for LabelText {
    fn eq(&self, other: &&str) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<String> for LabelText {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<LabelText> for &str {
    fn eq(&self, other: &LabelText) -> bool {
        **self == *other.0
    }
}

impl fmt::Display for LabelText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for LabelText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl EncodeLabelValue for LabelText {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), fmt::Error> {
        encoder.write_str(&self.0)
    }
}

impl serde::Serialize for LabelText {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for LabelText {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Self::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn clones_share_one_text() {
        let text = LabelText::from("llama");
        let copy = text.clone();
        assert!(
            std::ptr::eq(text.as_str(), copy.as_str()),
            "a clone points at the same text"
        );
        assert_eq!(copy, "llama");
    }

    #[test]
    fn is_found_in_a_set_by_its_text() {
        let set: HashSet<LabelText> = ["a", "b"].into_iter().map(LabelText::from).collect();
        assert!(set.contains("a"), "hashes as its str does, so a &str finds it");
        assert!(!set.contains("c"));
        assert_eq!(set.get("b").map(LabelText::as_str), Some("b"));
    }

    #[test]
    fn reads_and_writes_as_a_plain_string() {
        let text: LabelText = serde_yaml::from_str("\"we\\\"ird\"").unwrap();
        assert_eq!(text, "we\"ird");
        assert_eq!(format!("{text} {text:?}"), "we\"ird \"we\\\"ird\"");
        assert_eq!(serde_yaml::to_string(&text).unwrap().trim(), "we\"ird");
    }
}
