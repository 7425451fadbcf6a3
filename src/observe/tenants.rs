//! Whom a request serves: its tenant, from the first configured source that names one (a
//! header, an API key mapped through a table, a body field), bounded like model names (the
//! named tenants pinned, up to `max_tenants` others learned, the rest `other`; a learned
//! tenant idle for `forget_after` gives its slot back). An API key is matched on a keyed hash
//! held in memory: the key itself is never kept, logged or exported.

mod keys;

use crate::record::TenantSource;
use crate::record::{LabelText, Reader, RequestRecord};
use http::HeaderMap;
use keys::KeyTable;
pub use keys::{read_key_table, KeyFile, KeysRead, MAX_API_KEYS, MAX_API_KEY_FILE_BYTES};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::Duration;
use tokio::time::Instant;

/// `tenants.max_tenants` when none is given.
pub const DEFAULT_MAX_TENANTS: usize = 20;
/// `tenants.forget_after` when none is given: how long a learned tenant may be idle before
/// its slot is given back.
pub const DEFAULT_FORGET_AFTER: Duration = Duration::from_secs(3600);
/// The label of a request no source names a tenant for.
pub const UNKNOWN_TENANT: &str = "unknown";
/// The label of tenants past the bound, or whose name cannot be a label.
pub const OTHER_TENANT: &str = "other";
/// Longest tenant name kept as a label value.
const MAX_TENANT_NAME_LEN: usize = 64;

/// A body field that may name the tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyField {
    /// OpenAI's `safety_identifier`.
    SafetyIdentifier,
    /// OpenAI's `user`.
    User,
    /// Anthropic's `metadata.user_id`.
    MetadataUserId,
}

impl BodyField {
    /// The field as written in the config (`safety_identifier`, `user`, `metadata.user_id`).
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "safety_identifier" => Some(BodyField::SafetyIdentifier),
            "user" => Some(BodyField::User),
            "metadata.user_id" => Some(BodyField::MetadataUserId),
            _ => None,
        }
    }

    /// The field as written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            BodyField::SafetyIdentifier => "safety_identifier",
            BodyField::User => "user",
            BodyField::MetadataUserId => "metadata.user_id",
        }
    }
}

/// One place a tenant is read from, as configured.
#[derive(Clone, PartialEq, Eq)]
pub enum SourceSetting {
    /// A request header (its value is the tenant).
    Header(http::HeaderName),
    /// The request's API key (`Authorization: Bearer …` or `x-api-key`), looked up in the
    /// table of tenant → keys read from `path`.
    ApiKeys {
        /// The file the table is read from.
        path: PathBuf,
        /// Tenant → its keys, or why the file could not be read.
        table: Result<KeyFile, String>,
    },
    /// A body field the request carries.
    Body(BodyField),
}

impl std::fmt::Debug for SourceSetting {
    /// Never the keys: their file and how many there are.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SourceSetting::Header(name) => f.debug_tuple("Header").field(name).finish(),
            SourceSetting::ApiKeys { path, table } => f
                .debug_struct("ApiKeys")
                .field("path", path)
                .field("tenants", &table.as_ref().map(|t| t.len()))
                .finish_non_exhaustive(),
            SourceSetting::Body(field) => f.debug_tuple("Body").field(field).finish(),
        }
    }
}

/// How tenants are read and bounded (`tenants:`); no sources means tenants are off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantSettings {
    /// Where the tenant is read from, first match wins.
    pub from: Vec<SourceSetting>,
    /// Tenants always labelled as themselves.
    pub names: Vec<String>,
    /// Further tenants learned as they come, before the rest are `other`.
    pub max_tenants: usize,
    /// How long a learned tenant may send nothing before its slot (and its series) go.
    pub forget_after: Duration,
    /// Whether the SLO window gauges (burn rate, budget, attainment, goodput) are per tenant
    /// too; the counters always are.
    pub gauges: bool,
}

impl Default for TenantSettings {
    fn default() -> Self {
        Self {
            from: Vec::new(),
            names: Vec::new(),
            max_tenants: DEFAULT_MAX_TENANTS,
            forget_after: DEFAULT_FORGET_AFTER,
            gauges: false,
        }
    }
}

impl TenantSettings {
    /// The tenants labelled as themselves from the start: those in `names` and those an
    /// API-key table names (each counted once; names no label allows are not counted, being
    /// `other`).
    pub fn pinned_count(&self) -> usize {
        self.pinned_names().len()
    }

    /// Whether the tenant labels mean the same on every pod, in words for `check-config`
    /// (`None` when tenants are off): the named tenants do; learned ones are each pod's own.
    pub fn fleet_note(&self) -> Option<String> {
        if self.from.is_empty() {
            return None;
        }
        let pinned = self.pinned_count();
        Some(if self.max_tenants == 0 {
            format!(
                "tenants: the same on every pod: the {pinned} named tenants (names and API-key tables); \
                 any other is `other`"
            )
        } else {
            format!(
                "tenants: the {pinned} named tenants are the same on every pod; up to {} more are learned \
                 per pod (the first seen there, given back after {} without a request), so learned names and \
                 `other` differ between pods and a learned tenant's fleet burn counts only the pods that \
                 learned it. For the same set everywhere, name the tenants (names, or an API-key table) \
                 and set max_tenants: 0",
                self.max_tenants,
                humantime::format_duration(self.forget_after)
            )
        })
    }

    /// The pinned tenant names, sorted, each once.
    fn pinned_names(&self) -> Vec<String> {
        let tables = self.from.iter().filter_map(|source| match source {
            SourceSetting::ApiKeys { table: Ok(table), .. } => Some(table.keys()),
            _ => None,
        });
        let mut pinned: Vec<String> = self
            .names
            .iter()
            .chain(tables.flatten())
            .filter(|n| is_plausible(n))
            .cloned()
            .collect();
        pinned.sort();
        pinned.dedup();
        pinned
    }
}

/// The body fields a tenant may be read from, as the request peek found them.
#[derive(Debug, Clone, Copy, Default)]
pub struct BodyIds<'a> {
    /// `safety_identifier`.
    pub safety_identifier: Option<&'a str>,
    /// `user`.
    pub user: Option<&'a str>,
    /// `metadata.user_id`.
    pub metadata_user_id: Option<&'a str>,
}

/// The body fields the tenants read; the others are skipped unread.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantFields {
    /// `safety_identifier` is a tenant source.
    pub safety_identifier: bool,
    /// `user` is a tenant source.
    pub user: bool,
    /// `metadata.user_id` is a tenant source.
    pub metadata_user_id: bool,
}

impl TenantFields {
    /// Every body field a tenant may be read from.
    pub const ALL: Self = Self {
        safety_identifier: true,
        user: true,
        metadata_user_id: true,
    };
}

/// A configured source, ready to read.
enum Source {
    Header(http::HeaderName),
    ApiKeys(KeyTable),
    Body(BodyField),
}

/// The tenants of one sidecar: where they are read from and the labels they get.
pub struct Tenants {
    sources: Vec<Source>,
    pinned: Vec<LabelText>,
    /// Each learned tenant and when it was last seen (a request labelled or ended).
    learned: RwLock<HashMap<LabelText, LastSeen>>,
    max_learned: usize,
    forget_after: Duration,
    /// Held while idle tenants' series go, and by whoever (re)learns a tenant meanwhile: so
    /// no request of a tenant is counted while its series are being removed.
    forgetting: Mutex<()>,
    /// The clock `LastSeen` counts from.
    epoch: Instant,
    learned_now: Gauge,
    forgotten: Counter,
    unknown: LabelText,
    other: LabelText,
}

/// When a learned tenant was last seen: milliseconds since [`Tenants::epoch`].
#[derive(Debug)]
struct LastSeen(AtomicU64);

impl std::fmt::Debug for Tenants {
    /// Never the keys' hashes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenants")
            .field("sources", &self.sources.len())
            .field("pinned", &self.pinned)
            .finish_non_exhaustive()
    }
}

impl Tenants {
    /// The tenants `settings` describe; `None` when no source is configured (tenants off).
    pub fn new(settings: &TenantSettings) -> Option<Self> {
        if settings.from.is_empty() {
            return None;
        }
        let pinned: Vec<LabelText> = settings.pinned_names().into_iter().map(LabelText::from).collect();
        let mut tenants = Self {
            sources: Vec::new(),
            pinned,
            learned: RwLock::new(HashMap::new()),
            max_learned: settings.max_tenants,
            forget_after: settings.forget_after,
            forgetting: Mutex::new(()),
            epoch: Instant::now(),
            learned_now: Gauge::default(),
            forgotten: Counter::default(),
            unknown: LabelText::from(UNKNOWN_TENANT),
            other: LabelText::from(OTHER_TENANT),
        };
        tenants.sources = settings
            .from
            .iter()
            .map(|source| match source {
                SourceSetting::Header(name) => Source::Header(name.clone()),
                SourceSetting::Body(field) => Source::Body(*field),
                SourceSetting::ApiKeys { path, table } => {
                    Source::ApiKeys(KeyTable::new(path, table, &|name| tenants.named(name)))
                }
            })
            .collect();
        Some(tenants)
    }

    /// Reads every API-key table again whose file changed (a rotated Secret), or all of them
    /// when `forced` (SIGHUP): how each went, by file; a table that cannot be read keeps the
    /// last good one in force. A tenant a new table names that was not named at start is
    /// labelled as a learned one (within `max_tenants`, else `other`).
    pub fn reload_key_tables(&self, forced: bool) -> Vec<(PathBuf, KeysRead)> {
        self.key_tables()
            .filter_map(|table| {
                let read = table.reload(forced, &|name| self.named(name))?;
                Some((table.path().to_path_buf(), read))
            })
            .collect()
    }

    /// Whether every API-key table was read at its last look, and the keys in force in all;
    /// `None` without tables.
    pub fn key_tables_status(&self) -> Option<(bool, usize)> {
        self.key_tables()
            .map(KeyTable::status)
            .reduce(|(a, n), (b, m)| (a && b, n + m))
    }

    /// The failures of the tables as first read, by file.
    pub fn key_table_errors(settings: &TenantSettings) -> impl Iterator<Item = (usize, &str)> {
        settings.from.iter().enumerate().filter_map(|(i, source)| match source {
            SourceSetting::ApiKeys { table: Err(error), .. } => Some((i, error.as_str())),
            _ => None,
        })
    }

    fn key_tables(&self) -> impl Iterator<Item = &KeyTable> {
        self.sources.iter().filter_map(|source| match source {
            Source::ApiKeys(table) => Some(table),
            _ => None,
        })
    }

    /// A tenant name as a key table holds it: its pinned label when it has one (shared).
    fn named(&self, name: &str) -> LabelText {
        match self.pinned.binary_search_by(|p| p.as_str().cmp(name)) {
            Ok(at) => self.pinned[at].clone(),
            Err(_) => LabelText::from(name),
        }
    }

    /// The body fields a source reads (the request peek skips the others unread).
    pub fn body_fields(&self) -> TenantFields {
        let mut fields = TenantFields::default();
        for source in &self.sources {
            match source {
                Source::Body(BodyField::SafetyIdentifier) => fields.safety_identifier = true,
                Source::Body(BodyField::User) => fields.user = true,
                Source::Body(BodyField::MetadataUserId) => fields.metadata_user_id = true,
                Source::Header(_) | Source::ApiKeys(_) => {}
            }
        }
        fields
    }

    /// The tenants whose series exist from the start: the pinned ones, and `unknown`.
    pub fn known(&self) -> Vec<LabelText> {
        let mut known = self.pinned.clone();
        known.push(self.unknown.clone());
        known
    }

    /// The request's tenant label and the source that named it (`None` when none did: the
    /// label is `unknown`).
    pub fn label(&self, headers: &HeaderMap, body: BodyIds<'_>) -> (LabelText, Option<TenantSource>) {
        let Some((raw, source)) = self.sources.iter().find_map(|source| self.read(source, headers, body)) else {
            return (self.unknown.clone(), None);
        };
        (self.bounded(&raw), Some(source))
    }

    fn read<'a>(
        &'a self,
        source: &'a Source,
        headers: &'a HeaderMap,
        body: BodyIds<'a>,
    ) -> Option<(Named<'a>, TenantSource)> {
        match source {
            Source::Header(name) => headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(|v| (Named::Said(v), TenantSource::Header)),
            Source::ApiKeys(table) => {
                let tenant = table.tenant(api_key(headers)?)?;
                Some((Named::Keyed(tenant), TenantSource::ApiKey))
            }
            Source::Body(field) => match field {
                BodyField::SafetyIdentifier => body.safety_identifier,
                BodyField::User => body.user,
                BodyField::MetadataUserId => body.metadata_user_id,
            }
            .filter(|v| !v.is_empty())
            .map(|v| (Named::Said(v), TenantSource::Body)),
        }
    }

    /// `raw` as a label: itself when pinned or learned (within the bound), else `other`; each
    /// label is made once and shared.
    fn bounded(&self, raw: &str) -> LabelText {
        if let Ok(at) = self.pinned.binary_search_by(|p| p.as_str().cmp(raw)) {
            return self.pinned[at].clone();
        }
        if !is_plausible(raw) {
            return self.other.clone();
        }
        let now = self.millis(Instant::now());
        {
            let learned = self.learned.read().expect("tenant set lock");
            if let Some((known, seen)) = learned.get_key_value(raw) {
                seen.0.store(now, Ordering::Relaxed);
                return known.clone();
            }
            if learned.len() >= self.max_learned {
                return self.other.clone();
            }
        }
        // Learned after any forgetting under way, so none of its series are removed.
        let _forgetting = self.forgetting.lock().expect("tenant forgetting lock");
        let mut learned = self.learned.write().expect("tenant set lock");
        if let Some((known, seen)) = learned.get_key_value(raw) {
            seen.0.store(now, Ordering::Relaxed);
            known.clone()
        } else if learned.len() < self.max_learned {
            let label = LabelText::from(raw);
            learned.insert(label.clone(), LastSeen(AtomicU64::new(now)));
            self.learned_now.set(learned.len() as i64);
            label
        } else {
            self.other.clone()
        }
    }

    /// Milliseconds from the epoch to `at`.
    fn millis(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_millis()).unwrap_or(u64::MAX)
    }

    /// Gives back the slots of the learned tenants nobody has seen for `forget_after` by
    /// `now`: `forget` removes each one's series before anyone can learn it again. Returns
    /// the tenants forgotten.
    pub fn forget_idle(&self, now: Instant, forget: impl Fn(&LabelText)) -> Vec<LabelText> {
        let Some(cutoff) = self.millis(now).checked_sub(self.forget_after.as_millis() as u64) else {
            return Vec::new();
        };
        let _forgetting = self.forgetting.lock().expect("tenant forgetting lock");
        let idle: Vec<LabelText> = {
            let mut learned = self.learned.write().expect("tenant set lock");
            let idle: Vec<LabelText> = learned
                .iter()
                .filter(|(_, seen)| seen.0.load(Ordering::Relaxed) <= cutoff)
                .map(|(tenant, _)| tenant.clone())
                .collect();
            for tenant in &idle {
                learned.remove(tenant);
            }
            self.learned_now.set(learned.len() as i64);
            idle
        };
        for tenant in &idle {
            forget(tenant);
        }
        self.forgotten.inc_by(idle.len() as u64);
        idle
    }

    /// How often to look for idle tenants: a tenth of `forget_after`, between 1 s and 1 min.
    pub fn forget_every(&self) -> Duration {
        (self.forget_after / 10).clamp(Duration::from_secs(1), Duration::from_secs(60))
    }

    /// Registers the learned slots in use and the tenants forgotten.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "llmslo_tenants_learned",
            "Learned tenant slots in use (at most tenants.max_tenants; the named tenants are not counted)",
            self.learned_now.clone(),
        );
        registry.register(
            "llmslo_tenants_forgotten",
            "Learned tenants whose slot was given back after tenants.forget_after without a request, \
             their series removed",
            self.forgotten.clone(),
        );
    }

    /// Whether `tenant` is a label a learned tenant has (neither pinned nor reserved).
    fn is_learned_kind(&self, tenant: &LabelText) -> bool {
        tenant != &self.unknown
            && tenant != &self.other
            && self.pinned.binary_search_by(|p| p.as_str().cmp(tenant)).is_err()
    }
}

impl Reader for Tenants {
    /// A learned tenant's request ended: it was seen now. One that outlived its tenant's slot
    /// (forgotten while it ran) takes the slot back, past the bound if it must, so that the
    /// series its record makes are forgotten in their turn, never left behind.
    fn finished(&self, record: &RequestRecord) {
        let Some(tenant) = record.tenant.as_ref().filter(|t| self.is_learned_kind(t)) else {
            return;
        };
        let now = self.millis(Instant::now());
        if let Some(seen) = self.learned.read().expect("tenant set lock").get(tenant) {
            seen.0.store(now, Ordering::Relaxed);
            return;
        }
        let _forgetting = self.forgetting.lock().expect("tenant forgetting lock");
        let mut learned = self.learned.write().expect("tenant set lock");
        learned
            .entry(tenant.clone())
            .or_insert_with(|| LastSeen(AtomicU64::new(now)))
            .0
            .store(now, Ordering::Relaxed);
        self.learned_now.set(learned.len() as i64);
    }
}

/// A tenant name a source gave: as the request said it, or a key table's label.
enum Named<'a> {
    Said(&'a str),
    Keyed(LabelText),
}

impl std::ops::Deref for Named<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        match self {
            Named::Said(name) => name,
            Named::Keyed(label) => label.as_str(),
        }
    }
}

/// The request's API key: `Authorization: Bearer <key>` (OpenAI) or `x-api-key` (Anthropic).
fn api_key(headers: &HeaderMap) -> Option<&str> {
    let bearer = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim);
    bearer
        .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()).map(str::trim))
        .filter(|k| !k.is_empty())
}

/// Whether a tenant name may become a label: its length and characters (letters, digits and
/// `-._:@`), and not one of the reserved labels.
fn is_plausible(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_TENANT_NAME_LEN
        && name != UNKNOWN_TENANT
        && name != OTHER_TENANT
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._:@".contains(&b))
}

#[cfg(test)]
mod tests;
