//! Recoverability survives a killed process: the delayed-retry count lives in the broker.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use courier::recoverability::headers;
use courier::{Clock, Context, Embedded, Endpoint, EntityPath, HandlerError, Transport, VirtualClock};
use courier_tests::{CrashJob, crash_policy};

use crate::support::*;

const CHILD: &str = env!("CARGO_BIN_EXE_courier-test-child");

/// A process killed (SIGKILL) while a message waits for its first delayed retry: after a
/// restart the retry comes when due, counted as the second attempt, and the message ends
/// in the dead-letter queue after exactly the policy's attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_during_a_delayed_retry_resumes_the_count() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("courier.db");
    {
        let broker = Embedded::open(&db).await.unwrap();
        broker
            .create_queue("jobs", &courier::QueueOptions::default())
            .await
            .unwrap();
        let transport: Arc<dyn Transport> = Arc::new(broker);
        courier::Bus::new(transport.clone(), courier::Routes::new().send::<CrashJob>("jobs"))
            .send_with(&CrashJob { n: 1 }, courier::SendOptions::new().message_id("job-1"))
            .await
            .unwrap();
        transport.close().await;
    }
    let mut child = Command::new(CHILD)
        .args(["endpoint", db.to_str().unwrap(), "jobs"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let lines = tokio::task::spawn_blocking(move || {
        let mut lines = Vec::new();
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            let done = line == "SCHEDULED";
            lines.push(line);
            if done {
                break;
            }
        }
        child.kill().unwrap();
        child.wait().unwrap();
        lines
    })
    .await
    .unwrap();
    assert_eq!(lines, vec!["ATTEMPT 1 0", "SCHEDULED"]);

    // Restart: a new process (here, this one) opens the same file.
    let clock = VirtualClock::starting_now();
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let broker = Embedded::builder()
        .path(&db)
        .clock(shared.clone())
        .open()
        .await
        .unwrap();
    let transport: Arc<dyn Transport> = Arc::new(broker);
    let calls = Calls::default();
    let c = calls.clone();
    let running = Endpoint::builder("jobs")
        .transport(transport.clone())
        .clock(shared)
        .recoverability(crash_policy())
        .handler(handler_fn("again", move |_job: CrashJob, ctx: &mut Context| {
            c.record("again", ctx, String::new());
            fail(HandlerError::msg("still failing"))
        }))
        .start()
        .await
        .unwrap();
    for expected in 2..=3u32 {
        wait_counts(&transport, "jobs", |c| c.scheduled == 1 && c.active == 0).await;
        clock.advance(Duration::from_secs(3601));
        eventually("the delayed retry", || async { calls.len() == expected as usize - 1 }).await;
    }
    wait_counts(&transport, "jobs", |c| c.dead_lettered == 1).await;
    let seen: Vec<_> = calls.all().iter().map(|c| (c.attempt, c.delayed_retries)).collect();
    assert_eq!(
        seen,
        vec![(2, 1), (3, 2)],
        "the count resumed where the killed process left it"
    );
    let dead = transport
        .peek(&EntityPath::queue("jobs").dead_letter(), 0, 10)
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].message_id(), "job-1");
    assert_eq!(int_prop(&dead[0], headers::FAILURE_ATTEMPTS), 3);
    assert_eq!(string_prop(&dead[0], headers::FAILURE_ERROR), "still failing");
    running.shutdown().await.unwrap();
}
