//! How the families' label sets hash: as one word, their fingerprint.
//!
//! A Prometheus family finds a request's series by hashing its label set with SipHash, at every
//! request's end, for every family the record counts in. SipHash costs several times more per
//! value than a fast hasher, so a label set hashes its values together with foldhash (seeded
//! at random once per process) and hands SipHash the one word that comes out.

use std::hash::{BuildHasher, Hash};
use std::sync::LazyLock;

/// The fingerprint of `values`: one pass of foldhash over them all.
pub fn fingerprint(values: impl Hash) -> u64 {
    static SEED: LazyLock<foldhash::fast::RandomState> = LazyLock::new(Default::default);
    SEED.hash_one(values)
}

/// Hashes a label set as the fingerprint of its fields, which must all be named: a field added
/// later and left out of the list does not compile.
macro_rules! hash_as_fingerprint {
    ($set:ident: $($field:ident),+) => {
        impl std::hash::Hash for $set {
            fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
                let $set { $($field),+ } = self;
                state.write_u64($crate::fingerprint::fingerprint(($($field,)+)));
            }
        }
    };
}
pub(crate) use hash_as_fingerprint;
