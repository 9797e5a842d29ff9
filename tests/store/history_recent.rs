//! The SQLite stores write a handled event that names no saga instance to
//! `courier_history_recent`, an unindexed table (its saga instances to
//! `courier_history_instance_recent`), and move those rows into the indexed tables every
//! 512 ids (issue 33's cost; docs/history.md, "Cost"). Over any
//! sequence of events (any field, with and without saga instances, long enough to cross
//! the marks), on the SQLite store and the embedded broker's file: every event is read
//! back once, as written and in the order written, through `courier_history_all` and the
//! admin's reads; ids are one increasing sequence over both tables; every event at or
//! below the last mark crossed was moved with its instance rows, its id kept; and each
//! event's saga instances are there once. Events are written both in a handling's transaction (with its
//! `COMMIT`) and on their own (as a failed attempt's).

use std::path::Path;

use courier::admin::{HistoryAdmin, HistoryFilter, SqliteAdmin};
use courier::{Embedded, HistoryEvent, SqliteStore, Store};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use super::history_rows::event;

/// `courier::store`'s mark: every this many ids, the recent rows move.
const MOVE_EVERY: i64 = 512;

pub(super) fn failed(e: impl std::fmt::Display) -> TestCaseError {
    TestCaseError::fail(e.to_string())
}

/// An event, most often (four in five) naming no saga instance, as a plain handler's.
pub(super) fn mostly_plain_event() -> impl Strategy<Value = HistoryEvent> {
    (event(), proptest::bool::weighted(0.8)).prop_map(|(mut e, plain)| {
        if plain {
            e.detail.sagas.clear();
            e.detail.timeout = None;
        }
        e
    })
}

/// Some events, long enough to cross one or two marks.
fn events() -> impl Strategy<Value = Vec<HistoryEvent>> {
    (300_usize..1_200).prop_flat_map(|n| proptest::collection::vec(mostly_plain_event(), n..=n))
}

/// Records the `i`th event: one in three on its own (as a failed attempt's event is
/// written), the others in a handling's transaction, written with its `COMMIT`.
pub(super) async fn write(store: &dyn Store, i: usize, event: &HistoryEvent) -> Result<(), TestCaseError> {
    if i.is_multiple_of(3) {
        return store.record_history(event).await.map_err(failed);
    }
    let now = chrono::Utc::now();
    match store
        .begin("orders", &format!("m{i}"), None, now)
        .await
        .map_err(failed)?
    {
        courier::Begin::Fresh(mut work) => {
            work.record_history(event).await.map_err(failed)?;
            work.commit().await.map_err(failed)?;
            Ok(())
        }
        courier::Begin::Duplicate(_) => Err(failed("a fresh id was taken for a duplicate")),
    }
}

async fn read_only(file: &Path) -> sqlx::SqlitePool {
    let options = sqlx::sqlite::SqliteConnectOptions::new().filename(file).read_only(true);
    sqlx::SqlitePool::connect_with(options).await.unwrap()
}

/// What the file holds after `written` was recorded, in order, into a new file.
async fn check_file(pool: &sqlx::SqlitePool, written: &[HistoryEvent]) -> Result<(), TestCaseError> {
    let rows: Vec<(i64, Vec<u8>, i64, String)> =
        sqlx::query_as("SELECT id, message_id, attempt, detail FROM courier_history_all ORDER BY id")
            .fetch_all(pool)
            .await
            .map_err(failed)?;
    prop_assert_eq!(rows.len(), written.len(), "every event is read back once");
    for (i, ((id, message_id, attempt, detail), event)) in rows.iter().zip(written).enumerate() {
        prop_assert_eq!(
            *id,
            i64::try_from(i).map_err(failed)? + 1,
            "ids are one sequence over both tables"
        );
        prop_assert_eq!(message_id.as_slice(), event.message_id.as_bytes());
        prop_assert_eq!(*attempt, i64::from(event.attempt));
        let read: courier::HistoryDetail = serde_json::from_str(detail).map_err(failed)?;
        prop_assert_eq!(&read, &event.detail);
    }
    let last_mark = i64::try_from(written.len()).map_err(failed)? / MOVE_EVERY * MOVE_EVERY;
    let (recent_min, recent_rows): (Option<i64>, i64) =
        sqlx::query_as("SELECT min(id), count(*) FROM courier_history_recent")
            .fetch_one(pool)
            .await
            .map_err(failed)?;
    prop_assert!(
        recent_min.is_none_or(|min| min > last_mark),
        "every event up to the last mark ({}) was moved; the recent table starts at {:?}",
        last_mark,
        recent_min
    );
    prop_assert!(recent_rows < MOVE_EVERY);
    let moved: i64 = sqlx::query_scalar("SELECT count(*) FROM courier_history WHERE id <= ?1")
        .bind(last_mark)
        .fetch_one(pool)
        .await
        .map_err(failed)?;
    prop_assert_eq!(moved, last_mark, "the moved events kept their ids");
    let orphans: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM courier_history_instance_all i WHERE NOT EXISTS \
         (SELECT 1 FROM courier_history_all h WHERE h.id = i.history_id)",
    )
    .fetch_one(pool)
    .await
    .map_err(failed)?;
    prop_assert_eq!(orphans, 0, "every instance row names an event");
    let misplaced: i64 =
        sqlx::query_scalar("SELECT count(*) FROM courier_history_instance_recent i WHERE i.history_id <= ?1")
            .bind(last_mark)
            .fetch_one(pool)
            .await
            .map_err(failed)?;
    prop_assert_eq!(misplaced, 0, "the moved events' instance rows moved with them");
    let instances: Vec<(i64, String, String)> = sqlx::query_as(
        "SELECT history_id, saga_type, correlation FROM courier_history_instance_all \
         ORDER BY history_id, saga_type, correlation",
    )
    .fetch_all(pool)
    .await
    .map_err(failed)?;
    let mut expected = Vec::new();
    for (i, event) in written.iter().enumerate() {
        let id = i64::try_from(i).map_err(failed)? + 1;
        expected.extend(
            event
                .instances()
                .into_iter()
                .map(|(t, c)| (id, t.to_owned(), c.to_owned())),
        );
    }
    prop_assert_eq!(instances, expected, "each event's saga instances, once");
    // The admin's reads see both tables: the first event (moved when a mark was crossed)
    // and the last (still recent unless it named an instance).
    admin_reads_first_and_last(pool, written).await
}

/// `SqliteAdmin` reads the first and the last of `written` by their message ids.
pub(super) async fn admin_reads_first_and_last(
    pool: &sqlx::SqlitePool,
    written: &[HistoryEvent],
) -> Result<(), TestCaseError> {
    let admin = SqliteAdmin::new(pool.clone());
    for event in [written.first(), written.last()].into_iter().flatten() {
        let read = admin
            .message_history(&event.message_id, &HistoryFilter::default())
            .await
            .map_err(failed)?;
        prop_assert!(
            read.root.events.iter().any(|e| e.event.detail == event.detail),
            "the admin reads the event of {:?}",
            event.message_id
        );
    }
    Ok(())
}

/// A store on a new file, and what must live as long as it (the embedded broker).
pub(super) type Opened = (Box<dyn Store>, Box<dyn std::any::Any>);

/// Opens a store on the file.
pub(super) type Open = fn(&Path) -> std::pin::Pin<Box<dyn Future<Output = Opened>>>;

fn run(open: Open) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    courier_tests::run_property(
        &rt,
        courier_tests::fuzz_cases(6),
        &events(),
        move |_, written| async move {
            let dir = tempfile::tempdir().map_err(failed)?;
            let file = dir.path().join("history.db");
            let (store, keep) = open(&file).await;
            for (i, event) in written.iter().enumerate() {
                write(store.as_ref(), i, event).await?;
            }
            let pool = read_only(&file).await;
            let checked = check_file(&pool, &written).await;
            pool.close().await;
            drop(store);
            drop(keep);
            checked
        },
    );
}

/// A migrated `SqliteStore` on the file.
pub(super) fn sqlite_store(file: &Path) -> std::pin::Pin<Box<dyn Future<Output = Opened>>> {
    let file = file.to_owned();
    Box::pin(async move {
        let store = SqliteStore::open(&file).await.unwrap();
        store.migrate().await.unwrap();
        (
            Box::new(store) as Box<dyn Store>,
            Box::new(()) as Box<dyn std::any::Any>,
        )
    })
}

/// The store of an embedded broker on the file, and the broker.
pub(super) fn embedded_store(file: &Path) -> std::pin::Pin<Box<dyn Future<Output = Opened>>> {
    let file = file.to_owned();
    Box::pin(async move {
        let broker = Embedded::open(&file).await.unwrap();
        (
            Box::new(broker.store()) as Box<dyn Store>,
            Box::new(broker) as Box<dyn std::any::Any>,
        )
    })
}

#[test]
fn sqlite_store_moves_recent_events_and_reads_them_all() {
    run(sqlite_store);
}

#[test]
fn embedded_store_moves_recent_events_and_reads_them_all() {
    run(embedded_store);
}
