//! A stream's demand for a bucket: its requests, allowed or denied, over the last [`DEMAND_WINDOW_US`], by which
//! the bucket's quota is shared out among the streams that report it.

/// The window over which each stream's demand for a bucket is counted, in microseconds: two of Envoy's 5 s report
/// periods.
pub const DEMAND_WINDOW_US: u64 = 10_000_000;

/// A stream younger than this on a bucket counts its requests as they are; an older one, younger than
/// [`DEMAND_WINDOW_US`], at their pace over the whole window.
const PACE_AFTER_US: u64 = 1_000_000;

/// One stream's requests for a bucket over the last [`DEMAND_WINDOW_US`], estimated as a sliding window over two
/// epoch-aligned windows; while the stream has reported the bucket for less than that, its requests so far at their
/// pace, so that a stream that came later is not taken to want less than one with the same load.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Demand {
    start: u64,
    current: u64,
    previous: u64,
    /// The first report's time, and the requests reported since.
    born: Option<u64>,
    total: u64,
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
        self.born.get_or_insert(now);
        self.current = self.current.saturating_add(requests);
        self.total = self.total.saturating_add(requests);
    }

    pub(super) fn estimate(&mut self, now: u64) -> u64 {
        self.roll(now);
        let age = now.saturating_sub(self.born.unwrap_or(now));
        if age < PACE_AFTER_US {
            return self.total;
        }
        if age < DEMAND_WINDOW_US {
            let paced = u128::from(self.total) * u128::from(DEMAND_WINDOW_US) / u128::from(age);
            return u64::try_from(paced).unwrap_or(u64::MAX);
        }
        let elapsed = now - self.start;
        let carried = u128::from(self.previous) * u128::from(DEMAND_WINDOW_US - elapsed) / u128::from(DEMAND_WINDOW_US);
        u64::try_from(carried).unwrap_or(u64::MAX).saturating_add(self.current)
    }
}
