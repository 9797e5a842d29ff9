//! Every history event an endpoint may write is stored (issue 33): its message id, type,
//! correlation and causation are what a producer sent (any text, NUL and all), its
//! enqueued time what the broker or a producer stamped (anywhere in chrono's range), its
//! attempt any number, its detail any error, state and body. A write that failed would
//! fail the handling it describes. On SQLite each value is read back as written; on
//! Postgres, whose `text` holds no NUL and whose `timestamptz` ends sooner than chrono,
//! a NUL reads back as U+FFFD and a time outside the range is left out, saying so.

use chrono::{DateTime, TimeZone, Utc};
use courier::{
    HistoryDetail, HistoryEvent, HistoryKind, PostgresStore, SagaChange, SentMessage, SqliteStore, Store,
    TimeoutDispatch, TimeoutMark,
};
use courier_tests::pg::TestDatabase;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

/// Any text, with NUL and the other control characters likely.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[\\x00-\\x1f a-z\u{80}-\u{10ffff}]{0,12}",
        Just(String::new())
    ]
}

/// Any instant chrono can hold.
fn time() -> impl Strategy<Value = DateTime<Utc>> {
    let (min, max) = (
        DateTime::<Utc>::MIN_UTC.timestamp_micros(),
        DateTime::<Utc>::MAX_UTC.timestamp_micros(),
    );
    prop_oneof![
        Just(min),
        Just(max),
        min..=max,
        -62_000_000_000_000_000_i64..253_000_000_000_000_000
    ]
    .prop_map(|us| Utc.timestamp_micros(us).single().unwrap_or(DateTime::<Utc>::UNIX_EPOCH))
}

fn saga() -> impl Strategy<Value = SagaChange> {
    (
        text(),
        text(),
        proptest::option::of(text()),
        proptest::option::of(text()),
        any::<bool>(),
        proptest::collection::vec(mark(), 0..3),
        proptest::collection::vec(text(), 0..3),
    )
        .prop_map(
            |(saga_type, correlation, before, after, completed, requested, cancelled)| SagaChange {
                saga_type,
                correlation,
                before,
                after,
                completed,
                timeouts_requested: requested,
                timeouts_cancelled: cancelled,
                ..SagaChange::default()
            },
        )
}

fn mark() -> impl Strategy<Value = TimeoutMark> {
    (
        text(),
        proptest::option::of(text()),
        proptest::option::of(text()),
        time(),
    )
        .prop_map(|(id, key, message_type, due)| TimeoutMark {
            id,
            key,
            message_type,
            due,
        })
}

/// A dispatcher's timeout: any saga, correlation and mark.
fn timeout() -> impl Strategy<Value = TimeoutDispatch> {
    (text(), text(), mark()).prop_map(|(saga_type, correlation, mark)| TimeoutDispatch {
        saga_type,
        correlation,
        mark,
    })
}

pub(crate) fn event() -> impl Strategy<Value = HistoryEvent> {
    let kind = proptest::sample::select(HistoryKind::ALL.to_vec());
    let ids = (
        text(),
        proptest::option::of(text()),
        proptest::option::of(text()),
        proptest::option::of(text()),
    );
    let times = (time(), proptest::option::of(time()), proptest::option::of(time()));
    let detail = (
        proptest::option::of(text()),
        proptest::option::of(text()),
        proptest::collection::vec((text(), text(), any::<bool>(), proptest::option::of(time())), 0..3),
        proptest::collection::vec(saga(), 0..3),
        proptest::option::of(text()),
        proptest::option::of(timeout()),
    )
        .prop_map(|(error, reason, sent, sagas, body, timeout)| HistoryDetail {
            error,
            reason,
            sent: sent
                .into_iter()
                .map(|(message_id, destination, topic, due)| SentMessage {
                    message_id,
                    message_type: None,
                    destination,
                    topic,
                    due,
                })
                .collect(),
            sagas,
            timeout,
            body,
            cut: Vec::new(),
        });
    (kind, ids, times, any::<u32>(), detail).prop_map(
        |(
            kind,
            (message_id, message_type, conversation_id, causation_id),
            (at, enqueued_at, received_at),
            attempt,
            detail,
        )| {
            HistoryEvent {
                endpoint: "orders".to_owned(),
                kind,
                at,
                message_id,
                message_type,
                conversation_id,
                causation_id,
                attempt,
                enqueued_at,
                received_at,
                detail,
            }
        },
    )
}

/// The last row's message id, attempt and detail.
async fn last_sqlite(pool: &sqlx::SqlitePool) -> (String, i64, String) {
    sqlx::query_as("SELECT message_id, attempt, detail FROM courier_history_all ORDER BY id DESC LIMIT 1")
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn last_pg(pool: &sqlx::PgPool) -> (String, i32, String) {
    sqlx::query_as("SELECT message_id, attempt, detail::text FROM courier.history ORDER BY id DESC LIMIT 1")
        .fetch_one(pool)
        .await
        .unwrap()
}

fn failed(e: impl std::fmt::Display) -> TestCaseError {
    TestCaseError::fail(e.to_string())
}

#[test]
fn any_event_is_stored_in_sqlite_as_written() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = rt.block_on(async {
        let store = SqliteStore::open(dir.path().join("history.db")).await.unwrap();
        store.migrate().await.unwrap();
        store
    });
    courier_tests::run_property(&rt, courier_tests::fuzz_cases(64), &event(), |_, event| {
        let store = store.clone();
        async move {
            store.record_history(&event).await.map_err(failed)?;
            let (id, attempt, detail) = last_sqlite(store.pool()).await;
            prop_assert_eq!(id, event.message_id);
            prop_assert_eq!(attempt, i64::from(event.attempt));
            let read: HistoryDetail = serde_json::from_str(&detail).map_err(failed)?;
            prop_assert_eq!(read, event.detail);
            Ok(())
        }
    });
}

#[test]
fn any_event_is_stored_in_postgres_with_nul_and_far_times_made_storable() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (db, pool) = rt.block_on(async {
        let db = TestDatabase::create().await;
        let pool = db.pool().await;
        PostgresStore::from_pool(pool.clone()).migrate().await.unwrap();
        (db, pool)
    });
    let store = PostgresStore::from_pool(pool.clone());
    courier_tests::run_property(&rt, courier_tests::fuzz_cases(64), &event(), |_, event| {
        let (store, pool) = (store.clone(), pool.clone());
        async move {
            store.record_history(&event).await.map_err(failed)?;
            let (id, attempt, detail) = last_pg(&pool).await;
            prop_assert_eq!(id, event.message_id.replace('\0', "\u{FFFD}"));
            prop_assert_eq!(attempt, i32::try_from(event.attempt).unwrap_or(i32::MAX));
            let read: HistoryDetail = serde_json::from_str(&detail).map_err(failed)?;
            prop_assert_eq!(read.sagas.len(), event.detail.sagas.len());
            prop_assert_eq!(read.timeout.is_some(), event.detail.timeout.is_some());
            prop_assert!(!detail.contains("\\u0000"), "no NUL reached Postgres: {}", detail);
            Ok(())
        }
    });
    rt.block_on(async {
        pool.close().await;
        db.drop_now().await;
    });
}
