//! The `model` label: request-supplied model names mapped onto a bounded set of label values
//! (an allow-list, or names learned from the engine's successful answers up to `max_models`).

use crate::record::LabelText;
use std::collections::HashSet;
use std::sync::RwLock;

/// `max_models` when none is given.
pub const DEFAULT_MAX_MODELS: usize = 16;
/// Label value for requests whose body named no model (or could not be read).
pub const UNKNOWN_MODEL: &str = "unknown";
/// Label value for models outside the allow-list or past `max_models`.
pub const OTHER_MODEL: &str = "other";
/// Longest model name kept as a label value.
const MAX_MODEL_NAME_LEN: usize = 128;

/// Maps request-supplied model names onto a bounded set of label values, each made once and
/// shared by every request that carries it.
#[derive(Debug)]
pub struct ModelNames {
    allow_list: Option<HashSet<LabelText>>,
    learned: RwLock<HashSet<LabelText>>,
    max_models: usize,
    /// The label of the engine's only model, for requests that name none (TGI's native API).
    only_served: RwLock<Option<LabelText>>,
    unknown: LabelText,
    other: LabelText,
}

impl ModelNames {
    /// An allow-list when `models` is non-empty, else learning up to `max_models` names.
    pub fn new(models: &[String], max_models: usize) -> Self {
        Self {
            allow_list: (!models.is_empty()).then(|| models.iter().map(LabelText::from).collect()),
            learned: RwLock::new(HashSet::new()),
            max_models,
            only_served: RwLock::new(None),
            unknown: LabelText::from(UNKNOWN_MODEL),
            other: LabelText::from(OTHER_MODEL),
        }
    }

    /// Notes the models the engine serves; when it serves exactly one, requests that name
    /// no model are labelled with it.
    pub fn set_served(&self, served: &[String]) {
        let only = match served {
            [only] => Some(match &self.allow_list {
                Some(allowed) => allowed.get(only.as_str()).unwrap_or(&self.other).clone(),
                None if is_plausible_model_name(only) => LabelText::from(only),
                None => self.other.clone(),
            }),
            _ => None,
        };
        *self.only_served.write().expect("model set lock") = only;
    }

    /// The models known so far: the allow-list, or those learned.
    pub fn known(&self) -> Vec<LabelText> {
        let mut models: Vec<LabelText> = match &self.allow_list {
            Some(allowed) => allowed.iter().cloned().collect(),
            None => self.learned.read().expect("model set lock").iter().cloned().collect(),
        };
        models.sort();
        models
    }

    /// The label value for a request that named `raw` (or nothing), without learning: a name
    /// not known yet is labelled `other`, and comes back as the candidate to learn once the
    /// engine has answered it successfully.
    pub fn label(&self, raw: Option<&str>) -> (LabelText, Option<String>) {
        let Some(name) = raw else {
            // Only requests that name no model need the engine's only model.
            let only_served = self.only_served.read().expect("model set lock");
            return (only_served.as_ref().unwrap_or(&self.unknown).clone(), None);
        };
        if let Some(allowed) = &self.allow_list {
            return (allowed.get(name).unwrap_or(&self.other).clone(), None);
        }
        if !is_plausible_model_name(name) {
            return (self.other.clone(), None);
        }
        if let Some(known) = self.learned.read().expect("model set lock").get(name) {
            return (known.clone(), None);
        }
        (self.other.clone(), Some(name.to_string()))
    }

    /// Learns `name` (the engine lists it, or answered it successfully) while fewer than
    /// `max_models` are known: its label, and whether it was just learned.
    pub fn learn(&self, name: &str) -> (LabelText, bool) {
        if self.allow_list.is_some() || !is_plausible_model_name(name) {
            return (self.label(Some(name)).0, false);
        }
        let mut learned = self.learned.write().expect("model set lock");
        if let Some(known) = learned.get(name) {
            (known.clone(), false)
        } else if learned.len() < self.max_models {
            let label = LabelText::from(name);
            learned.insert(label.clone());
            (label, true)
        } else {
            (self.other.clone(), false)
        }
    }
}

/// Whether a client's model name may become a label: a model id's length and characters
/// (letters, digits and `-._/:@+`, as in `meta-llama/Llama-3.1-8B-Instruct` or `llama3:8b`).
fn is_plausible_model_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_MODEL_NAME_LEN
        && name != UNKNOWN_MODEL
        && name != OTHER_MODEL
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._/:@+".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_list_maps_everything_else_to_other() {
        let names = ModelNames::new(&["llama".into()], 16);
        assert_eq!(names.label(Some("llama")).0, "llama");
        assert_eq!(names.label(Some("gpt-x")), (LabelText::from(OTHER_MODEL), None));
        assert_eq!(names.learn("gpt-x").0, OTHER_MODEL, "the allow-list is never extended");
        assert_eq!(names.label(None).0, UNKNOWN_MODEL);
        assert_eq!(names.known(), ["llama"]);
    }

    #[test]
    fn requests_without_a_model_get_the_only_served_one() {
        let names = ModelNames::new(&[], 4);
        assert_eq!(names.label(None).0, UNKNOWN_MODEL);
        names.set_served(&["tgi-model".into()]);
        assert_eq!(names.label(None).0, "tgi-model");
        names.set_served(&["a".into(), "b".into()]);
        assert_eq!(names.label(None).0, UNKNOWN_MODEL, "ambiguous with two");
    }

    #[test]
    fn every_request_of_a_model_shares_one_label_value() {
        let names = ModelNames::new(&[], 4);
        let (learned, _) = names.learn("llama");
        let (first, _) = names.label(Some("llama"));
        let (second, _) = names.label(Some("llama"));
        assert!(std::ptr::eq(first.as_str(), learned.as_str()), "no copy per request");
        assert!(std::ptr::eq(first.as_str(), second.as_str()));
        let (other, _) = names.label(Some("not-learned"));
        assert!(
            std::ptr::eq(other.as_str(), names.label(Some("x y")).0.as_str()),
            "`other` too"
        );
        let allowed = ModelNames::new(&["m".into()], 4);
        assert!(std::ptr::eq(
            allowed.label(Some("m")).0.as_str(),
            allowed.label(Some("m")).0.as_str()
        ));
    }

    #[test]
    fn the_only_served_model_is_labelled_as_a_named_one_would_be() {
        let names = ModelNames::new(&["llama".into()], 4);
        names.set_served(&["mistral".into()]);
        assert_eq!(names.label(None).0, OTHER_MODEL, "outside the allow-list");
        names.set_served(&["llama".into()]);
        assert_eq!(names.label(None).0, "llama");
        let learning = ModelNames::new(&[], 4);
        learning.set_served(&["has space".into()]);
        assert_eq!(learning.label(None).0, OTHER_MODEL, "not a plausible name");
        learning.set_served(&["tgi-model".into()]);
        assert_eq!(
            learning.label(None),
            (LabelText::from("tgi-model"), None),
            "never a candidate"
        );
    }

    #[test]
    fn learning_stops_at_max_models() {
        let names = ModelNames::new(&[], 2);
        assert_eq!(
            names.label(Some("a")),
            (LabelText::from(OTHER_MODEL), Some("a".to_string())),
            "not learned by asking"
        );
        assert_eq!(names.learn("a"), (LabelText::from("a"), true));
        assert_eq!(names.learn("b"), (LabelText::from("b"), true));
        assert_eq!(names.learn("c"), (LabelText::from(OTHER_MODEL), false));
        assert_eq!(names.learn("a"), (LabelText::from("a"), false));
        assert_eq!(names.label(Some("a")), (LabelText::from("a"), None));
    }

    #[test]
    fn implausible_names_are_other_and_not_learned() {
        let names = ModelNames::new(&[], 1);
        for bad in [
            "",
            "has space",
            &"x".repeat(200),
            "unknown",
            "quote\"d",
            "back\\slash",
            "new\nline",
            "brace}",
            "x\u{e9}",
        ] {
            assert_eq!(names.label(Some(bad)), (LabelText::from(OTHER_MODEL), None), "{bad}");
        }
        assert_eq!(names.label(Some("ok")).1.as_deref(), Some("ok"));
        for good in [
            "meta-llama/Llama-3.1-8B-Instruct",
            "llama3:8b",
            "org/model@rev",
            "a+b_c.d",
        ] {
            assert_eq!(names.label(Some(good)).1.as_deref(), Some(good), "{good}");
        }
    }

    #[test]
    fn configured_names_stay_raw_for_the_encoders_to_escape() {
        let names = ModelNames::new(&["we\"ird\\".into()], 4);
        assert_eq!(names.label(Some("we\"ird\\")).0, "we\"ird\\");
        assert_eq!(names.known(), ["we\"ird\\"]);
    }
}
