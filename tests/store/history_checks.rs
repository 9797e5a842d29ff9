//! `courier_history_recent`'s checks were rewritten to cost less (migration
//! `20261209000001_history_recent_checks`: the outcome compared name by name instead of
//! with an `IN` list, the detail parsed once instead of twice). A row the recent table
//! takes is moved into `courier_history`, whose checks are the old ones: if the recent
//! table took a row that `courier_history` refuses, every later move would fail. So the
//! two tables must accept exactly the same rows. Checked over any value SQLite can hold in
//! the two rewritten columns (NULL, integers, reals with their extremes and infinities,
//! any text, any bytes), weighted to the outcomes' names and their near misses and to
//! JSON texts of every type with any white space around them, JSON5 forms and truncated
//! ones: each table takes or refuses the row alike. And a file written before the
//! migration keeps its recent rows (ids and saga instances) and moves them as before.

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use sqlx::SqlitePool;

use courier::{SqliteStore, Store};

use super::history_recent::failed;

/// A value SQLite may hold in a column of any declared type.
#[derive(Debug, Clone)]
enum Value {
    Null,
    Integer(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

/// The outcome names Courier writes, and near misses of them.
fn kind() -> impl Strategy<Value = Value> {
    let named = prop_oneof![
        Just("handled"),
        Just("retried"),
        Just("dead_lettered"),
        Just("duplicate"),
        Just("timeout_dispatched"),
        Just("timeout_dead_lettered"),
        Just("Handled"),
        Just("handled "),
        Just(" handled"),
        Just("handled\0"),
        Just("timeout"),
        Just(""),
        Just("lost"),
    ];
    prop_oneof![
        4 => named.clone().prop_map(|n| Value::Text(n.to_owned())),
        1 => named.prop_map(|n| Value::Blob(n.as_bytes().to_vec())),
        2 => any_value(),
    ]
}

/// Any value: every storage class, with the integers' and the reals' extremes.
fn any_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        prop_oneof![
            Just(i64::MIN),
            Just(-1_i64),
            Just(0_i64),
            Just(1_i64),
            Just(i64::MAX),
            any::<i64>()
        ]
        .prop_map(Value::Integer),
        prop_oneof![
            Just(f64::INFINITY),
            Just(f64::NEG_INFINITY),
            Just(f64::MAX),
            Just(f64::MIN_POSITIVE),
            Just(-0.0_f64),
            any::<f64>().prop_filter("SQLite stores NaN as NULL", |f| !f.is_nan()),
        ]
        .prop_map(Value::Real),
        any::<String>().prop_map(Value::Text),
        proptest::collection::vec(any::<u8>(), 0..64).prop_map(Value::Blob),
    ]
}

/// White space around a JSON text: JSON's own four, others that JSON does not allow
/// (JSON5 allows some), and a JSON5 comment.
fn space() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            Just(" "),
            Just("\t"),
            Just("\n"),
            Just("\r"),
            Just("\u{a0}"),
            Just("\u{b}"),
            Just("\u{c}"),
            Just("\u{feff}"),
            Just("/* c */"),
        ],
        0..4,
    )
    .prop_map(|parts| parts.concat())
}

/// A JSON value of any type, as serde_json writes it.
fn json() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::Bool),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>().prop_map(serde_json::Value::from),
        "\\PC{0,8}".prop_map(serde_json::Value::String),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
            proptest::collection::btree_map("\\PC{0,6}", inner, 0..4)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
    .prop_map(|v| v.to_string())
}

/// A detail: JSON texts of any type (most often objects) with any space around them,
/// JSON5 and broken forms, the same as bytes, or any value.
fn detail() -> impl Strategy<Value = Value> {
    let core = prop_oneof![
        3 => json(),
        1 => prop_oneof![
            Just("{}"),
            Just("{\"a\":1}"),
            Just("{'a':1}"),
            Just("{a:1}"),
            Just("{\"a\":1,}"),
            Just("{\"a\":"),
            Just("{"),
            Just("}"),
            Just("{\"a\":NaN}"),
            Just("{\"a\":Infinity}"),
            Just("{\"a\":0x1F}"),
            Just("{}{}"),
            Just("{} x"),
            Just("{\"a\":\"\0\"}"),
        ]
        .prop_map(str::to_owned),
    ];
    let text = (space(), core, space())
        .prop_map(|(before, core, after)| format!("{before}{core}{after}"))
        .boxed();
    prop_oneof![
        6 => text.clone().prop_map(Value::Text),
        1 => text.prop_map(|t| Value::Blob(t.into_bytes())),
        2 => any_value(),
    ]
}

fn bind<'q>(
    query: sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments>,
    value: &'q Value,
) -> sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments> {
    match value {
        Value::Null => query.bind(None::<String>),
        Value::Integer(i) => query.bind(*i),
        Value::Real(r) => query.bind(*r),
        Value::Text(t) => query.bind(t.as_str()),
        Value::Blob(b) => query.bind(b.as_slice()),
    }
}

/// Whether `table` takes a row with this outcome and detail (the other columns valid);
/// the row is deleted again.
async fn takes(pool: &SqlitePool, table: &str, kind: &Value, detail: &Value) -> Result<bool, TestCaseError> {
    let sql = format!(
        "INSERT INTO {table} (endpoint, kind, at, message_id, attempt, detail) VALUES ('flows', ?1, 1, 'm', 1, ?2)"
    );
    let query = bind(bind(sqlx::query(sqlx::AssertSqlSafe(sql)), kind), detail);
    match query.execute(pool).await {
        Ok(done) => {
            sqlx::query(sqlx::AssertSqlSafe(format!("DELETE FROM {table} WHERE id = ?1")))
                .bind(done.last_insert_rowid())
                .execute(pool)
                .await
                .map_err(failed)?;
            Ok(true)
        }
        Err(sqlx::Error::Database(_)) => Ok(false),
        Err(e) => Err(failed(e)),
    }
}

#[test]
fn the_recent_table_takes_exactly_the_rows_the_history_takes() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = rt.block_on(SqliteStore::open(dir.path().join("checks.db"))).unwrap();
    rt.block_on(store.migrate()).unwrap();
    let pool = store.pool().clone();
    courier_tests::run_property(
        &rt,
        courier_tests::fuzz_cases(2_000),
        &(kind(), detail()),
        |_, (kind, detail)| {
            let pool = pool.clone();
            async move {
                let history = takes(&pool, "courier_history", &kind, &detail).await?;
                let recent = takes(&pool, "courier_history_recent", &kind, &detail).await?;
                prop_assert_eq!(
                    history,
                    recent,
                    "courier_history takes the row: {}, courier_history_recent: {}",
                    history,
                    recent
                );
                Ok(())
            }
        },
    );
    // The property would pass if both tables refused everything: Courier's rows are taken.
    let handled = Value::Text("handled".into());
    let object = Value::Text(" \n{\"a\": [1, {}]}\t".into());
    assert!(
        rt.block_on(takes(&pool, "courier_history_recent", &handled, &object))
            .unwrap()
    );
    let array = Value::Text("[{}]".into());
    assert!(
        !rt.block_on(takes(&pool, "courier_history_recent", &handled, &array))
            .unwrap()
    );
}

/// The last migration before the one under test.
const BEFORE: i64 = 20261206000001;

/// Recent events written before the migration (one with white space around its detail,
/// as another writer may write it, one with a saga instance) are there after it, ids and
/// instances kept, read through the view as before; the rebuilt table still refuses what
/// the old one did, and the next event takes the next id.
#[tokio::test]
async fn a_sqlite_history_keeps_its_recent_events_through_the_checks_upgrade() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("store.db")).await.unwrap();
    let pool = store.pool().clone();
    super::history_upgrade::migrations_up_to("migrations/sqlite", "courier_migrations", BEFORE)
        .await
        .run(&pool)
        .await
        .unwrap();
    for (id, kind, detail) in [(7, "handled", "{\"sagas\":[]}"), (9, "duplicate", " \r\n\t{}\n")] {
        sqlx::query(
            "INSERT INTO courier_history_recent (id, endpoint, kind, at, message_id, attempt, detail) \
             VALUES (?1, 'flows', ?2, 1000, 'm-' || ?1, 1, ?3)",
        )
        .bind(id)
        .bind(kind)
        .bind(detail)
        .execute(&pool)
        .await
        .unwrap();
    }
    sqlx::query("INSERT INTO courier_history_instance_recent VALUES (7, 'tests.Flow', 'c-1')")
        .execute(&pool)
        .await
        .unwrap();

    store.migrate().await.unwrap();

    let rows: Vec<(i64, String, String)> =
        sqlx::query_as("SELECT id, kind, detail FROM courier_history_all ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        rows,
        vec![
            (7, "handled".into(), "{\"sagas\":[]}".into()),
            (9, "duplicate".into(), " \r\n\t{}\n".into())
        ]
    );
    let instances: Vec<i64> = sqlx::query_scalar(
        "SELECT history_id FROM courier_history_instance_all WHERE saga_type = 'tests.Flow' AND correlation = 'c-1'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(instances, vec![7]);
    for (kind, detail) in [("lost", "{}"), ("handled", "[]"), ("handled", "{'a':1}")] {
        let refused = sqlx::query(
            "INSERT INTO courier_history_recent (endpoint, kind, at, message_id, attempt, detail) \
             VALUES ('flows', ?1, 1, 'm', 1, ?2)",
        )
        .bind(kind)
        .bind(detail)
        .execute(&pool)
        .await;
        assert!(refused.is_err(), "{kind} {detail} is refused after the upgrade");
    }
    let event = courier::HistoryEvent {
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
        detail: courier::HistoryDetail::default(),
    };
    store.record_history(&event).await.unwrap();
    let last: (i64, String) = sqlx::query_as("SELECT id, message_id FROM courier_history_recent ORDER BY id DESC")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        last,
        (10, "new-1".to_owned()),
        "the sequence goes on after the kept ids"
    );
}
