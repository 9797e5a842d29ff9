//! A recorder that keeps every value (counters add up, gauges keep their last value,
//! histograms keep every sample), installed once for the test binary, read by endpoint.

use std::sync::{Arc, OnceLock};

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_util::registry::{AtomicStorage, Registry};

struct Keeping(Arc<Registry<Key, AtomicStorage>>);

impl Recorder for Keeping {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        self.0.get_or_create_counter(key, |c| Counter::from_arc(c.clone()))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.0.get_or_create_gauge(key, |g| Gauge::from_arc(g.clone()))
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        self.0.get_or_create_histogram(key, |h| Histogram::from_arc(h.clone()))
    }
}

static REGISTRY: OnceLock<Arc<Registry<Key, AtomicStorage>>> = OnceLock::new();

/// Installs the recorder (once for the binary): call first in every test. It installs the
/// binary's tracing subscriber too (see `otel`), before any test opens a span.
pub fn install() {
    crate::otel::tracing_to_memory();
    REGISTRY.get_or_init(|| {
        let registry = Arc::new(Registry::atomic());
        metrics::set_global_recorder(Keeping(registry.clone())).expect("the only recorder of this binary");
        registry
    });
}

/// One series: a metric name, its labels (sorted) and its value.
#[derive(Debug, Clone, PartialEq)]
pub enum Series {
    Counter {
        name: String,
        labels: Vec<(String, String)>,
        value: u64,
    },
    Gauge {
        name: String,
        labels: Vec<(String, String)>,
        value: f64,
    },
    Histogram {
        name: String,
        labels: Vec<(String, String)>,
        values: Vec<f64>,
    },
}

impl Series {
    pub fn labels(&self) -> &[(String, String)] {
        match self {
            Series::Counter { labels, .. } | Series::Gauge { labels, .. } | Series::Histogram { labels, .. } => labels,
        }
    }
}

fn split(key: &Key) -> (String, Vec<(String, String)>) {
    let mut labels: Vec<_> = key
        .labels()
        .map(|l| (l.key().to_owned(), l.value().to_owned()))
        .collect();
    labels.sort();
    (key.name().to_owned(), labels)
}

/// Every series labelled with `messaging.destination.name` = `endpoint`.
pub fn series_of(endpoint: &str) -> Vec<Series> {
    let registry = REGISTRY.get().expect("install() first");
    let mine = |labels: &[(String, String)]| {
        labels
            .iter()
            .any(|(k, v)| k == courier::observability::labels::DESTINATION && v == endpoint)
    };
    let mut out = Vec::new();
    for (key, c) in registry.get_counter_handles() {
        let (name, labels) = split(&key);
        if mine(&labels) {
            let value = c.load(std::sync::atomic::Ordering::Relaxed);
            out.push(Series::Counter { name, labels, value });
        }
    }
    for (key, g) in registry.get_gauge_handles() {
        let (name, labels) = split(&key);
        if mine(&labels) {
            let value = f64::from_bits(g.load(std::sync::atomic::Ordering::Relaxed));
            out.push(Series::Gauge { name, labels, value });
        }
    }
    for (key, h) in registry.get_histogram_handles() {
        let (name, labels) = split(&key);
        if mine(&labels) {
            out.push(Series::Histogram {
                name,
                labels,
                values: h.data(),
            });
        }
    }
    out
}

/// The value of counter `name` with exactly `labels` (0 when it was never registered).
pub fn counter(name: &str, labels: &[(&str, &str)]) -> u64 {
    let registry = REGISTRY.get().expect("install() first");
    let mut wanted: Vec<(String, String)> = labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    wanted.sort();
    registry
        .get_counter_handles()
        .into_iter()
        .find(|(key, _)| split(key) == (name.to_owned(), wanted.clone()))
        .map_or(0, |(_, c)| c.load(std::sync::atomic::Ordering::Relaxed))
}
