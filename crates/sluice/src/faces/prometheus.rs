//! The core's metrics as Prometheus text: a [`Sink`] over metrics-exporter-prometheus's recorder, one per server
//! (no global recorder), with the store-call latency histogram's buckets.

use std::sync::Arc;

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder};

use crate::metrics::{Metrics, STORE_DURATION, Sink};

/// Buckets of the store-call latency histogram, in seconds.
const BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
];

/// A Prometheus recorder and the handle that renders it.
pub struct Prometheus {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
}

impl Prometheus {
    pub fn new() -> Prometheus {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Full(STORE_DURATION.to_string()), BUCKETS)
            .map(PrometheusBuilder::build_recorder)
            .unwrap_or_else(|_| PrometheusBuilder::new().build_recorder());
        let handle = recorder.handle();
        Prometheus { recorder, handle }
    }
}

impl Default for Prometheus {
    fn default() -> Self {
        Prometheus::new()
    }
}

/// Metrics rendered as Prometheus text. `near_limit_ratio`: see [`Metrics::new`].
pub fn metrics(near_limit_ratio: f64) -> Metrics {
    Metrics::new(near_limit_ratio, Arc::new(Prometheus::new()))
}

impl Recorder for Prometheus {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.recorder.describe_counter(key, unit, description);
    }
    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.recorder.describe_gauge(key, unit, description);
    }
    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.recorder.describe_histogram(key, unit, description);
    }
    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        self.recorder.register_counter(key, metadata)
    }
    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        self.recorder.register_gauge(key, metadata)
    }
    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        self.recorder.register_histogram(key, metadata)
    }
}

impl Sink for Prometheus {
    fn render(&self) -> String {
        self.handle.render()
    }

    fn upkeep(&self) {
        self.handle.run_upkeep();
    }
}
