//! Rows another writer puts in the SQLite history's tables (an operator's script, a test
//! staging odd rows, a tool) never stop Courier recording, moving or reading its own
//! events (issue 33; docs/history.md, "Cost"). Between Courier's events, on the SQLite
//! store and the embedded broker's file, another connection inserts event rows into
//! `courier_history` and `courier_history_recent` with any id or none (SQLite then takes
//! one more than that table's largest, which the other table may hold), including every
//! extreme up to the largest SQLite allows (a recent row one time in two with a first
//! saga instance in its own columns), and instance rows naming any event id, in both
//! instance tables, the same instance as such a recent row names when the ids meet. Checked: every Courier write succeeds; once a move follows,
//! both recent tables are empty; every Courier event is read back once with exactly its
//! saga instances (whatever id it ended with); every event row the other writer got in
//! is there once; the admin reads the first and the last of Courier's.

use std::collections::BTreeMap;

use courier::HistoryEvent;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use super::history_recent::{
    Open, admin_reads_first_and_last, embedded_store, failed, mostly_plain_event, sqlite_store, write,
};

/// `courier::store`'s mark: every this many ids, the recent rows move.
const MOVE_EVERY: usize = 512;

/// The saga type of the other writer's instance rows (Courier's events never name it:
/// the generator's types are shorter than this mark, or it would show as an extra).
const OUTSIDER_SAGA: &str = "outsider\u{1}saga\u{1}type";

/// An event table or an instance table.
#[derive(Debug, Clone, Copy)]
enum Table {
    History,
    HistoryRecent,
    Instance,
    InstanceRecent,
}

impl Table {
    fn name(self) -> &'static str {
        match self {
            Table::History => "courier_history",
            Table::HistoryRecent => "courier_history_recent",
            Table::Instance => "courier_history_instance",
            Table::InstanceRecent => "courier_history_instance_recent",
        }
    }
}

/// One insert by the other writer: into `table`, with this id (the event's, or the event
/// an instance row names); `None` leaves an event's id to SQLite.
#[derive(Debug, Clone)]
struct Outsider {
    table: Table,
    id: Option<i64>,
}

/// Any id, weighted to the ones that collide with Courier's (small, near the marks) and
/// to the extremes.
fn id() -> impl Strategy<Value = Option<i64>> {
    prop_oneof![
        3 => Just(None),
        2 => (0_i64..3_000).prop_map(Some),
        1 => any::<i64>().prop_map(Some),
        2 => proptest::sample::select(vec![
            i64::MIN,
            -1,
            0,
            1,
            511,
            512,
            513,
            (1 << 62) - 2,
            (1 << 62) - 1,
            1 << 62,
            i64::MAX - 1,
            i64::MAX,
        ])
        .prop_map(Some),
    ]
}

fn outsider() -> impl Strategy<Value = Outsider> {
    let table = proptest::sample::select(vec![
        Table::History,
        Table::HistoryRecent,
        Table::Instance,
        Table::InstanceRecent,
    ]);
    (table, id()).prop_map(|(table, id)| Outsider { table, id })
}

/// Courier's events, and the other writer's inserts, each with the index of the event
/// it comes before.
fn program() -> impl Strategy<Value = (Vec<HistoryEvent>, Vec<(usize, Outsider)>)> {
    (300_usize..1_100).prop_flat_map(|n| {
        (
            proptest::collection::vec(mostly_plain_event(), n..=n),
            proptest::collection::vec((0..n, outsider()), 1..40),
        )
    })
}

/// Runs `o`, the `k`th insert of the other writer, on its own connection; whether the
/// row got in (an insert SQLite refuses, a taken id or a missing event, is the other
/// writer's failure, not Courier's).
async fn insert(pool: &sqlx::SqlitePool, k: usize, o: &Outsider) -> bool {
    let done = match o.table {
        Table::History | Table::HistoryRecent => {
            // A recent row may name a first saga instance in its own columns, as Courier's
            // do; every other one does, with the correlation of the other writer's instance
            // rows, so that an instance row may name the same instance again.
            let (columns, values) = match o.table {
                Table::HistoryRecent => (", saga_type, correlation", ", ?4, 'c'"),
                _ => ("", ""),
            };
            let sql = format!(
                "INSERT INTO {} (id, endpoint, kind, at, message_id, attempt, detail{columns}) \
                 VALUES (?1, 'outsider', 'handled', 0, ?2, 0, ?3{values})",
                o.table.name()
            );
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(o.id)
                .bind(format!("outsider-{k}"))
                .bind(format!("{{\"outsider\": {k}}}"))
                .bind(k.is_multiple_of(2).then_some(OUTSIDER_SAGA))
                .execute(pool)
                .await
        }
        Table::Instance | Table::InstanceRecent => {
            let sql = format!(
                "INSERT INTO {} (history_id, saga_type, correlation) VALUES (?1, ?2, ?3)",
                o.table.name()
            );
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(o.id.unwrap_or(1))
                .bind(OUTSIDER_SAGA)
                .bind("c")
                .execute(pool)
                .await
        }
    };
    done.is_ok()
}

async fn count(pool: &sqlx::SqlitePool, sql: &'static str) -> Result<i64, TestCaseError> {
    sqlx::query_scalar(sql).fetch_one(pool).await.map_err(failed)
}

/// An event as read back or written: message id, attempt, detail, its saga instances.
type Seen = (Vec<u8>, i64, courier::HistoryDetail, Vec<(String, String)>);

async fn check(pool: &sqlx::SqlitePool, written: &[HistoryEvent], outsiders_in: usize) -> Result<(), TestCaseError> {
    prop_assert_eq!(count(pool, "SELECT count(*) FROM courier_history_recent").await?, 0);
    prop_assert_eq!(
        count(pool, "SELECT count(*) FROM courier_history_instance_recent").await?,
        0
    );
    let rows: Vec<(i64, Vec<u8>, i64, String)> = sqlx::query_as(
        "SELECT id, message_id, attempt, detail FROM courier_history \
         WHERE json_extract(detail, '$.outsider') IS NULL",
    )
    .fetch_all(pool)
    .await
    .map_err(failed)?;
    let instances: Vec<(i64, String, String)> =
        sqlx::query_as("SELECT history_id, saga_type, correlation FROM courier_history_instance WHERE saga_type <> ?1")
            .bind(OUTSIDER_SAGA)
            .fetch_all(pool)
            .await
            .map_err(failed)?;
    let mut by_id: BTreeMap<i64, Vec<(String, String)>> = BTreeMap::new();
    for (id, t, c) in instances {
        by_id.entry(id).or_default().push((t, c));
    }
    let mut read: Vec<Seen> = Vec::new();
    for (id, message_id, attempt, detail) in rows {
        let detail: courier::HistoryDetail = serde_json::from_str(&detail).map_err(failed)?;
        let mut mine = by_id.remove(&id).unwrap_or_default();
        mine.sort();
        read.push((message_id, attempt, detail, mine));
    }
    prop_assert!(
        by_id.is_empty(),
        "instance rows with no event of Courier's: {:?}",
        by_id
    );
    let mut expected: Vec<Seen> = written
        .iter()
        .map(|e| {
            let mut mine: Vec<(String, String)> = e
                .instances()
                .into_iter()
                .map(|(t, c)| (t.to_owned(), c.to_owned()))
                .collect();
            mine.sort();
            (
                e.message_id.as_bytes().to_vec(),
                i64::from(e.attempt),
                e.detail.clone(),
                mine,
            )
        })
        .collect();
    let key = |s: &Seen| format!("{:?}", s);
    read.sort_by_key(key);
    expected.sort_by_key(key);
    prop_assert_eq!(read.len(), expected.len(), "every event of Courier's is read back once");
    prop_assert!(
        read == expected,
        "each event as written, with exactly its saga instances"
    );
    prop_assert_eq!(
        count(
            pool,
            "SELECT count(*) FROM courier_history WHERE json_extract(detail, '$.outsider') IS NOT NULL"
        )
        .await?,
        i64::try_from(outsiders_in).map_err(failed)?,
        "every event row the other writer got in is kept"
    );
    admin_reads_first_and_last(pool, written).await
}

fn run(open: Open) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    courier_tests::run_property(
        &rt,
        courier_tests::fuzz_cases(6),
        &(program(), mostly_plain_event()),
        move |_, ((mut written, outsiders), tail)| async move {
            let dir = tempfile::tempdir().map_err(failed)?;
            let file = dir.path().join("history.db");
            let (store, keep) = open(&file).await;
            let options = sqlx::sqlite::SqliteConnectOptions::new()
                .filename(&file)
                .busy_timeout(std::time::Duration::from_secs(30));
            let other = sqlx::SqlitePool::connect_with(options).await.map_err(failed)?;
            let mut outsiders_in = 0;
            let mut next = outsiders.iter().enumerate().peekable();
            for (i, event) in written.iter().enumerate() {
                while let Some((k, (_, o))) = next.next_if(|(_, (before, _))| *before <= i) {
                    if insert(&other, k, o).await && matches!(o.table, Table::History | Table::HistoryRecent) {
                        outsiders_in += 1;
                    }
                }
                write(store.as_ref(), i, event).await?;
            }
            // Courier's events on, until a move followed the other writer's rows: the
            // recent table is empty right after one (the writer that crossed a mark moves
            // every recent row, its own included, before it returns).
            let mut moved = false;
            for _ in 0..20 * MOVE_EVERY {
                let event = &tail;
                store.record_history(event).await.map_err(failed)?;
                written.push(event.clone());
                if count(&other, "SELECT count(*) FROM courier_history_recent").await? == 0 {
                    moved = true;
                    break;
                }
            }
            prop_assert!(moved, "no move emptied the recent table in {} events", 20 * MOVE_EVERY);
            let checked = check(&other, &written, outsiders_in).await;
            other.close().await;
            drop(store);
            drop(keep);
            checked
        },
    );
}

#[test]
fn sqlite_store_records_and_moves_whatever_another_writer_inserted() {
    run(sqlite_store);
}

#[test]
fn embedded_store_records_and_moves_whatever_another_writer_inserted() {
    run(embedded_store);
}
