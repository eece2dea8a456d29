//! Lists fetched from URLs (`url:` in a domain file's `lists`): each is fetched when the server starts (a list that
//! cannot be fetched then stops it, naming the URL), again every `refresh_seconds`, and at once when a reload brings
//! a list (or a URL) not fetched yet. The text is read as a list file is (one value per line, `#` comments, at most
//! [`MAX_LIST_FILE_BYTES`]). A fetch that fails, answers an error status, or holds a malformed line keeps the last
//! good values: it is counted in `sluice_list_fetches_total{result="failure"}`, named in `/readyz`'s body, and
//! tried again after a minute (or the list's interval, when shorter).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::limiter::Limiter;
use crate::rules::{ListSource, Matcher};
use crate::store::{Announcements, Counters, Lists};
use sluice_core::config::MAX_LIST_FILE_BYTES;

/// The longest one fetch may take, connection and body included.
const FETCH_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest a connection to a list's server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How soon a failed fetch is tried again, unless the list's interval is shorter.
const RETRY: Duration = Duration::from_secs(60);

/// The HTTP client lists are fetched with: rustls with the system's roots, redirects followed (at most 10).
pub fn client() -> Result<reqwest::Client, String> {
    let tls = rustls::ClientConfig::builder_with_provider(sluice_core::pem::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("list fetches: {e}"))?
        .with_root_certificates(sluice_core::pem::native_roots())
        .with_no_client_auth();
    reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .timeout(FETCH_TIMEOUT)
        .connect_timeout(CONNECT_TIMEOUT)
        .user_agent(concat!("sluice/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| format!("list fetches: {e}"))
}

/// Fetches one list's values; the error names the URL and what went wrong (the line, for a malformed value).
pub async fn fetch(client: &reqwest::Client, url: &str) -> Result<Matcher, String> {
    let mut response = client
        .get(url)
        .send()
        .await
        .map_err(|e| format!("cannot fetch '{url}': {}", chain(&e)))?;
    if !response.status().is_success() {
        return Err(format!("'{url}' answered {}", response.status()));
    }
    let too_big = |n: u64| format!("'{url}' is {n} bytes or more, more than the {MAX_LIST_FILE_BYTES} a list may have");
    if let Some(n) = response.content_length().filter(|&n| n > MAX_LIST_FILE_BYTES) {
        return Err(too_big(n));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| format!("cannot read '{url}': {}", chain(&e)))?
    {
        body.extend_from_slice(&chunk);
        if body.len() as u64 > MAX_LIST_FILE_BYTES {
            return Err(too_big(body.len() as u64));
        }
    }
    let text = String::from_utf8(body).map_err(|_| format!("'{url}' is not UTF-8 text"))?;
    Matcher::from_text(&text).map_err(|e| format!("'{url}' {e}"))
}

/// An error with its causes, as reqwest's own message leaves them out.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text += &format!(": {s}");
        source = s.source();
    }
    text
}

/// Fetches every list of the rules in force that has a URL, once, and puts the values in force. The first failure
/// is returned, naming the list and the URL: a server must not start without its lists.
pub async fn fetch_all<S: Counters + Announcements + Lists>(
    limiter: &Limiter<S>,
    client: &reqwest::Client,
) -> Result<(), String> {
    for (domain, name, source) in limiter.lists().with_urls() {
        let values = fetch(client, &source.url)
            .await
            .map_err(|e| format!("list '{name}' of domain '{domain}': {e}"))?;
        tracing::info!(domain = %domain, list = %name, url = %source.url, entries = values.len(), "list fetched");
        limiter.lists().set_fetched(&domain, &name, Arc::new(values));
    }
    Ok(())
}

/// Fetches each list again when its time comes, for as long as the limiter lives (run it in a task of its own). The
/// HTTP client is made when the rules first have a list with a URL.
pub async fn keep_fetching<S: Counters + Announcements + Lists>(limiter: Arc<Limiter<S>>) {
    let mut client: Option<reqwest::Client> = None;
    // When each (domain, list, source) is fetched next: the lists fetched already (at start) after their interval,
    // any other (a reload brought it, or changed its URL) at once.
    let start = Instant::now();
    let mut due: HashMap<(Arc<str>, Arc<str>, ListSource), Instant> = limiter
        .lists()
        .with_urls()
        .into_iter()
        .filter(|(domain, name, _)| limiter.lists().fetched(domain, name).is_some())
        .map(|list| {
            let next = start + list.2.refresh;
            (list, next)
        })
        .collect();
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = Instant::now();
        let lists = limiter.lists().with_urls();
        due.retain(|list, _| lists.contains(list));
        if lists.is_empty() {
            continue;
        }
        let client = match &client {
            Some(c) => c,
            None => match self::client() {
                Ok(c) => client.insert(c),
                Err(e) => {
                    tracing::error!(error = %e, "lists with a URL cannot be fetched");
                    continue;
                }
            },
        };
        for list in lists {
            let (domain, name, source) = &list;
            let next = *due.entry(list.clone()).or_insert(now);
            if next > now {
                continue;
            }
            let retry_after = match fetch(client, &source.url).await {
                Ok(values) => {
                    tracing::info!(domain = %domain, list = %name, url = %source.url, entries = values.len(), "list fetched");
                    limiter.lists().set_fetched(domain, name, Arc::new(values));
                    source.refresh
                }
                Err(why) => {
                    tracing::warn!(domain = %domain, list = %name, error = %why, "list fetch failed; the last values stay");
                    limiter.lists().fetch_failed(domain, name, why);
                    source.refresh.min(RETRY)
                }
            };
            due.insert(list, Instant::now() + retry_after);
        }
    }
}
