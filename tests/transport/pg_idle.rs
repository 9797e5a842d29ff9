//! The cost of an idle receiver on the Postgres transport, counted on the client. A test
//! binary of its own: tracing caches per call site whether anyone listens, so the count is
//! reliable only while no other test of the process runs.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use courier::{Clock, EntityPath, PostgresTransport, QueueOptions, Transport, VirtualClock};
use courier_tests::pg_transport::database;

async fn process(clock: &VirtualClock, poll: Duration) -> PostgresTransport {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect_with(database().await)
        .await
        .unwrap();
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    PostgresTransport::from_pool(pool)
        .clock(shared)
        .migrate(false)
        .poll_interval(poll)
        .open()
        .await
        .unwrap()
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// Counts the statements sqlx runs on the threads where it is the default subscriber
/// (sqlx reports each statement as an event of target `sqlx::query`).
#[derive(Clone, Default)]
struct Statements(Arc<std::sync::atomic::AtomicU64>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Statements {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: tracing_subscriber::layer::Context<'_, S>) {
        if event.metadata().target() == "sqlx::query" {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// The cost of an idle receiver (issue 15: "an idle endpoint costs next to no queries"):
/// a receive waiting on an empty queue runs two statements (the entity's time-driven work,
/// then the locking select) per poll interval, and the transport checks its lock holder's
/// connection once per poll interval (at least a second apart); nothing else. Counted on
/// the client; the bound allows for the first attempt and the one at the end of the wait.
/// Prints the figure (`cargo test -p courier-tests --test pg_idle -- --nocapture`).
#[tokio::test(flavor = "current_thread")]
async fn an_idle_receiver_runs_two_statements_per_poll_interval() {
    use tracing_subscriber::layer::SubscriberExt;
    let counter = Statements::default();
    let _default = tracing::subscriber::set_default(tracing_subscriber::registry().with(counter.clone()));
    let clock = VirtualClock::starting_now();
    let poll = Duration::from_millis(250);
    let t = process(&clock, poll).await;
    let q = unique("q");
    t.create_queue(&q, &QueueOptions::default()).await.unwrap();
    let r = t.receiver(&EntityPath::queue(&q)).await.unwrap();
    let before = counter.0.load(std::sync::atomic::Ordering::Relaxed);
    let started = std::time::Instant::now();
    assert!(r.receive(1, Duration::from_secs(3)).await.unwrap().is_empty());
    let elapsed = started.elapsed();
    let statements = counter.0.load(std::sync::atomic::Ordering::Relaxed) - before;
    let intervals = elapsed.as_secs_f64() / poll.as_secs_f64();
    let holder_checks = elapsed.as_secs_f64().ceil();
    eprintln!(
        "idle receiver: {statements} statements in {:.2} s at a poll interval of {poll:?}, \
         holder checks included",
        elapsed.as_secs_f64(),
    );
    assert!(statements > 0, "the counter sees the receiver's statements");
    assert!(
        statements as f64 <= 2.0 * (intervals + 2.0) + holder_checks,
        "{statements} statements in {intervals:.1} poll intervals"
    );
}
