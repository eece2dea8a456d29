//! One limit of a rule compiled: its unit and window, its algorithm and what that algorithm allows (a bucket's
//! burst and refill, a log's size, counting across regions), and what a hit costs it.

use std::sync::Arc;

use super::Compiler;
use crate::config::{ConfigError, RawRateLimit};
use crate::rules::vocabulary::{
    Algorithm, Limit, MAX_BUCKETS, MAX_LOG_LIMIT, MAX_WINDOW_SECONDS, Tier, TierCost, Unit,
};

impl Compiler<'_> {
    /// One limit; `None` for `unlimited: true`.
    pub(super) fn tier(&self, rl: &RawRateLimit, base: &str) -> Result<Option<Tier>, ConfigError> {
        let at = |field: &str| format!("{base}.{field}");
        let name = rl.name.as_deref().filter(|n| !n.is_empty()).map(Arc::from);
        if rl.unlimited {
            return self.unlimited(rl, base).map(|()| None);
        }
        let unit = match rl.unit.as_deref() {
            None => return Err(self.err(&at("unit"), "unit is missing (or set unlimited: true)")),
            Some(u) => Unit::from_name(u).ok_or_else(|| {
                self.err(
                    &at("unit"),
                    format!("unknown unit '{u}' (expected second, minute, hour, day, week, month or year)"),
                )
            })?,
        };
        let algorithm = match rl.algorithm.as_deref() {
            None => Algorithm::default(),
            Some(a) => Algorithm::from_name(a).ok_or_else(|| {
                let names: Vec<&str> = Algorithm::ALL.iter().map(|a| a.name()).collect();
                self.err(
                    &at("algorithm"),
                    format!("unknown algorithm '{a}' (expected {})", names.join(", ")),
                )
            })?,
        };
        let multiplier = rl.unit_multiplier.unwrap_or(1);
        if multiplier == 0 {
            return Err(self.err(&at("unit_multiplier"), "must be at least 1"));
        }
        let window_s = unit.seconds() * u64::from(multiplier);
        if window_s > MAX_WINDOW_SECONDS {
            return Err(self.err(
                &at("unit_multiplier"),
                format!("a window of {multiplier} {}s is longer than 100 years", unit.name()),
            ));
        }
        let requests = rl.requests_per_unit;
        let burst = if algorithm.has_sub_windows() {
            self.sub_windows(rl, window_s, base)?
        } else {
            self.burst(rl, algorithm, window_s, base)?
        };
        if rl.buckets.is_some() && !algorithm.has_sub_windows() {
            return Err(self.err(
                &at("buckets"),
                format!("buckets applies to bucketed_window, not {}", algorithm.name()),
            ));
        }
        self.algorithm_fits(rl, algorithm, base)?;
        Ok(Some(Tier {
            limit: Limit {
                requests,
                unit,
                multiplier,
                algorithm,
                burst,
            },
            name,
            cost: self.tier_cost(rl, base)?,
            global: rl.global,
        }))
    }

    /// Refuses what does not apply to an unlimited limit: a unit (named as unknown when it is), an algorithm, a
    /// window, a burst, records, costs, counting across regions.
    fn unlimited(&self, rl: &RawRateLimit, base: &str) -> Result<(), ConfigError> {
        let at = |field: &str| format!("{base}.{field}");
        if let Some(unit) = &rl.unit {
            if Unit::from_name(unit).is_none() {
                return Err(self.err(&at("unit"), format!("unknown unit '{unit}'")));
            }
            return Err(self.err(&at("unit"), "a rule cannot be unlimited and have a unit"));
        }
        for (field, set) in [
            ("algorithm", rl.algorithm.is_some()),
            ("unit_multiplier", rl.unit_multiplier.is_some()),
            ("burst", rl.burst.is_some()),
            ("buckets", rl.buckets.is_some()),
            ("record", rl.record.is_some()),
            ("cost", rl.cost.is_some()),
            ("price", rl.price.is_some()),
            ("global", rl.global),
        ] {
            if set {
                return Err(self.err(&at(field), "does not apply to an unlimited rule"));
            }
        }
        Ok(())
    }

    /// The burst of a limit of `algorithm` over `window_s` seconds: a bucket's capacity (the requests by default,
    /// 1 for a leaky bucket), which only the buckets take, and which must fill within 100 years.
    fn burst(&self, rl: &RawRateLimit, algorithm: Algorithm, window_s: u64, base: &str) -> Result<u32, ConfigError> {
        let at = |field: &str| format!("{base}.{field}");
        let requests = rl.requests_per_unit;
        let burst = match rl.burst {
            Some(_) if !algorithm.is_bucket() => {
                return Err(self.err(
                    &at("burst"),
                    format!(
                        "burst applies to token_bucket and leaky_bucket, not {}",
                        algorithm.name()
                    ),
                ));
            }
            Some(b) => b,
            None => algorithm.default_burst(requests),
        };
        if algorithm.is_bucket() {
            if requests == 0 {
                return Err(self.err(
                    &at("requests_per_unit"),
                    format!("must be at least 1 for {} (the refill rate)", algorithm.name()),
                ));
            }
            if burst == 0 {
                return Err(self.err(&at("burst"), "must be at least 1"));
            }
            let interval = (window_s * 1_000_000).div_ceil(u64::from(requests));
            if u64::from(burst) * interval > MAX_WINDOW_SECONDS * 1_000_000 {
                return Err(self.err(&at("burst"), "the bucket takes longer than 100 years to fill"));
            }
        }
        Ok(burst)
    }

    /// The number of sub-windows of a `bucketed_window` over `window_s` seconds (carried as its burst): `buckets`,
    /// which must split the window into whole seconds, at most [`MAX_BUCKETS`]; by default the most whole-second
    /// sub-windows up to 60.
    fn sub_windows(&self, rl: &RawRateLimit, window_s: u64, base: &str) -> Result<u32, ConfigError> {
        let at = |field: &str| format!("{base}.{field}");
        if rl.burst.is_some() {
            return Err(self.err(
                &at("burst"),
                "burst applies to token_bucket and leaky_bucket, not bucketed_window",
            ));
        }
        let Some(buckets) = rl.buckets else {
            let most = (1..=window_s.min(60)).rev().find(|n| window_s % n == 0).unwrap_or(1);
            return Ok(u32::try_from(most).unwrap_or(1));
        };
        if buckets == 0 || buckets > MAX_BUCKETS {
            return Err(self.err(&at("buckets"), format!("must be between 1 and {MAX_BUCKETS}")));
        }
        if window_s % u64::from(buckets) != 0 {
            return Err(self.err(
                &at("buckets"),
                format!("{buckets} sub-windows do not split a window of {window_s} s into whole seconds"),
            ));
        }
        Ok(buckets)
    }

    /// Refuses what `algorithm` cannot do: a sliding log of more hits than it may store, and counting across regions
    /// for any but the windows.
    fn algorithm_fits(&self, rl: &RawRateLimit, algorithm: Algorithm, base: &str) -> Result<(), ConfigError> {
        let at = |field: &str| format!("{base}.{field}");
        let requests = rl.requests_per_unit;
        if algorithm == Algorithm::SlidingLog && requests > MAX_LOG_LIMIT {
            return Err(self.err(
                &at("requests_per_unit"),
                format!(
                    "{requests} is too many for sliding_log (at most {MAX_LOG_LIMIT}: it stores every hit); \
                     use sliding_window"
                ),
            ));
        }
        if rl.global && !algorithm.can_be_global() {
            return Err(self.err(
                &at("global"),
                format!(
                    "{} cannot be counted across regions (global limits are fixed_window or sliding_window: a \
                     region adds the others' counts, and a {} is state no count can merge)",
                    algorithm.name(),
                    if algorithm.is_bucket() {
                        "bucket's arrival time"
                    } else {
                        "set of hits or leases"
                    }
                ),
            ));
        }
        Ok(())
    }

    /// What a hit costs a limit: `cost: <name>`, `price: {<name>: <price>, ...}`, or the request's cost.
    fn tier_cost(&self, rl: &RawRateLimit, base: &str) -> Result<TierCost, ConfigError> {
        let at = |field: &str| format!("{base}.{field}");
        match (&rl.cost, &rl.price) {
            (Some(_), Some(_)) => Err(self.err(&at("price"), "use either cost or price, not both")),
            (Some(name), None) if name.is_empty() => Err(self.err(&at("cost"), "the cost name is empty")),
            (Some(name), None) => Ok(TierCost::Named(Arc::from(&**name))),
            (None, Some(prices)) if prices.is_empty() => Err(self.err(&at("price"), "no named costs to price")),
            (None, Some(prices)) => {
                if let Some(name) = prices.keys().find(|n| n.is_empty()) {
                    return Err(self.err(&at(&format!("price.{name}")), "the cost name is empty"));
                }
                Ok(TierCost::Priced(
                    prices
                        .iter()
                        .map(|(name, price)| (Arc::from(name.as_str()), *price))
                        .collect(),
                ))
            }
            (None, None) => Ok(TierCost::Request),
        }
    }
}
