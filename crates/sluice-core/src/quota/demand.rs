//! A stream's demand for a bucket: its requests, allowed or denied, over the last [`DEMAND_WINDOW_US`], by which
//! the bucket's quota is shared out among the streams that report it.

/// The window over which each stream's demand for a bucket is counted, in microseconds: two of Envoy's 5 s report
/// periods.
pub const DEMAND_WINDOW_US: u64 = 10_000_000;

/// One stream's requests for a bucket over the last [`DEMAND_WINDOW_US`], estimated as a sliding window over two
/// epoch-aligned windows.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Demand {
    start: u64,
    current: u64,
    previous: u64,
}

impl Demand {
    fn roll(&mut self, now: u64) {
        let start = now - now % DEMAND_WINDOW_US;
        if start == self.start {
            return;
        }
        self.previous = if start == self.start + DEMAND_WINDOW_US {
            self.current
        } else {
            0
        };
        self.current = 0;
        self.start = start;
    }

    pub(super) fn add(&mut self, now: u64, requests: u64) {
        self.roll(now);
        self.current = self.current.saturating_add(requests);
    }

    pub(super) fn estimate(&mut self, now: u64) -> u64 {
        self.roll(now);
        let elapsed = now - self.start;
        let carried = u128::from(self.previous) * u128::from(DEMAND_WINDOW_US - elapsed) / u128::from(DEMAND_WINDOW_US);
        u64::try_from(carried).unwrap_or(u64::MAX).saturating_add(self.current)
    }
}
