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
    Fixture::new(Arc::new(broker), clock)
}

pub mod cluster;
pub mod containers;
pub mod corpus;
pub mod crash;
pub mod crash_saga;
pub mod logs;
pub mod pg;
pub mod pg_transport;
pub mod rabbit;
pub mod raw_amqp;
pub mod stores;

/// The job the crash tests hand to a child process's endpoint.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, courier::Message)]
#[message(name = "tests.CrashJob")]
pub struct CrashJob {
    /// Which job.
    pub n: u32,
}

/// What the crash tests' child sends for each job it handles.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, courier::Message)]
#[message(name = "tests.CrashDone")]
pub struct CrashDone {
    /// Which job.
    pub n: u32,
}

/// The retry policy of the crash tests: no immediate retries, two delayed retries an hour
/// apart (long enough that none fires before the test kills the child).
pub fn crash_policy() -> courier::RetryPolicy {
    courier::RetryPolicy::default().immediate(0).delayed([
        std::time::Duration::from_secs(3600),
        std::time::Duration::from_secs(3600),
    ])
}

/// Waits (real time, at most 20 s) until `check` holds: a poll with a deadline, for
/// conditions no signal announces.
///
/// # Panics
/// When the deadline passes, naming `what`.
#[allow(clippy::panic)]
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        if check().await {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out waiting for {what}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
}

/// Polls `fut` `polls` times, a moment apart (letting the runtime's other tasks and the
/// broker's thread run between polls), then drops it: an operation cut short at a moment
/// that varies with `polls`. `true` if it finished first.
pub async fn poll_then_drop<F: std::future::Future>(fut: F, polls: usize) -> bool {
    let mut fut = Box::pin(fut);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    for _ in 0..polls {
        if fut.as_mut().poll(&mut cx).is_ready() {
            return true;
        }
        // Not a wait for anything: it spreads the moments at which the future is cut.
        tokio::time::sleep(std::time::Duration::from_micros(150)).await;
    }
    false
}

/// How many cases a property runs: `COURIER_FUZZ_CASES` when set (a long run), else
/// `default`.
pub fn fuzz_cases(default: u32) -> u32 {
    std::env::var("COURIER_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs a property whose cases are checked on `rt`: `cases` inputs from `strategy`, each
/// given to `check` with its number (0, 1, ...: names of its own for each case), no
/// failure file kept. Panics with proptest's report (the minimal failing input) when a
/// case fails.
#[allow(clippy::panic)]
pub fn run_property<S, F, Fut>(rt: &tokio::runtime::Runtime, cases: u32, strategy: &S, check: F)
where
    S: proptest::strategy::Strategy,
    F: Fn(u64, S::Value) -> Fut,
    Fut: std::future::Future<Output = Result<(), proptest::test_runner::TestCaseError>>,
{
    use proptest::test_runner::{Config, TestRunner};
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let n = std::sync::atomic::AtomicU64::new(0);
    let result = runner.run(strategy, |input| {
        let n = n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        rt.block_on(check(n, input))
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
