//! Shared helpers of Courier's integration tests.

use std::sync::Arc;

use courier::conformance::Fixture;
use courier::{Clock, Embedded, VirtualClock};

/// A fresh in-memory embedded broker on a virtual clock.
///
/// # Panics
/// If the broker cannot be opened (a test failure).
#[allow(clippy::expect_used)]
pub async fn embedded_fixture() -> Fixture {
    let clock = VirtualClock::starting_now();
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let broker = Embedded::builder()
        .in_memory()
        .clock(shared)
        .open()
        .await
        .expect("open an in-memory embedded broker");
    Fixture {
        transport: Arc::new(broker),
        clock,
    }
}
