//! The storage format: which form of keys and values this version reads and writes, recorded once per server under
//! `<prefix>format`, so that a later version that changes the form can tell what a server holds and move it, and so
//! that this version refuses a server written by a form it does not know instead of misreading it.

use fred::types::Value;

use super::RedisStore;
use crate::store::{CounterKey, StoreError};

/// The storage format this version reads and writes: the compact keys and values `docs/src/storage.md` describes.
pub const FORMAT: &str = "1";

/// What [`RedisStore::check_format`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FormatCheck {
    /// The server holds this version's format (or held nothing, and now says so).
    Known,
    /// The server was written in another format, named by the marker's value: nothing may be decided against it.
    Unknown(String),
}

impl FormatCheck {
    /// Why a server holding the storage format `found` under `prefix` is refused.
    pub fn refusal(prefix: &str, found: &str) -> String {
        format!(
            "redis holds sluice's storage format '{found}' under the key '{prefix}format', and this version reads \
             format '{FORMAT}' only: use a version that reads it, or another --key-prefix"
        )
    }
}

impl RedisStore {
    /// Reads the format marker `<prefix>format` and writes [`FORMAT`] there when there is none (the first instance to
    /// start on a server sets it for all; it never expires and is never changed). An error means the marker could not
    /// be read (the server or the primary of its slot is not reachable yet): the caller decides whether to wait.
    pub async fn check_format(&self, prefix: &str) -> Result<FormatCheck, StoreError> {
        let marker = format!("{prefix}format");
        let key = CounterKey::named(marker.clone(), 0);
        let get = || self.send(&key, "GET", vec![Value::from(marker.as_str())]);
        let call = async {
            if let Some(found) = get().await?.as_string() {
                return Ok(found);
            }
            let set = vec![Value::from(marker.as_str()), Value::from(FORMAT), Value::from("NX")];
            self.send(&key, "SET", set).await?;
            Ok(get().await?.as_string().unwrap_or_default())
        };
        let found = tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| StoreError::Timeout(self.timeout))??;
        Ok(if found == FORMAT {
            FormatCheck::Known
        } else {
            FormatCheck::Unknown(found)
        })
    }
}
