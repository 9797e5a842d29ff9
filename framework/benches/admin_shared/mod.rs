//! What the operations benches (`admin`, `admin_pg`, `admin_amqp`) share: the send rate
//! they compare a resubmit against, and the median of timings.

use std::time::{Duration, Instant};

use courier::prelude::*;

/// Messages a batch of the send-rate measurement.
pub(crate) const BATCH: usize = 256;

/// Sends `n` messages made by `message` to `queue` of `transport`, `BATCH` at a time;
/// returns messages per second.
pub(crate) async fn send_all(transport: &dyn Transport, queue: &str, n: usize, message: fn(usize) -> Envelope) -> f64 {
    let sender = transport.sender(queue, SenderOptions::default()).await.unwrap();
    let start = Instant::now();
    let mut i = 0;
    while i < n {
        let batch: Vec<Envelope> = (i..(i + BATCH).min(n)).map(message).collect();
        i += batch.len();
        sender.send_batch(batch).await.unwrap();
    }
    n as f64 / start.elapsed().as_secs_f64()
}

/// The median of `v` (not empty).
pub(crate) fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}
