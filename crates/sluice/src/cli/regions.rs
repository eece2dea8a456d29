//! Several regions: this region's name, the other regions' Redis, and how counts of global limits are shipped to
//! them.

use std::time::Duration;

use clap::Args;

use crate::regions::{RegionSettings, check_names};
use crate::server::Regions;

/// `serve`'s flags for the regions.
#[derive(Debug, Args)]
pub(super) struct RegionFlags {
    /// This region's name: global limits (`global: true`) count every region, this one deciding from its own Redis
    /// and shipping its counts to the others' (--region-redis). Needs --redis-url.
    #[arg(long, env = "SLUICE_REGION", requires = "redis_url")]
    pub(super) region: Option<String>,
    /// Another region and its Redis, as NAME=URL (repeat the flag, or separate with commas). That Redis takes this
    /// region's counts of global limits; the region's own sluice ships it theirs into --redis-url.
    #[arg(long, env = "SLUICE_REGION_REDIS", value_delimiter = ',', value_parser = parse_region_redis, requires = "region")]
    pub(super) region_redis: Vec<(String, String)>,
    /// How often counts of global limits are shipped to the other regions, in milliseconds.
    #[arg(long, env = "SLUICE_REGION_INTERVAL_MS", default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub(super) region_interval_ms: u64,
    /// The most window counts kept per region while it cannot be reached; what comes past it is dropped and
    /// counted (sluice_region_dropped_total).
    #[arg(long, env = "SLUICE_REGION_BACKLOG", default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub(super) region_backlog: u64,
    /// Bound on one shipment to another region's Redis, connection included, in milliseconds: more than the link's
    /// round trip. Also bounds the last shipment, on SIGTERM, of the counts not yet shipped.
    #[arg(long, env = "SLUICE_REGION_TIMEOUT_MS", default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub(super) region_timeout_ms: u64,
}

impl RegionFlags {
    /// Checks the names of this region and the others.
    pub(super) fn check(&self) -> Result<(), String> {
        match &self.region {
            Some(region) => {
                let others: Vec<String> = self.region_redis.iter().map(|(n, _)| n.clone()).collect();
                check_names(region, &others)
            }
            None => Ok(()),
        }
    }

    /// This region and the others, when `--region` is given.
    pub(super) fn regions(&self) -> Option<Regions> {
        self.region.clone().map(|name| Regions {
            settings: RegionSettings {
                name,
                interval: Duration::from_millis(self.region_interval_ms),
                backlog: self.region_backlog as usize,
                timeout: Duration::from_millis(self.region_timeout_ms),
            },
            others: self.region_redis.clone(),
        })
    }
}

/// `NAME=URL`: another region and its Redis.
fn parse_region_redis(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((name, url)) if !name.trim().is_empty() && !url.trim().is_empty() => {
            Ok((name.trim().to_string(), url.trim().to_string()))
        }
        _ => Err(format!(
            "'{s}' is not NAME=URL (a region and its Redis, e.g. eu=redis://redis.eu:6379)"
        )),
    }
}
