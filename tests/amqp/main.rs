//! Endpoints on RabbitMQ with a Postgres store (the production pairing): effects once
//! with competing instances, a dropped connection that loses nothing, retries and the
//! dead-letter queue through RabbitMQ's delivery count and the scheduled-message table.
//! RabbitMQ comes from `AMQP_URL` or testcontainers (`courier_tests::rabbit`), Postgres
//! from `DATABASE_URL` or testcontainers; every test has its own queue names and database.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs,
    unreachable_pub
)]

mod close;
mod corpus;
mod foreign;
mod leftovers;
mod malformed;
mod quiet;
mod retry_headers;
mod scheduled;
mod session_ids;
mod sessions;
mod silent;
mod support;
mod test_servers;
mod tls;

use std::io::{BufRead, BufReader};
use std::process::{ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use courier::{Clock, Context, Endpoint, EntityPath, HandlerError, Transport, VirtualClock};
use courier_tests::eventually;
use courier_tests::rabbit::amqp_url;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_compete_on_one_queue_and_every_job_has_its_effect_once() {
    let (db, store) = database().await;
    let name = unique("jobs");
    let (ta, tb) = (rabbit(&store, None).await, rabbit(&store, None).await);
    let a = endpoint(&name, ta.clone(), &store, 1)
        .concurrency(4)
        .start()
        .await
        .unwrap();
    let b = endpoint(&name, tb.clone(), &store, 2)
        .concurrency(4)
        .start()
        .await
        .unwrap();
    send_jobs(&a, 0..300).await;
    wait_effects(&store, 300).await;
    let per_instance: Vec<(i64, i64)> =
        sqlx::query_as("SELECT instance, count(*) FROM effects GROUP BY instance ORDER BY instance")
            .fetch_all(store.pool())
            .await
            .unwrap();
    assert_eq!(per_instance.len(), 2, "both instances took jobs: {per_instance:?}");
    // A job's effects commit before its message is acknowledged and counted: wait for
    // the counts (a flaky assertion read them at once).
    eventually("every job completed", || async {
        a.stats().completed + b.stats().completed >= 300
    })
    .await;
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
    cleanup(&ta, &name).await;
    db.drop_now().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_connection_loses_no_job_and_repeats_no_effect() {
    let (db, store) = database().await;
    let name = unique("drop");
    let transport = rabbit(&store, None).await;
    let running = endpoint(&name, transport.clone(), &store, 1)
        .concurrency(8)
        .start()
        .await
        .unwrap();
    send_jobs(&running, 0..200).await;
    // Cut the connection while jobs are in flight: unacknowledged deliveries go back to
    // the queue (some after their effects committed), the consumer starts again.
    eventually("some jobs handled", || async { effects(&store).await.1 >= 20 }).await;
    transport.sever_connection().await;
    send_jobs(&running, 200..400).await;
    wait_effects(&store, 400).await;
    assert!(transport.connections_made() >= 2, "the transport reconnected");
    running.shutdown().await.unwrap();
    cleanup(&transport, &name).await;
    db.drop_now().await;
}

#[courier::handler]
async fn always_fails(_job: Job, ctx: &mut Context) -> Result<(), HandlerError> {
    ctx.state::<Arc<AtomicU32>>()?.fetch_add(1, Ordering::SeqCst);
    Err(HandlerError::msg("the card was declined"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_go_through_rabbitmq_and_the_schedule_table_into_the_dead_letter_queue() {
    let (db, store) = database().await;
    let clock = VirtualClock::starting_now();
    let transport = rabbit(&store, Some(&clock)).await;
    let name = unique("retry");
    let calls = Arc::new(AtomicU32::new(0));
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let running = Endpoint::builder(&name)
        .transport(transport.clone())
        .store(Arc::new(store.clone()))
        .clock(shared)
        .routes(routes(&name, &format!("{name}-done")))
        .handler(always_fails)
        .state(calls.clone())
        .recoverability(
            courier::RetryPolicy::default()
                .immediate(1)
                .delayed([Duration::from_secs(600)]),
        )
        .start()
        .await
        .unwrap();
    running.bus().send(&Job { n: 7 }).await.unwrap();
    // Attempts 1 and 2 (an immediate retry: nack, requeue, x-delivery-count 1), then the
    // delayed retry waits in the schedule table for 10 minutes of virtual time.
    let queue = EntityPath::queue(&name);
    eventually("the delayed retry is scheduled", || async {
        transport.counts(&queue).await.unwrap().scheduled == 1
    })
    .await;
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    clock.advance(Duration::from_secs(600));
    eventually("dead-lettered", || async {
        transport.counts(&queue).await.unwrap().dead_lettered == 1
    })
    .await;
    assert_eq!(calls.load(Ordering::SeqCst), 4, "two more attempts after the delay");
    let dlq = transport.receiver(&queue.clone().dead_letter()).await.unwrap();
    let dead = dlq.receive(1, Duration::from_secs(5)).await.unwrap();
    let m = dead[0].message();
    assert_eq!(
        m.broker.dead_letter_reason.as_deref(),
        Some(courier::recoverability::reasons::RETRIES_EXHAUSTED)
    );
    assert!(
        m.broker
            .dead_letter_description
            .as_deref()
            .is_some_and(|d| d.contains("declined")),
        "{:?}",
        m.broker.dead_letter_description
    );
    assert_eq!(
        m.envelope
            .properties
            .get(courier::recoverability::headers::FAILURE_ATTEMPTS),
        Some(&courier::PropertyValue::Int(4))
    );
    running.shutdown().await.unwrap();
    cleanup(&transport, &name).await;
    db.drop_now().await;
}

/// Starts a worker process; returns it once it printed `READY`.
fn start_worker(amqp: &str, pg: &str, name: &str, instance: u32) -> (std::process::Child, BufReader<ChildStdout>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_courier-test-amqp-worker"))
        .args([amqp, pg, name, &instance.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "READY", "worker {instance} did not start");
    (child, out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_worker_processes_compete_on_one_queue_and_every_job_has_its_effect_once() {
    let (db, store) = database().await;
    let name = unique("procs");
    let url = amqp_url().await;
    let pg = db.url();
    let (w1, w2) = tokio::task::spawn_blocking({
        let (url, pg, name) = (url.clone(), pg.clone(), name.clone());
        move || (start_worker(&url, &pg, &name, 1), start_worker(&url, &pg, &name, 2))
    })
    .await
    .unwrap();
    let transport = rabbit(&store, None).await;
    let bus = courier::Bus::new(transport.clone(), routes(&name, &format!("{name}-done")));
    for n in 0..300 {
        bus.send(&Job { n }).await.unwrap();
    }
    wait_effects(&store, 300).await;
    let instances: Vec<(i64, i64)> =
        sqlx::query_as("SELECT instance, count(*) FROM effects GROUP BY instance ORDER BY instance")
            .fetch_all(store.pool())
            .await
            .unwrap();
    assert_eq!(instances.len(), 2, "both processes took jobs: {instances:?}");
    let reports = tokio::task::spawn_blocking(move || {
        [w1, w2].map(|(mut child, mut out)| {
            drop(child.stdin.take()); // end of input: the worker shuts down
            let mut line = String::new();
            out.read_line(&mut line).unwrap();
            assert!(child.wait().unwrap().success());
            line
        })
    })
    .await
    .unwrap();
    assert!(reports.iter().all(|l| l.starts_with("DONE ")), "{reports:?}");
    cleanup(&transport, &name).await;
    db.drop_now().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_message_outlives_the_process_that_scheduled_it() {
    let (db, store) = database().await;
    let clock = VirtualClock::starting_now();
    let name = unique("sched");
    let first = rabbit(&store, Some(&clock)).await;
    first
        .create_queue(&name, &courier::QueueOptions::default())
        .await
        .unwrap();
    let sender = first.sender(&name, courier::SenderOptions::default()).await.unwrap();
    let at = clock.now() + chrono::Duration::hours(1);
    sender
        .schedule(courier::Envelope::new("in an hour").with_message_id("later-1"), at)
        .await
        .unwrap();
    first.close().await;
    drop((sender, first));
    // A new process (a new transport on the same database) publishes it when it is due.
    let second = rabbit(&store, Some(&clock)).await;
    let queue = EntityPath::queue(&name);
    assert_eq!(second.counts(&queue).await.unwrap().scheduled, 1);
    let receiver = second.receiver(&queue).await.unwrap();
    assert!(
        receiver
            .receive(1, Duration::from_millis(300))
            .await
            .unwrap()
            .is_empty()
    );
    clock.advance(Duration::from_secs(3600));
    let got = receiver.receive(1, Duration::from_secs(10)).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].message().message_id(), "later-1");
    assert_eq!(got[0].message().broker.enqueued_time, at, "enqueued when it activated");
    got.into_iter().next().unwrap().complete().await.unwrap();
    // The row is deleted when the publish is confirmed, which may come after the message
    // was received (a flaky assertion read the count at once).
    eventually("the schedule row deleted", || async {
        second.counts(&queue).await.unwrap().scheduled == 0
    })
    .await;
    cleanup(&second, &name).await;
    db.drop_now().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_published_by_another_client_as_the_wire_format_says_is_handled_once() {
    use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
    let (db, store) = database().await;
    let name = unique("wire");
    let transport = rabbit(&store, None).await;
    let running = endpoint(&name, transport.clone(), &store, 1).start().await.unwrap();
    // A producer that knows nothing of Courier: plain AMQP properties (docs/rabbitmq.md).
    let conn = lapin::Connection::connect(&amqp_url().await, lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let channel = conn.create_channel().await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    let properties = lapin::BasicProperties::default()
        .with_message_id("order-7".into())
        .with_type("amqp.Job".into())
        .with_content_type("application/json".into())
        .with_delivery_mode(2);
    for _ in 0..2 {
        // Published twice with one message id: the inbox drops the second.
        let confirm = channel
            .basic_publish(
                "".into(),
                name.as_str().into(),
                BasicPublishOptions::default(),
                br#"{"n":7}"#,
                properties.clone(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(confirm.is_ack());
    }
    eventually("the duplicate is recognised", || async {
        running.stats().duplicates == 1
    })
    .await;
    assert_eq!(effects(&store).await, (1, 1), "one effect for one message id");
    running.shutdown().await.unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(5), conn.close(200, "done".into())).await;
    cleanup(&transport, &name).await;
    db.drop_now().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_fails_half_way_hands_back_exactly_the_messages_not_confirmed() {
    use lapin::options::QueueDeclareOptions;
    use lapin::types::{AMQPValue, FieldTable};
    // S1.3 batch is bent: a full queue (declared by another client with a length limit)
    // refuses the second half of a batch; the sender hands back exactly that half.
    let name = unique("full");
    let conn = lapin::Connection::connect(&amqp_url().await, lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let channel = conn.create_channel().await.unwrap();
    // A classic queue: it applies the length limit to each publish exactly (a quorum queue
    // may take a few messages over the limit).
    let mut args = FieldTable::default();
    args.insert("x-max-length".into(), AMQPValue::LongLongInt(5));
    args.insert("x-overflow".into(), AMQPValue::LongString("reject-publish".into()));
    channel
        .queue_declare(name.as_str().into(), QueueDeclareOptions::durable(), args)
        .await
        .unwrap();
    let transport = courier::AmqpTransport::connect(amqp_url().await).await.unwrap();
    let sender = transport
        .sender(&name, courier::SenderOptions::default())
        .await
        .unwrap();
    let batch = (0..10)
        .map(|i| courier::Envelope::new(format!("m{i}")).with_message_id(format!("m{i}")))
        .collect();
    let e = sender.send_batch(batch).await.unwrap_err();
    assert!(e.is_transient(), "a full queue may have room later: {e}");
    let back: Vec<&str> = e.messages.iter().map(|m| m.message_id.as_str()).collect();
    assert_eq!(back, ["m5", "m6", "m7", "m8", "m9"]);
    assert_eq!(transport.counts(&EntityPath::queue(&name)).await.unwrap().active, 5);
    // Bounded: lapin's close of this raw connection once waited forever (a hung run).
    let _ = tokio::time::timeout(
        Duration::from_secs(5),
        channel.queue_delete(name.as_str().into(), Default::default()),
    )
    .await;
    let _ = tokio::time::timeout(Duration::from_secs(5), conn.close(200, "done".into())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_receiver_or_delivery_gives_its_messages_back_at_once() {
    let transport = courier::AmqpTransport::connect(amqp_url().await).await.unwrap();
    let name = unique("drop");
    transport
        .create_queue(&name, &courier::QueueOptions::default())
        .await
        .unwrap();
    let sender = transport
        .sender(&name, courier::SenderOptions::default())
        .await
        .unwrap();
    let path = EntityPath::queue(&name);
    sender.send(courier::Envelope::new("first")).await.unwrap();
    let first = transport.receiver(&path).await.unwrap();
    let got = first.receive(3, Duration::from_secs(5)).await.unwrap();
    assert_eq!(got.len(), 1);
    // Two more arrive while `first` may take three: RabbitMQ pushes them to its consumer.
    sender.send(courier::Envelope::new("second")).await.unwrap();
    sender.send(courier::Envelope::new("third")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(got); // an unsettled delivery: requeued at once (the settler's Drop)
    drop(first); // its consumer's buffer: requeued when lapin closes the last handle of its channel
    let second = transport.receiver(&path).await.unwrap();
    let mut bodies = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while bodies.len() < 3 && tokio::time::Instant::now() < deadline {
        for d in second.receive(3, Duration::from_millis(500)).await.unwrap() {
            bodies.push(String::from_utf8_lossy(d.message().body()).into_owned());
            d.complete().await.unwrap();
        }
    }
    bodies.sort();
    assert_eq!(bodies, ["first", "second", "third"]);
    transport.delete(&path).await.unwrap();
}
