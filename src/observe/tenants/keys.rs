//! API-key tables: files of tenant → keys (a mounted Secret), read within their bounds, matched
//! on a keyed hash held in memory, and read again when the file changes (a rotated Secret) or
//! on SIGHUP. A table that cannot be read keeps the last good one in force (none at start):
//! the tenants alone fail open, loudly.

use crate::record::LabelText;
use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

/// Most keys an API-key table may hold: each costs its hash and a pointer to its tenant.
pub const MAX_API_KEYS: usize = 100_000;
/// Largest API-key table file read.
pub const MAX_API_KEY_FILE_BYTES: u64 = 8 << 20;

/// A table as its file states it: tenant → its keys.
pub type KeyFile = HashMap<String, Vec<String>>;

/// The table of tenant → API keys in `path` (a YAML mapping of names to lists of keys), within
/// its bounds: the file's size and the number of keys. An error never quotes a key.
pub fn read_key_table(path: &Path) -> Result<KeyFile, String> {
    let size = std::fs::metadata(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?
        .len();
    if size > MAX_API_KEY_FILE_BYTES {
        return Err(format!(
            "{} holds {size} bytes; an API-key table may hold at most {MAX_API_KEY_FILE_BYTES}",
            path.display()
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    // A parse error could quote a key: say where, never what.
    let table: KeyFile = serde_yaml::from_str(&text).map_err(|e| {
        format!(
            "{} is not a mapping of tenant names to lists of keys (line {})",
            path.display(),
            e.location().map_or(0, |l| l.line())
        )
    })?;
    let keys: usize = table.values().map(Vec::len).sum();
    if keys > MAX_API_KEYS {
        return Err(format!(
            "{} holds {keys} keys; an API-key table may hold at most {MAX_API_KEYS}",
            path.display()
        ));
    }
    // A key under two tenants would count for whichever the map visits last: refused, naming
    // both tenants (never the key).
    let mut owner: HashMap<&str, &str> = HashMap::with_capacity(keys);
    let mut tenants: Vec<&String> = table.keys().collect();
    tenants.sort();
    for tenant in tenants {
        for key in &table[tenant] {
            if let Some(first) = owner.insert(key.as_str(), tenant.as_str()) {
                if first != tenant.as_str() {
                    return Err(format!(
                        "{} lists one key under two tenants, `{first}` and `{tenant}`: a key names one tenant",
                        path.display()
                    ));
                }
            }
        }
    }
    Ok(table)
}

/// What tells a file changed without reading it: its length, modification time and inode (a
/// Secret's update swaps the file the path leads to).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified: Option<SystemTime>,
    inode: u64,
}

impl Stamp {
    fn of(path: &Path) -> Option<Self> {
        let meta = std::fs::metadata(path).ok()?;
        #[cfg(unix)]
        let inode = std::os::unix::fs::MetadataExt::ino(&meta);
        #[cfg(not(unix))]
        let inode = 0;
        Some(Self {
            len: meta.len(),
            modified: meta.modified().ok(),
            inode,
        })
    }
}

/// How a table's reading went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeysRead {
    /// Read: this many keys in force.
    Loaded(usize),
    /// Not read (the error); the last good table stays in force.
    Failed(String),
}

/// One API-key table in force.
pub(super) struct KeyTable {
    path: PathBuf,
    /// Hashes keys; its keys are random, made when the table is.
    hasher: RandomState,
    keys: RwLock<Arc<HashMap<u64, LabelText>>>,
    stamp: Mutex<Option<Stamp>>,
    valid: AtomicBool,
}

impl KeyTable {
    /// The table at `path` as first read (`first`), its tenants labelled by `label`.
    pub(super) fn new(path: &Path, first: &Result<KeyFile, String>, label: &dyn Fn(&str) -> LabelText) -> Self {
        let table = Self {
            path: path.to_path_buf(),
            hasher: RandomState::new(),
            keys: RwLock::new(Arc::default()),
            stamp: Mutex::new(Stamp::of(path)),
            valid: AtomicBool::new(false),
        };
        if let Ok(file) = first {
            table.put_in_force(file, label);
        }
        table
    }

    /// The tenant of `key`, when the table names one.
    pub(super) fn tenant(&self, key: &str) -> Option<LabelText> {
        let hash = self.hasher.hash_one(key.as_bytes());
        self.keys.read().expect("key table lock").get(&hash).cloned()
    }

    /// Reads the file again when it changed since the last look, or when `forced` (SIGHUP);
    /// `None` when there was nothing to read.
    pub(super) fn reload(&self, forced: bool, label: &dyn Fn(&str) -> LabelText) -> Option<KeysRead> {
        let now = Stamp::of(&self.path);
        {
            let mut stamp = self.stamp.lock().expect("key stamp lock");
            if !forced && *stamp == now {
                return None;
            }
            *stamp = now;
        }
        Some(match read_key_table(&self.path) {
            Ok(file) => KeysRead::Loaded(self.put_in_force(&file, label)),
            Err(error) => {
                self.valid.store(false, Ordering::Relaxed);
                KeysRead::Failed(error)
            }
        })
    }

    /// Whether its last reading succeeded, and the keys in force.
    pub(super) fn status(&self) -> (bool, usize) {
        (
            self.valid.load(Ordering::Relaxed),
            self.keys.read().expect("key table lock").len(),
        )
    }

    /// The file it is read from.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    fn put_in_force(&self, file: &KeyFile, label: &dyn Fn(&str) -> LabelText) -> usize {
        let keys: HashMap<u64, LabelText> = file
            .iter()
            .flat_map(|(tenant, keys)| {
                let label = label(tenant);
                keys.iter()
                    .map(move |key| (self.hasher.hash_one(key.as_bytes()), label.clone()))
            })
            .collect();
        let count = keys.len();
        *self.keys.write().expect("key table lock") = Arc::new(keys);
        self.valid.store(true, Ordering::Relaxed);
        count
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, text: &str) -> PathBuf {
        let path = std::env::temp_dir().join(format!("llmslo-keys-{}-{name}.yaml", std::process::id()));
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn a_key_under_two_tenants_is_refused_naming_both_and_never_the_key() {
        let path = file("twice", "team-a: [sk-secret-1, sk-a]\nteam-b: [sk-b, sk-secret-1]\n");
        let error = read_key_table(&path).unwrap_err();
        assert!(error.contains("`team-a` and `team-b`"), "{error}");
        assert!(!error.contains("sk-secret-1"), "{error}");
        std::fs::write(&path, "team-a: [sk-a, sk-a]\nteam-b: [sk-b]\n").unwrap();
        assert_eq!(
            read_key_table(&path).unwrap().len(),
            2,
            "twice under one tenant is still that tenant"
        );
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_rotated_table_is_read_again_and_a_bad_one_keeps_the_last_good() {
        let path = file("rotate", "team-a: [sk-old]\n");
        let label = |name: &str| LabelText::from(name);
        let table = KeyTable::new(&path, &read_key_table(&path), &label);
        assert_eq!(table.tenant("sk-old").as_deref(), Some("team-a"));
        assert_eq!(table.reload(false, &label), None, "unchanged: not read");
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, "team-a: [sk-new]\nteam-b: [sk-b]\n").unwrap();
        assert_eq!(table.reload(false, &label), Some(KeysRead::Loaded(2)));
        assert_eq!(
            (table.tenant("sk-old"), table.tenant("sk-new").as_deref()),
            (None, Some("team-a"))
        );
        std::fs::write(&path, "team-a: [oops\n").unwrap();
        assert!(matches!(table.reload(true, &label), Some(KeysRead::Failed(_))));
        assert_eq!(table.tenant("sk-b").as_deref(), Some("team-b"), "the last good table");
        assert_eq!(table.status(), (false, 2));
        std::fs::remove_file(&path).unwrap();
        let missing = KeyTable::new(&path, &read_key_table(&path), &label);
        assert_eq!(missing.status(), (false, 0));
        std::fs::write(&path, "team-c: [sk-c]\n").unwrap();
        assert_eq!(missing.reload(false, &label), Some(KeysRead::Loaded(1)));
        assert_eq!(missing.tenant("sk-c").as_deref(), Some("team-c"));
        assert_eq!(missing.status(), (true, 1));
        std::fs::remove_file(&path).unwrap();
    }
}
