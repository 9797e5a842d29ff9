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

/// A look-up that RabbitMQ refuses (a passive declare of a missing queue: 404, which
/// closes its channel), cut short by its caller at every moment, 1,500 times on one
/// connection, never costs the connection, and a channel opens after it. Before, two
/// faults: the cut look-up's channel was closed at once by Courier while RabbitMQ was
/// closing it, and a `channel.close` that lapin queued just after its `channel.close-ok`
/// made RabbitMQ (or lapin) close the whole connection (`CHANNEL_ERROR - expected
/// 'channel.open'`: a CI run's admin test failed on it); and once lapin's channel ids
/// wrapped around (2,047), a new channel given the id of a refused one failed to open
/// with the old 404 (`patches/lapin/PATCH.md`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_cut_short_while_rabbitmq_refuses_them_never_cost_the_connection() {
    let transport = courier::AmqpTransport::connect(courier_tests::rabbit::amqp_url().await)
        .await
        .unwrap();
    let missing = courier::EntityPath::queue(unique("cut-missing"));
    let present = unique("cut-present");
    transport
        .create_queue(&present, &courier::QueueOptions::default())
        .await
        .unwrap();
    let (mut cut, mut finished) = (0, 0);
    for i in 0..1_500 {
        if courier_tests::poll_then_drop(transport.counts(&missing), i % 40).await {
            finished += 1;
        } else {
            cut += 1;
        }
    }
    // What the cut look-ups left running ends: each asks once more after this.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let counts = transport.counts(&courier::EntityPath::queue(&present)).await.unwrap();
    assert_eq!(counts.active, 0);
    assert!(cut > 0 && finished > 0, "cut {cut}, finished {finished}");
    assert_eq!(
        transport.connections_made(),
        1,
        "RabbitMQ closed the connection while look-ups were cut short ({cut} cut, {finished} finished)"
    );
    transport.delete(&courier::EntityPath::queue(&present)).await.unwrap();
    transport.close().await;
}
