//! The bad-input corpus on the Postgres transport: rows another program inserted into
//! `courier.message` whose properties Courier cannot read (jsonb that is not an object of
//! booleans, integers, floats and strings). Postgres itself guarantees UTF-8 text and
//! valid JSON, so the properties' shape is what can be wrong. A receive dead-letters
//! each such row at once as `courier.InvalidWireFormat`, naming the properties and
//! keeping them as stored, and hands out the valid messages around it; before the fix the
//! first such row failed every receive of its queue.

use std::sync::Arc;
use std::time::Duration;

use courier::reasons::INVALID_WIRE_FORMAT;
use courier::{
    Clock, Endpoint, EntityPath, Envelope, QueueOptions, ReceivedMessage, SenderOptions, Transport, VirtualClock,
};
use courier_tests::corpus as shared;
use courier_tests::pg_transport::{database, transport};
use uuid::Uuid;

/// Properties a foreign producer could store that are not Courier's.
const BAD_PROPERTIES: [&str; 6] = [
    "[1, 2]",
    "{\"tags\": [\"a\", \"b\"]}",
    "{\"tenant\": {\"id\": 7}}",
    "{\"tenant\": null}",
    "null",
    "\"tenant=acme\"",
];

/// Sends `valid-<n>` through Courier, then a foreign row per bad property value, then
/// `valid-<n+1>`, and so on; returns the queue.
async fn queue_with_corpus(t: &courier::PostgresTransport) -> String {
    let q = format!("corpus-{}", Uuid::new_v4().simple());
    t.create_queue(&q, &QueueOptions::default()).await.unwrap();
    let sender = t.sender(&q, SenderOptions::default()).await.unwrap();
    let pool = sqlx::PgPool::connect_with(database().await).await.unwrap();
    for (n, props) in BAD_PROPERTIES.iter().enumerate() {
        let mut m = Envelope::new(format!("{{\"n\":{n}}}"));
        m.message_id = format!("valid-{n}");
        sender.send(m).await.unwrap();
        sqlx::query(
            "INSERT INTO courier.message (entity_id, seq, state, enqueued_at, message_id, message_type, properties, \
             body) SELECT id, nextval('courier.message_seq'), 0, now(), $2, 'test.Foreign', $3::jsonb, '\\x7b7d' \
             FROM courier.entity WHERE kind = 0 AND name = $1",
        )
        .bind(&q)
        .bind(format!("bad-{n}"))
        .bind(props)
        .execute(&pool)
        .await
        .unwrap();
    }
    pool.close().await;
    q
}

async fn stored_properties(q: &str, message_id: &str) -> Option<String> {
    let pool = sqlx::PgPool::connect_with(database().await).await.unwrap();
    let p = sqlx::query_scalar(
        "SELECT m.properties::text FROM courier.message m JOIN courier.entity e ON e.id = m.entity_id \
         WHERE e.name = $1 AND m.message_id = $2 AND m.state = 3",
    )
    .bind(q)
    .bind(message_id)
    .fetch_one(&pool)
    .await
    .unwrap();
    pool.close().await;
    p
}

fn check_dead_letters(dead: &[ReceivedMessage]) {
    let mut ids: Vec<&str> = dead.iter().map(ReceivedMessage::message_id).collect();
    ids.sort_unstable();
    let want: Vec<String> = (0..BAD_PROPERTIES.len()).map(|n| format!("bad-{n}")).collect();
    assert_eq!(ids, want);
    for m in dead {
        assert_eq!(m.broker.dead_letter_reason.as_deref(), Some(INVALID_WIRE_FORMAT));
        let description = m.broker.dead_letter_description.as_deref().unwrap_or_default();
        assert!(description.contains("properties"), "{description}");
        assert!(m.envelope.properties.is_empty(), "shown without what could not be read");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_with_unreadable_properties_are_dead_lettered_and_the_queue_keeps_flowing() {
    let clock = VirtualClock::starting_now();
    let t = transport(&clock).await;
    let q = queue_with_corpus(&t).await;
    let receiver = t.receiver(&EntityPath::queue(&q)).await.unwrap();
    let mut handled = Vec::new();
    for _ in 0..20 {
        let got = receiver.receive(10, Duration::from_millis(200)).await.unwrap();
        for d in got {
            handled.push((d.message().message_id().to_owned(), d.message().delivery_count()));
            d.complete().await.unwrap();
        }
        if handled.len() == BAD_PROPERTIES.len() {
            break;
        }
    }
    let want: Vec<(String, u32)> = (0..BAD_PROPERTIES.len()).map(|n| (format!("valid-{n}"), 1)).collect();
    assert_eq!(handled, want, "every valid message, in order, at its first delivery");

    let dead = t.peek(&EntityPath::queue(&q).dead_letter(), 0, 100).await.unwrap();
    check_dead_letters(&dead);
    for m in &dead {
        assert_eq!(m.broker.dead_letter_source.as_deref(), Some(q.as_str()));
    }
    // What was stored is kept as it was, for an operator to see.
    assert_eq!(
        stored_properties(&q, "bad-1").await.as_deref(),
        Some("{\"tags\": [\"a\", \"b\"]}")
    );

    // The dead-letter sub-queue is read as it is and can be drained.
    let dlq = t.receiver(&EntityPath::queue(&q).dead_letter()).await.unwrap();
    let mut drained = 0;
    while drained < BAD_PROPERTIES.len() {
        let got = dlq.receive(10, Duration::from_secs(5)).await.unwrap();
        assert!(!got.is_empty());
        for d in got {
            d.complete().await.unwrap();
            drained += 1;
        }
    }
    let counts = t.counts(&EntityPath::queue(&q)).await.unwrap();
    assert_eq!((counts.active, counts.dead_lettered), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receive_and_delete_puts_an_unreadable_row_in_the_dead_letter_queue_with_its_properties() {
    let clock = VirtualClock::starting_now();
    let t = transport(&clock).await;
    let q = queue_with_corpus(&t).await;
    let receiver = t.receiver(&EntityPath::queue(&q)).await.unwrap();
    let mut taken = Vec::new();
    for _ in 0..20 {
        let got = receiver
            .receive_and_delete(10, Duration::from_millis(200))
            .await
            .unwrap();
        taken.extend(got.iter().map(|m| m.message_id().to_owned()));
        if taken.len() == BAD_PROPERTIES.len() {
            break;
        }
    }
    let want: Vec<String> = (0..BAD_PROPERTIES.len()).map(|n| format!("valid-{n}")).collect();
    assert_eq!(taken, want);
    let dead = t.peek(&EntityPath::queue(&q).dead_letter(), 0, 100).await.unwrap();
    check_dead_letters(&dead);
    assert_eq!(
        stored_properties(&q, "bad-2").await.as_deref(),
        Some("{\"tenant\": {\"id\": 7}}")
    );
    let counts = t.counts(&EntityPath::queue(&q)).await.unwrap();
    assert_eq!((counts.active, counts.dead_lettered), (0, BAD_PROPERTIES.len() as u64));
}

/// Any JSON value, nested a few levels.
fn json() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
    use proptest::prelude::*;
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>().prop_map(serde_json::Value::from),
        "[ -~]{0,8}".prop_map(serde_json::Value::from),
        any::<String>().prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            proptest::collection::btree_map("[a-z]{1,3}", inner, 0..4)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Property test (issue 18, fuzzed decoding of Postgres rows): a row with any jsonb as its
/// properties is received or dead-lettered, never a failed receive; it is dead-lettered
/// exactly when its properties are not Courier's. `COURIER_FUZZ_CASES` sets the number of
/// cases (64: each is a round trip to the server).
#[test]
fn any_jsonb_properties_are_received_or_dead_lettered() {
    use proptest::prelude::*;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let clock = VirtualClock::starting_now();
    let (t, q, pool) = rt.block_on(async {
        let t = transport(&clock).await;
        let q = format!("fuzz-{}", Uuid::new_v4().simple());
        t.create_queue(&q, &QueueOptions::default()).await.unwrap();
        let pool = sqlx::PgPool::connect_with(database().await).await.unwrap();
        (t, q, pool)
    });
    let receiver = rt.block_on(t.receiver(&EntityPath::queue(&q))).unwrap();
    let cases = std::env::var("COURIER_FUZZ_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(64);
    let config = ProptestConfig {
        cases,
        ..ProptestConfig::default()
    };
    proptest!(config, |(value in prop_oneof![json(), proptest::collection::btree_map("[a-z]{1,3}", json(), 0..4).prop_map(|m| serde_json::Value::Object(m.into_iter().collect()))])| {
        let courier_reads = serde_json::from_value::<courier::Properties>(value.clone()).is_ok();
        let id = format!("fuzz-{}", Uuid::new_v4().simple());
        let got = rt.block_on(async {
            sqlx::query(
                "INSERT INTO courier.message (entity_id, seq, state, enqueued_at, message_id, properties, body) \
                 SELECT id, nextval('courier.message_seq'), 0, now(), $2, $3, '\\x' FROM courier.entity \
                 WHERE kind = 0 AND name = $1",
            )
            .bind(&q)
            .bind(&id)
            .bind(&value)
            .execute(&pool)
            .await
            .unwrap();
            match receiver.receive(1, Duration::from_millis(100)).await {
                Ok(got) => {
                    let n = got.len();
                    for d in got {
                        d.complete().await.unwrap();
                    }
                    Ok(n)
                }
                Err(e) => Err(e),
            }
        });
        let got = got.map_err(|e| TestCaseError::fail(format!("the receive failed: {e}")))?;
        prop_assert_eq!(got == 1, courier_reads, "{}", value);
        if !courier_reads {
            let dead = rt
                .block_on(t.peek(&EntityPath::queue(&q).dead_letter(), 0, 10_000))
                .unwrap();
            prop_assert!(dead.iter().any(|m| m.message_id() == id
                && m.broker.dead_letter_reason.as_deref() == Some(INVALID_WIRE_FORMAT)));
        }
    });
}

/// Inserts the shared corpus (`courier_tests::corpus`) into queue `q` as another program
/// would (`INSERT INTO courier.message`), and the broken saga row; returns the labels of
/// the rows the table refused.
async fn insert_shared_corpus(pool: &sqlx::PgPool, q: &str, corpus: &shared::Corpus) -> Vec<String> {
    let mut refused = Vec::new();
    for (case, raw) in corpus.sequence(shared::Producer::PostgresRows) {
        if let Some((correlation, state)) = case.and_then(|c| c.saga_row) {
            sqlx::query(
                "INSERT INTO courier.saga (saga_type, correlation, state, version, created_at, updated_at) \
                 VALUES ('corpus.Booking', $1, $2::jsonb, 1, now(), now())",
            )
            .bind(correlation)
            .bind(state)
            .execute(pool)
            .await
            .unwrap();
        }
        let scheduled = raw.scheduled.map(shared::Scheduled::at);
        let inserted = sqlx::query(
            "INSERT INTO courier.message (entity_id, seq, state, enqueued_at, scheduled_at, message_id, \
             correlation_id, message_type, content_type, properties, body) \
             SELECT id, nextval('courier.message_seq'), $2, now(), $3, $4, $5, $6, $7, $8::jsonb, $9 \
             FROM courier.entity WHERE kind = 0 AND name = $1",
        )
        .bind(q)
        .bind(if scheduled.is_some() { 1_i16 } else { 0 })
        .bind(scheduled)
        .bind(raw.message_id())
        .bind(raw.correlation_id.as_deref())
        .bind(raw.message_type.as_deref())
        .bind(raw.content_type.as_deref())
        .bind(raw.properties_json())
        .bind(raw.body.as_slice())
        .execute(pool)
        .await;
        if let Err(e) = inserted {
            assert!(e.to_string().contains("not-null"), "{}: {e}", raw.label);
            refused.push(raw.label.clone());
        }
    }
    refused
}

/// Issue 18, point 3: the corpus every transport shares (`courier_tests::corpus`), as rows
/// another program inserted, handled by an endpoint with the transport's own store
/// (`PgTransportStore`), a plain handler and a saga with a timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_corpus_inserted_as_rows_is_dead_lettered_case_by_case_and_the_valid_messages_are_handled_once() {
    let clock = VirtualClock::starting_now();
    let t = Arc::new(transport(&clock).await);
    let q = format!("corpus-{}", Uuid::new_v4().simple());
    t.create_queue(&q, &QueueOptions::default()).await.unwrap();
    let pool = sqlx::PgPool::connect_with(database().await).await.unwrap();
    let corpus = shared::corpus();
    let refused = insert_shared_corpus(&pool, &q, &corpus).await;

    let seen = shared::Seen::default();
    let shared_clock: Arc<dyn Clock> = Arc::new(clock.clone());
    let endpoint = shared::endpoint(
        Endpoint::builder(q.clone())
            .transport(t.clone())
            .store(t.store())
            .clock(shared_clock),
        &q,
        &seen,
    )
    .start()
    .await
    .unwrap();
    let path = EntityPath::queue(&q);
    let (handled, want_dead) = shared::totals(&corpus, shared::Producer::PostgresRows);
    let settled = shared::settle(|| async {
        let c = t.counts(&path).await.unwrap();
        seen.calls().len() >= handled && c.active == 0 && c.scheduled == 0 && c.dead_lettered >= want_dead as u64
    })
    .await;
    let outcome = shared::Outcome {
        calls: seen.calls(),
        dead: t.peek(&path.clone().dead_letter(), 0, 100).await.unwrap(),
        refused,
    };
    for line in shared::check(&corpus, shared::Producer::PostgresRows, &outcome) {
        eprintln!("{line}");
    }
    let c = t.counts(&path).await.unwrap();
    assert!(settled, "nothing left active or scheduled: {c:?}");
    // Nothing stuck: the valid booking closed (its timeout cancelled), the broken one
    // kept as stored for an operator.
    let sagas: Vec<String> =
        sqlx::query_scalar("SELECT correlation FROM courier.saga WHERE saga_type = 'corpus.Booking'")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(sagas, [shared::BROKEN_BOOKING]);
    let timeouts: i64 =
        sqlx::query_scalar("SELECT count(*) FROM courier.saga_timeout WHERE saga_type = 'corpus.Booking'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(timeouts, 0, "no timeout left");
    endpoint.shutdown().await.unwrap();
    pool.close().await;
}

/// Times only Postgres can store (`infinity`, `-infinity`) and a scheduled row without a
/// time (now refused at INSERT), in the columns another program may fill. Before the fix, reading a row whose
/// time chrono cannot hold panicked in sqlx's decoding ("`NaiveDateTime + TimeDelta`
/// overflowed"), failing the receive (`Closed`) every time: the queue stopped. A row
/// scheduled at `infinity` or without a time never became due. Now the infinite times
/// read as the nearest time chrono holds and are handled; the impossible schedules are
/// dead-lettered saying why; the valid message behind them is received.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_with_infinite_or_missing_times_do_not_stop_the_queue() {
    let clock = VirtualClock::starting_now();
    let t = transport(&clock).await;
    let q = format!("corpus-times-{}", Uuid::new_v4().simple());
    t.create_queue(&q, &QueueOptions::default()).await.unwrap();
    let pool = sqlx::PgPool::connect_with(database().await).await.unwrap();
    let rows = [
        ("scheduled-infinity", 1_i16, "now()", Some("infinity")),
        ("scheduled-minus-infinity", 1, "now()", Some("-infinity")),
        ("enqueued-minus-infinity", 0, "'-infinity'::timestamptz", None),
        ("enqueued-infinity", 0, "'infinity'::timestamptz", None),
    ];
    for (id, state, enqueued, scheduled) in rows {
        // The enqueued time is one of the literals above, never input.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO courier.message (entity_id, seq, state, enqueued_at, scheduled_at, message_id, \
             message_type, body) SELECT id, nextval('courier.message_seq'), $2, {enqueued}, $3::timestamptz, $4, \
             'test.Foreign', '\\x7b7d' FROM courier.entity WHERE kind = 0 AND name = $1"
        )))
        .bind(&q)
        .bind(state)
        .bind(scheduled)
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();
    }
    // A scheduled row without a time is refused at INSERT (the constraint
    // message_scheduled_has_time, issue 30); before it, the maintenance dead-lettered it.
    let refused = sqlx::query(
        "INSERT INTO courier.message (entity_id, seq, state, enqueued_at, scheduled_at, message_id, message_type, \
         body) SELECT id, nextval('courier.message_seq'), 1, now(), NULL, 'scheduled-null', 'test.Foreign', \
         '\\x7b7d' FROM courier.entity WHERE kind = 0 AND name = $1",
    )
    .bind(&q)
    .execute(&pool)
    .await
    .unwrap_err();
    assert!(refused.to_string().contains("message_scheduled_has_time"), "{refused}");
    let sender = t.sender(&q, SenderOptions::default()).await.unwrap();
    sender.send(Envelope::new("{}").with_message_id("valid")).await.unwrap();
    let receiver = t.receiver(&EntityPath::queue(&q)).await.unwrap();
    let mut got = Vec::new();
    for _ in 0..20 {
        for d in receiver.receive(10, Duration::from_millis(200)).await.unwrap() {
            got.push((d.message().message_id().to_owned(), d.message().delivery_count()));
            d.complete().await.unwrap();
        }
        if got.len() == 4 {
            break;
        }
    }
    got.sort();
    let want: Vec<(String, u32)> = [
        "enqueued-infinity",
        "enqueued-minus-infinity",
        "scheduled-minus-infinity",
        "valid",
    ]
    .iter()
    .map(|id| ((*id).to_owned(), 1))
    .collect();
    assert_eq!(got, want, "each at its first delivery");
    let mut dead = t.peek(&EntityPath::queue(&q).dead_letter(), 0, 100).await.unwrap();
    dead.sort_by(|a, b| a.message_id().cmp(b.message_id()));
    let dead: Vec<(&str, Option<&str>, String)> = dead
        .iter()
        .map(|m| {
            (
                m.message_id(),
                m.broker.dead_letter_reason.as_deref(),
                m.broker.dead_letter_description.clone().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(
        (dead[0].0, dead[0].1),
        ("scheduled-infinity", Some(INVALID_WIRE_FORMAT))
    );
    assert!(
        dead[0].2.contains("scheduled for infinity, more than 100 years ahead"),
        "{}",
        dead[0].2
    );
    let counts = t.counts(&EntityPath::queue(&q)).await.unwrap();
    assert_eq!((counts.active, counts.scheduled), (0, 0));
    pool.close().await;
}
