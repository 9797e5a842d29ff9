//! RabbitMQ restarts in the middle of a run: the endpoint reconnects with backoff,
//! declares its topology again and goes on consuming; deliveries in flight come back and
//! the inbox drops the repeats; sends during the outage fail with a transient error (and
//! succeed when sent again) or wait within the connect timeout. No job is lost and none
//! has its effect twice.
//!
//! The broker restarted is one the test started ([`RestartableBroker`]): when a Docker
//! engine answers, a RabbitMQ container of its own (stopped and started again), even when
//! `AMQP_URL` is set. Without an engine the test never restarts the broker `AMQP_URL`
//! names: it works in a virtual host of its own there and has the broker close that
//! vhost's connections (`rabbitmqctl close_all_connections -p`, the close a client gets
//! when the broker shuts down), again and again for the length of the outage; other
//! vhosts' connections are not touched.
//!
//! A test binary of its own, so that the broker's pauses do not slow other tests down.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs,
    unreachable_pub
)]

#[path = "support.rs"]
mod support;

use std::time::Duration;

use courier::AmqpTransport;
use courier_tests::eventually;
use courier_tests::rabbit::RestartableBroker;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rabbitmq_restart_mid_run_loses_no_job_and_repeats_no_effect() {
    let (db, store) = database().await;
    let broker = RestartableBroker::start().await;
    let name = unique("restart");
    let transport = std::sync::Arc::new(
        AmqpTransport::builder(broker.url())
            .schedules(&store)
            .open()
            .await
            .unwrap(),
    );
    let running = endpoint(&name, transport.clone(), &store, 1)
        .concurrency(8)
        .start()
        .await
        .unwrap();
    send_jobs(&running, 0..300).await;
    eventually("some jobs handled", || async { effects(&store).await.1 >= 30 }).await;

    let broker = std::sync::Arc::new(broker);
    let restarting = broker.clone();
    let restart = tokio::spawn(async move { restarting.restart(Duration::from_secs(2)).await });
    // Send while the broker goes down and comes back, and 100 more after: every send
    // either succeeds or fails with a transient error and is sent again (the same job with
    // the same message id; a repeated effect would show as a second row).
    let mut transient_failures = 0;
    let mut n = 300;
    let mut after = None;
    while after.is_none_or(|a| n < a + 100) {
        if after.is_none() && restart.is_finished() {
            after = Some(n);
        }
        // The job's message id is fixed: a send whose outcome was unknown (the broker went
        // away before confirming) is sent again with the same id, so the inbox drops the
        // copy if the first one had arrived after all.
        let once = courier::SendOptions::new().message_id(format!("job-{n}"));
        match running.bus().send_with(&Job { n }, once).await {
            Ok(_) => n += 1,
            Err(e) => {
                assert!(e.is_transient(), "a send during the outage failed for good: {e}");
                transient_failures += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        if after.is_none() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    restart.await.unwrap();
    wait_effects(&store, i64::from(n)).await;
    assert!(transport.connections_made() >= 2, "the transport reconnected");
    eprintln!(
        "restart ({}): {n} jobs, {transient_failures} sends failed with a transient error and were \
         sent again; {} connections made",
        if broker.is_container() {
            "a container of the test's own, stopped and started"
        } else {
            "the connections of a vhost of the test's own, closed by the broker"
        },
        transport.connections_made()
    );
    running.shutdown().await.unwrap();
    cleanup(&transport, &name).await;
    drop(transport);
    if let Ok(broker) = std::sync::Arc::try_unwrap(broker) {
        broker.remove().await;
    }
    db.drop_now().await;
}
