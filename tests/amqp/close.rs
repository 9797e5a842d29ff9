//! `AmqpTransport::close()` after every endpoint on the transport has shut down: it ends
//! (issue 34: it did not, now and then, once for over 290 s). A loop of whole runs (two
//! endpoints on one transport with a Postgres store, jobs sent at once and through the
//! schedule table, a shutdown), each close under a watchdog that says, when it fires,
//! where the close waits (`AmqpTransport::close_progress`). `COURIER_CLOSE_LOOP` sets the
//! number of runs (10 by default).
//! (`quiet.rs` has the close right after channels are dropped, which logged an ERROR.)

use std::sync::Arc;
use std::time::Duration;

use courier::{AmqpTransport, SendOptions, Transport, VirtualClock};

use crate::support::*;

/// How many runs the loop makes: `COURIER_CLOSE_LOOP`, else 10.
fn runs() -> u32 {
    std::env::var("COURIER_CLOSE_LOOP")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10)
}

/// Closes `transport` under a watchdog: a close that has not ended within 30 s fails the
/// test with where it waits.
pub(crate) async fn close_within_watchdog(transport: Arc<AmqpTransport>, run: u32) {
    let closing = tokio::spawn({
        let transport = transport.clone();
        async move { transport.close().await }
    });
    if tokio::time::timeout(Duration::from_secs(30), closing).await.is_err() {
        panic!(
            "run {run}: close() did not return within 30 s: {}",
            transport.close_progress()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_after_the_endpoints_shut_down_always_returns() {
    let (db, store) = database().await;
    for run in 0..runs() {
        let clock = VirtualClock::starting_now();
        let transport = rabbit(&store, Some(&clock)).await;
        let (a_name, b_name) = (unique("close-a"), unique("close-b"));
        let a = endpoint(&a_name, transport.clone(), &store, 1).start().await.unwrap();
        let b = endpoint(&b_name, transport.clone(), &store, 2).start().await.unwrap();
        let first = run * 6;
        send_jobs(&a, first..first + 3).await;
        // Through the schedule table and the transport's dispatcher.
        for n in first + 3..first + 6 {
            let later = SendOptions::default().deliver_after(Duration::from_secs(3600));
            b.bus().send_with(&Job { n }, later).await.unwrap();
        }
        clock.advance(Duration::from_secs(7200));
        wait_effects(&store, i64::from(first) + 6).await;
        a.shutdown().await.unwrap();
        b.shutdown().await.unwrap();
        close_within_watchdog(transport, run).await;
        let admin = rabbit(&store, None).await;
        for name in [&a_name, &b_name] {
            cleanup(&admin, name).await;
        }
        admin.close().await;
    }
    db.drop_now().await;
}
