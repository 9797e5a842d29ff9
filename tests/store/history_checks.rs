//! `courier_history_recent`'s checks were rewritten to cost less (migration
//! `20261209000001_history_recent_lighter`: the outcome compared name by name instead of
//! with an `IN` list, the detail parsed once instead of twice). A row the recent table
//! takes is moved into `courier_history`, whose checks are the old ones: if the recent
//! table took a row that `courier_history` refuses, every later move would fail. So the
//! two tables must accept exactly the same rows. Checked over any value SQLite can hold in
//! the two rewritten columns (NULL, integers, reals with their extremes and infinities,
//! any text, any bytes), weighted to the outcomes' names and their near misses and to
//! JSON texts of every type with any white space around them, JSON5 forms and truncated
//! ones: each table takes or refuses the row alike. The recent table's first saga
//! instance (two columns, both set or both NULL) is taken with any values set alike, and
//! what it takes `courier_history_instance` takes when the row is moved. And a file
//! written before the migration keeps its recent rows (ids and saga instances).

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

/// The id of the row `table` took with this outcome and detail (the other columns
/// valid) and, for the recent table, this first saga instance; `None` when it refused it.
async fn insert(
    pool: &SqlitePool,
    table: &str,
    kind: &Value,
    detail: &Value,
    instance: Option<(&Value, &Value)>,
) -> Result<Option<i64>, TestCaseError> {
    let (columns, values) = match instance {
        Some(_) => (", saga_type, correlation", ", ?3, ?4"),
        None => ("", ""),
    };
    let sql = format!(
        "INSERT INTO {table} (endpoint, kind, at, message_id, attempt, detail{columns}) \
         VALUES ('flows', ?1, 1, 'm', 1, ?2{values})"
    );
    let mut query = bind(bind(sqlx::query(sqlx::AssertSqlSafe(sql)), kind), detail);
    if let Some((saga_type, correlation)) = instance {
        query = bind(bind(query, saga_type), correlation);
    }
    match query.execute(pool).await {
        Ok(done) => Ok(Some(done.last_insert_rowid())),
        Err(sqlx::Error::Database(_)) => Ok(None),
        Err(e) => Err(failed(e)),
    }
}

async fn delete(pool: &SqlitePool, table: &str, id: Option<i64>) -> Result<(), TestCaseError> {
    if let Some(id) = id {
        sqlx::query(sqlx::AssertSqlSafe(format!("DELETE FROM {table} WHERE id = ?1")))
            .bind(id)
            .execute(pool)
            .await
            .map_err(failed)?;
    }
    Ok(())
}

/// Whether `table` takes a row with this outcome and detail; the row is deleted again.
async fn takes(pool: &SqlitePool, table: &str, kind: &Value, detail: &Value) -> Result<bool, TestCaseError> {
    let id = insert(pool, table, kind, detail, None).await?;
    delete(pool, table, id).await?;
    Ok(id.is_some())
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
        &(kind(), detail(), instance_part(), instance_part()),
        |_, (kind, detail, saga_type, correlation)| {
            let pool = pool.clone();
            async move {
                let history = insert(&pool, "courier_history", &kind, &detail, None).await?;
                let recent = insert(
                    &pool,
                    "courier_history_recent",
                    &kind,
                    &detail,
                    Some((&saga_type, &correlation)),
                )
                .await?;
                let paired = matches!(saga_type, Value::Null) == matches!(correlation, Value::Null);
                prop_assert_eq!(
                    recent.is_some(),
                    history.is_some() && paired,
                    "courier_history takes the row: {}, courier_history_recent: {} (instance set or unset alike: {})",
                    history.is_some(),
                    recent.is_some(),
                    paired
                );
                // The move puts a first instance the recent table took into
                // courier_history_instance.
                if let (Some(event), Some(_)) = (history, recent)
                    && !matches!(saga_type, Value::Null)
                {
                    let moved = bind(
                        bind(
                            sqlx::query(
                                "INSERT INTO courier_history_instance (history_id, saga_type, correlation) \
                                 VALUES (?1, ?2, ?3)",
                            )
                            .bind(event),
                            &saga_type,
                        ),
                        &correlation,
                    )
                    .execute(&pool)
                    .await;
                    prop_assert!(moved.is_ok(), "the first instance cannot be moved: {:?}", moved);
                }
                delete(&pool, "courier_history_recent", recent).await?;
                delete(&pool, "courier_history", history).await?;
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

/// A saga type or correlation: most often text, else any value (NULL among them).
fn instance_part() -> impl Strategy<Value = Value> {
    prop_oneof![
        3 => "\\PC{0,12}".prop_map(Value::Text),
        2 => any_value(),
    ]
}

/// The last migration before the one under test.
const BEFORE: i64 = 20261206000001;

/// Recent events written before the migration (one with white space around its detail,
/// as another writer may write it, one with a saga instance) are there after it, ids and
/// instances kept, read through the views as before; the rebuilt table still refuses what
/// the old one did; the next event takes the next id, its first saga instance in its row
/// and its second in the instance table, and reads as one timeline with the old event.
#[tokio::test]
async fn a_sqlite_history_keeps_its_recent_events_through_the_lighter_recent_upgrade() {
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
    let event = super::history_upgrade::new_event_of_two_sagas();
    store.record_history(&event).await.unwrap();
    let last: (i64, String, Option<String>) =
        sqlx::query_as("SELECT id, message_id, saga_type FROM courier_history_recent ORDER BY id DESC")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        last,
        (10, "new-1".to_owned(), Some("tests.Flow".to_owned())),
        "the sequence goes on after the kept ids; the first instance is in the row"
    );
    let others: Vec<(i64, String)> =
        sqlx::query_as("SELECT history_id, saga_type FROM courier_history_instance_recent ORDER BY history_id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        others,
        vec![(7, "tests.Flow".to_owned()), (10, "tests.Other".to_owned())]
    );
    let timeline: Vec<i64> = sqlx::query_scalar(
        "SELECT history_id FROM courier_history_instance_all WHERE saga_type = 'tests.Flow' AND correlation = 'c-1' \
         ORDER BY history_id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        timeline,
        vec![7, 10],
        "the old event's instance row and the new one's in its row"
    );
}
