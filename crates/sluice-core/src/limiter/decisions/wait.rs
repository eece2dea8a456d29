//! Waiting for a permit: [`Decisions::wait_for_permit`] holds a call until its hit would pass or its longest wait
//! runs out, then answers as ShouldRateLimit does, with how long it waited.
//!
//! The wait is the exact one the statuses already carry (an over-limit status's `reset_after_us` is the time until
//! the same hit would pass), taken on the limiter's clock, so a test drives it with a manual clock. A waiter checks
//! before it counts (a check consumes nothing) and counts only once the check passes, so a caller that gives up while
//! waiting has consumed nothing. Waiters of one request (the same domain and descriptors) are served in the order
//! they arrived on this instance: each takes its turn through a fair lock per request. At most
//! [`LimiterSettings::max_waiters`](crate::limiter::LimiterSettings) calls wait at once on an instance; past it a
//! call is refused at once ([`LimitError::Busy`]).

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use super::Decisions;
use crate::limiter::decide::How;
use crate::limiter::decision::{Code, Decision, LimitError, Report};
use crate::limiter::request::{Costs, Request};
use crate::store::{Announcements, Counters};

/// What [`Decisions::wait_for_permit`] answered.
#[derive(Debug, Clone, PartialEq)]
pub struct Waited {
    /// ShouldRateLimit's answer once the hit passed; the last check's when the wait ran out or could never end.
    pub decision: Decision,
    /// How long the call waited, by the limiter's clock.
    pub waited_us: u64,
}

/// The calls waiting on one instance.
pub(crate) struct Waiters {
    slots: tokio::sync::Semaphore,
    max: usize,
    /// One fair lock per request waited on, while anyone waits on it.
    turns: std::sync::Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>,
}

impl Waiters {
    pub(crate) fn new(max: usize) -> Waiters {
        Waiters {
            slots: tokio::sync::Semaphore::new(max),
            max,
            turns: std::sync::Mutex::default(),
        }
    }

    /// The fair lock of the request named `name`, made when nobody holds it.
    fn turn(&self, name: String) -> Arc<tokio::sync::Mutex<()>> {
        let mut turns = self.turns.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(turn) = turns.get(&name).and_then(Weak::upgrade) {
            return turn;
        }
        // Drop the locks nobody holds any more, so the map stays as large as the requests waited on.
        turns.retain(|_, t| t.strong_count() > 0);
        let turn = Arc::new(tokio::sync::Mutex::new(()));
        turns.insert(name, Arc::downgrade(&turn));
        turn
    }
}

/// The name of a request's turn: its domain and descriptors, each part length-prefixed so no two requests share it.
fn turn_name(request: &Request) -> String {
    let mut name = String::new();
    let mut push = |s: &str| {
        name.push_str(&s.len().to_string());
        name.push(':');
        name.push_str(s);
    };
    push(&request.domain);
    for d in &request.descriptors {
        push("|");
        for (k, v) in &d.entries {
            push(k);
            push(v);
        }
        if let Some(cost) = d.hits_addend {
            push(&cost.to_string());
        }
    }
    name
}

impl<S: Counters + Announcements> Decisions<S> {
    /// Waits until the request's hit would pass, at most `max_wait_us`, then decides it as
    /// [`Decisions::should_rate_limit`] does. Answers the last check (OVER_LIMIT, nothing consumed) when the wait would
    /// run past `max_wait_us` or can never end (a cost that never fits, a deny list); refuses the call with
    /// [`LimitError::Busy`] when as many calls as allowed wait already.
    pub async fn wait_for_permit(&self, request: &Request, max_wait_us: u64) -> Result<Waited, LimitError> {
        let _slot = self.waiters.slots.try_acquire().map_err(|_| {
            LimitError::Busy(format!(
                "{} calls wait for a permit already on this instance",
                self.waiters.max
            ))
        })?;
        let start = self.core.clock.now_us();
        let costs = Costs {
            cost: u64::from(request.hits_addend.max(1)),
            named: Vec::new(),
        };
        let turn = self.waiters.turn(turn_name(request));
        // Behind earlier waiters of the same request, at most until this call's own wait runs out; then it is
        // answered once, as a call that does not wait (counted if it fits, nothing consumed if not).
        let mut out_of_turn = false;
        let _turn = tokio::select! {
            held = turn.lock() => Some(held),
            () = self.core.clock.sleep_until(start.saturating_add(max_wait_us)) => {
                out_of_turn = true;
                None
            }
        };
        loop {
            let mut answer = self.core.decide(request, How::Check(&costs)).await?;
            if answer.overall == Code::Ok {
                let decision = self.core.decide(request, How::Decide).await?;
                if decision.overall == Code::Ok || out_of_turn {
                    let waited_us = self.core.clock.now_us().saturating_sub(start);
                    return Ok(Waited { decision, waited_us });
                }
                // Another caller took the room between the check and the hit: wait as its answer says.
                answer = decision;
            }
            let waited_us = self.core.clock.now_us().saturating_sub(start);
            let wait = if out_of_turn {
                None
            } else {
                self.wait_us(request, &answer, costs.cost).await?
            };
            match wait {
                Some(wait) if waited_us.saturating_add(wait) <= max_wait_us => {
                    self.core
                        .clock
                        .sleep_until(self.core.clock.now_us().saturating_add(wait))
                        .await;
                }
                _ => {
                    return Ok(Waited {
                        decision: answer,
                        waited_us,
                    });
                }
            }
        }
    }

    /// How long until the request's hit would pass, after a check that refused it: the longest wait of its limits
    /// (GetRemaining's exact retry time, at least a millisecond, so a wait never spins); `None` when it never will (a
    /// deny list refused it, or a cost no limit can ever fit).
    async fn wait_us(&self, request: &Request, check: &Decision, cost: u64) -> Result<Option<u64>, LimitError> {
        // A descriptor a deny list refused has no limit to wait for.
        if check
            .statuses
            .iter()
            .any(|s| s.code == Code::OverLimit && s.limit.is_none())
        {
            return Ok(None);
        }
        let mut longest = 0;
        for report in self.get_remaining(request, cost).await? {
            if let Report::Limited { retry_after_us, .. } = report {
                let Some(retry) = retry_after_us else {
                    return Ok(None);
                };
                longest = longest.max(retry);
            }
        }
        Ok(Some(longest.max(1_000)))
    }
}
