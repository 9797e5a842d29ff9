//! A producer's `courier.retry.delayed` cannot make a message skip its retries (issue 30,
//! "a foreign producer cannot ... make a message skip its retry policy"): an endpoint with
//! a store trusts the count only with the seal it writes itself (`courier.retry.seal`,
//! HMAC-SHA256 under the endpoint's secret from its store). Before, a message sent with
//! `courier.retry.delayed = 1000` was dead-lettered at the end of its first round of
//! immediate retries: 2 attempts instead of 6 under the policy below.
//!
//! On the embedded broker with its store (`TestEndpoint`, virtual time), on the Postgres
//! transport with its own store (the producer writing through `courier.send`, as
//! docs/postgres.md says) and on RabbitMQ with a SQLite store (the producer a plain AMQP
//! client setting the header).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier::recoverability::{headers, reasons};
use courier::testing::TestEndpoint;
use courier::{
    Clock, Context, Endpoint, EntityPath, HandlerError, PostgresTransport, PropertyValue, QueueOptions, RetryPolicy,
    SendOptions, Transport, VirtualClock,
};
use courier_tests::eventually;
use courier_tests::pg::TestDatabase;

use crate::support::{PlaceOrder, fail, handler_fn};
use crate::tracing_capture::Capture;

/// What the handler saw on one attempt.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    attempt: u32,
    delayed: u32,
    /// The count property as the handler sees it.
    header: Option<PropertyValue>,
}

#[derive(Clone, Default)]
struct Attempts(Arc<Mutex<Vec<Seen>>>);

impl Attempts {
    fn all(&self) -> Vec<Seen> {
        self.0.lock().unwrap().clone()
    }
    fn delayed(&self) -> Vec<u32> {
        self.all().iter().map(|s| s.delayed).collect()
    }
}

/// One immediate retry and two delayed ones: 2 x 3 = 6 attempts.
fn policy(first: Duration, second: Duration) -> RetryPolicy {
    RetryPolicy::none().immediate(1).delayed([first, second])
}

/// A handler that records what it saw and always fails.
fn always_fails(attempts: &Attempts) -> crate::support::FnHandler<PlaceOrder> {
    let attempts = attempts.clone();
    handler_fn("charge", move |_m: PlaceOrder, ctx: &mut Context| {
        attempts.0.lock().unwrap().push(Seen {
            attempt: ctx.attempt(),
            delayed: ctx.delayed_retries(),
            header: ctx.header(headers::DELAYED_RETRIES).cloned(),
        });
        fail(HandlerError::msg("card declined"))
    })
}

fn forged(count: i64) -> SendOptions {
    SendOptions::new().header(headers::DELAYED_RETRIES, count)
}

#[tokio::test]
async fn a_forged_count_on_the_embedded_broker_skips_no_delayed_retry() {
    let capture = Capture::default();
    let _guard = tracing::subscriber::set_default(capture.subscriber());
    let attempts = Attempts::default();
    let (first, second) = (Duration::from_secs(10), Duration::from_secs(20));
    let t = TestEndpoint::start("sales", |e| {
        e.recoverability(policy(first, second)).handler(always_fails(&attempts))
    })
    .await
    .unwrap();

    t.send_with(&PlaceOrder { id: 1 }, forged(1000).message_id("order-1"))
        .await
        .unwrap();
    assert_eq!(
        attempts.all().len(),
        2,
        "the first round: the forged count does not dead-letter the message at its end"
    );
    assert!(t.dead_lettered().await.unwrap().is_empty());
    t.advance(first).await.unwrap();
    assert_eq!(attempts.all().len(), 4, "the first delayed retry");
    t.advance(second).await.unwrap();
    assert_eq!(
        attempts.all().len(),
        6,
        "the second delayed retry, then the dead-letter queue"
    );
    assert_eq!(attempts.delayed(), vec![0, 0, 1, 1, 2, 2]);
    let seen = attempts.all();
    assert_eq!(
        seen.iter().map(|s| s.attempt).collect::<Vec<_>>(),
        vec![1, 2, 3, 4, 5, 6]
    );
    assert!(
        seen[..2].iter().all(|s| s.header.is_none()),
        "the unsealed count is taken off the headers the handler sees: {seen:?}"
    );
    assert_eq!(seen[2].header, Some(PropertyValue::Int(1)));

    let dead = t.dead_lettered().await.unwrap();
    assert_eq!(dead.len(), 1);
    let d = &dead[0];
    assert_eq!(d.reason.as_deref(), Some(reasons::RETRIES_EXHAUSTED));
    assert_eq!(
        d.envelope.properties.get(headers::DELAYED_RETRIES),
        Some(&PropertyValue::Int(2))
    );
    let Some(PropertyValue::String(seal)) = d.envelope.properties.get(headers::DELAYED_RETRY_SEAL) else {
        panic!(
            "the dead letter carries the seal of its count: {:?}",
            d.envelope.properties
        );
    };
    assert_eq!(seal.len(), 64);
    assert!(seal.bytes().all(|b| b.is_ascii_hexdigit()));

    // One WARN per delivery that carried the forged count, in the message's span, with
    // the value.
    let warned: Vec<_> = capture
        .events()
        .into_iter()
        .filter(|e| e.message.contains("did not seal"))
        .collect();
    assert_eq!(warned.len(), 2, "{warned:?}");
    assert!(warned.iter().all(|e| e.level == tracing::Level::WARN
        && e.span.as_deref() == Some("message")
        && e.fields.get("count").map(String::as_str) == Some("1000")));

    // A valid count and seal copied from that message onto another one count for
    // nothing: the seal names the message id.
    let copied = SendOptions::new()
        .header(headers::DELAYED_RETRIES, 2)
        .header(headers::DELAYED_RETRY_SEAL, seal.clone())
        .message_id("order-2");
    t.send_with(&PlaceOrder { id: 2 }, copied).await.unwrap();
    t.advance(first).await.unwrap();
    t.advance(second).await.unwrap();
    assert_eq!(attempts.delayed()[6..], [0, 0, 1, 1, 2, 2]);
    assert_eq!(t.dead_lettered().await.unwrap().len(), 2);
    t.shutdown().await.unwrap();
}

/// A count of any value, sealed or not, never takes a message past a retry: counts of
/// the edges of the property's range, each forged on its own message.
#[tokio::test]
async fn no_forged_count_shortens_the_policy() {
    let attempts = Attempts::default();
    let (first, second) = (Duration::from_secs(10), Duration::from_secs(20));
    let t = TestEndpoint::start("sales", |e| {
        e.recoverability(policy(first, second)).handler(always_fails(&attempts))
    })
    .await
    .unwrap();
    let counts = [1, 2, 3, i64::from(u32::MAX), i64::MAX, -1, i64::MIN];
    for (i, count) in counts.into_iter().enumerate() {
        let options = forged(count)
            .header(headers::DELAYED_RETRY_SEAL, "00".repeat(32))
            .message_id(format!("order-{i}"));
        t.send_with(&PlaceOrder { id: 1 }, options).await.unwrap();
    }
    t.advance(first).await.unwrap();
    t.advance(second).await.unwrap();
    assert_eq!(attempts.all().len(), 6 * counts.len(), "{:?}", attempts.all());
    assert_eq!(t.dead_lettered().await.unwrap().len(), counts.len());
    t.shutdown().await.unwrap();
}

/// The same on the Postgres transport with its own store, the producer writing the count
/// into the properties through `courier.send`; the secret is in `courier.endpoint_secret`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_count_on_the_postgres_transport_skips_no_delayed_retry() {
    let db = TestDatabase::create().await;
    let pool = db.pool().await;
    let transport = Arc::new(
        PostgresTransport::from_pool(pool.clone())
            .poll_interval(Duration::from_millis(50))
            .open()
            .await
            .unwrap(),
    );
    transport
        .create_queue("forged", &QueueOptions::default())
        .await
        .unwrap();
    let attempts = Attempts::default();
    let endpoint = Endpoint::builder("forged")
        .transport(transport.clone())
        .store(transport.store())
        .recoverability(policy(Duration::from_millis(200), Duration::from_millis(400)))
        .handler(always_fails(&attempts))
        .start()
        .await
        .unwrap();
    sqlx::query(
        "SELECT courier.send(queue => 'forged', message_id => 'order-1', message_type => 'test.PlaceOrder', \
         body => convert_to('{\"id\": 1}', 'UTF8'), properties => '{\"courier.retry.delayed\": 1000}')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let dlq = EntityPath::queue("forged").dead_letter();
    eventually("the dead letter", || async {
        !transport.peek(&dlq, 0, 10).await.unwrap().is_empty()
    })
    .await;
    assert_eq!(attempts.delayed(), vec![0, 0, 1, 1, 2, 2]);
    let dead = transport.peek(&dlq, 0, 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(
        dead[0].broker.dead_letter_reason.as_deref(),
        Some(reasons::RETRIES_EXHAUSTED)
    );
    assert_eq!(
        dead[0].envelope.properties.get(headers::DELAYED_RETRIES),
        Some(&PropertyValue::Int(2))
    );
    // One secret for the endpoint, made when it started, shared through its store.
    let secrets: Vec<(String, i32)> =
        sqlx::query_as("SELECT endpoint, octet_length(secret) FROM courier.endpoint_secret")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(secrets, vec![("forged".to_owned(), 32)]);
    endpoint.shutdown().await.unwrap();
    transport.close().await;
    pool.close().await;
    db.drop_now().await;
}

/// The same on RabbitMQ, the count an AMQP header a plain client (lapin) sets; the
/// endpoint's store (SQLite) holds its secret and the scheduled retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_count_on_rabbitmq_skips_no_delayed_retry() {
    use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
    use lapin::types::{AMQPValue, FieldTable};

    let clock = VirtualClock::starting_now();
    let store = courier_tests::rabbit::memory_store().await;
    let transport = Arc::new(courier_tests::rabbit::transport(&clock, courier::ScheduleStore::from(&store)).await);
    let name = format!("forged-{}", uuid::Uuid::new_v4().simple());
    transport.create_queue(&name, &QueueOptions::default()).await.unwrap();
    let attempts = Attempts::default();
    let (first, second) = (Duration::from_secs(10), Duration::from_secs(20));
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let endpoint = Endpoint::builder(name.clone())
        .transport(transport.clone())
        .store(Arc::new(store.clone()))
        .clock(shared)
        .recoverability(policy(first, second))
        .handler(always_fails(&attempts))
        .start()
        .await
        .unwrap();

    let conn = lapin::Connection::connect(
        &courier_tests::rabbit::amqp_url().await,
        lapin::ConnectionProperties::default(),
    )
    .await
    .unwrap();
    let channel = conn.create_channel().await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    let mut headers = FieldTable::default();
    headers.insert(headers::DELAYED_RETRIES.into(), AMQPValue::LongLongInt(1000));
    let properties = lapin::BasicProperties::default()
        .with_message_id("order-1".into())
        .with_type("test.PlaceOrder".into())
        .with_content_type("application/json".into())
        .with_delivery_mode(2)
        .with_headers(headers);
    let confirm = channel
        .basic_publish(
            "".into(),
            name.as_str().into(),
            BasicPublishOptions::default(),
            br#"{"id":1}"#,
            properties,
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(confirm.is_ack());
    conn.close(0, "done".into()).await.unwrap();

    let queue = EntityPath::queue(&name);
    for (delay, done) in [(first, 2), (second, 4)] {
        eventually("a round over and its delayed retry scheduled", || async {
            attempts.all().len() == done && transport.counts(&queue).await.unwrap().scheduled == 1
        })
        .await;
        clock.advance(delay);
    }
    eventually("the dead letter", || async {
        transport.counts(&queue).await.unwrap().dead_lettered == 1
    })
    .await;
    assert_eq!(attempts.delayed(), vec![0, 0, 1, 1, 2, 2]);
    endpoint.shutdown().await.unwrap();
    let _ = transport.delete(&queue).await;
    transport.close().await;
}
