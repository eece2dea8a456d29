//! The gRPC face: Envoy's `RateLimitService` and `sluice.v1.RateLimiter`, both thin conversions between protobuf
//! messages and the decision core's types (through [`crate::faces::wire`]); the core's errors become statuses in
//! [`crate::faces::errors`].

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::faces::auth::authorize_call;
use crate::faces::errors::to_status;
use crate::faces::headers::ResponseHeaders;
use crate::faces::wire::{check_request_bytes, to_core, to_response, unit};
use crate::limiter::{self, Limiter, QueuedWork, Report};
use crate::proto::envoy::service::ratelimit::v3 as rls;
use crate::proto::sluice::v1 as sluice;
use crate::store::{Announcements, Counters, Span, Store};

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

    /// Checks the admin token in the call's metadata; `rpc` names the call in errors.
    fn authorize<T>(&self, request: &Request<T>, rpc: &str) -> Result<(), Status> {
        authorize_call(self.admin_token.as_deref(), request.metadata(), rpc)
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
        let reports = self
            .limiter
            .decisions()
            .get_remaining(&core, cost)
            .await
            .map_err(to_status)?;
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
            .decisions()
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
        let decision = self.limiter.budgets().check(&core, &costs).await.map_err(to_status)?;
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
            .decisions()
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
        let decision = self.limiter.budgets().report(&core, &costs).await.map_err(to_status)?;
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
        let reserved = self
            .limiter
            .budgets()
            .reserve(&core, &costs, ttl_us)
            .await
            .map_err(to_status)?;
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
            .budgets()
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
        let report = self.limiter.decisions().reset(&core, queued).await.map_err(to_status)?;
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
        check_size(&self.limiter, &request)?;
        let ttl_us = bounded_us(
            "ttl",
            request.ttl.as_ref(),
            MAX_LIST_TTL_US,
            "the longest a list entry may stay",
        )?;
        let changed = self
            .limiter
            .lists()
            .add_entries(&request.domain, &request.list, &request.values, Some(ttl_us))
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
        check_size(&self.limiter, &request)?;
        let changed = self
            .limiter
            .lists()
            .remove_entries(&request.domain, &request.list, &request.values)
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
        check_size(&self.limiter, &request)?;
        let entries = self
            .limiter
            .lists()
            .entries(&request.domain, &request.list)
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
        check_size(&self.limiter, &request)?;
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
            .tallies()
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
    let decision = limiter.decisions().should_rate_limit(&core).await.map_err(to_status)?;
    Ok(Response::new(to_response(decision, headers)))
}

/// Refuses a request whose encoding is over `--max-request-bytes`.
fn check_size<S: Counters + Announcements, M: prost::Message>(limiter: &Limiter<S>, request: &M) -> Result<(), Status> {
    check_request_bytes(limiter, request.encoded_len()).map_err(to_status)
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
