//! `--metrics ADDR`: Courier's metrics served as Prometheus text at `http://ADDR/metrics`
//! through `metrics-exporter-prometheus`, the recorder of the `metrics` facade the
//! endpoints report to (see docs/observability.md).

use std::error::Error;
use std::net::SocketAddr;

use metrics_exporter_prometheus::PrometheusBuilder;

/// Bucket bounds of every histogram, in seconds: handler and send durations (ms), end-to-end
/// latency and timeout lateness (up to minutes).
const BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// Installs the Prometheus recorder and its HTTP listener on `addr`. Call it before the
/// endpoints start: they register their metrics with the recorder installed then.
pub(crate) fn serve(addr: SocketAddr) -> Result<(), Box<dyn Error>> {
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets(BUCKETS)?
        .install()?;
    Ok(())
}
