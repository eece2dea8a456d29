//! The load itself: request slots that send over shared connections, the check every answer must pass, and the
//! tallies the report is built from.
//!
//! One tokio task per slot keeps exactly `--concurrency` requests in flight at most. In a closed loop a slot sends
//! its next request when the previous answer arrives. At a fixed rate the global schedule is request `j` at
//! `j / rate` seconds: the pacer (`pace`) releases each request at its time and a free slot sends it; when no slot
//! is free, the request waits for one, and latency is counted from the scheduled time, so a slow answer shows up in
//! the latency of the requests that had to wait for it instead of silently lowering the rate (coordinated
//! omission).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hdrhistogram::Histogram;
use tokio::time::Instant;

use super::args::Api;
use super::keys::{Keys, SplitMix64};
use super::pace::Pacer;
use super::wire::Connection;
use crate::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use crate::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_response::Code as RlsCode;
use crate::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use crate::proto::sluice::v1::{GetRemainingRequest, GetRemainingResponse};

/// How late a request must be, when the run ends, to count as held up by the server rather than released a little
/// late by the pacer (which wakes tens of microseconds after a request's time): one still waiting for a slot this
/// long after its time at the deadline is never sent.
const HELD_UP: Duration = Duration::from_millis(1);

/// Latencies are recorded in microseconds, up to an hour (longer ones count as an hour).
const LATENCY_MAX_US: u64 = 3_600_000_000;

/// What every request carries, apart from the values drawn for it.
#[derive(Debug)]
pub(super) struct Shape {
    pub domain: String,
    /// Entries put before the drawn one in every descriptor, to reach nested rules.
    pub parent_entries: Vec<Entry>,
    pub descriptor_key: String,
    pub descriptors: usize,
    pub hits_addend: Option<u32>,
    pub keys: Keys,
}

impl Shape {
    /// The descriptors of one request, each with its own drawn value.
    fn descriptors(&self, rng: &mut SplitMix64) -> Vec<RateLimitDescriptor> {
        (0..self.descriptors)
            .map(|_| {
                let mut entries = Vec::with_capacity(self.parent_entries.len() + 1);
                entries.extend_from_slice(&self.parent_entries);
                entries.push(Entry {
                    key: self.descriptor_key.clone(),
                    value: self.keys.sample(rng).to_string(),
                });
                RateLimitDescriptor {
                    entries,
                    ..Default::default()
                }
            })
            .collect()
    }
}

/// When and how long the load runs.
#[derive(Debug)]
pub(super) struct Plan {
    pub start: Instant,
    /// Requests sent (or scheduled) before this are warm-up: sent and awaited, but not counted.
    pub measure_from: Instant,
    /// No request is sent after this.
    pub deadline: Instant,
    /// At a fixed rate: what releases the scheduled requests at their times; `None` for a closed loop.
    pub pacer: Option<Pacer>,
    pub timeout: Duration,
}

/// A client of the chosen RPC over one connection.
#[derive(Debug, Clone)]
pub(super) struct Client {
    api: Api,
    connection: Connection,
    /// The method's full URI: the target's scheme and authority, then `/package.Service/Method`.
    method: http::Uri,
}

impl Client {
    /// A client of `api` on `connection`; fails if `target` has no authority to call the method on.
    pub fn new(api: Api, connection: Connection, target: &http::Uri) -> Result<Client, http::Error> {
        let path = match api {
            Api::Envoy => "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            Api::Sluice => "/sluice.v1.RateLimiter/ShouldRateLimit",
            Api::Remaining => "/sluice.v1.RateLimiter/GetRemaining",
        };
        let mut parts = target.clone().into_parts();
        parts.path_and_query = Some(http::uri::PathAndQuery::from_static(path));
        let method = http::Uri::from_parts(parts)?;
        Ok(Client {
            api,
            connection,
            method,
        })
    }

    /// Sends one request and checks its answer.
    async fn send(
        &self,
        shape: &Shape,
        descriptors: Vec<RateLimitDescriptor>,
        timeout: Duration,
    ) -> Result<Answer, Failure> {
        let sent = descriptors.len();
        let domain = shape.domain.clone();
        let hits_addend = shape.hits_addend;
        let call = async {
            match self.api {
                Api::Envoy | Api::Sluice => {
                    let request = RateLimitRequest {
                        domain,
                        descriptors,
                        hits_addend: hits_addend.unwrap_or(0),
                    };
                    let answer: RateLimitResponse = self.connection.unary(&self.method, &request).await?;
                    Ok(check_decision(&answer, sent))
                }
                Api::Remaining => {
                    let request = GetRemainingRequest {
                        domain,
                        descriptors,
                        cost: hits_addend.map(u64::from),
                    };
                    let answer: GetRemainingResponse = self.connection.unary(&self.method, &request).await?;
                    Ok(check_remaining(&answer, sent))
                }
            }
        };
        match tokio::time::timeout(timeout, call).await {
            Ok(Ok(checked)) => checked.map_err(Failure::Check),
            Ok(Err(code)) => Err(Failure::Status(code)),
            Err(_elapsed) => Err(Failure::Status(tonic::Code::DeadlineExceeded)),
        }
    }
}

/// A well-formed answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Answer {
    Ok,
    /// ShouldRateLimit said OVER_LIMIT; GetRemaining said a hit would not be allowed now for some descriptor.
    OverLimit,
}

/// A request that got no well-formed answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Failure {
    /// The call failed with this gRPC status (or timed out: `DEADLINE_EXCEEDED`).
    Status(tonic::Code),
    /// The call succeeded but the answer is wrong.
    Check(CheckFailure),
}

/// How an answer can be wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckFailure {
    #[error("overall_code is {0}, expected OK (1) or OVER_LIMIT (2)")]
    OverallCode(i32),
    #[error("{got} statuses for {sent} descriptors")]
    StatusCount { got: usize, sent: usize },
    #[error("statuses[{index}].code is {code}, expected OK (1) or OVER_LIMIT (2)")]
    StatusCode { index: usize, code: i32 },
    #[error("overall_code is OVER_LIMIT but no status is")]
    OverLimitWithoutStatus,
    #[error("{got} GetRemaining entries for {sent} descriptors")]
    EntryCount { got: usize, sent: usize },
}

/// Checks a ShouldRateLimit answer: a known overall code, one known status per descriptor sent, and an
/// OVER_LIMIT overall code backed by at least one OVER_LIMIT status. (The converse need not hold: shadow mode
/// and quota rules answer OK over OVER_LIMIT statuses.)
pub(super) fn check_decision(response: &RateLimitResponse, sent: usize) -> Result<Answer, CheckFailure> {
    let overall = match RlsCode::try_from(response.overall_code) {
        Ok(RlsCode::Ok) => Answer::Ok,
        Ok(RlsCode::OverLimit) => Answer::OverLimit,
        _ => return Err(CheckFailure::OverallCode(response.overall_code)),
    };
    if response.statuses.len() != sent {
        return Err(CheckFailure::StatusCount {
            got: response.statuses.len(),
            sent,
        });
    }
    let mut any_over = false;
    for (index, status) in response.statuses.iter().enumerate() {
        match RlsCode::try_from(status.code) {
            Ok(RlsCode::Ok) => {}
            Ok(RlsCode::OverLimit) => any_over = true,
            _ => {
                return Err(CheckFailure::StatusCode {
                    index,
                    code: status.code,
                });
            }
        }
    }
    if overall == Answer::OverLimit && !any_over {
        return Err(CheckFailure::OverLimitWithoutStatus);
    }
    Ok(overall)
}

/// Checks a GetRemaining answer: one entry per descriptor sent. It counts as OVER_LIMIT when some descriptor
/// could not take a hit of the request's cost now (a non-zero `retry_after`, or `never`).
pub(super) fn check_remaining(response: &GetRemainingResponse, sent: usize) -> Result<Answer, CheckFailure> {
    if response.descriptors.len() != sent {
        return Err(CheckFailure::EntryCount {
            got: response.descriptors.len(),
            sent,
        });
    }
    let refused = response
        .descriptors
        .iter()
        .any(|d| d.never || d.retry_after.is_some_and(|r| r.seconds != 0 || r.nanos != 0));
    Ok(if refused { Answer::OverLimit } else { Answer::Ok })
}

/// The counts and latencies of the requests of one connection, shared by its slots. A slot holds the lock only
/// to add one result, never across an `.await`.
#[derive(Debug)]
pub(super) struct Tally {
    pub requests: u64,
    pub ok: u64,
    pub over_limit: u64,
    pub failed_checks: u64,
    pub first_failure: Option<CheckFailure>,
    /// Indexed by gRPC code.
    pub errors: [u64; 17],
    /// From the scheduled send time at a fixed rate, from the actual one in a closed loop.
    pub latency: Histogram<u64>,
    /// From the actual send time (kept apart only at a fixed rate).
    pub service_time: Histogram<u64>,
}

impl Tally {
    pub fn new() -> Tally {
        let histogram =
            || Histogram::new_with_bounds(1, LATENCY_MAX_US, 3).expect("constant histogram bounds are valid");
        Tally {
            requests: 0,
            ok: 0,
            over_limit: 0,
            failed_checks: 0,
            first_failure: None,
            errors: [0; 17],
            latency: histogram(),
            service_time: histogram(),
        }
    }

    fn record(&mut self, result: Result<Answer, Failure>, latency: Duration, service: Duration) {
        self.requests += 1;
        match result {
            Ok(Answer::Ok) => self.ok += 1,
            Ok(Answer::OverLimit) => self.over_limit += 1,
            Err(Failure::Check(failure)) => {
                self.failed_checks += 1;
                self.first_failure.get_or_insert(failure);
            }
            Err(Failure::Status(code)) => self.errors[code as usize] += 1,
        }
        self.latency.saturating_record(micros(latency));
        self.service_time.saturating_record(micros(service));
    }

    /// Adds another connection's tally to this one.
    pub fn merge(&mut self, other: &Tally) {
        self.requests += other.requests;
        self.ok += other.ok;
        self.over_limit += other.over_limit;
        self.failed_checks += other.failed_checks;
        if self.first_failure.is_none() {
            self.first_failure.clone_from(&other.first_failure);
        }
        for (mine, theirs) in self.errors.iter_mut().zip(other.errors) {
            *mine += theirs;
        }
        // Same bounds on both sides, so neither addition can fail.
        let _ = self.latency.add(&other.latency);
        let _ = self.service_time.add(&other.service_time);
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A poisoned tally only means a slot panicked between two integer updates; the counts are still usable.
pub(super) fn lock(tally: &Mutex<Tally>) -> MutexGuard<'_, Tally> {
    tally.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs request slot `slot` until the plan's deadline.
pub(super) async fn drive(slot: u64, client: Client, shape: Arc<Shape>, tally: Arc<Mutex<Tally>>, plan: Arc<Plan>) {
    let mut rng = SplitMix64::for_slot(slot);
    match &plan.pacer {
        None => loop {
            let descriptors = shape.descriptors(&mut rng);
            let sent = Instant::now();
            if sent >= plan.deadline {
                return;
            }
            let result = client.send(&shape, descriptors, plan.timeout).await;
            if sent >= plan.measure_from {
                let took = sent.elapsed();
                lock(&tally).record(result, took, took);
            }
        },
        Some(pacer) => {
            let first_measured = pacer.schedule().first_measured;
            while let Some((index, due)) = pacer.take().await {
                let descriptors = shape.descriptors(&mut rng);
                let sent = Instant::now();
                if sent >= plan.deadline && sent - due >= HELD_UP {
                    // Held up past the end by answers that came late: what is left was never sent; the report counts
                    // it from the schedule.
                    return;
                }
                let result = client.send(&shape, descriptors, plan.timeout).await;
                if index >= first_measured {
                    let done = Instant::now();
                    // The pacer never releases a request before its time, so `due` is never after `sent`.
                    lock(&tally).record(result, done - due, done - sent);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::envoy::service::ratelimit::v3::rate_limit_response::DescriptorStatus;
    use crate::proto::sluice::v1::DescriptorRemaining;

    fn decision(overall: RlsCode, statuses: &[RlsCode]) -> RateLimitResponse {
        RateLimitResponse {
            overall_code: overall as i32,
            statuses: statuses
                .iter()
                .map(|&c| DescriptorStatus {
                    code: c as i32,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn decisions_are_checked() {
        use RlsCode::{OverLimit, Unknown};
        let ok = RlsCode::Ok;
        assert_eq!(check_decision(&decision(ok, &[ok, ok]), 2), Ok(Answer::Ok));
        assert_eq!(
            check_decision(&decision(OverLimit, &[ok, OverLimit]), 2),
            Ok(Answer::OverLimit)
        );
        // Shadow mode: OK over an OVER_LIMIT status.
        assert_eq!(check_decision(&decision(ok, &[OverLimit]), 1), Ok(Answer::Ok));
        assert_eq!(
            check_decision(&decision(Unknown, &[ok]), 1),
            Err(CheckFailure::OverallCode(0))
        );
        assert_eq!(
            check_decision(&decision(ok, &[ok]), 3),
            Err(CheckFailure::StatusCount { got: 1, sent: 3 })
        );
        assert_eq!(
            check_decision(&decision(ok, &[ok, Unknown]), 2),
            Err(CheckFailure::StatusCode { index: 1, code: 0 })
        );
        assert_eq!(
            check_decision(&decision(OverLimit, &[ok]), 1),
            Err(CheckFailure::OverLimitWithoutStatus)
        );
    }

    #[test]
    fn remaining_answers_are_checked() {
        let wait = |seconds| DescriptorRemaining {
            matched: true,
            retry_after: Some(prost_types::Duration { seconds, nanos: 0 }),
            ..Default::default()
        };
        let response = |descriptors| GetRemainingResponse { descriptors };
        assert_eq!(
            check_remaining(&response(vec![wait(0), Default::default()]), 2),
            Ok(Answer::Ok)
        );
        assert_eq!(
            check_remaining(&response(vec![wait(0), wait(3)]), 2),
            Ok(Answer::OverLimit)
        );
        let never = DescriptorRemaining {
            matched: true,
            never: true,
            ..Default::default()
        };
        assert_eq!(check_remaining(&response(vec![never]), 1), Ok(Answer::OverLimit));
        assert_eq!(
            check_remaining(&response(vec![]), 1),
            Err(CheckFailure::EntryCount { got: 0, sent: 1 })
        );
    }

    #[test]
    fn tallies_count_every_result_and_merge() {
        let ms = Duration::from_millis;
        let mut a = Tally::new();
        a.record(Ok(Answer::Ok), ms(1), ms(1));
        a.record(Ok(Answer::OverLimit), ms(2), ms(1));
        a.record(Err(Failure::Status(tonic::Code::Unavailable)), ms(3), ms(3));
        let mut b = Tally::new();
        b.record(Err(Failure::Check(CheckFailure::OverallCode(7))), ms(4), ms(4));
        b.record(Err(Failure::Check(CheckFailure::OverallCode(8))), ms(5), ms(5));
        a.merge(&b);
        assert_eq!((a.requests, a.ok, a.over_limit, a.failed_checks), (5, 1, 1, 2));
        assert_eq!(a.errors[tonic::Code::Unavailable as usize], 1);
        assert_eq!(a.first_failure, Some(CheckFailure::OverallCode(7)));
        assert_eq!(a.latency.len(), 5);
        assert_eq!(a.latency.max(), a.latency.highest_equivalent(5_000));
    }
}
