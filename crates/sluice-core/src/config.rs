//! The configuration files as written: the envoyproxy/ratelimit YAML format, one domain per file, plus sluice's
//! extensions under `rate_limit`.
//!
//! This module owns reading and shape-checking only. Every key is checked (unknown keys and non-string keys are
//! errors, as in the reference), and every error names the file and the path inside it. Meaning — units, limits,
//! duplicates, `replaces` — is checked when [`crate::rules`] compiles these raw types into a matcher.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde::de;

mod yaml;

/// One configuration file: a domain and its descriptor tree.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDomain {
    #[serde(default)]
    pub domain: String,
    #[serde(default)]
    pub descriptors: Vec<RawDescriptor>,
    /// sluice extension: what to answer for this domain when the store cannot decide.
    pub failure_policy: Option<String>,
    /// sluice extension: the quota buckets of Envoy's Rate Limit Quota Service (RLQS) in this domain.
    #[serde(default)]
    pub quota_buckets: Vec<RawQuotaBucket>,
    /// sluice extension: deny and allow lists of descriptor values, checked before the limits.
    #[serde(default)]
    pub lists: Vec<RawList>,
}

/// One deny or allow list: the values of one descriptor key it holds, inline and from a file next to the
/// configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawList {
    #[serde(default)]
    pub name: String,
    /// The descriptor key whose values it holds (`remote_address`, `user_agent`, any key).
    #[serde(default)]
    pub key: String,
    /// `deny` (default) or `allow`.
    pub action: Option<String>,
    /// Exact values, `*` wildcards, and IPv4 or IPv6 addresses and CIDR ranges.
    #[serde(default)]
    pub values: Vec<String>,
    /// A file of values, one per line (`#` starts a comment), relative to the configuration file's directory; read
    /// with the configuration, and again on every reload.
    pub file: Option<String>,
    /// A URL (`http://` or `https://`) serving values one per line, as a file would: fetched when the server starts
    /// (an unreachable URL stops it) and again every `refresh_seconds`; a fetch that fails keeps the last good values.
    pub url: Option<String>,
    /// How often the `url` is fetched again, in seconds: 3600 unless set.
    pub refresh_seconds: Option<u64>,
    /// The values read from `file`, with the line each came from (filled when the configuration is loaded).
    #[serde(skip)]
    pub file_values: Vec<(usize, String)>,
}

/// The largest list file read: a million CIDR ranges take about 20 MB of text.
pub const MAX_LIST_FILE_BYTES: u64 = 64 << 20;

/// One rule of RLQS buckets: which bucket ids it applies to, their quota, and how assignments are handed out.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawQuotaBucket {
    /// The bucket id's entries: a key with a value (exact, or with `*` wildcards) or with no value (any value, each
    /// value its own quota). A bucket id matches when it has exactly these keys; key order is irrelevant.
    #[serde(default)]
    pub bucket: std::collections::BTreeMap<String, Option<String>>,
    pub rate_limit: Option<RawRateLimit>,
    pub rate_limits: Option<Vec<RawRateLimit>>,
    /// Every value matching a wildcard shares one quota (per wildcard key), instead of one quota per value.
    #[serde(default)]
    pub share_threshold: bool,
    #[serde(default)]
    pub shadow_mode: bool,
    /// How long an assignment holds without a refresh, in whole seconds (Envoy's timer granularity).
    pub assignment_ttl_seconds: Option<u32>,
    /// A bucket reported with no requests for this long is abandoned: the Envoy forgets it.
    pub abandon_after_seconds: Option<u32>,
    /// The answer to a bucket's first report on a stream: `share` (default), `allow_all` or `deny_all`.
    pub initial_assignment: Option<String>,
}

/// One node of the descriptor tree.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDescriptor {
    #[serde(default)]
    pub key: Box<str>,
    pub value: Option<Box<str>>,
    pub rate_limit: Option<Box<RawRateLimit>>,
    /// sluice extension: several limits on one node, all decided together (instead of `rate_limit`).
    pub rate_limits: Option<Vec<RawRateLimit>>,
    #[serde(default)]
    pub descriptors: Vec<RawDescriptor>,
    #[serde(default)]
    pub shadow_mode: bool,
    #[serde(default)]
    pub detailed_metric: bool,
    #[serde(default)]
    pub value_to_metric: bool,
    #[serde(default)]
    pub share_threshold: bool,
    #[serde(default)]
    pub quota_mode: bool,
    /// sluice extension: hits with a cost report usage that already happened (counted whatever the limits say);
    /// a hit of cost 0 checks that something is left.
    #[serde(default)]
    pub cost_reports: bool,
    /// Free-form data handed back with a decision; its keys are strings at every level.
    #[serde(default, deserialize_with = "metadata")]
    pub metadata: Option<Box<RawMetadata>>,
}

/// A rule's `metadata`: a map of strings to JSON-like values.
pub type RawMetadata = serde_json::Map<String, serde_json::Value>;

/// The limit of one node.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRateLimit {
    pub unit: Option<Box<str>>,
    #[serde(default)]
    pub requests_per_unit: u32,
    #[serde(default)]
    pub unlimited: bool,
    pub name: Option<Box<str>>,
    #[serde(default)]
    pub replaces: Vec<RawReplaces>,
    /// sluice extension: the counting algorithm (`fixed_window` by default).
    pub algorithm: Option<Box<str>>,
    /// sluice extension: the window is this many units long (1 by default).
    pub unit_multiplier: Option<u32>,
    /// sluice extension: bucket capacity of `token_bucket` and `leaky_bucket`.
    pub burst: Option<u32>,
    /// sluice extension: how many sub-windows a `bucketed_window` splits its window into.
    pub buckets: Option<u32>,
    /// sluice extension: keep the last values of a request entry that hit this limit.
    pub record: Option<Box<RawRecord>>,
    /// sluice extension: the named cost this limit counts (e.g. `input_tokens`), instead of the request's cost.
    pub cost: Option<Box<str>>,
    /// sluice extension: this limit counts the sum of named costs, each times its price (whole units of the budget).
    pub price: Option<Box<std::collections::BTreeMap<String, u32>>>,
    /// sluice extension: counted in every region (with `--region`), each region adding what the others shipped.
    #[serde(default)]
    pub global: bool,
}

/// `record`: which request entry's value to keep, and how many of the latest.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRecord {
    #[serde(default)]
    pub key: String,
    #[serde(default)]
    pub size: u32,
}

/// One entry of `replaces`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawReplaces {
    #[serde(default)]
    pub name: String,
}

/// A configuration file that was read and shape-checked.
#[derive(Debug, Clone)]
pub struct ConfigFile {
    pub path: PathBuf,
    pub domain: RawDomain,
    /// A hash of the file's name and text, to tell whether a reload changed anything.
    pub digest: u64,
}

/// Why a configuration could not be loaded. Every message names the file, and the path inside it when there is one.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config '{}': cannot read: {source}", file.display())]
    Read { file: PathBuf, source: std::io::Error },
    #[error("config '{}': no *.yaml or *.yml files in the directory", dir.display())]
    NoFiles { dir: PathBuf },
    #[error("config '{}': {message}", file.display())]
    Yaml { file: PathBuf, message: String },
    #[error("config '{}': {path}: {message}", file.display())]
    Invalid {
        file: PathBuf,
        path: String,
        message: String,
    },
}

impl ConfigError {
    pub(crate) fn invalid(file: &Path, path: &str, message: impl Into<String>) -> Self {
        ConfigError::Invalid {
            file: file.to_path_buf(),
            path: if path.is_empty() {
                "(top level)".to_string()
            } else {
                path.to_string()
            },
            message: message.into(),
        }
    }
}

/// Reads a configuration: a single file, or every `*.yaml`/`*.yml` file of a directory (not recursive, in name
/// order, hidden files skipped). Kubernetes ConfigMap mounts (`..data` symlinks) read as a plain directory.
pub fn load(path: &Path) -> Result<Vec<ConfigFile>, ConfigError> {
    let read_err = |source| ConfigError::Read {
        file: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(read_err)?;
    if !meta.is_dir() {
        return Ok(vec![load_file(path)?]);
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path).map_err(read_err)? {
        let file = entry.map_err(read_err)?.path();
        let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let is_yaml = file
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| e == "yaml" || e == "yml");
        if is_yaml && !name.starts_with('.') && file.is_file() {
            files.push(file);
        }
    }
    if files.is_empty() {
        return Err(ConfigError::NoFiles {
            dir: path.to_path_buf(),
        });
    }
    files.sort();
    files.iter().map(|f| load_file(f)).collect()
}

/// Reads and shape-checks one file, and reads the list files it names.
pub fn load_file(file: &Path) -> Result<ConfigFile, ConfigError> {
    let text = std::fs::read_to_string(file).map_err(|source| ConfigError::Read {
        file: file.to_path_buf(),
        source,
    })?;
    let mut config = parse(file, &text)?;
    read_list_files(&mut config)?;
    Ok(config)
}

/// Reads the values of every list that names a file, relative to the configuration file's directory, and folds
/// their text into the file's digest, so that a reload sees a changed list.
fn read_list_files(config: &mut ConfigFile) -> Result<(), ConfigError> {
    let dir = config.path.parent().map(Path::to_path_buf).unwrap_or_default();
    let mut hasher = std::hash::DefaultHasher::new();
    std::hash::Hash::hash(&config.digest, &mut hasher);
    for (i, list) in config.domain.lists.iter_mut().enumerate() {
        let Some(name) = &list.file else { continue };
        let at = format!("lists[{i}].file");
        let path = dir.join(name);
        let invalid = |message: String| ConfigError::invalid(&config.path, &at, message);
        let size = std::fs::metadata(&path)
            .map_err(|e| invalid(format!("cannot read '{}': {e}", path.display())))?
            .len();
        if size > MAX_LIST_FILE_BYTES {
            return Err(invalid(format!(
                "'{}' is {size} bytes, more than the {MAX_LIST_FILE_BYTES} a list file may have",
                path.display()
            )));
        }
        let text =
            std::fs::read_to_string(&path).map_err(|e| invalid(format!("cannot read '{}': {e}", path.display())))?;
        std::hash::Hash::hash(&(name, &text), &mut hasher);
        list.file_values = list_lines(&text).map(|(n, value)| (n, value.to_string())).collect();
    }
    config.digest = std::hash::Hasher::finish(&hasher);
    Ok(())
}

/// The values of a list's text with their line numbers: one per line, `#` starting a comment, blanks skipped.
pub fn list_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines().enumerate().filter_map(|(n, line)| {
        let value = line.split('#').next().unwrap_or("").trim();
        (!value.is_empty()).then_some((n + 1, value))
    })
}

/// Shape-checks the text of one file; `file` only names it in errors.
pub fn parse(file: &Path, text: &str) -> Result<ConfigFile, ConfigError> {
    // One pass into the typed structures: a mapping key that is not a string can only be an unknown field there
    // (the reader names it with its path), except inside the free-form `metadata`, which refuses it itself.
    let domain: Option<RawDomain> = yaml::from_str(text).map_err(|e| ConfigError::Yaml {
        file: file.to_path_buf(),
        message: e.to_string(),
    })?;
    let Some(domain) = domain else {
        return Err(ConfigError::invalid(file, "", "the file is empty"));
    };
    let mut hasher = std::hash::DefaultHasher::new();
    std::hash::Hash::hash(&(file, text), &mut hasher);
    Ok(ConfigFile {
        path: file.to_path_buf(),
        domain,
        digest: std::hash::Hasher::finish(&hasher),
    })
}

/// Reads `metadata`: a mapping whose keys are strings at every level, with any values.
fn metadata<'de, D: de::Deserializer<'de>>(d: D) -> Result<Option<Box<RawMetadata>>, D::Error> {
    Ok(Option::<FreeMap>::deserialize(d)?.map(|m| Box::new(m.0)))
}

/// A free-form mapping with string keys.
struct FreeMap(RawMetadata);

/// A free-form value: null, a boolean, a number, a string, or a sequence or mapping of them.
struct Free(serde_json::Value);

/// A key of a free-form mapping, refused unless it is a string.
struct FreeKey(String);

impl<'de> Deserialize<'de> for FreeMap {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match d.deserialize_map(FreeVisitor)? {
            serde_json::Value::Object(map) => Ok(FreeMap(map)),
            _ => Err(de::Error::custom("expected a mapping")),
        }
    }
}

impl<'de> Deserialize<'de> for Free {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(FreeVisitor).map(Free)
    }
}

struct FreeVisitor;

impl<'de> de::Visitor<'de> for FreeVisitor {
    type Value = serde_json::Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a mapping")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Null)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        while let Some(Free(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(serde_json::Value::Array(items))
    }

    fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = RawMetadata::new();
        while let Some(FreeKey(k)) = map.next_key()? {
            let Free(v) = map.next_value()?;
            out.insert(k, v);
        }
        Ok(serde_json::Value::Object(out))
    }
}

impl<'de> Deserialize<'de> for FreeKey {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        fn refuse<E: de::Error>(what: impl std::fmt::Display) -> Result<FreeKey, E> {
            Err(E::custom(format!("key is not a string: {what}")))
        }
        impl<'de> de::Visitor<'de> for KeyVisitor {
            type Value = FreeKey;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<FreeKey, E> {
                Ok(FreeKey(v.to_string()))
            }

            fn visit_string<E: de::Error>(self, v: String) -> Result<FreeKey, E> {
                Ok(FreeKey(v))
            }

            fn visit_unit<E: de::Error>(self) -> Result<FreeKey, E> {
                refuse("null")
            }

            fn visit_bool<E: de::Error>(self, v: bool) -> Result<FreeKey, E> {
                refuse(v)
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<FreeKey, E> {
                refuse(v)
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<FreeKey, E> {
                refuse(v)
            }

            fn visit_f64<E: de::Error>(self, v: f64) -> Result<FreeKey, E> {
                refuse(v)
            }

            fn visit_seq<A: de::SeqAccess<'de>>(self, _: A) -> Result<FreeKey, A::Error> {
                refuse("a sequence")
            }

            fn visit_map<A: de::MapAccess<'de>>(self, _: A) -> Result<FreeKey, A::Error> {
                refuse("a mapping")
            }
        }
        d.deserialize_any(KeyVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(text: &str) -> Result<ConfigFile, ConfigError> {
        parse(Path::new("t.yaml"), text)
    }

    #[test]
    fn reads_the_reference_format() {
        let f = parse_str(
            "domain: edge\ndescriptors:\n  - key: a\n    value: b\n    rate_limit: {unit: Second, requests_per_unit: 3, name: x}\n    descriptors:\n      - key: c\n",
        )
        .unwrap();
        assert_eq!(f.domain.domain, "edge");
        assert_eq!(&*f.domain.descriptors[0].descriptors[0].key, "c");
        let rl = f.domain.descriptors[0].rate_limit.as_ref().unwrap();
        assert_eq!(rl.requests_per_unit, 3);
    }

    #[test]
    fn unknown_key_names_file_and_path() {
        let e = parse_str(
            "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 3, colour: red}\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("t.yaml"), "{e}");
        assert!(e.contains("descriptors[0].rate_limit"), "{e}");
        assert!(e.contains("colour"), "{e}");
    }

    #[test]
    fn non_string_key_is_rejected() {
        let e = parse_str("domain: edge\ndescriptors:\n  - key: a\n    1: b\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("descriptors[0]: unknown field `1`"), "{e}");
        let e = parse_str(
            "domain: edge\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        metadata: {x: {2: y}}\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("descriptors[0].descriptors[0].metadata.x: key is not a string: 2"),
            "{e}"
        );
        let e = parse_str("# nothing but a comment\n").unwrap_err().to_string();
        assert!(e.contains("the file is empty"), "{e}");
    }

    #[test]
    fn invalid_yaml_and_empty_file() {
        let e = parse_str("domain: [edge\n").unwrap_err().to_string();
        assert!(e.starts_with("config 't.yaml': "), "{e}");
        let e = parse_str("  \n").unwrap_err().to_string();
        assert!(e.contains("empty"), "{e}");
    }

    #[test]
    fn negative_limit_is_a_type_error_with_path() {
        let e = parse_str(
            "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("descriptors[0].rate_limit.requests_per_unit"), "{e}");
    }
}
