//! A store whose history was written before the history told of timeouts (migration
//! `20261205000001_history_timeouts`) keeps every event and its instance index through
//! the upgrade, and then takes the dispatcher's events (`timeout_dispatched`,
//! `timeout_dead_lettered`) and still refuses an outcome none of Courier's. On SQLite the
//! migration builds the table anew (a CHECK cannot change in place) and sets the index's
//! rows aside, as dropping the old table would otherwise empty the index by its cascade.
//! And a Postgres history from before an event's first saga instance moved into its row
//! (migration `20261208000001_history_first_instance`) reads as one timeline with the
//! events written after it.

use std::path::Path;

use courier::admin::{HistoryAdmin, HistoryFilter, PostgresAdmin};
use courier::{PostgresStore, SqliteStore, Store};
use courier_tests::pg::TestDatabase;
use sqlx::migrate::Migrator;

/// The last migration before the one under test.
const BEFORE: i64 = 20261203000001;

/// `dir`'s migrations up to `last`, recorded in `table` as the store records them.
pub(super) async fn migrations_up_to(dir: &str, table: &'static str, last: i64) -> Migrator {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(dir);
    let mut migrator = Migrator::new(path).await.unwrap();
    migrator.migrations = migrator
        .migrations
        .iter()
        .filter(|m| m.version <= last)
        .cloned()
        .collect::<Vec<_>>()
        .into();
    migrator.dangerous_set_table_name(table);
    migrator
}

#[tokio::test]
async fn a_sqlite_history_keeps_its_events_and_index_through_the_upgrade() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("store.db");
    let store = SqliteStore::open(&file).await.unwrap();
    let pool = store.pool().clone();
    migrations_up_to("migrations/sqlite", "courier_migrations", BEFORE)
        .await
        .run(&pool)
        .await
        .unwrap();
    for (id, kind) in [(1, "handled"), (2, "retried"), (3, "handled")] {
        sqlx::query(
            "INSERT INTO courier_history (id, endpoint, kind, at, message_id, attempt, detail) \
             VALUES (?1, 'flows', ?2, 1000, 'm-' || ?1, 1, '{}')",
        )
        .bind(id)
        .bind(kind)
        .execute(&pool)
        .await
        .unwrap();
    }
    for id in [1, 3] {
        sqlx::query("INSERT INTO courier_history_instance VALUES (?1, 'tests.Flow', 'c-1')")
            .bind(id)
            .execute(&pool)
            .await
            .unwrap();
    }
    let refused = sqlx::query(
        "INSERT INTO courier_history (endpoint, kind, at, message_id, attempt, detail) \
         VALUES ('flows', 'timeout_dispatched', 1, 'm', 1, '{}')",
    )
    .execute(&pool)
    .await;
    assert!(refused.is_err(), "before the upgrade the new outcomes are refused");

    store.migrate().await.unwrap();

    let rows: Vec<(i64, String)> = sqlx::query_as("SELECT id, kind FROM courier_history ORDER BY id")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(
        rows,
        vec![(1, "handled".into()), (2, "retried".into()), (3, "handled".into())]
    );
    let index: Vec<i64> = sqlx::query_scalar(
        "SELECT history_id FROM courier_history_instance WHERE saga_type = 'tests.Flow' AND correlation = 'c-1' \
         ORDER BY history_id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(index, vec![1, 3], "the instance index kept");
    for kind in ["timeout_dispatched", "timeout_dead_lettered"] {
        sqlx::query(
            "INSERT INTO courier_history (endpoint, kind, at, message_id, attempt, detail) \
             VALUES ('flows', ?1, 2000, 't-1', 1, '{}')",
        )
        .bind(kind)
        .execute(&pool)
        .await
        .unwrap();
    }
    let next: i64 = sqlx::query_scalar("SELECT MAX(id) FROM courier_history")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(next, 5, "ids go on after the kept ones");
    let bogus = sqlx::query(
        "INSERT INTO courier_history (endpoint, kind, at, message_id, attempt, detail) \
         VALUES ('flows', 'lost', 1, 'm', 1, '{}')",
    )
    .execute(&pool)
    .await;
    assert!(bogus.is_err(), "an outcome none of Courier's is still refused");
    // The index still follows its events: deleting one deletes its index row.
    sqlx::query("DELETE FROM courier_history WHERE id = 1")
        .execute(&pool)
        .await
        .unwrap();
    let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM courier_history_instance")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left, 1, "ON DELETE CASCADE kept");
}

/// A new database with the Postgres migrations up to `last` applied.
async fn postgres_up_to(last: i64) -> (TestDatabase, sqlx::PgPool) {
    let db = TestDatabase::create().await;
    let pool = db.pool().await;
    sqlx::query("CREATE SCHEMA IF NOT EXISTS courier")
        .execute(&pool)
        .await
        .unwrap();
    migrations_up_to("migrations/postgres", "courier.migrations", last)
        .await
        .run(&pool)
        .await
        .unwrap();
    (db, pool)
}

#[tokio::test]
async fn a_postgres_history_keeps_its_events_through_the_upgrade() {
    let (db, pool) = postgres_up_to(BEFORE).await;
    sqlx::query(
        "INSERT INTO courier.history (endpoint, kind, at, message_id, attempt, detail) \
         VALUES ('flows', 'handled', now(), 'm-1', 1, '{}')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let store = PostgresStore::from_pool(pool.clone());
    store.migrate().await.unwrap();
    for kind in ["timeout_dispatched", "timeout_dead_lettered"] {
        sqlx::query(
            "INSERT INTO courier.history (endpoint, kind, at, message_id, attempt, detail) \
             VALUES ('flows', $1, now(), 't-1', 1, '{}')",
        )
        .bind(kind)
        .execute(&pool)
        .await
        .unwrap();
    }
    let kinds: Vec<String> = sqlx::query_scalar("SELECT kind FROM courier.history ORDER BY id")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(kinds, ["handled", "timeout_dispatched", "timeout_dead_lettered"]);
    let bogus = sqlx::query(
        "INSERT INTO courier.history (endpoint, kind, at, message_id, attempt, detail) \
         VALUES ('flows', 'lost', now(), 'm', 1, '{}')",
    )
    .execute(&pool)
    .await;
    assert!(bogus.is_err(), "an outcome none of Courier's is still refused");
    pool.close().await;
    db.drop_now().await;
}

/// The last migration before the one that keeps an event's first saga instance in its row.
const BEFORE_FIRST_INSTANCE: i64 = 20261207000002;

/// An event of a Postgres history written before migration
/// `20261208000001_history_first_instance` (its instance in `courier.history_instance`)
/// and one written after (its first instance in its row, its second in the table) read as
/// one timeline of the instance; a plain delete of both leaves no instance behind.
#[tokio::test]
async fn a_postgres_history_keeps_its_timelines_through_the_first_instance_upgrade() {
    let (db, pool) = postgres_up_to(BEFORE_FIRST_INSTANCE).await;
    let at = chrono::Utc::now() - chrono::Duration::minutes(5);
    sqlx::query(
        "WITH e AS (INSERT INTO courier.history (endpoint, kind, at, message_id, attempt, detail) \
         VALUES ('flows', 'handled', $1, 'old-1', 1, '{}') RETURNING id) \
         INSERT INTO courier.history_instance (history_id, saga_type, correlation) SELECT id, 'tests.Flow', 'c-1' FROM e",
    )
    .bind(at)
    .execute(&pool)
    .await
    .unwrap();
    let store = PostgresStore::from_pool(pool.clone());
    store.migrate().await.unwrap();
    let event = new_event_of_two_sagas();
    let courier::Begin::Fresh(mut work) = store.begin("flows", "new-1", None, chrono::Utc::now()).await.unwrap() else {
        panic!("a fresh message id was taken for a duplicate");
    };
    work.record_history(&event).await.unwrap();
    work.commit().await.unwrap();
    let admin = PostgresAdmin::new(pool.clone());
    for saga_type in ["tests.Flow", "tests.Other"] {
        let timeline = admin
            .saga_history(saga_type, "c-1", &HistoryFilter::default())
            .await
            .unwrap();
        let ids: Vec<&str> = timeline.events.iter().map(|e| e.event.message_id.as_str()).collect();
        let expected: &[&str] = if saga_type == "tests.Flow" {
            &["old-1", "new-1"]
        } else {
            &["new-1"]
        };
        assert_eq!(ids, expected, "{saga_type}: the events before and after the upgrade");
    }
    let (inline, in_table): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM courier.history WHERE saga_type IS NOT NULL), \
         (SELECT count(*) FROM courier.history_instance)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        (inline, in_table),
        (1, 2),
        "the new event's first instance in its row, the old one's and the second in the table"
    );
    sqlx::query("DELETE FROM courier.history").execute(&pool).await.unwrap();
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM courier.history_instance_all")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left, 0, "a plain delete takes every instance");
    pool.close().await;
    db.drop_now().await;
}

/// A handled event, message `new-1` of endpoint `flows`, that touched two saga instances
/// of correlation `c-1`: `tests.Flow` (its first) and `tests.Other`.
pub(super) fn new_event_of_two_sagas() -> courier::HistoryEvent {
    let change = |saga_type: &str| courier::SagaChange {
        saga_type: saga_type.to_owned(),
        correlation: "c-1".to_owned(),
        after: Some("{}".to_owned()),
        ..Default::default()
    };
    courier::HistoryEvent {
        endpoint: "flows".to_owned(),
        kind: courier::HistoryKind::Handled,
        at: chrono::Utc::now(),
        message_id: "new-1".to_owned(),
        message_type: None,
        conversation_id: None,
        causation_id: None,
        attempt: 1,
        enqueued_at: None,
        received_at: None,
        detail: courier::HistoryDetail {
            sagas: vec![change("tests.Flow"), change("tests.Other")],
            ..Default::default()
        },
    }
}
