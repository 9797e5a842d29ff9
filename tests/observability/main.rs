//! Metrics through the `metrics` facade: exact counts and labels for a run, bounded label
//! values, saga and timeout counters. One recording recorder is installed for the whole
//! binary; each test reads only the series of its own endpoint (its own name), so the
//! tests run in parallel. Traces through OpenTelemetry (feature `opentelemetry`): `otel`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs,
    unreachable_pub
)]

mod dead_letters;
mod otel;
mod recorder;
mod saga;

use std::sync::Arc;
use std::time::Duration;

use courier::observability::{labels, names};
use courier::{
    BoxFuture, Clock, Context, Endpoint, Envelope, Handler, HandlerError, Message, ResultExt, Routes, Store,
    recoverability::reasons,
};
use courier_tests::{embedded_fixture, eventually};
use recorder::{Series, series_of};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "obs.PlaceOrder")]
pub struct PlaceOrder {
    pub id: u32,
}

/// Succeeds for id 1, fails the first attempt of id 2, fails id 3 for good.
struct Mixed;

impl Handler for Mixed {
    type Message = PlaceOrder;
    fn name(&self) -> &'static str {
        "mixed"
    }
    fn handle<'a>(&'a self, m: PlaceOrder, ctx: &'a mut Context) -> BoxFuture<'a, Result<(), HandlerError>> {
        let attempt = ctx.attempt();
        Box::pin(async move {
            match m.id {
                2 if attempt == 1 => Err(HandlerError::msg("first attempt fails")),
                3 => {
                    Err::<(), _>(std::io::Error::other("order 3 cannot exist")).permanent()?;
                    Ok(())
                }
                _ => Ok(()),
            }
        })
    }
}

async fn endpoint(fx: &courier::conformance::Fixture, name: &str) -> courier::RunningEndpoint {
    let clock: Arc<dyn Clock> = Arc::new(fx.clock.clone());
    Endpoint::builder(name)
        .transport(fx.transport.clone())
        .clock(clock)
        .routes(Routes::new().send::<PlaceOrder>(name))
        .shutdown_timeout(Duration::from_secs(10))
        .handler(Mixed)
        .start()
        .await
        .unwrap()
}

/// A counter: its name, labels and value.
type Count = (String, Vec<(String, String)>, u64);

fn labels_of(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut l: Vec<_> = pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    l.sort();
    l
}

#[tokio::test]
async fn one_success_one_retry_and_one_dead_letter_give_exact_counts_and_labels() {
    recorder::install();
    let name = "obs-counts";
    let fx = embedded_fixture().await;
    let system = fx.transport.name();
    let sales = endpoint(&fx, name).await;
    for id in 1..=3 {
        sales.bus().send(&PlaceOrder { id }).await.unwrap();
    }
    eventually("two completed and one dead-lettered", || async {
        let s = sales.stats();
        s.completed == 2 && s.dead_lettered == 1
    })
    .await;
    sales.shutdown().await.unwrap();

    let series = series_of(name);
    let base = [
        (labels::SYSTEM, system),
        (labels::DESTINATION, name),
        (labels::MESSAGE_TYPE, "obs.PlaceOrder"),
    ];
    let with = |extra: &[(&str, &str)]| {
        let mut l = base.to_vec();
        l.extend_from_slice(extra);
        labels_of(&l)
    };
    let counters: Vec<Count> = series
        .iter()
        .filter_map(|s| match s {
            Series::Counter { name, labels, value } if *value > 0 => Some((name.clone(), labels.clone(), *value)),
            _ => None,
        })
        .collect();
    let mut expected = vec![
        (names::CONSUMED.to_owned(), with(&[(labels::OPERATION, "receive")]), 4),
        (names::HANDLED.to_owned(), with(&[]), 2),
        (names::FAILED.to_owned(), with(&[(labels::ERROR_TYPE, "handler")]), 2),
        (names::RETRIED.to_owned(), with(&[(labels::RETRY_KIND, "immediate")]), 1),
        (
            names::DEAD_LETTERED.to_owned(),
            with(&[(labels::REASON, reasons::PERMANENT_FAILURE)]),
            1,
        ),
        (
            names::SENT.to_owned(),
            labels_of(&[
                (labels::SYSTEM, system),
                (labels::DESTINATION, name),
                (labels::OPERATION, "send"),
            ]),
            3,
        ),
    ];
    expected.sort();
    let mut got = counters;
    got.sort();
    assert_eq!(got, expected);

    let histogram = |metric: &str, l: &[(String, String)]| -> usize {
        series
            .iter()
            .find_map(|s| match s {
                Series::Histogram { name, labels, values } if name == metric && labels == l => Some(values.len()),
                _ => None,
            })
            .unwrap_or(0)
    };
    let process = with(&[(labels::OPERATION, "process")]);
    let process_failed = with(&[(labels::OPERATION, "process"), (labels::ERROR_TYPE, "handler")]);
    assert_eq!(
        histogram(names::PROCESS_DURATION, &process),
        2,
        "two handlings succeeded"
    );
    assert_eq!(
        histogram(names::PROCESS_DURATION, &process_failed),
        2,
        "two handlings failed"
    );
    assert_eq!(
        histogram(names::END_TO_END, &with(&[])),
        2,
        "one latency per completed message"
    );
    let send = labels_of(&[
        (labels::SYSTEM, system),
        (labels::DESTINATION, name),
        (labels::OPERATION, "send"),
    ]);
    assert_eq!(
        histogram(names::OPERATION_DURATION, &send),
        3,
        "one send latency per message sent, labelled with the transport"
    );
}

#[tokio::test]
async fn label_values_stay_bounded_when_a_thousand_correlation_values_pass() {
    recorder::install();
    let name = "obs-cardinality";
    let fx = embedded_fixture().await;
    let sales = endpoint(&fx, name).await;
    let mut ids = Vec::new();
    for n in 0..1000u32 {
        let mut env = PlaceOrder { id: 1 }
            .to_envelope()
            .unwrap()
            .with_correlation_id(format!("order-{n}"));
        env.message_id = format!("message-{n}");
        ids.push(env.message_id.clone());
        sales.bus().send_envelope(name, env).await.unwrap();
    }
    // Types the endpoint does not know, each different: all labelled `unknown`.
    for n in 0..20u32 {
        let env = Envelope::new("{}")
            .with_message_type(format!("evil.Type{n}"))
            .with_content_type("application/json");
        sales.bus().send_envelope(name, env).await.unwrap();
    }
    eventually("every message settled", || async {
        let s = sales.stats();
        s.completed == 1000 && s.dead_lettered == 20
    })
    .await;
    sales.shutdown().await.unwrap();

    let series = series_of(name);
    let values: std::collections::BTreeSet<String> = series
        .iter()
        .flat_map(|s| s.labels().iter().map(|(_, v)| v.clone()))
        .collect();
    assert!(
        values
            .iter()
            .all(|v| !v.starts_with("order-") && !v.starts_with("message-")),
        "no correlation value or message id among the label values: {values:?}"
    );
    let types: std::collections::BTreeSet<&str> = series
        .iter()
        .flat_map(|s| s.labels().iter())
        .filter(|(k, _)| k == labels::MESSAGE_TYPE)
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(types.into_iter().collect::<Vec<_>>(), vec!["obs.PlaceOrder", "unknown"]);
    assert!(
        series.len() <= 24,
        "a fixed set of series whatever passes: {} series",
        series.len()
    );
    let consumed = |t: &str| {
        series
            .iter()
            .find_map(|s| match s {
                Series::Counter { name, labels, value }
                    if name == names::CONSUMED && labels.iter().any(|(k, v)| k == labels::MESSAGE_TYPE && v == t) =>
                {
                    Some(*value)
                }
                _ => None,
            })
            .unwrap_or(0)
    };
    assert_eq!(consumed("obs.PlaceOrder"), 1000);
    assert_eq!(consumed("unknown"), 20);
    let dead = series.iter().find_map(|s| match s {
        Series::Counter { name, labels, value } if name == names::DEAD_LETTERED => {
            Some((labels.iter().find(|(k, _)| k == labels::REASON).cloned(), *value))
        }
        _ => None,
    });
    assert_eq!(
        dead,
        Some((
            Some((labels::REASON.to_owned(), reasons::UNKNOWN_MESSAGE_TYPE.to_owned())),
            20
        ))
    );
}

#[tokio::test]
async fn queue_depth_is_sampled_only_when_asked() {
    recorder::install();
    let fx = embedded_fixture().await;
    let clock: Arc<dyn Clock> = Arc::new(fx.clock.clone());
    let build = |name: &str| {
        Endpoint::builder(name)
            .transport(fx.transport.clone())
            .clock(clock.clone())
            .routes(Routes::new().send::<PlaceOrder>(name))
            .handler(Mixed)
    };
    let sampled = build("obs-depth")
        .sample_queue_metrics(Duration::from_secs(15))
        .start()
        .await
        .unwrap();
    let quiet = build("obs-depth-off").start().await.unwrap();
    let gauge = |endpoint: &str, metric: &str| {
        series_of(endpoint).iter().find_map(|s| match s {
            Series::Gauge { name, value, .. } if name == metric => Some(*value),
            _ => None,
        })
    };
    eventually("the first sample", || async {
        gauge("obs-depth", names::QUEUE_DEPTH).is_some()
    })
    .await;
    assert_eq!(gauge("obs-depth", names::QUEUE_DEAD_LETTERED), Some(0.0));
    // One message waits an hour; one of an unknown type is dead-lettered at once.
    let later = courier::SendOptions::new().deliver_after(Duration::from_secs(3600));
    sampled.bus().send_with(&PlaceOrder { id: 1 }, later).await.unwrap();
    let unknown = Envelope::new("{}").with_message_type("obs.Nobody");
    sampled.bus().send_envelope("obs-depth", unknown).await.unwrap();
    eventually("the dead letter", || async { sampled.stats().dead_lettered == 1 }).await;
    eventually("the next samples", || async {
        fx.clock.advance(Duration::from_secs(15));
        gauge("obs-depth", names::QUEUE_DEAD_LETTERED) == Some(1.0)
            && gauge("obs-depth", names::QUEUE_SCHEDULED) == Some(1.0)
    })
    .await;
    assert_eq!(gauge("obs-depth", names::QUEUE_DEPTH), Some(0.0));
    assert_eq!(gauge("obs-depth-off", names::QUEUE_DEPTH), None, "off by default");
    sampled.shutdown().await.unwrap();
    quiet.shutdown().await.unwrap();
}

/// Samples an endpoint with `store`, after it handled three messages: the inbox holds
/// their three ids, the outbox is empty.
async fn backlog_sampled_with(store: Arc<dyn courier::Store>, name: &str) {
    let fx = embedded_fixture().await;
    let clock: Arc<dyn Clock> = Arc::new(fx.clock.clone());
    let sales = Endpoint::builder(name)
        .transport(fx.transport.clone())
        .store(store.clone())
        .clock(clock)
        .routes(Routes::new().send::<PlaceOrder>(name))
        .handler(Mixed)
        .sample_queue_metrics(Duration::from_secs(15))
        .start()
        .await
        .unwrap();
    for _ in 0..3 {
        sales.bus().send(&PlaceOrder { id: 1 }).await.unwrap();
    }
    eventually("three handled", || async { sales.stats().completed == 3 }).await;
    let backlog = store.backlog(name).await.unwrap().expect("the store counts");
    assert_eq!((backlog.outbox, backlog.oldest_outbox, backlog.inbox), (0, None, 3));
    let gauge = |metric: &str| {
        series_of(name).iter().find_map(|s| match s {
            Series::Gauge { name, value, .. } if name == metric => Some(*value),
            _ => None,
        })
    };
    eventually("a sample after the handlings", || async {
        fx.clock.advance(Duration::from_secs(15));
        gauge(names::INBOX_ROWS) == Some(3.0)
    })
    .await;
    assert_eq!(gauge(names::OUTBOX_BACKLOG), Some(0.0));
    assert_eq!(gauge(names::OUTBOX_OLDEST_AGE), Some(0.0));
    sales.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_outbox_and_inbox_of_a_sqlite_store_are_sampled() {
    recorder::install();
    let dir = tempfile::tempdir().unwrap();
    let store = courier::SqliteStore::open(dir.path().join("store.db")).await.unwrap();
    store.migrate().await.unwrap();
    backlog_sampled_with(Arc::new(store), "obs-backlog-sqlite").await;
}

#[tokio::test]
async fn the_outbox_and_inbox_of_a_postgres_store_are_sampled() {
    recorder::install();
    let db = courier_tests::pg::TestDatabase::create().await;
    let store = courier::PostgresStore::from_pool(db.pool().await);
    store.migrate().await.unwrap();
    backlog_sampled_with(Arc::new(store.clone()), "obs-backlog-pg").await;
    store.pool().close().await;
    db.drop_now().await;
}

/// The RabbitMQ transport counts a reconnection after a dropped connection. The counter
/// is labelled with the transport only, so this is the binary's only RabbitMQ test.
#[tokio::test]
async fn a_reconnection_to_rabbitmq_is_counted() {
    use courier::{EntityPath, QueueOptions, ScheduleStore, Transport, VirtualClock};
    recorder::install();
    let clock = VirtualClock::starting_now();
    let store = courier_tests::rabbit::memory_store().await;
    let transport = courier_tests::rabbit::transport(&clock, ScheduleStore::from(&store)).await;
    let queue = format!("q-{}", uuid::Uuid::new_v4().simple());
    transport.create_queue(&queue, &QueueOptions::default()).await.unwrap();
    let reconnects = || recorder::counter(names::RECONNECTS, &[(labels::SYSTEM, "amqp")]);
    let before = reconnects();
    transport.sever_connection().await;
    // The next call connects again.
    transport.delete(&EntityPath::queue(&queue)).await.unwrap();
    assert_eq!(transport.connections_made(), 2);
    assert_eq!(reconnects() - before, 1);
}

/// The Postgres transport counts the dead-letterings it does itself (issue 30): expired
/// messages moved by its maintenance, labelled with the transport, the queue and the
/// reason (before, they were neither logged nor counted).
#[tokio::test]
async fn the_postgres_transport_counts_what_its_maintenance_dead_letters() {
    use courier::{EntityPath, Envelope, QueueOptions, SenderOptions, Transport, VirtualClock};
    recorder::install();
    let clock = VirtualClock::starting_now();
    let transport = courier_tests::pg_transport::transport(&clock).await;
    let queue = format!("obs-expiring-{}", uuid::Uuid::new_v4().simple());
    transport.create_queue(&queue, &QueueOptions::default()).await.unwrap();
    let sender = transport.sender(&queue, SenderOptions::default()).await.unwrap();
    for n in 0..2 {
        let mut m = Envelope::new("{}").with_time_to_live(std::time::Duration::from_secs(1));
        m.message_id = format!("expiring-{n}");
        sender.send(m).await.unwrap();
    }
    clock.advance(std::time::Duration::from_secs(2));
    let counts = transport.counts(&EntityPath::queue(&queue)).await.unwrap();
    assert_eq!(counts.dead_lettered, 2);
    let dead = recorder::counter(
        names::DEAD_LETTERED,
        &[
            (labels::SYSTEM, "postgres"),
            (labels::DESTINATION, queue.as_str()),
            (labels::REASON, "TTLExpiredException"),
        ],
    );
    assert_eq!(dead, 2);
    transport.close().await;
}
