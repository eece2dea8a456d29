//! The server's side of several regions: the links to the other regions' Redis, and the shipping of this region's
//! counts to them from start to stop.

use std::sync::Arc;
use std::time::Duration;

use super::{Regions, ServerError};
use crate::limiter::Limiter;
use crate::regions::Replicator;
use crate::store::Store;
use crate::store::redis::{RedisSettings, RedisStore};

/// The links to the other regions' Redis, connecting in the background: the start never waits for another region
/// (one that cannot be reached is retried by its link's shipments), and local decisions never do either.
pub(super) async fn replicator(
    redis: &RedisSettings,
    regions: &Regions,
) -> Result<Replicator<RedisStore>, ServerError> {
    let connects = regions.others.iter().map(|(name, url)| async move {
        let settings = RedisSettings {
            url: url.clone(),
            timeout: regions.settings.timeout,
            pool_size: 1,
            server_time: true,
            tls: redis.tls.clone(),
        };
        let store = RedisStore::connect_in_background(&settings)
            .await
            .map_err(|e| ServerError::Serve(format!("--region-redis {name}: {e}")))?;
        Ok::<_, ServerError>((name.clone(), store))
    });
    let others = futures::future::try_join_all(connects).await?;
    tracing::info!(
        region = %regions.settings.name,
        others = ?regions.others.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        interval = ?regions.settings.interval,
        "regions: global limits count every region"
    );
    Ok(Replicator::new(regions.settings.clone(), others))
}

/// The shipping of counts to the other regions, running.
pub(super) struct Shipping {
    stop: tokio::sync::oneshot::Sender<()>,
    task: AbortOnDrop,
}

impl Shipping {
    /// Joins `limiter` to the regions of `replicator` and starts shipping its counts to them.
    pub(super) fn start<S: Store>(limiter: &Arc<Limiter<S>>, replicator: Replicator<RedisStore>) -> Shipping {
        limiter.join_regions(replicator.shared());
        let limiter = limiter.clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        Shipping {
            stop,
            task: AbortOnDrop(tokio::spawn(async move {
                let replicator = Arc::new(replicator);
                let stopped = async {
                    let _ = stopped.await;
                };
                replicator
                    .run(limiter.store(), limiter.clock(), limiter.metrics(), stopped)
                    .await
            })),
        }
    }

    /// Ships what was counted and not yet shipped, and stops: the shipment to each region is bounded by `timeout`
    /// (the links concurrently), and a region not reached is logged with what it missed.
    pub(super) async fn stop(mut self, timeout: Duration) {
        let _ = self.stop.send(());
        // The last read of this region's counts is bounded by the store's timeout; this bounds it all.
        let last = timeout + Duration::from_millis(500);
        if tokio::time::timeout(last, &mut self.task.0).await.is_err() {
            tracing::warn!(waited = ?last, "counts not yet shipped to the other regions when stopping: given up");
        }
    }
}

/// Aborts its task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
