//! The gRPC face: Envoy's `RateLimitService` and `sluice.v1.RateLimiter`, both thin conversions between protobuf
//! messages and the decision core's types. Errors become gRPC statuses here and nowhere else.

use std::sync::Arc;

use prost_types::{ListValue, Struct, Value, value::Kind};
use tonic::{Request, Response, Status};

use crate::faces::headers::ResponseHeaders;
use crate::limiter::{self, AppliedLimit, Cap, Code, Decision, LimitError, Limiter, QueuedWork, Report};
use crate::proto::envoy::config::core::v3::HeaderValue;
use crate::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use crate::proto::envoy::service::ratelimit::v3 as rls;
use crate::proto::sluice::v1 as sluice;
use crate::rules::{Metadata, Unit};
use crate::store::{Span, Store, StoreError};

use rls::rate_limit_response::{Code as PbCode, DescriptorStatus, RateLimit, rate_limit::Unit as PbUnit};

/// `envoy.service.ratelimit.v3.RateLimitService`.
pub struct EnvoyService<S> {
    limiter: Arc<Limiter<S>>,
    /// Rate limit headers added to each response.
    headers: ResponseHeaders,
}

/// `sluice.v1.RateLimiter`.
pub struct SluiceService<S> {
    limiter: Arc<Limiter<S>>,
    headers: ResponseHeaders,
    /// `Reset` is refused unless set, and then needs `authorization: Bearer <token>`.
    admin_token: Option<Arc<str>>,
}

impl<S> EnvoyService<S> {
    pub fn new(limiter: Arc<Limiter<S>>, headers: ResponseHeaders) -> Self {
        EnvoyService { limiter, headers }
    }
}

impl<S> SluiceService<S> {
    pub fn new(limiter: Arc<Limiter<S>>, headers: ResponseHeaders, admin_token: Option<Arc<str>>) -> Self {
        SluiceService {
            limiter,
            headers,
            admin_token,
        }
    }

    /// Checks the admin token in the call's metadata, comparing in constant time; `rpc` names the call in errors.
    fn authorize<T>(&self, request: &Request<T>, rpc: &str) -> Result<(), Status> {
        let Some(token) = &self.admin_token else {
            return Err(Status::permission_denied(format!(
                "{rpc} is disabled: the server has no admin token"
            )));
        };
        let given = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default();
        if same_token(given, token) {
            Ok(())
        } else {
            Err(Status::unauthenticated(format!(
                "{rpc} needs the admin token as 'authorization: Bearer <token>'"
            )))
        }
    }
}

#[tonic::async_trait]
impl<S: Store> rls::rate_limit_service_server::RateLimitService for EnvoyService<S> {
    #[tracing::instrument(level = "debug", name = "envoy.ShouldRateLimit", skip_all, fields(domain = %request.get_ref().domain))]
    async fn should_rate_limit(
        &self,
        request: Request<rls::RateLimitRequest>,
    ) -> Result<Response<rls::RateLimitResponse>, Status> {
        should_rate_limit(&self.limiter, &self.headers, request.into_inner()).await
    }
}

#[tonic::async_trait]
impl<S: Store> sluice::rate_limiter_server::RateLimiter for SluiceService<S> {
    #[tracing::instrument(level = "debug", name = "sluice.ShouldRateLimit", skip_all, fields(domain = %request.get_ref().domain))]
    async fn should_rate_limit(
        &self,
        request: Request<rls::RateLimitRequest>,
    ) -> Result<Response<rls::RateLimitResponse>, Status> {
        should_rate_limit(&self.limiter, &self.headers, request.into_inner()).await
    }

    #[tracing::instrument(level = "debug", name = "sluice.GetRemaining", skip_all, fields(domain = %request.get_ref().domain))]
    async fn get_remaining(
        &self,
        request: Request<sluice::GetRemainingRequest>,
    ) -> Result<Response<sluice::GetRemainingResponse>, Status> {
        let request = request.into_inner();
        check_size(&self.limiter, &request)?;
        let cost = request.cost.unwrap_or(1);
        let core = to_core(request.domain, request.descriptors, 0);
        let reports = self.limiter.get_remaining(&core, cost).await.map_err(to_status)?;
        Ok(Response::new(sluice::GetRemainingResponse {
            descriptors: reports.into_iter().map(to_remaining).collect(),
        }))
    }

    #[tracing::instrument(level = "debug", name = "sluice.Release", skip_all, fields(domain = %request.get_ref().domain))]
    async fn release(
        &self,
        request: Request<sluice::ReleaseRequest>,
    ) -> Result<Response<sluice::ReleaseResponse>, Status> {
        let request = request.into_inner();
        check_size(&self.limiter, &request)?;
        let core = to_core(request.domain, request.descriptors, 0);
        let released = self
            .limiter
            .release(&core, &request.lease_id)
            .await
            .map_err(to_status)?;
        Ok(Response::new(sluice::ReleaseResponse {
            released: u32::try_from(released).unwrap_or(u32::MAX),
        }))
    }

    #[tracing::instrument(level = "debug", name = "sluice.Check", skip_all, fields(domain = %request.get_ref().domain))]
    async fn check(&self, request: Request<sluice::CostRequest>) -> Result<Response<rls::RateLimitResponse>, Status> {
        let request = request.into_inner();
        check_size(&self.limiter, &request)?;
        let (core, costs) = cost_request(request);
        let decision = self.limiter.check(&core, &costs).await.map_err(to_status)?;
        Ok(Response::new(to_response(decision, &self.headers)))
    }

    #[tracing::instrument(level = "debug", name = "sluice.WaitForPermit", skip_all, fields(domain = %request.get_ref().domain))]
    async fn wait_for_permit(
        &self,
        request: Request<sluice::WaitForPermitRequest>,
    ) -> Result<Response<sluice::WaitForPermitResponse>, Status> {
        let request = request.into_inner();
        check_size(&self.limiter, &request)?;
        let max_wait_us = max_wait_us(request.max_wait.as_ref())?;
        let core = to_core(request.domain, request.descriptors, request.hits_addend);
        let waited = self
            .limiter
            .wait_for_permit(&core, max_wait_us)
            .await
            .map_err(to_status)?;
        Ok(Response::new(sluice::WaitForPermitResponse {
            decision: Some(to_response(waited.decision, &self.headers)),
            waited: Some(exact(waited.waited_us)),
        }))
    }

    #[tracing::instrument(level = "debug", name = "sluice.Report", skip_all, fields(domain = %request.get_ref().domain))]
    async fn report(&self, request: Request<sluice::CostRequest>) -> Result<Response<rls::RateLimitResponse>, Status> {
        let request = request.into_inner();
        check_size(&self.limiter, &request)?;
        let (core, costs) = cost_request(request);
        let decision = self.limiter.report(&core, &costs).await.map_err(to_status)?;
        Ok(Response::new(to_response(decision, &self.headers)))
    }

    #[tracing::instrument(level = "debug", name = "sluice.Reserve", skip_all, fields(domain = %request.get_ref().domain))]
    async fn reserve(
        &self,
        request: Request<sluice::ReserveRequest>,
    ) -> Result<Response<sluice::ReserveResponse>, Status> {
        let request = request.into_inner();
        check_size(&self.limiter, &request)?;
        let ttl_us = match request.ttl {
            None => DEFAULT_RESERVATION_TTL_US,
            Some(d) if d.seconds < 0 || d.nanos < 0 => {
                return Err(Status::invalid_argument("ttl is negative"));
            }
            Some(d) => (d.seconds as u64)
                .saturating_mul(1_000_000)
                .saturating_add(d.nanos as u64 / 1_000),
        };
        let costs = limiter::Costs {
            cost: request.estimate.unwrap_or(1),
            named: request.estimates.into_iter().collect(),
        };
        let core = to_core(request.domain, request.descriptors, 0);
        let reserved = self.limiter.reserve(&core, &costs, ttl_us).await.map_err(to_status)?;
        let response = to_response(reserved.decision, &ResponseHeaders::OFF);
        Ok(Response::new(sluice::ReserveResponse {
            overall_code: response.overall_code,
            statuses: response.statuses,
            reservation_id: reserved.id.unwrap_or_default(),
            ttl: Some(exact(reserved.ttl_us)),
        }))
    }

    #[tracing::instrument(level = "debug", name = "sluice.Settle", skip_all, fields(domain = %request.get_ref().domain))]
    async fn settle(
        &self,
        request: Request<sluice::SettleRequest>,
    ) -> Result<Response<sluice::SettleResponse>, Status> {
        let request = request.into_inner();
        check_size(&self.limiter, &request)?;
        let costs = limiter::Costs {
            cost: request.actual.unwrap_or(0),
            named: request.actuals.into_iter().collect(),
        };
        let core = to_core(request.domain, request.descriptors, 0);
        let settled = self
            .limiter
            .settle(&core, &request.reservation_id, &costs)
            .await
            .map_err(to_status)?;
        Ok(Response::new(match settled {
            None => sluice::SettleResponse::default(),
            Some(descriptors) => sluice::SettleResponse {
                settled: true,
                settlements: descriptors
                    .into_iter()
                    .map(|d| sluice::Settlement {
                        estimate: d.estimate,
                        actual: d.actual,
                        charged: d.charged,
                        refunded: d.refunded,
                    })
                    .collect(),
            },
        }))
    }

    #[tracing::instrument(level = "debug", name = "sluice.Reset", skip_all, fields(domain = %request.get_ref().domain))]
    async fn reset(&self, request: Request<sluice::ResetRequest>) -> Result<Response<sluice::ResetResponse>, Status> {
        self.authorize(&request, "Reset")?;
        let request = request.into_inner();
        check_size(&self.limiter, &request)?;
        let queued = if request.drop_queued_work {
            QueuedWork::Drop
        } else {
            QueuedWork::Keep
        };
        let core = to_core(request.domain, request.descriptors, 0);
        let report = self.limiter.reset(&core, queued).await.map_err(to_status)?;
        tracing::info!(domain = %core.domain, deleted = report.deleted, kept_streams = report.kept_streams.len(), "reset");
        Ok(Response::new(sluice::ResetResponse {
            deleted: u32::try_from(report.deleted).unwrap_or(u32::MAX),
            kept_streams: report.kept_streams,
        }))
    }

    #[tracing::instrument(level = "debug", name = "sluice.AddListEntries", skip_all, fields(domain = %request.get_ref().domain, list = %request.get_ref().list))]
    async fn add_list_entries(
        &self,
        request: Request<sluice::ListEntriesRequest>,
    ) -> Result<Response<sluice::ListEntriesResponse>, Status> {
        self.authorize(&request, "AddListEntries")?;
        let request = request.into_inner();
        let ttl_us = bounded_us(
            "ttl",
            request.ttl.as_ref(),
            MAX_LIST_TTL_US,
            "the longest a list entry may stay",
        )?;
        let changed = self
            .limiter
            .add_list_entries(&request.domain, &request.list, &request.values, Some(ttl_us))
            .await
            .map_err(to_status)?;
        tracing::info!(domain = %request.domain, list = %request.list, values = request.values.len(), added = changed, ttl_us, "list entries added");
        Ok(Response::new(sluice::ListEntriesResponse {
            changed: u32::try_from(changed).unwrap_or(u32::MAX),
        }))
    }

    #[tracing::instrument(level = "debug", name = "sluice.RemoveListEntries", skip_all, fields(domain = %request.get_ref().domain, list = %request.get_ref().list))]
    async fn remove_list_entries(
        &self,
        request: Request<sluice::ListEntriesRequest>,
    ) -> Result<Response<sluice::ListEntriesResponse>, Status> {
        self.authorize(&request, "RemoveListEntries")?;
        let request = request.into_inner();
        let changed = self
            .limiter
            .remove_list_entries(&request.domain, &request.list, &request.values)
            .await
            .map_err(to_status)?;
        tracing::info!(domain = %request.domain, list = %request.list, values = request.values.len(), removed = changed, "list entries removed");
        Ok(Response::new(sluice::ListEntriesResponse {
            changed: u32::try_from(changed).unwrap_or(u32::MAX),
        }))
    }

    #[tracing::instrument(level = "debug", name = "sluice.GetListEntries", skip_all, fields(domain = %request.get_ref().domain, list = %request.get_ref().list))]
    async fn get_list_entries(
        &self,
        request: Request<sluice::GetListEntriesRequest>,
    ) -> Result<Response<sluice::GetListEntriesResponse>, Status> {
        self.authorize(&request, "GetListEntries")?;
        let request = request.into_inner();
        let entries = self
            .limiter
            .list_entries(&request.domain, &request.list)
            .await
            .map_err(to_status)?;
        let now_us = self.limiter.now_us();
        Ok(Response::new(sluice::GetListEntriesResponse {
            entries: entries
                .into_iter()
                .map(|e| sluice::ListEntry {
                    value: e.value,
                    expires_in: e.expires_us.map(|t| exact(t.saturating_sub(now_us))),
                })
                .collect(),
        }))
    }

    #[tracing::instrument(level = "debug", name = "sluice.GetTopOffenders", skip_all, fields(domain = %request.get_ref().domain))]
    async fn get_top_offenders(
        &self,
        request: Request<sluice::GetTopOffendersRequest>,
    ) -> Result<Response<sluice::GetTopOffendersResponse>, Status> {
        use sluice::get_top_offenders_request::Span as PbSpan;
        self.authorize(&request, "GetTopOffenders")?;
        let request = request.into_inner();
        let span = match PbSpan::try_from(request.span) {
            Ok(PbSpan::Minute) => Span::Minute,
            Ok(PbSpan::Hour) => Span::Hour,
            Err(_) => {
                return Err(Status::invalid_argument(format!(
                    "span: unknown value {}",
                    request.span
                )));
            }
        };
        let limit = match request.limit {
            0 => 10,
            n if n > MAX_TOP_LIMIT => {
                return Err(Status::invalid_argument(format!(
                    "limit is {n}, over the most answered ({MAX_TOP_LIMIT})"
                )));
            }
            n => n,
        };
        let rules = self
            .limiter
            .top_offenders(&request.domain, span, limit as usize)
            .await
            .map_err(to_status)?;
        let offenders = |list: Vec<(String, u64)>| {
            list.into_iter()
                .map(|(value, count)| sluice::Offender { value, count })
                .collect()
        };
        Ok(Response::new(sluice::GetTopOffendersResponse {
            rules: rules
                .into_iter()
                .map(|r| sluice::RuleOffenders {
                    rule: r.rule,
                    hits: offenders(r.hits),
                    denied: offenders(r.denied),
                })
                .collect(),
        }))
    }
}

/// Whether `given` is the admin `token`, compared in constant time.
pub fn same_token(given: &str, token: &str) -> bool {
    given.len() == token.len() && given.bytes().zip(token.bytes()).fold(0, |acc, (a, b)| acc | (a ^ b)) == 0
}

/// How long a reservation holds when the request does not say: five minutes.
pub const DEFAULT_RESERVATION_TTL_US: u64 = 300_000_000;

/// A cost-budget request in the core's types: the request (its descriptors' own `hits_addend` kept) and its costs.
fn cost_request(request: sluice::CostRequest) -> (limiter::Request, limiter::Costs) {
    let costs = limiter::Costs {
        cost: request.cost.unwrap_or(1),
        named: request.costs.into_iter().collect(),
    };
    (to_core(request.domain, request.descriptors, 0), costs)
}

async fn should_rate_limit<S: Store>(
    limiter: &Limiter<S>,
    headers: &ResponseHeaders,
    request: rls::RateLimitRequest,
) -> Result<Response<rls::RateLimitResponse>, Status> {
    check_size(limiter, &request)?;
    let core = to_core(request.domain, request.descriptors, request.hits_addend);
    let decision = limiter.should_rate_limit(&core).await.map_err(to_status)?;
    Ok(Response::new(to_response(decision, headers)))
}

/// Refuses a request whose encoding is over `--max-request-bytes`.
fn check_size<S: Store, M: prost::Message>(limiter: &Limiter<S>, request: &M) -> Result<(), Status> {
    check_request_bytes(limiter, request.encoded_len()).map_err(to_status)
}

/// The byte cap every face applies to a request (`--max-request-bytes`): gRPC to the encoded message, the JSON API to
/// the body. A request over it is counted as invalid and refused, naming the cap.
pub fn check_request_bytes<S: Store>(limiter: &Limiter<S>, len: usize) -> Result<(), LimitError> {
    let cap = limiter.settings().caps.max_request_bytes;
    if len > cap {
        limiter.metrics().invalid_request("any");
        return Err(LimitError::OverCap {
            cap: Cap::RequestBytes,
            message: format!("request is {len} bytes, over the cap of {cap}"),
        });
    }
    Ok(())
}

/// An over-cap message naming the flag that sets the cap.
pub fn over_cap(cap: Cap, message: &str) -> String {
    let flag = match cap {
        Cap::Descriptors => "--max-descriptors",
        Cap::Entries => "--max-entries",
        Cap::ValueBytes => "--max-value-bytes",
        Cap::RequestBytes => "--max-request-bytes",
    };
    format!("{message} ({flag})")
}

/// The one place where errors become gRPC statuses. Store details stay in the logs.
pub fn to_status(error: LimitError) -> Status {
    match error {
        LimitError::InvalidArgument(message) => Status::invalid_argument(message),
        LimitError::OverCap { cap, message } => Status::invalid_argument(over_cap(cap, &message)),
        LimitError::Store(StoreError::Timeout(after)) => {
            Status::unavailable(format!("rate limit store timed out after {after:?}"))
        }
        LimitError::Store(_) => Status::unavailable("rate limit store unavailable"),
        LimitError::Busy(message) => Status::resource_exhausted(message),
        LimitError::NotFound(message) => Status::not_found(message),
    }
}

/// Moves the request's strings into the core's types without copying them.
pub fn to_core(domain: String, descriptors: Vec<RateLimitDescriptor>, hits_addend: u32) -> limiter::Request {
    limiter::Request {
        domain,
        hits_addend,
        descriptors: descriptors
            .into_iter()
            .map(|d| limiter::Descriptor {
                entries: d.entries.into_iter().map(|e| (e.key, e.value)).collect(),
                limit_override: d.limit.map(|o| limiter::Override {
                    requests_per_unit: o.requests_per_unit,
                    unit: o.unit,
                }),
                hits_addend: d.hits_addend,
            })
            .collect(),
    }
}

/// The protobuf response for a decision, with the rate limit headers `headers` asks for.
pub fn to_response(decision: Decision, headers: &ResponseHeaders) -> rls::RateLimitResponse {
    let dynamic_metadata = dynamic_metadata(&decision);
    let response_headers_to_add = crate::faces::headers::for_decision(headers, &decision)
        .into_iter()
        .map(|(key, value)| HeaderValue {
            key: key.to_string(),
            value,
            raw_value: Vec::new(),
        })
        .collect();
    rls::RateLimitResponse {
        overall_code: code(decision.overall) as i32,
        statuses: decision
            .statuses
            .into_iter()
            .map(|s| DescriptorStatus {
                code: code(s.code) as i32,
                current_limit: s.limit.map(current_limit),
                limit_remaining: s.remaining,
                duration_until_reset: s.reset_after_us.map(whole_seconds),
                quota: None,
            })
            .collect(),
        dynamic_metadata,
        response_headers_to_add,
        ..Default::default()
    }
}

/// The response's `dynamic_metadata`: the passing rules' `metadata` (when switched on), and under `sluice` what the
/// caller needs to hand back or to find its work: `lease_id` for `Release`, and `queued` entries
/// (`{descriptor, stream, entry_id}`) appended to `queue` limits.
fn dynamic_metadata(decision: &Decision) -> Option<Struct> {
    let mut merged = merge_metadata(&decision.metadata);
    if decision.lease.is_none() && decision.queued.is_empty() {
        return merged;
    }
    let text = |s: &str| Value {
        kind: Some(Kind::StringValue(s.to_string())),
    };
    let mut fields = std::collections::BTreeMap::new();
    if let Some(lease) = &decision.lease {
        fields.insert("lease_id".to_string(), text(lease));
    }
    if !decision.queued.is_empty() {
        let entries = decision
            .queued
            .iter()
            .map(|q| Value {
                kind: Some(Kind::StructValue(Struct {
                    fields: [
                        (
                            "descriptor".to_string(),
                            Value {
                                kind: Some(Kind::NumberValue(q.descriptor as f64)),
                            },
                        ),
                        ("stream".to_string(), text(&q.stream)),
                        ("entry_id".to_string(), text(&q.entry_id)),
                    ]
                    .into_iter()
                    .collect(),
                })),
            })
            .collect();
        fields.insert(
            "queued".to_string(),
            Value {
                kind: Some(Kind::ListValue(ListValue { values: entries })),
            },
        );
    }
    let sluice = Value {
        kind: Some(Kind::StructValue(Struct { fields })),
    };
    merged
        .get_or_insert_with(Struct::default)
        .fields
        .insert("sluice".to_string(), sluice);
    merged
}

fn code(code: Code) -> PbCode {
    match code {
        Code::Ok => PbCode::Ok,
        Code::OverLimit => PbCode::OverLimit,
    }
}

fn unit(unit: Unit) -> PbUnit {
    match unit {
        Unit::Second => PbUnit::Second,
        Unit::Minute => PbUnit::Minute,
        Unit::Hour => PbUnit::Hour,
        Unit::Day => PbUnit::Day,
        Unit::Week => PbUnit::Week,
        Unit::Month => PbUnit::Month,
        Unit::Year => PbUnit::Year,
    }
}

fn current_limit(applied: AppliedLimit) -> RateLimit {
    RateLimit {
        name: applied.name.as_deref().unwrap_or_default().to_string(),
        requests_per_unit: applied.limit.requests,
        unit: unit(applied.limit.unit) as i32,
    }
}

/// Envoy's status reports whole seconds, rounded up, so a live window never reads as 0 (as the reference does).
fn whole_seconds(us: u64) -> prost_types::Duration {
    prost_types::Duration {
        seconds: us.div_ceil(1_000_000).max(1) as i64,
        nanos: 0,
    }
}

/// The longest a WaitForPermit call may wait.
const MAX_WAIT_US: u64 = 3_600_000_000;

/// A WaitForPermit's `max_wait` in microseconds: unset or zero is no wait; negative, malformed or over an hour is
/// refused, naming the field.
fn max_wait_us(max_wait: Option<&prost_types::Duration>) -> Result<u64, Status> {
    bounded_us("max_wait", max_wait, MAX_WAIT_US, "the most a call may wait")
}

/// The longest a list entry's TTL may be: a year.
const MAX_LIST_TTL_US: u64 = 365 * 86_400_000_000;

/// A duration field in microseconds: unset is 0; negative, malformed or over `max_us` is refused, naming `field`.
fn bounded_us(field: &str, d: Option<&prost_types::Duration>, max_us: u64, what: &str) -> Result<u64, Status> {
    let Some(d) = d else { return Ok(0) };
    if d.seconds < 0 || d.nanos < 0 || d.nanos >= 1_000_000_000 {
        return Err(Status::invalid_argument(format!(
            "{field} is negative or malformed ({}s, {}ns)",
            d.seconds, d.nanos
        )));
    }
    let us = (d.seconds as u64)
        .saturating_mul(1_000_000)
        .saturating_add(d.nanos as u64 / 1_000);
    if us > max_us {
        return Err(Status::invalid_argument(format!(
            "{field} is {}s, over {what} ({}s)",
            d.seconds,
            max_us / 1_000_000
        )));
    }
    Ok(us)
}

/// The most rules, and values per list, GetTopOffenders answers.
const MAX_TOP_LIMIT: u32 = 1_000;

fn exact(us: u64) -> prost_types::Duration {
    prost_types::Duration {
        seconds: (us / 1_000_000) as i64,
        nanos: ((us % 1_000_000) * 1_000) as i32,
    }
}

fn to_remaining(report: Report) -> sluice::DescriptorRemaining {
    match report {
        Report::NoRule => sluice::DescriptorRemaining::default(),
        Report::Unlimited => sluice::DescriptorRemaining {
            matched: true,
            unlimited: true,
            ..Default::default()
        },
        Report::Limited {
            limit,
            remaining,
            reset_after_us,
            retry_after_us,
            records,
        } => sluice::DescriptorRemaining {
            matched: true,
            unlimited: false,
            limit: Some(sluice::Limit {
                name: limit.name.as_deref().unwrap_or_default().to_string(),
                requests_per_unit: limit.limit.requests,
                unit: unit(limit.limit.unit) as i32,
                unit_multiplier: limit.limit.multiplier,
                algorithm: limit.limit.algorithm.name().to_string(),
                burst: limit.limit.capacity(),
            }),
            remaining,
            reset_after: Some(exact(reset_after_us)),
            retry_after: retry_after_us.map(exact),
            never: retry_after_us.is_none(),
            records,
        },
    }
}

/// Merges rule metadata maps into one `Struct`; a later rule's key wins.
fn merge_metadata(maps: &[Arc<Metadata>]) -> Option<Struct> {
    if maps.is_empty() {
        return None;
    }
    let mut merged = Struct::default();
    for map in maps {
        merged
            .fields
            .extend(map.iter().map(|(k, v)| (k.clone(), Value { kind: Some(kind(v)) })));
    }
    Some(merged)
}

fn kind(v: &serde_json::Value) -> Kind {
    use serde_json::Value as J;
    match v {
        J::Null => Kind::NullValue(0),
        J::Bool(b) => Kind::BoolValue(*b),
        J::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        J::String(s) => Kind::StringValue(s.clone()),
        J::Array(items) => Kind::ListValue(ListValue {
            values: items.iter().map(|i| Value { kind: Some(kind(i)) }).collect(),
        }),
        J::Object(map) => Kind::StructValue(Struct {
            fields: map
                .iter()
                .map(|(k, v)| (k.clone(), Value { kind: Some(kind(v)) }))
                .collect(),
        }),
    }
}
