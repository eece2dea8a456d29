//! Envoy's Rate Limit Quota Service on the gRPC port: `StreamRateLimitQuotas`, one task per stream.
//!
//! The task turns each usage report into the core's [`Report`] and its answer into one response, ticks about once a
//! second (and at once when another stream's report concerns one of its buckets) so that assignments are refreshed,
//! re-sent when a quota frees up, and idle buckets abandoned. A bad message ends the stream with INVALID_ARGUMENT
//! naming the field (or the cap, for a message over `--max-request-bytes`); a full server or stream with RESOURCE_EXHAUSTED. On shutdown every stream ends with
//! UNAVAILABLE: Envoys keep their assignments until the TTL lapses, then follow their expired-assignment behaviour,
//! and open a new stream to whichever instance answers.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

use crate::faces::errors::quota_status;
use crate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use crate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    self, AbandonAction, QuotaAssignmentAction,
};
use crate::proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaService;
use crate::proto::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use crate::proto::envoy::r#type::v3::{RateLimitStrategy, TokenBucket, rate_limit_strategy};
use crate::quota::{Action, Quotas, Report, ReportedUsage, Strategy};
use crate::store::Store;

/// How often each stream looks for due work when nothing else wakes it.
const TICK: Duration = Duration::from_micros(sluice_core::quota::TICK_US);

/// The RLQS gRPC service.
pub struct QuotaService<S> {
    quotas: Arc<Quotas<S>>,
    stop: watch::Receiver<bool>,
}

impl<S: Store> QuotaService<S> {
    /// Streams end when `stop` turns true.
    pub fn new(quotas: Arc<Quotas<S>>, stop: watch::Receiver<bool>) -> QuotaService<S> {
        QuotaService { quotas, stop }
    }
}

/// What woke a stream's task.
enum Event {
    Message(Result<Option<RateLimitQuotaUsageReports>, Status>),
    Tick,
    Stop,
}

#[tonic::async_trait]
impl<S: Store> RateLimitQuotaService for QuotaService<S> {
    type StreamRateLimitQuotasStream = ReceiverStream<Result<RateLimitQuotaResponse, Status>>;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Self::StreamRateLimitQuotasStream>, Status> {
        let mut stream = self.quotas.open().map_err(quota_status)?;
        let mut inbound = request.into_inner();
        let quotas = self.quotas.clone();
        let mut stop = self.stop.clone();
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(TICK);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let event = tokio::select! {
                    message = inbound.message() => Event::Message(message),
                    _ = ticker.tick() => Event::Tick,
                    () = stream.wake() => Event::Tick,
                    _ = stop.wait_for(|stop| *stop) => Event::Stop,
                };
                let answer = match event {
                    Event::Message(Ok(Some(message))) => {
                        let span = tracing::info_span!(
                            "rlqs.report",
                            domain = %message.domain,
                            buckets = message.bucket_quota_usages.len()
                        );
                        quotas.report(&mut stream, report(message)).instrument(span).await
                    }
                    // A message over --max-request-bytes, which the server refused to decode.
                    Event::Message(Err(e)) if e.code() == tonic::Code::OutOfRange => {
                        let message = format!("a usage report is over the cap (--max-request-bytes): {}", e.message());
                        let _ = tx.send(Err(Status::invalid_argument(message))).await;
                        break;
                    }
                    // The Envoy closed its side or cancelled, or the connection is gone: it left with its tokens.
                    Event::Message(Ok(None) | Err(_)) => {
                        quotas.leave(&mut stream).await;
                        break;
                    }
                    Event::Tick => quotas.tick(&mut stream).await,
                    Event::Stop => {
                        let _ = tx.send(Err(Status::unavailable("sluice is shutting down"))).await;
                        break;
                    }
                };
                let sent = match answer {
                    Ok(actions) if actions.is_empty() => Ok(()),
                    Ok(actions) => tx.send(Ok(response(actions))).await,
                    Err(e) => {
                        tracing::debug!(error = %e, "RLQS stream ended");
                        let _ = tx.send(Err(quota_status(e))).await;
                        break;
                    }
                };
                if sent.is_err() {
                    break;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

fn report(message: RateLimitQuotaUsageReports) -> Report {
    Report {
        domain: message.domain,
        usages: message
            .bucket_quota_usages
            .into_iter()
            .map(|usage| ReportedUsage {
                bucket: usage
                    .bucket_id
                    .map(|id| id.bucket.into_iter().collect())
                    .unwrap_or_default(),
                allowed: usage.num_requests_allowed,
                denied: usage.num_requests_denied,
            })
            .collect(),
    }
}

fn response(actions: Vec<Action>) -> RateLimitQuotaResponse {
    let mut bucket_action = Vec::with_capacity(actions.len());
    for action in actions {
        match action {
            Action::Assign {
                bucket,
                strategy,
                ttl_s,
                fresh,
            } => {
                if fresh {
                    // Envoy applies a message's actions in order and installs its buckets once, after the last: the
                    // DENY_ALL leaves no token bucket whose fill fraction the new one would start at, and no request
                    // ever sees it.
                    bucket_action.push(assignment(bucket.clone(), Strategy::DenyAll, ttl_s));
                }
                bucket_action.push(assignment(bucket, strategy, ttl_s));
            }
            Action::Abandon { bucket } => bucket_action.push(BucketAction {
                bucket_id: Some(bucket_id(bucket)),
                bucket_action: Some(bucket_action::BucketAction::AbandonAction(AbandonAction {})),
            }),
        }
    }
    RateLimitQuotaResponse { bucket_action }
}

fn assignment(bucket: Vec<(String, String)>, strategy: Strategy, ttl_s: u32) -> BucketAction {
    let strategy = match strategy {
        Strategy::AllowAll => {
            rate_limit_strategy::Strategy::BlanketRule(rate_limit_strategy::BlanketRule::AllowAll.into())
        }
        Strategy::DenyAll => {
            rate_limit_strategy::Strategy::BlanketRule(rate_limit_strategy::BlanketRule::DenyAll.into())
        }
        Strategy::TokenBucket {
            max_tokens,
            tokens_per_fill,
            fill_interval_s,
        } => rate_limit_strategy::Strategy::TokenBucket(TokenBucket {
            max_tokens,
            tokens_per_fill: Some(tokens_per_fill),
            fill_interval: Some(seconds(fill_interval_s)),
        }),
    };
    BucketAction {
        bucket_id: Some(bucket_id(bucket)),
        bucket_action: Some(bucket_action::BucketAction::QuotaAssignmentAction(
            QuotaAssignmentAction {
                assignment_time_to_live: Some(seconds(ttl_s)),
                rate_limit_strategy: Some(RateLimitStrategy {
                    strategy: Some(strategy),
                }),
            },
        )),
    }
}

fn bucket_id(entries: Vec<(String, String)>) -> BucketId {
    BucketId {
        bucket: entries.into_iter().collect(),
    }
}

fn seconds(s: u32) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::from(s),
        nanos: 0,
    }
}
