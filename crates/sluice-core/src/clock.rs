//! Time, injected: the decision core reads the clock once per request through [`Clock`], so tests drive time with
//! a [`ManualClock`] instead of sleeping.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A wait on a [`Clock`].
pub type Sleep<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// A source of the current time in microseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    fn now_us(&self) -> u64;

    /// Waits until the clock reads `at_us` or later: by default for the difference in real time, which a clock that
    /// moves only when told to replaces with a wait for its own moves.
    fn sleep_until(&self, at_us: u64) -> Sleep<'_> {
        let wait = at_us.saturating_sub(self.now_us());
        Box::pin(tokio::time::sleep(Duration::from_micros(wait)))
    }
}

/// The system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_us(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0)
    }
}

/// A clock that moves only when told to; what waits on it wakes when it is moved past its time.
#[derive(Debug)]
pub struct ManualClock {
    now_us: tokio::sync::watch::Sender<u64>,
}

impl Default for ManualClock {
    fn default() -> ManualClock {
        ManualClock::new(0)
    }
}

impl ManualClock {
    pub fn new(now_us: u64) -> ManualClock {
        ManualClock {
            now_us: tokio::sync::watch::Sender::new(now_us),
        }
    }

    pub fn set(&self, now_us: u64) {
        self.now_us.send_replace(now_us);
    }

    pub fn advance(&self, by_us: u64) {
        self.now_us.send_modify(|now| *now = now.saturating_add(by_us));
    }

    /// How many waits on this clock are in progress: a test moves the clock once what it drives is asleep.
    pub fn sleepers(&self) -> usize {
        self.now_us.receiver_count()
    }
}

impl Clock for ManualClock {
    fn now_us(&self) -> u64 {
        *self.now_us.borrow()
    }

    fn sleep_until(&self, at_us: u64) -> Sleep<'_> {
        let mut moves = self.now_us.subscribe();
        Box::pin(async move {
            // The sender lives as long as the clock, which outlives this wait.
            let _ = moves.wait_for(|&now| now >= at_us).await;
        })
    }
}
