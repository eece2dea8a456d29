//! Notices between the instances that share one Redis (or one cluster): each instance publishes on one channel,
//! [`CHANNEL`], and listens on a connection of its own, a fred subscriber. In a cluster a PUBLISH reaches the
//! subscribers of every node.
//!
//! What is published while an instance's subscription is down is never heard by it, so the instance does not trust
//! what the notices protect meanwhile: [`Notices::hearing`] is false from the moment the connection fails until it is
//! subscribed again, and then the listeners are told [`Notice::Missed`] (everything may have changed). A message is a
//! JSON array: `["freed", key…]`, `["quota", name…]`, `["streams", instance, count]`, or `["hello"]`, which an instance publishes when it starts and
//! nobody acts on (and `["lists", key…]`); one that does not parse is logged and ignored.
//!
//! Redis answers a SUBSCRIBE to a channel the user may not use with an error that the subscriber does not report, so
//! the instance tries the channel with that hello: refused (NOPERM), the instance does not trust the notices, and
//! says why. A PUBLISH refused later does the same. While refused it tries again every second, and once a hello goes
//! through (the user's ACL was mended) it subscribes again and trusts the notices from then on, no restart needed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::clients::{Pool, SubscriberClient};
use fred::interfaces::{ClientLike, EventInterface, PubsubInterface};
use fred::types::Value;
use fred::types::config::Config;
use tokio::sync::broadcast;

use super::super::{NOTICE_BACKLOG, Notice};
use super::StoreError;
use super::settings::builder;

/// The channel every instance publishes its notices on and listens to.
pub const CHANNEL: &str = "sluice:notices";

/// One instance's subscription, and the listeners it feeds.
#[derive(Clone)]
pub(super) struct Notices {
    tx: broadcast::Sender<Notice>,
    hearing: Arc<AtomicBool>,
    /// The user may not use the channel.
    refused: Arc<AtomicBool>,
    subscriber: SubscriberClient,
    /// Freed keys waiting for their notice ([`Notices::freed`]).
    outbox: Arc<Mutex<Outbox>>,
}

/// The most keys one notice of freed keys carries.
const MAX_FREED: usize = 1024;

/// The most freed keys that wait for a notice (a Redis that does not answer holds them up). Past it a key's notice is
/// dropped, as one that cannot be sent is: an instance whose subscription is down trusts none of its denials.
const MAX_WAITING: usize = 64 * MAX_FREED;

/// Freed keys waiting for their notice, and whether a task is sending them.
#[derive(Debug, Default)]
struct Outbox {
    keys: Vec<String>,
    sending: bool,
    /// Keys dropped since the outbox was last emptied (said once, when the first is dropped).
    dropped: usize,
}

impl Outbox {
    /// Adds `keys` (those past [`MAX_WAITING`] are dropped); true when no task is sending, and the caller must start
    /// one.
    fn add(&mut self, keys: Vec<String>) -> bool {
        let room = MAX_WAITING.saturating_sub(self.keys.len());
        if keys.len() > room {
            if self.dropped == 0 {
                tracing::warn!(
                    waiting = self.keys.len(),
                    "notices of freed counters are waiting on Redis; further ones are dropped until they go out"
                );
            }
            self.dropped += keys.len() - room;
        }
        self.keys.extend(keys.into_iter().take(room));
        !std::mem::replace(&mut self.sending, true)
    }

    /// The keys of the next notice, at most [`MAX_FREED`]; none once the outbox is empty, and then no task sends.
    fn next(&mut self) -> Vec<String> {
        if self.keys.is_empty() {
            self.sending = false;
            self.dropped = 0;
            return Vec::new();
        }
        let n = self.keys.len().min(MAX_FREED);
        self.keys.drain(..n).collect()
    }
}

impl Notices {
    /// Starts the subscriber: it connects, and subscribes again after every reconnection, in the background.
    pub(super) fn start(config: Config, timeout: Duration) -> Result<Notices, StoreError> {
        let subscriber = builder(config, timeout)
            .build_subscriber_client()
            .map_err(|e| StoreError::Other(e.details().to_string()))?;
        let notices = Notices {
            tx: broadcast::Sender::new(NOTICE_BACKLOG),
            hearing: Arc::new(AtomicBool::new(false)),
            refused: Arc::new(AtomicBool::new(false)),
            subscriber,
            outbox: Arc::default(),
        };
        let mut messages = notices.subscriber.message_rx();
        let tx = notices.tx.clone();
        tokio::spawn(async move {
            loop {
                match messages.recv().await {
                    Ok(message) if &*message.channel == CHANNEL => match decode(&message.value) {
                        Some(Some(notice)) => {
                            let _ = tx.send(notice);
                        }
                        Some(None) => {}
                        None => tracing::warn!(channel = CHANNEL, "a notice that does not parse was ignored"),
                    },
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        let _ = tx.send(Notice::Missed);
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                }
            }
        });
        let hearing = notices.hearing.clone();
        let mut errors = notices.subscriber.error_rx();
        tokio::spawn(async move {
            while errors.recv().await.is_ok() {
                hearing.store(false, Ordering::Release);
            }
        });
        // Every successful connection, the first included, is a reconnection to fred: subscribe on it, then say that
        // what was published before may have been missed, and only then trust the notices again.
        let mut connected = notices.subscriber.reconnect_rx();
        let this = notices.clone();
        tokio::spawn(async move {
            while connected.recv().await.is_ok() {
                this.hearing.store(false, Ordering::Release);
                match this.subscriber.subscribe(CHANNEL).await {
                    Ok(()) => {
                        let _ = this.tx.send(Notice::Missed);
                        this.hearing.store(true, Ordering::Release);
                    }
                    Err(e) => tracing::warn!(error = %e, "could not subscribe to notices; retrying on reconnection"),
                }
            }
        });
        notices.subscriber.connect();
        Ok(notices)
    }

    pub(super) fn hearing(&self) -> bool {
        self.hearing.load(Ordering::Acquire) && !self.refused.load(Ordering::Acquire)
    }

    /// The user may not use the channel: the notices are not trusted until a hello goes through ([`Notices::mend`]).
    pub(super) fn refuse(&self) {
        if !self.refused.swap(true, Ordering::AcqRel) {
            tracing::error!(
                channel = CHANNEL,
                "the Redis user may not use the notices channel (its ACL needs &{CHANNEL}): this instance neither \
                 tells the others nor hears them, and keeps nothing that notices would keep true"
            );
        }
    }

    pub(super) fn listen(&self) -> broadcast::Receiver<Notice> {
        self.tx.subscribe()
    }

    /// Publishes through `pool` that `keys` were freed. The keys freed while a notice is on its way go out together
    /// in the next one (at most [`MAX_FREED`] keys each), so that concurrent refunds cost one PUBLISH per round trip
    /// rather than one each. A task of its own sends them: a caller that gives up stops nothing.
    pub(super) fn freed(&self, pool: &Pool, keys: Vec<String>) {
        if !self.outbox.lock().unwrap_or_else(|e| e.into_inner()).add(keys) {
            return;
        }
        let (this, pool) = (self.clone(), pool.clone());
        tokio::spawn(async move {
            loop {
                let keys = this.outbox.lock().unwrap_or_else(|e| e.into_inner()).next();
                if keys.is_empty() {
                    break;
                }
                this.publish(&pool, &Notice::Freed(keys)).await;
            }
        });
    }

    /// Publishes `notice` through `pool`; a refusal means the user may not use the channel ([`Notices::refuse`]).
    pub(super) async fn publish(&self, pool: &Pool, notice: &Notice) {
        let sent: Result<Value, fred::error::Error> = pool.next().publish(CHANNEL, encode(notice)).await;
        match sent {
            Err(e) if refused(&e) => self.refuse(),
            Err(e) => tracing::warn!(error = %e, "a notice to the other instances could not be sent"),
            Ok(_) => {}
        }
    }
}

impl Notices {
    /// While the channel is refused, tries it every second with a hello through `pool`; once one goes through,
    /// subscribes again, says that notices may have been missed, and trusts them again.
    pub(super) fn mend(&self, pool: fred::clients::Pool) {
        let this = self.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(1));
            loop {
                every.tick().await;
                if !this.refused.load(Ordering::Acquire) {
                    continue;
                }
                let hello: Result<Value, fred::error::Error> = pool.next().publish(CHANNEL, HELLO).await;
                if hello.is_ok() && this.subscriber.subscribe(CHANNEL).await.is_ok() {
                    let _ = this.tx.send(Notice::Missed);
                    this.refused.store(false, Ordering::Release);
                    tracing::info!(
                        channel = CHANNEL,
                        "the notices channel is allowed again: notices are trusted"
                    );
                }
            }
        });
    }
}

/// The message an instance publishes when it starts, to try the channel.
pub(super) const HELLO: &str = "[\"hello\"]";

/// Whether a failed command was refused for want of permission.
pub(super) fn refused(error: &fred::error::Error) -> bool {
    error.details().contains("NOPERM")
}

/// The message that carries `notice`.
pub(super) fn encode(notice: &Notice) -> String {
    let count;
    let (kind, names): (&str, &[String]) = match notice {
        Notice::Streams(instance, n) => {
            count = [instance.clone(), n.to_string()];
            ("streams", &count)
        }
        Notice::Freed(keys) => ("freed", keys),
        Notice::Quota(names) => ("quota", names),
        Notice::Lists(names) => ("lists", names),
        Notice::Missed => ("missed", &[]),
    };
    let mut all = Vec::with_capacity(names.len() + 1);
    all.push(kind);
    all.extend(names.iter().map(String::as_str));
    serde_json::to_string(&all).unwrap_or_default()
}

/// The notice a message carries (`Some(None)`: a hello), or `None` when it does not parse.
fn decode(value: &Value) -> Option<Option<Notice>> {
    let text = value.as_str()?;
    let mut parts: Vec<String> = serde_json::from_str(&text).ok()?;
    if parts.is_empty() {
        return None;
    }
    let kind = parts.remove(0);
    match kind.as_str() {
        "freed" => Some(Some(Notice::Freed(parts))),
        "quota" => Some(Some(Notice::Quota(parts))),
        "lists" => Some(Some(Notice::Lists(parts))),
        "missed" => Some(Some(Notice::Missed)),
        "streams" => match &parts[..] {
            [instance, n] => Some(Some(Notice::Streams(instance.clone(), n.parse().ok()?))),
            _ => None,
        },
        "hello" => Some(None),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_keys_wait_for_one_sender_and_go_out_in_bounded_notices() {
        let keys = |from: usize, n: usize| (from..from + n).map(|i| i.to_string()).collect::<Vec<_>>();
        let mut outbox = Outbox::default();
        assert!(outbox.add(keys(0, 3)), "the first caller starts the sender");
        assert!(!outbox.add(keys(3, MAX_FREED)), "later ones join its next notice");
        assert_eq!(
            outbox.next(),
            keys(0, MAX_FREED),
            "at most MAX_FREED keys a notice, in order"
        );
        assert_eq!(outbox.next(), keys(MAX_FREED, 3));
        assert!(outbox.next().is_empty() && !outbox.sending, "empty: the sender stops");
        assert!(outbox.add(keys(0, 1)), "and the next caller starts another");
        // A Redis that does not answer: what waits is bounded, and drained as it goes out.
        outbox.add(keys(1, MAX_WAITING + 10));
        assert_eq!((outbox.keys.len(), outbox.dropped), (MAX_WAITING, 11));
        while !outbox.next().is_empty() {}
        assert_eq!((outbox.keys.len(), outbox.dropped, outbox.sending), (0, 0, false));
    }

    #[test]
    fn notices_travel_as_they_were_sent() {
        for notice in [
            Notice::Freed(vec!["a\n\"b\"".into(), "c".into()]),
            Notice::Quota(vec!["q".into()]),
            Notice::Lists(vec!["l".into()]),
            Notice::Streams("i".into(), 15),
            Notice::Missed,
        ] {
            assert_eq!(decode(&Value::from(encode(&notice))), Some(Some(notice)));
        }
        assert_eq!(decode(&Value::from(HELLO)), Some(None));
        assert_eq!(decode(&Value::from("not json")), None);
        assert_eq!(decode(&Value::from("[\"other\"]")), None);
    }
}
