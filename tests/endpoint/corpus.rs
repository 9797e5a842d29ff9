//! The bad-input corpus on the embedded broker: rows written into the broker's file by
//! something other than Courier (a damaged file, another program, an older version), each
//! of a kind of bad input, with valid messages between them. An endpoint with a store
//! handles every valid message once, at delivery count 1, and dead-letters every bad one
//! with a reason naming what is wrong; nothing is dropped and the queue never stalls.
//! The dead-letter sub-queue can always be read, browsed and drained.

use std::sync::Arc;
use std::time::Duration;

use courier::reasons::INVALID_WIRE_FORMAT;
use courier::recoverability::reasons;
use courier::{Embedded, Endpoint, EntityPath, QueueOptions, ReceivedMessage, RetryPolicy, Routes, Transport};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};

use courier_tests::corpus as shared;

use super::support::*;

/// One raw row: each text column as SQL (a literal, `NULL`, or a `CAST(X'..' AS TEXT)` for
/// bytes that are not UTF-8), the body as a blob literal, and the row's state.
struct Raw {
    /// What the case is, and the dead-letter reason expected (`None`: handled).
    case: &'static str,
    expect: Option<&'static str>,
    message_id: &'static str,
    message_type: &'static str,
    content_type: &'static str,
    properties: &'static str,
    body: &'static str,
}

const ORDER: &str = "'test.PlaceOrder'";
const JSON: &str = "'application/json'";

fn valid(n: u32) -> Raw {
    let (id, body) = match n {
        1 => ("'valid-1'", "CAST('{\"id\":1}' AS BLOB)"),
        2 => ("'valid-2'", "CAST('{\"id\":2}' AS BLOB)"),
        3 => ("'valid-3'", "CAST('{\"id\":3}' AS BLOB)"),
        4 => ("'valid-4'", "CAST('{\"id\":4}' AS BLOB)"),
        _ => ("'valid-5'", "CAST('{\"id\":5}' AS BLOB)"),
    };
    Raw {
        case: "valid",
        expect: None,
        message_id: id,
        message_type: ORDER,
        content_type: JSON,
        properties: "NULL",
        body,
    }
}

fn corpus() -> Vec<Raw> {
    let bad = |case, expect, message_id, message_type, content_type, properties, body| Raw {
        case,
        expect: Some(expect),
        message_id,
        message_type,
        content_type,
        properties,
        body,
    };
    let json = |s: &'static str| s;
    vec![
        valid(1),
        bad(
            "malformed JSON",
            reasons::DESERIALIZATION_FAILED,
            "'bad-json'",
            ORDER,
            JSON,
            "NULL",
            json("CAST('{\"id\":' AS BLOB)"),
        ),
        bad(
            "a wrong shape",
            reasons::DESERIALIZATION_FAILED,
            "'bad-shape'",
            ORDER,
            JSON,
            "NULL",
            "CAST('{\"name\":\"x\"}' AS BLOB)",
        ),
        bad(
            "an empty body",
            reasons::DESERIALIZATION_FAILED,
            "'bad-empty'",
            ORDER,
            JSON,
            "NULL",
            "X''",
        ),
        valid(2),
        bad(
            "an unknown type",
            reasons::UNKNOWN_MESSAGE_TYPE,
            "'bad-type'",
            "'test.NoSuchThing'",
            JSON,
            "NULL",
            "CAST('{\"id\":9}' AS BLOB)",
        ),
        bad(
            "no type",
            reasons::UNKNOWN_MESSAGE_TYPE,
            "'bad-no-type'",
            "NULL",
            JSON,
            "NULL",
            "CAST('{\"id\":9}' AS BLOB)",
        ),
        bad(
            "a content type no codec reads",
            reasons::DESERIALIZATION_FAILED,
            "'bad-content-type'",
            ORDER,
            "'application/x-protobuf'",
            "NULL",
            "CAST('{\"id\":9}' AS BLOB)",
        ),
        valid(3),
        bad(
            "properties that are not JSON",
            INVALID_WIRE_FORMAT,
            "'bad-props-text'",
            ORDER,
            JSON,
            "'tenant=acme'",
            "CAST('{\"id\":9}' AS BLOB)",
        ),
        bad(
            "properties that are a JSON array",
            INVALID_WIRE_FORMAT,
            "'bad-props-array'",
            ORDER,
            JSON,
            "'[1,2,3]'",
            "CAST('{\"id\":9}' AS BLOB)",
        ),
        bad(
            "properties whose bytes are not UTF-8",
            INVALID_WIRE_FORMAT,
            "'bad-props-bytes'",
            ORDER,
            JSON,
            "CAST(X'7B2261223A2280FF227D' AS TEXT)",
            "CAST('{\"id\":9}' AS BLOB)",
        ),
        valid(4),
        bad(
            "a type that is not UTF-8",
            INVALID_WIRE_FORMAT,
            "'bad-type-bytes'",
            "CAST(X'746573742EFF4F72646572' AS TEXT)",
            JSON,
            "NULL",
            "CAST('{\"id\":9}' AS BLOB)",
        ),
        bad(
            "a message id that is not UTF-8",
            INVALID_WIRE_FORMAT,
            "CAST(X'6261642DC328' AS TEXT)",
            ORDER,
            JSON,
            "NULL",
            "CAST('{\"id\":9}' AS BLOB)",
        ),
        valid(5),
    ]
}

/// Writes `rows` into queue `queue` of the broker file at `path` (the broker is closed),
/// as state `state`, due at `scheduled_at` (microseconds) when scheduled; returns their
/// sequence numbers in order.
async fn insert_raw(
    path: &std::path::Path,
    queue: &str,
    rows: &[Raw],
    state: i64,
    scheduled_at: Option<i64>,
) -> Vec<i64> {
    let pool = SqlitePool::connect_with(SqliteConnectOptions::new().filename(path))
        .await
        .unwrap();
    let (entity, next): (i64, i64) =
        sqlx::query_as("SELECT id, next_seq FROM courier_entity WHERE name = ?1 AND parent = 0")
            .bind(queue)
            .fetch_one(&pool)
            .await
            .unwrap();
    let now = chrono::Utc::now().timestamp_micros();
    let mut seqs = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        let seq = next + i as i64;
        let id = (entity << 40) | seq;
        // The columns are the corpus's own SQL literals, never input.
        let sql = format!(
            "INSERT INTO courier_message (id, entity_id, seq, state, delivery_count, enqueued_at, scheduled_at, \
             message_id, message_type, content_type, properties, body) VALUES ({id}, {entity}, {seq}, {state}, 0, \
             {now}, ?1, {}, {}, {}, {}, {})",
            r.message_id, r.message_type, r.content_type, r.properties, r.body
        );
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(scheduled_at)
            .execute(&pool)
            .await
            .unwrap();
        seqs.push(seq);
    }
    sqlx::query("UPDATE courier_entity SET next_seq = ?1 WHERE id = ?2")
        .bind(next + rows.len() as i64)
        .bind(entity)
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    seqs
}

/// A broker file with queue `queue` in it, closed.
async fn broker_file(dir: &tempfile::TempDir, queue: &str) -> std::path::PathBuf {
    let path = dir.path().join("broker.db");
    let broker = Embedded::open(&path).await.unwrap();
    broker.create_queue(queue, &QueueOptions::default()).await.unwrap();
    broker.close().await;
    path
}

async fn dead_letters_of(broker: &Embedded, queue: &str) -> Vec<ReceivedMessage> {
    let mut all = broker
        .peek(&EntityPath::queue(queue).dead_letter(), 0, 1000)
        .await
        .unwrap();
    all.sort_by_key(|m| m.broker.sequence_number);
    all
}

/// Issue 18, point 3 (the corpus), on the embedded broker. On the code before the fix the
/// first unreadable row failed every receive of the queue (`Corrupt`), and the valid
/// messages behind it were never handled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_row_is_dead_lettered_with_a_reason_and_the_valid_ones_are_handled_once() {
    let dir = tempfile::tempdir().unwrap();
    let queue = "corpus";
    let path = broker_file(&dir, queue).await;
    let rows = corpus();
    let seqs = insert_raw(&path, queue, &rows, 0, None).await;

    let broker = Embedded::open(&path).await.unwrap();
    let calls = Calls::default();
    let endpoint = Endpoint::builder(queue)
        .transport(broker.clone())
        .store(broker.store())
        .routes(Routes::new().send::<PlaceOrder>(queue))
        .handler(recording::<PlaceOrder>("place", &calls))
        .recoverability(RetryPolicy::none())
        .start()
        .await
        .unwrap();
    let valid = rows.iter().filter(|r| r.expect.is_none()).count();
    let bad = rows.len() - valid;
    let transport: Arc<dyn Transport> = Arc::new(broker.clone());
    wait_counts(&transport, queue, |c| c.active == 0 && c.dead_lettered == bad as u64).await;
    eventually("every valid message handled", || async { calls.len() == valid }).await;

    let mut handled: Vec<(String, u32)> = calls
        .all()
        .into_iter()
        .map(|c| (c.message_id, c.delivery_count))
        .collect();
    handled.sort();
    let want: Vec<(String, u32)> = (1..=valid).map(|n| (format!("valid-{n}"), 1)).collect();
    assert_eq!(handled, want, "each valid message once, at its first delivery");

    let dead = dead_letters_of(&broker, queue).await;
    assert_eq!(dead.len(), bad);
    for (raw, seq) in rows.iter().zip(&seqs).filter(|(r, _)| r.expect.is_some()) {
        let m = dead
            .iter()
            .find(|m| m.broker.sequence_number == *seq)
            .unwrap_or_else(|| panic!("{}: not in the dead-letter queue", raw.case));
        assert_eq!(
            m.broker.dead_letter_reason.as_deref(),
            raw.expect,
            "{}: {:?}",
            raw.case,
            m.broker.dead_letter_description
        );
        let description = m.broker.dead_letter_description.clone().unwrap_or_default();
        assert!(!description.is_empty(), "{}: a description", raw.case);
        assert_eq!(m.broker.dead_letter_source.as_deref(), Some(queue), "{}", raw.case);
        if raw.expect == Some(INVALID_WIRE_FORMAT) {
            // The description names the field and quotes what was there.
            let field = if raw.case.contains("type") {
                "message_type is not UTF-8: \"test.\\xffOrder\""
            } else if raw.case.contains("message id") {
                "message_id is not UTF-8: \"bad-\\xc3(\""
            } else {
                "properties"
            };
            assert!(description.contains(field), "{}: {description}", raw.case);
        }
    }
    let shown = dead
        .iter()
        .find(|m| {
            m.broker.dead_letter_reason.as_deref() == Some(INVALID_WIRE_FORMAT) && m.message_id().starts_with("bad-")
        })
        .map(|m| m.message_id().to_owned());
    assert!(shown.is_some(), "a lossy id is shown");

    // The dead-letter queue can be drained through Courier, whatever its messages hold.
    let receiver = broker.receiver(&EntityPath::queue(queue).dead_letter()).await.unwrap();
    let mut drained = 0;
    while drained < bad {
        let got = receiver.receive(bad, Duration::from_secs(5)).await.unwrap();
        assert!(!got.is_empty(), "the dead-letter queue gives its messages");
        for d in got {
            d.complete().await.unwrap();
            drained += 1;
        }
    }
    assert_eq!(broker.counts(&EntityPath::queue(queue)).await.unwrap().dead_lettered, 0);
    endpoint.shutdown().await.unwrap();
    broker.close().await;
}

/// A receive-and-delete receiver takes the readable messages; an unreadable row is not
/// handed out lossily nor deleted: it is put in the dead-letter sub-queue with its reason.
#[tokio::test]
async fn receive_and_delete_dead_letters_an_unreadable_row_instead_of_taking_it() {
    let dir = tempfile::tempdir().unwrap();
    let queue = "corpus-take";
    let path = broker_file(&dir, queue).await;
    let rows = vec![
        valid(1),
        Raw {
            case: "a message id that is not UTF-8",
            expect: Some(INVALID_WIRE_FORMAT),
            message_id: "CAST(X'FF' AS TEXT)",
            message_type: ORDER,
            content_type: JSON,
            properties: "NULL",
            body: "X''",
        },
        valid(2),
    ];
    let seqs = insert_raw(&path, queue, &rows, 0, None).await;
    let broker = Embedded::open(&path).await.unwrap();
    let receiver = broker.receiver(&EntityPath::queue(queue)).await.unwrap();
    let got = receiver.receive_and_delete(10, Duration::from_secs(1)).await.unwrap();
    let ids: Vec<&str> = got.iter().map(ReceivedMessage::message_id).collect();
    assert_eq!(ids, ["valid-1", "valid-2"]);
    let dead = dead_letters_of(&broker, queue).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].broker.sequence_number, seqs[1]);
    assert_eq!(dead[0].broker.dead_letter_reason.as_deref(), Some(INVALID_WIRE_FORMAT));
    assert_eq!(dead[0].message_id(), "\u{FFFD}");
    let counts = broker.counts(&EntityPath::queue(queue)).await.unwrap();
    assert_eq!((counts.active, counts.dead_lettered), (0, 1));
    broker.close().await;
}

/// A scheduled row that cannot be read is dead-lettered when it becomes due; before the
/// fix it was deleted and dropped ("an unreadable scheduled message was dropped").
#[tokio::test]
async fn an_unreadable_scheduled_row_is_dead_lettered_when_due_not_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let queue = "corpus-scheduled";
    let path = broker_file(&dir, queue).await;
    let rows = vec![Raw {
        case: "properties that are not JSON",
        expect: Some(INVALID_WIRE_FORMAT),
        message_id: "'scheduled-bad'",
        message_type: ORDER,
        content_type: JSON,
        properties: "'{'",
        body: "CAST('{\"id\":1}' AS BLOB)",
    }];
    let due = chrono::Utc::now().timestamp_micros() - 1_000_000;
    insert_raw(&path, queue, &rows, 1, Some(due)).await;
    let broker = Embedded::open(&path).await.unwrap();
    let transport: Arc<dyn Transport> = Arc::new(broker.clone());
    wait_counts(&transport, queue, |c| c.scheduled == 0 && c.dead_lettered == 1).await;
    let dead = dead_letters_of(&broker, queue).await;
    assert_eq!(dead[0].message_id(), "scheduled-bad");
    assert_eq!(dead[0].broker.dead_letter_reason.as_deref(), Some(INVALID_WIRE_FORMAT));
    assert!(
        dead[0]
            .broker
            .dead_letter_description
            .as_deref()
            .unwrap_or_default()
            .contains("properties"),
        "{:?}",
        dead[0].broker.dead_letter_description
    );
    assert_eq!(broker.counts(&EntityPath::queue(queue)).await.unwrap().active, 0);
    broker.close().await;
}

/// A row stored as scheduled at the largest time the column holds would never become due
/// (before the fix it stayed in the file for good, counted as scheduled): the broker
/// dead-letters it when it opens, saying why. One without a scheduled time is refused by
/// the table (`message_scheduled_has_time`, docs/embedded-broker.md).
#[tokio::test]
async fn a_scheduled_row_that_can_never_become_due_is_dead_lettered_when_the_broker_opens() {
    let dir = tempfile::tempdir().unwrap();
    let queue = "corpus-never-due";
    let path = broker_file(&dir, queue).await;
    let row = |id| Raw {
        case: "scheduled, never due",
        expect: Some(INVALID_WIRE_FORMAT),
        message_id: id,
        message_type: ORDER,
        content_type: JSON,
        properties: "NULL",
        body: "CAST('{\"id\":1}' AS BLOB)",
    };
    let pool = SqlitePool::connect_with(SqliteConnectOptions::new().filename(&path))
        .await
        .unwrap();
    let refused = sqlx::query(
        "INSERT INTO courier_message (id, entity_id, seq, state, enqueued_at, message_id, body) \
         SELECT (id << 40) | next_seq, id, next_seq, 1, 0, 'no-time', x'7b7d' FROM courier_entity WHERE name = ?1",
    )
    .bind(queue)
    .execute(&pool)
    .await
    .unwrap_err();
    assert!(refused.to_string().contains("message_scheduled_has_time"), "{refused}");
    pool.close().await;
    insert_raw(&path, queue, &[row("'at-the-end-of-time'")], 1, Some(i64::MAX)).await;
    let broker = Embedded::open(&path).await.unwrap();
    let dead = dead_letters_of(&broker, queue).await;
    let got: Vec<(&str, Option<&str>)> = dead
        .iter()
        .map(|m| (m.message_id(), m.broker.dead_letter_reason.as_deref()))
        .collect();
    assert_eq!(got, [("at-the-end-of-time", Some(INVALID_WIRE_FORMAT))]);
    let description = dead[0].broker.dead_letter_description.clone().unwrap_or_default();
    assert!(description.contains("more than 100 years ahead"), "{description}");
    assert_eq!(dead[0].broker.dead_letter_source.as_deref(), Some(queue));
    let counts = broker.counts(&EntityPath::queue(queue)).await.unwrap();
    assert_eq!((counts.scheduled, counts.dead_lettered), (0, 1));
    broker.close().await;
}

/// Writes the shared corpus (`courier_tests::corpus`) into queue `queue` of the closed
/// broker file at `path`, as another program would: one row per message, bound as given
/// (a row the table refuses is reported by its label), and the broken saga row.
async fn insert_corpus(path: &std::path::Path, queue: &str, corpus: &shared::Corpus) -> Vec<String> {
    let pool = SqlitePool::connect_with(SqliteConnectOptions::new().filename(path))
        .await
        .unwrap();
    let (entity, mut seq): (i64, i64) =
        sqlx::query_as("SELECT id, next_seq FROM courier_entity WHERE name = ?1 AND parent = 0")
            .bind(queue)
            .fetch_one(&pool)
            .await
            .unwrap();
    let now = chrono::Utc::now().timestamp_micros();
    let mut refused = Vec::new();
    for (case, raw) in corpus.sequence(shared::Producer::EmbeddedRows) {
        if let Some((correlation, state)) = case.and_then(|c| c.saga_row) {
            sqlx::query(
                "INSERT INTO courier_saga (saga_type, correlation, state, version, created_at, updated_at) \
                 VALUES ('corpus.Booking', ?1, ?2, 1, ?3, ?3)",
            )
            .bind(correlation)
            .bind(state)
            .bind(now)
            .execute(&pool)
            .await
            .unwrap();
        }
        let scheduled = raw.scheduled.map(|s| s.at().timestamp_micros());
        let inserted = sqlx::query(
            "INSERT INTO courier_message (id, entity_id, seq, state, delivery_count, enqueued_at, scheduled_at, \
             message_id, correlation_id, message_type, content_type, properties, body) \
             VALUES (?1, ?2, ?3, ?4, 0, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
        )
        .bind((entity << 40) | seq)
        .bind(entity)
        .bind(seq)
        .bind(if scheduled.is_some() { 1 } else { 0 })
        .bind(now)
        .bind(scheduled)
        .bind(raw.message_id())
        .bind(raw.correlation_id.as_deref())
        .bind(raw.message_type.as_deref())
        .bind(raw.content_type.as_deref())
        .bind(raw.properties_json())
        .bind(raw.body.as_slice())
        .execute(&pool)
        .await;
        match inserted {
            Ok(_) => seq += 1,
            Err(e) => {
                assert!(e.to_string().contains("NOT NULL"), "{}: {e}", raw.label);
                refused.push(raw.label.clone());
            }
        }
    }
    sqlx::query("UPDATE courier_entity SET next_seq = ?1 WHERE id = ?2")
        .bind(seq)
        .bind(entity)
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    refused
}

/// Issue 18, point 3: the corpus every transport shares (`courier_tests::corpus`), as rows
/// another program wrote into the broker's file, handled by an endpoint with the
/// broker's own store, a plain handler and a saga with a timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_corpus_written_as_rows_is_dead_lettered_case_by_case_and_the_valid_messages_are_handled_once() {
    let dir = tempfile::tempdir().unwrap();
    let queue = "corpus-shared";
    let path = broker_file(&dir, queue).await;
    let corpus = shared::corpus();
    let refused = insert_corpus(&path, queue, &corpus).await;

    let broker = Embedded::open(&path).await.unwrap();
    let seen = shared::Seen::default();
    let endpoint = shared::endpoint(
        Endpoint::builder(queue).transport(broker.clone()).store(broker.store()),
        queue,
        &seen,
    )
    .start()
    .await
    .unwrap();
    let transport: Arc<dyn Transport> = Arc::new(broker.clone());
    let (handled, want_dead) = shared::totals(&corpus, shared::Producer::EmbeddedRows);
    let settled = shared::settle(|| async {
        let c = counts(&transport, queue).await;
        seen.calls().len() >= handled && c.active == 0 && c.scheduled == 0 && c.dead_lettered >= want_dead as u64
    })
    .await;
    let outcome = shared::Outcome {
        calls: seen.calls(),
        dead: dead_letters_of(&broker, queue).await,
        refused,
    };
    for line in shared::check(&corpus, shared::Producer::EmbeddedRows, &outcome) {
        eprintln!("{line}");
    }
    let c = counts(&transport, queue).await;
    assert!(settled, "nothing left active or scheduled: {c:?}");
    // Nothing stuck: the valid booking closed (its timeout cancelled), the broken one
    // kept as stored for an operator.
    let pool = broker.read_pool();
    let sagas: Vec<String> = sqlx::query_scalar("SELECT correlation FROM courier_saga")
        .fetch_all(pool)
        .await
        .unwrap();
    assert_eq!(sagas, [shared::BROKEN_BOOKING]);
    let timeouts: i64 = sqlx::query_scalar("SELECT count(*) FROM courier_saga_timeout")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(timeouts, 0, "no timeout left");
    endpoint.shutdown().await.unwrap();
    broker.close().await;
}
