//! Envoy's calls on counters: a request decided ([`Decisions::should_rate_limit`]), its limits reported
//! (`remaining.rs`), a call held until its hit would pass (`wait.rs`), and leases ended and state deleted
//! (`reset.rs`, the only one that asks the store for more than decisions: its [`Releases`](crate::store::Releases)).

mod remaining;
mod reset;
mod wait;

use std::sync::Arc;

pub use wait::Waited;

use super::core::Core;
use super::decide::How;
use super::decision::{Decision, LimitError};
use super::request::Request;
use crate::store::{Announcements, Counters};

/// The decisions on a request's counters.
pub struct Decisions<S> {
    core: Arc<Core<S>>,
    /// The calls waiting for a permit.
    waiters: wait::Waiters,
}

impl<S> Decisions<S> {
    pub(super) fn new(core: Arc<Core<S>>, max_waiters: usize) -> Decisions<S> {
        Decisions {
            core,
            waiters: wait::Waiters::new(max_waiters),
        }
    }
}

impl<S: Counters + Announcements> Decisions<S> {
    /// Decides a request, counting each descriptor's hit against its limits.
    pub async fn should_rate_limit(&self, request: &Request) -> Result<Decision, LimitError> {
        self.core.decide(request, How::Decide).await
    }
}
