//! Cost budgets: costs known only after the work is done (LLM tokens, bytes, compute units).
//!
//! - [`Budgets::check`] decides a cost without counting it;
//! - [`Budgets::report`] counts a cost that already happened, whatever the limits say (never refused);
//! - [`Budgets::reserve`] admits an estimated cost when every limit has room for it and holds it under a reservation
//!   id, so that concurrent calls can never together overspend; [`Budgets::settle`] replaces the estimate with the
//!   actual cost. An unsettled reservation expires and stays charged at its estimate, and
//!   [`Budgets::reap_expired`] counts it so in the cost metrics.
//!
//! Each limit counts the request's cost, or a named cost (`cost: input_tokens`), or a priced sum of named costs
//! (`price: {input_tokens: 3, output_tokens: 12}`): several limits of one descriptor, each counting its own cost,
//! are still decided together.

use std::sync::{Arc, Mutex, MutexGuard};

use super::core::Core;
use super::decide::How;
use super::request::{Costs, Descriptor, Request, validate};
use super::resolve::{Target, resolve};
use super::{Code, Decision, LimitError};
use crate::store::{Announcements, Counters, Reservations, Settled, Settlement, StoreError};

/// The cost-budget calls, over the store's [`Reservations`].
pub struct Budgets<S> {
    core: Arc<Core<S>>,
    /// The reservations made here and not yet seen settled, to count those that expire.
    book: Mutex<ReservationBook>,
}

/// What [`Budgets::reserve`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct Reserved {
    /// OK: every descriptor's limits admitted the estimate, now held; OVER_LIMIT: nothing is held.
    pub decision: Decision,
    /// Names the reservation in [`Budgets::settle`]; `None` when nothing was reserved.
    pub id: Option<String>,
    pub ttl_us: u64,
}

/// One descriptor's settlement, summed over its limits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SettledDescriptor {
    pub estimate: u64,
    pub actual: u64,
    /// Counted beyond the estimate.
    pub charged: u64,
    /// What came back to a window still in force: a limit whose window has passed gives back nothing, one that held
    /// less than the difference gives back what it held.
    pub refunded: u64,
}

/// The longest a reservation may be held: a day.
pub const MAX_RESERVATION_TTL_US: u64 = 86_400_000_000;

impl<S> Budgets<S> {
    pub(super) fn new(core: Arc<Core<S>>) -> Budgets<S> {
        Budgets {
            core,
            book: Mutex::default(),
        }
    }

    fn book(&self) -> MutexGuard<'_, ReservationBook> {
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<S: Counters + Announcements + Reservations> Budgets<S> {
    /// Decides `costs` without counting anything: the statuses
    /// [`Decisions::should_rate_limit`](super::Decisions::should_rate_limit) would answer.
    pub async fn check(&self, request: &Request, costs: &Costs) -> Result<Decision, LimitError> {
        self.core.decide(request, How::Check(costs)).await
    }

    /// Counts `costs` against every limit the descriptors match, whatever the limits say; every status is OK and
    /// says what is left.
    pub async fn report(&self, request: &Request, costs: &Costs) -> Result<Decision, LimitError> {
        self.core.decide(request, How::Report(costs)).await
    }

    /// Admits the estimated `costs` when every limit of every descriptor has room for them, and holds them for
    /// `ttl_us` under a new reservation id. When any descriptor is over its limit, the others' holds are given back
    /// at once and nothing stays reserved.
    pub async fn reserve(&self, request: &Request, costs: &Costs, ttl_us: u64) -> Result<Reserved, LimitError> {
        if ttl_us == 0 || ttl_us > MAX_RESERVATION_TTL_US {
            self.core.metrics.invalid_request("reserve");
            return Err(LimitError::InvalidArgument(format!(
                "ttl must be more than 0 and at most {} s",
                MAX_RESERVATION_TTL_US / 1_000_000
            )));
        }
        let id = super::new_lease();
        let decision = self
            .core
            .decide(request, How::Reserve { costs, id: &id, ttl_us })
            .await?;
        // Nothing is held when no descriptor met a limit (an unknown domain or key): no id, which Settle would not
        // know.
        let holds = decision.statuses.iter().any(|s| s.limit.is_some());
        if decision.overall == Code::Ok && !holds {
            return Ok(Reserved {
                decision,
                id: None,
                ttl_us,
            });
        }
        if decision.overall == Code::Ok {
            let expires_at = self.core.clock.now_us().saturating_add(ttl_us);
            self.book().track(&id, expires_at, request);
            return Ok(Reserved {
                decision,
                id: Some(id),
                ttl_us,
            });
        }
        // Give back what the descriptors that fitted now hold: settle them at nothing (no call when none fitted).
        let held: Vec<Descriptor> = request
            .descriptors
            .iter()
            .zip(&decision.statuses)
            .filter(|(_, status)| status.code == Code::Ok && status.limit.is_some())
            .map(|(d, _)| Descriptor {
                hits_addend: None,
                ..d.clone()
            })
            .collect();
        if !held.is_empty() {
            let nothing = Request {
                domain: request.domain.clone(),
                descriptors: held,
                hits_addend: 0,
            };
            if let Err(e) = self.settle(&nothing, &id, &Costs::default()).await {
                tracing::warn!(error = %e, "a refused reservation's holds could not be given back; they expire");
            }
        }
        Ok(Reserved {
            decision,
            id: None,
            ttl_us,
        })
    }

    /// Replaces reservation `id`'s estimates with the actual `costs`, per descriptor (the descriptors it was made
    /// with). `None` when there is no such reservation: it expired (and stays charged at its estimate), was
    /// settled already, or never existed; nothing changes then.
    pub async fn settle(
        &self,
        request: &Request,
        id: &str,
        costs: &Costs,
    ) -> Result<Option<Vec<SettledDescriptor>>, LimitError> {
        validate(request, &self.core.settings.caps).inspect_err(|_| self.core.metrics.invalid_request("settle"))?;
        if id.is_empty() || id.len() > self.core.settings.caps.max_value_bytes {
            self.core.metrics.invalid_request("settle");
            return Err(LimitError::InvalidArgument(format!(
                "reservation_id must be 1 to {} bytes",
                self.core.settings.caps.max_value_bytes
            )));
        }
        let found = self.settle_with(request, id, costs, false).await?;
        // Settled: nothing to reap. Not found, it may have expired unsettled, which the reaping will tell.
        if found.is_some() {
            self.book().remove(id);
        }
        Ok(found)
    }

    /// Counts as expired the reservations this limiter made that expired unsettled (settled by no instance), and
    /// forgets them; returns the cost reaped, summed over limits. The server calls it every few seconds. A
    /// reservation settled through another instance left no record, so it is never counted; one this limiter did not
    /// make, or could not keep track of (more than [`MAX_TRACKED`] held at once), is not counted here.
    pub async fn reap_expired(&self) -> Result<u64, LimitError> {
        let now_us = self.core.clock.now_us();
        let due = self.book().take_due(now_us.saturating_sub(REAP_AFTER_US));
        let (mut reaped, mut failed) = (0u64, None);
        for (id, request) in due {
            match self.settle_with(&request, &id, &Costs::default(), true).await {
                Ok(Some(descriptors)) => {
                    reaped = descriptors.iter().fold(reaped, |sum, d| sum.saturating_add(d.estimate));
                }
                Ok(None) => {}
                Err(e) => {
                    // Tried again on the next call (the record outlives its expiry by the grace).
                    self.book().track(&id, now_us.saturating_sub(REAP_AFTER_US), &request);
                    failed = Some(e);
                }
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(reaped),
        }
    }

    /// Settles (or, with `reap`, reaps) reservation `id` over the request's descriptors, counting the cost metrics.
    async fn settle_with(
        &self,
        request: &Request,
        id: &str,
        costs: &Costs,
        reap: bool,
    ) -> Result<Option<Vec<SettledDescriptor>>, LimitError> {
        let now_us = self.core.clock.now_us();
        let rules = self.core.rules.load();
        let targets = resolve(rules.domain(&request.domain), request);
        let how = How::Report(costs);
        let mut settlements = Vec::new();
        let mut index = Vec::new();
        let mut labels: Vec<SettleLabel> = Vec::new();
        for (i, (descriptor, target)) in request.descriptors.iter().zip(&targets).enumerate() {
            if let Target::Limited { tiers, rule, shared } = target {
                let cost = how.cost(request, descriptor);
                let hit = self
                    .core
                    .hit(request, descriptor, (tiers, *rule, shared), cost, &costs.named);
                let reservation = self.core.identity(&request.domain, descriptor, shared).reservation(id);
                settlements.push(Settlement {
                    tiers: hit.tiers,
                    cost: hit.cost,
                    reservation,
                    reap,
                });
                index.push(i);
                labels.push(rule.map(|r| {
                    let limits: Vec<String> = tiers
                        .iter()
                        .enumerate()
                        .map(|(j, t)| t.name.as_deref().map_or_else(|| j.to_string(), str::to_string))
                        .collect();
                    (r.path.clone(), limits)
                }));
            }
        }
        if settlements.is_empty() {
            return Ok(None);
        }
        let answers = self.core.guard.store().settle(now_us, &settlements).await;
        if !reap {
            // What came back frees its counters' denials, here and on every instance. A settlement that failed may
            // still have been applied (a timeout), so its counters are freed too.
            let freed = settlements
                .iter()
                .zip(&answers)
                .filter(|(_, answer)| match answer {
                    Ok(Settled::Done { tiers, .. }) => tiers.iter().any(|t| t.refunded > 0),
                    Ok(Settled::Unknown) => false,
                    Err(_) => true,
                })
                .flat_map(|(s, _)| s.tiers.iter().map(|t| t.key.as_str().to_string()))
                .collect();
            self.core.guard.freed(freed).await;
        }
        self.tally_settled(request, (&index, &labels), answers, reap)
    }

    /// Each descriptor's settlement, summed over its limits, from the store's `answers` (one per settled descriptor,
    /// at `index` in the request, its rule's metric label and limit names in `labels`), counted in the cost metrics;
    /// `None` when the store knew none of them.
    fn tally_settled(
        &self,
        request: &Request,
        (index, labels): (&[usize], &[SettleLabel]),
        answers: Vec<Result<Settled, StoreError>>,
        reap: bool,
    ) -> Result<Option<Vec<SettledDescriptor>>, LimitError> {
        let mut out = vec![SettledDescriptor::default(); request.descriptors.len()];
        let mut found = false;
        let domain = request.domain.as_str();
        for ((&i, answer), label) in index.iter().zip(answers).zip(labels) {
            match answer? {
                Settled::Unknown => {}
                Settled::Done { tiers, .. } => {
                    found = true;
                    let d = &mut out[i];
                    for (j, t) in tiers.into_iter().enumerate() {
                        if let Some((rule, limits)) = label {
                            let limit = limits.get(j).map_or("", String::as_str);
                            if reap {
                                self.core.metrics.cost(domain, rule, limit, "expired", t.estimate);
                            } else {
                                self.core.metrics.cost(domain, rule, limit, "settled", t.estimate);
                                self.core.metrics.cost(domain, rule, limit, "actual", t.actual);
                                self.core.metrics.cost(domain, rule, limit, "refunded", t.refunded);
                                self.core.metrics.cost(domain, rule, limit, "charged", t.charged);
                            }
                        }
                        d.estimate = d.estimate.saturating_add(t.estimate);
                        d.actual = d.actual.saturating_add(t.actual);
                        d.charged = d.charged.saturating_add(t.charged);
                        d.refunded = d.refunded.saturating_add(t.refunded);
                    }
                }
            }
        }
        Ok(found.then_some(out))
    }
}

/// A settled descriptor's rule in the cost metrics: its label, and the name of each of its limits (its index when
/// unnamed); `None` for limits the request carried (an override).
type SettleLabel = Option<(Arc<str>, Vec<String>)>;

/// How long after a reservation's expiry it is reaped: its record then is certainly expired by the store's clock too
/// (a record expires on a whole millisecond).
const REAP_AFTER_US: u64 = 1_000_000;

/// The most reservations one limiter keeps track of at once, to reap them; beyond, new ones go untracked.
pub const MAX_TRACKED: usize = 100_000;

/// The reservations a limiter made and has not seen settled: what it may have to reap.
#[derive(Debug, Default)]
struct ReservationBook {
    by_expiry: std::collections::BTreeMap<(u64, String), Request>,
    expiry_of: std::collections::HashMap<String, u64>,
}

impl ReservationBook {
    fn track(&mut self, id: &str, expires_at: u64, request: &Request) {
        if self.expiry_of.len() < MAX_TRACKED {
            self.expiry_of.insert(id.to_string(), expires_at);
            self.by_expiry.insert((expires_at, id.to_string()), request.clone());
        }
    }

    fn remove(&mut self, id: &str) {
        if let Some(at) = self.expiry_of.remove(id) {
            self.by_expiry.remove(&(at, id.to_string()));
        }
    }

    /// Takes every reservation that expired at or before `until`.
    fn take_due(&mut self, until: u64) -> Vec<(String, Request)> {
        let later = self.by_expiry.split_off(&(until.saturating_add(1), String::new()));
        let due = std::mem::replace(&mut self.by_expiry, later);
        due.into_iter()
            .map(|((_, id), request)| {
                self.expiry_of.remove(&id);
                (id, request)
            })
            .collect()
    }
}
