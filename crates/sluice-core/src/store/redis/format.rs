//! The storage format: which form of keys and values this version reads and writes, recorded once per server under
//! `<prefix>format`, so that a later version that changes the form can tell what a server holds and move it, and so
//! that this version refuses a server written by a form it does not know instead of misreading it.

use fred::interfaces::KeysInterface;
use fred::types::{Expiration, SetOptions, Value};

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

impl RedisStore {
    /// Reads the format marker `<prefix>format` and writes [`FORMAT`] there when there is none (the first instance to
    /// start on a server sets it for all; it never expires and is never changed). An error means the marker could not
    /// be read (the server or the primary of its slot is not reachable yet): the caller decides whether to wait.
    pub async fn check_format(&self, prefix: &str) -> Result<FormatCheck, StoreError> {
        let marker = format!("{prefix}format");
        let client = self.client_for(&CounterKey::named(marker.clone(), 0))?;
        let call = async {
            let found: Option<String> = client.get(&marker).await?;
            if let Some(found) = found {
                return Ok(found);
            }
            let _: Value = client
                .set(&marker, FORMAT, None::<Expiration>, Some(SetOptions::NX), false)
                .await?;
            client
                .get::<Option<String>, _>(&marker)
                .await
                .map(Option::unwrap_or_default)
        };
        let found = tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| StoreError::Timeout(self.timeout))?
            .map_err(|e| self.classify(e))?;
        Ok(if found == FORMAT {
            FormatCheck::Known
        } else {
            FormatCheck::Unknown(found)
        })
    }
}
