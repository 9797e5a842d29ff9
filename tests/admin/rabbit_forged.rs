//! A dead letter's record on RabbitMQ is Courier's only when Courier sealed it (issue 31,
//! point 6): a property over every header a producer may write in Courier's namespaces
//! (`x-courier-dead-letter-*` with its seal, `courier.failure.*`, `courier.*`, RabbitMQ's
//! `x-death` and `x-delivery-count`), with values of every AMQP kind (text with bytes that
//! are not UTF-8, integers and floats at their extremes, tables, arrays, none), as far as
//! RabbitMQ 3.10 takes them: an infinity, a NaN or a short-string value (lapin's `s`,
//! RabbitMQ's short integer) in a header make it close the producer's connection
//! (INTERNAL_ERROR), so no producer can write one,
//! on three ways into the dead-letter queue:
//!
//! * published straight into `<queue>::dlq`;
//! * expired by RabbitMQ in a queue no one reads (RabbitMQ's own dead-lettering, with the
//!   producer's headers kept);
//! * refused by Courier's receiver (a message id that is not UTF-8): a record Courier
//!   wrote and sealed.
//!
//! Whatever the producer wrote, the operations API (`AmqpAdmin`, what `courier dlq` and the
//! console show) never shows a forged text as the reason, description, error, error chain
//! or source, never counts a forged number of deliveries, and keeps a forged record among
//! the message's headers only under `(unverified) `. A refusal's record is Courier's:
//! reason, description and source as the receiver wrote them.

use std::collections::HashMap;
use std::time::Duration;

use courier::admin::{AmqpAdmin, QueueAdmin};
use courier::reasons::INVALID_WIRE_FORMAT;
use courier::{AmqpTransport, EntityPath, PropertyValue, QueueOptions, Transport};
use courier_tests::eventually;
use courier_tests::rabbit::amqp_url;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use super::rabbit::{counts, setup, unique};

/// What every forged text holds: no text Courier writes does.
const MARK: &str = "FORGED";

/// How a message reaches the dead-letter queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    /// Published straight into the DLQ.
    Straight,
    /// Expired by RabbitMQ in a queue no one reads.
    Expired,
    /// Refused by Courier's receiver.
    Refused,
}

fn text() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        "[ -~]{0,20}".prop_map(|s| format!("{MARK}{s}").into_bytes()),
        prop::collection::vec(any::<u8>(), 0..12).prop_map(|b| [MARK.as_bytes(), &b[..]].concat()),
        Just(format!("{MARK}\n{MARK}").into_bytes()),
    ]
}

fn value() -> impl Strategy<Value = AMQPValue> {
    let leaf = prop_oneof![
        4 => text().prop_map(|b| AMQPValue::LongString(LongString::from(b))),
        2 => prop_oneof![Just(i64::MIN), Just(i64::MAX), Just(0), Just(-1), Just(4), any::<i64>()]
            .prop_map(AMQPValue::LongLongInt),
        1 => any::<i32>().prop_map(AMQPValue::LongInt),
        // Finite only: RabbitMQ 3.10 cannot parse an infinity or NaN in a header and
        // closes the producer's connection (INTERNAL_ERROR), so no producer can write one.
        1 => prop_oneof![Just(f64::MAX), Just(f64::MIN_POSITIVE), Just(-0.0), any::<f64>().prop_filter("finite", |f| f.is_finite())]
            .prop_map(AMQPValue::Double),
        1 => any::<bool>().prop_map(AMQPValue::Boolean),
        1 => any::<u64>().prop_map(AMQPValue::Timestamp),
        1 => Just(AMQPValue::Void),
    ];
    leaf.prop_recursive(2, 6, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(|v| AMQPValue::FieldArray(FieldArray::from(v))),
            prop::collection::vec(("[a-z]{1,8}", inner), 0..3).prop_map(|v| {
                let mut t = FieldTable::default();
                for (k, x) in v {
                    t.insert(k.into(), x);
                }
                AMQPValue::FieldTable(t)
            }),
        ]
    })
}

/// An `x-death` a producer made: a list of tables with RabbitMQ's field names.
fn death() -> impl Strategy<Value = AMQPValue> {
    let reason = prop_oneof![
        Just("expired"),
        Just("delivery_limit"),
        Just("maxlen"),
        Just("rejected"),
        Just("FORGED")
    ];
    (reason, text(), any::<i64>()).prop_map(|(reason, queue, count)| {
        let mut t = FieldTable::default();
        t.insert(
            "reason".into(),
            AMQPValue::LongString(LongString::from(reason.as_bytes())),
        );
        t.insert("queue".into(), AMQPValue::LongString(LongString::from(queue)));
        t.insert("count".into(), AMQPValue::LongLongInt(count));
        AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::FieldTable(t)]))
    })
}

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "x-courier-dead-letter-reason",
            "x-courier-dead-letter-description",
            "x-courier-dead-letter-source",
            "x-courier-dead-letter-time-to-live",
            "x-courier-dead-letter-seal",
            "x-delivery-count",
        ])
        .prop_map(str::to_owned),
        prop::sample::select(courier::recoverability::headers::FAILURE_HEADERS.to_vec()).prop_map(str::to_owned),
        "[a-z_.]{1,10}".prop_map(|s| format!("courier.failure.{s}")),
        "[a-z_.]{1,10}".prop_map(|s| format!("x-courier-dead-letter-{s}")),
    ]
}

fn headers() -> impl Strategy<Value = (Vec<(String, AMQPValue)>, Option<AMQPValue>)> {
    (
        prop::collection::vec((name(), value()), 0..7),
        prop::option::of(death()),
    )
}

type Input = Vec<(Way, (Vec<(String, AMQPValue)>, Option<AMQPValue>))>;

fn input() -> impl Strategy<Value = Input> {
    prop::collection::vec(
        (
            prop::sample::select(vec![Way::Straight, Way::Expired, Way::Refused]),
            headers(),
        ),
        1..5,
    )
}

struct Setup {
    t: AmqpTransport,
    admin: AmqpAdmin,
    /// The queue the dead letters belong to (its receiver refuses), and one no one reads.
    queue: String,
    idle: String,
    _conn: Connection,
    channel: Channel,
}

async fn publish(channel: &Channel, to: &str, p: BasicProperties) {
    let confirm = channel
        .basic_publish(
            "".into(),
            to.into(),
            BasicPublishOptions::default(),
            b"{\"n\":1}",
            p.with_type("forge.Charge".into()).with_delivery_mode(2),
        )
        .await
        .unwrap();
    assert!(confirm.await.unwrap().is_ack(), "published to {to}");
}

/// Whether a text shown holds a forged one.
fn forged(text: Option<&str>) -> bool {
    text.is_some_and(|t| t.contains(MARK))
}

impl Setup {
    async fn check(&self, n: u64, input: &Input) -> Result<(), TestCaseError> {
        let mut ways = HashMap::new();
        let queue_path = EntityPath::queue(self.queue.as_str());
        let idle_path = EntityPath::queue(self.idle.as_str());
        for (i, (way, (named, death))) in input.iter().enumerate() {
            let id = format!("f{n}-{i}");
            let mut h = FieldTable::default();
            for (k, v) in named {
                h.insert(k.as_str().into(), v.clone());
            }
            if let Some(d) = death {
                h.insert("x-death".into(), d.clone());
            }
            let p = BasicProperties::default().with_headers(h);
            match way {
                Way::Straight => {
                    publish(
                        &self.channel,
                        &format!("{}::dlq", self.queue),
                        p.with_message_id(id.as_str().into()),
                    )
                    .await;
                }
                Way::Expired => {
                    let p = p.with_message_id(id.as_str().into()).with_expiration("1".into());
                    publish(&self.channel, &self.idle, p).await;
                }
                Way::Refused => {
                    let raw = [id.as_bytes(), b"\xff"].concat();
                    publish(
                        &self.channel,
                        &self.queue,
                        p.with_message_id(ShortString::from_received_bytes(raw)),
                    )
                    .await;
                }
            }
            ways.insert(id, *way);
        }
        // Courier's receiver refuses what reaches the queue; RabbitMQ expires the rest.
        let receiver = self.t.receiver(&queue_path).await.unwrap();
        let want = u64::try_from(input.len()).unwrap();
        eventually("every message in a dead-letter queue", || async {
            let handed = receiver.receive(10, Duration::from_millis(100)).await.unwrap();
            assert!(handed.is_empty(), "a refused message was handed out");
            counts(&self.t, &queue_path).await.dead_lettered + counts(&self.t, &idle_path).await.dead_lettered == want
        })
        .await;
        let mut met = 0;
        for q in [&self.queue, &self.idle] {
            let page = self.admin.dead_letters(q, 0, 500).await.unwrap();
            for listed in &page.items {
                let summary = [listed.reason.as_deref(), listed.error.as_deref()];
                prop_assert!(
                    !summary.iter().any(|t| forged(*t)),
                    "a forged text is listed: {listed:?}"
                );
                prop_assert_eq!(listed.delivery_count, 0, "a forged count is listed: {:?}", listed);
            }
            let numbers: Vec<i64> = page.items.iter().map(|d| d.sequence_number).collect();
            for &number in &numbers {
                let d = self.admin.dead_letter(q, number).await.unwrap();
                let key = d.message_id.trim_end_matches(r"\xff").to_owned();
                let Some(way) = ways.get(&key) else {
                    continue;
                };
                met += 1;
                let shown = [
                    d.reason.as_deref(),
                    d.description.as_deref(),
                    d.error.as_deref(),
                    d.error_chain.as_deref(),
                    d.source.as_deref(),
                ];
                prop_assert!(
                    !shown.iter().any(|t| forged(*t)),
                    "{way:?}: a forged text is shown: {d:?}"
                );
                prop_assert_eq!(d.delivery_count, 0, "{:?}: a forged count: {:?}", way, d);
                for (k, v) in &d.headers {
                    let record = k.starts_with("x-courier-dead-letter-") || k.starts_with("courier.failure.");
                    prop_assert!(!record, "{:?}: {} = {:?} is shown as Courier's record", way, k, v);
                    if k.starts_with("(unverified) ") {
                        prop_assert!(*way != Way::Refused, "a refusal's record is Courier's: {:?}", d);
                    }
                }
                match way {
                    Way::Refused => {
                        prop_assert_eq!(d.reason.as_deref(), Some(INVALID_WIRE_FORMAT));
                        prop_assert_eq!(d.source.as_deref(), Some(self.queue.as_str()));
                    }
                    Way::Expired => {
                        prop_assert_eq!(d.reason.as_deref(), Some(courier::reasons::TTL_EXPIRED));
                    }
                    Way::Straight => {}
                }
                if let Some(PropertyValue::String(_)) = d.headers.get("(unverified) x-courier-dead-letter-reason") {
                    prop_assert!(*way != Way::Refused);
                }
            }
            // The next case starts from empty dead-letter queues.
            let outcome = self.admin.delete_many(q, &numbers).await.unwrap();
            prop_assert_eq!(outcome.done.len(), numbers.len());
        }
        prop_assert_eq!(met, input.len(), "every message was listed");
        eventually("the dead-letter queues empty", || async {
            counts(&self.t, &queue_path).await.dead_lettered + counts(&self.t, &idle_path).await.dead_lettered == 0
        })
        .await;
        Ok(())
    }
}

#[test]
fn rabbit_a_record_a_producer_wrote_is_never_shown_as_courier_s() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let setup = rt.block_on(async {
        let (t, admin, _clock) = setup().await;
        let queue = unique("rbforge");
        let idle = format!("{queue}-idle");
        for q in [&queue, &idle] {
            t.create_queue(q, &QueueOptions::default()).await.unwrap();
        }
        let admin = admin.with_queues([queue.clone(), idle.clone()]);
        let conn = Connection::connect(&amqp_url().await, ConnectionProperties::default())
            .await
            .unwrap();
        let channel = conn.create_channel().await.unwrap();
        channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
        Setup {
            t,
            admin,
            queue,
            idle,
            _conn: conn,
            channel,
        }
    });
    // The queues go when the property passed (a failure leaves them for a look).
    courier_tests::run_property(&rt, courier_tests::fuzz_cases(12), &input(), |n, input| {
        let setup = &setup;
        async move { setup.check(n, &input).await }
    });
    rt.block_on(async {
        for q in [&setup.queue, &setup.idle] {
            let _ = setup.t.delete(&EntityPath::queue(q.as_str())).await;
        }
    });
}
