//! Sagas, timeouts and the outbox through `StoreAdmin`, the same checks on the Postgres
//! store, the SQLite store and the embedded broker's file. The rows are written with SQL
//! at known times (a virtual clock), so ages and "overdue" are exact.

use std::sync::Arc;

use chrono::{DateTime, TimeZone, Utc};
use courier::admin::{
    AdminError, EmbeddedAdmin, PostgresAdmin, SagaFilter, SqliteAdmin, StoreAdmin, TimeoutFilter, TimeoutState,
};
use courier::{Embedded, SqliteStore, Store, VirtualClock};
use courier_tests::pg::TestDatabase;

/// The database the rows are written to.
enum Db {
    Pg(sqlx::PgPool),
    Lite(sqlx::SqlitePool),
}

impl Db {
    fn table(&self, name: &str) -> String {
        match self {
            Db::Pg(_) => format!("courier.{name}"),
            Db::Lite(_) => format!("courier_{name}"),
        }
    }

    fn time(&self, at: DateTime<Utc>) -> String {
        match self {
            Db::Pg(_) => format!("'{}'::timestamptz", at.to_rfc3339()),
            Db::Lite(_) => at.timestamp_micros().to_string(),
        }
    }

    fn blob(&self) -> &'static str {
        match self {
            Db::Pg(_) => "'\\x7b7d'::bytea",
            Db::Lite(_) => "X'7B7D'",
        }
    }

    fn boolean(&self, v: bool) -> &'static str {
        match (self, v) {
            (Db::Pg(_), true) => "true",
            (Db::Pg(_), false) => "false",
            (Db::Lite(_), true) => "1",
            (Db::Lite(_), false) => "0",
        }
    }

    async fn exec(&self, sql: String) {
        let sql = sqlx::AssertSqlSafe(sql);
        match self {
            Db::Pg(p) => drop(sqlx::query(sql).execute(p).await.unwrap()),
            Db::Lite(p) => drop(sqlx::query(sql).execute(p).await.unwrap()),
        }
    }

    async fn count(&self, sql: String) -> i64 {
        let sql = sqlx::AssertSqlSafe(sql);
        match self {
            Db::Pg(p) => sqlx::query_scalar(sql).fetch_one(p).await.unwrap(),
            Db::Lite(p) => sqlx::query_scalar(sql).fetch_one(p).await.unwrap(),
        }
    }

    async fn saga(&self, saga_type: &str, correlation: &str, updated: DateTime<Utc>) {
        let t = self.table("saga");
        let at = self.time(updated);
        self.exec(format!(
            "INSERT INTO {t} (saga_type, correlation, state, version, created_at, updated_at) VALUES \
             ('{saga_type}', '{correlation}', '{{\"step\":\"paid\",\"note\":\"<b>\"}}', 3, {at}, {at})"
        ))
        .await;
    }

    async fn timeout(&self, id: &str, correlation: &str, due: DateTime<Utc>, dispatched: Option<DateTime<Utc>>) {
        let t = self.table("saga_timeout");
        let (due, created) = (self.time(due), self.time(start()));
        let dispatched = dispatched.map_or("NULL".to_owned(), |d| self.time(d));
        let blob = self.blob();
        self.exec(format!(
            "INSERT INTO {t} (id, endpoint, saga_type, correlation, due_at, dispatched_at, envelope, body, \
             created_at, timeout_key) VALUES ('{id}', 'orders', 'OrderSaga', '{correlation}', {due}, {dispatched}, \
             '{{\"message_id\":\"{id}\",\"message_type\":\"orders.PaymentExpired\"}}', {blob}, {created}, \
             'orders.PaymentExpired')"
        ))
        .await;
    }

    async fn outbox(&self, dead: bool, id: i64, message_id: &str) {
        let created = self.time(start() - chrono::Duration::minutes(5));
        let blob = self.blob();
        let no = self.boolean(false);
        let envelope = format!("'{{\"message_id\":\"{message_id}\",\"message_type\":\"orders.Shipped\"}}'");
        if dead {
            let t = self.table("outbox_dead_letters");
            self.exec(format!(
                "INSERT INTO {t} (id, endpoint, source_id, destination, is_topic, envelope, body, created_at, \
                 dead_lettered_at, reason, description) VALUES ({id}, 'orders', 'src-1', 'shipping', {no}, \
                 {envelope}, {blob}, {created}, {created}, 'courier.DispatchRefused', 'too large')"
            ))
            .await;
        } else {
            let t = self.table("outbox");
            self.exec(format!(
                "INSERT INTO {t} (endpoint, source_id, destination, is_topic, envelope, body, created_at) VALUES \
                 ('orders', 'src-1', 'shipping', {no}, {envelope}, {blob}, {created})"
            ))
            .await;
        }
    }
}

fn start() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 3, 1, 12, 0, 0).unwrap()
}

fn ago(minutes: i64) -> DateTime<Utc> {
    start() - chrono::Duration::minutes(minutes)
}

fn correlations(list: &[courier::admin::SagaSummary]) -> Vec<&str> {
    list.iter().map(|s| s.correlation.as_str()).collect()
}

/// The same checks on every store.
async fn sagas_timeouts_and_outbox(admin: &dyn StoreAdmin, db: &Db) {
    db.saga("OrderSaga", "order-1", ago(120)).await;
    db.saga("OrderSaga", "order-2", ago(1)).await;
    db.saga("OrderSaga", "order-3", ago(180)).await;
    db.saga("OrderSaga", "order-4", ago(90)).await;
    db.saga("ShippingSaga", "ship-9", ago(30)).await;
    // order-1: due 10 min ago, not sent (overdue); order-3: due in an hour; order-4:
    // sent two hours ago and never handled (overdue).
    db.timeout("t-1", "order-1", ago(10), None).await;
    db.timeout("t-3", "order-3", ago(-60), None).await;
    db.timeout("t-4", "order-4", ago(120), Some(ago(120))).await;
    let property = db.table("saga_property");
    db.exec(format!(
        "INSERT INTO {property} (saga_type, name, value, correlation) VALUES ('OrderSaga', 'payment', 'p-1', 'order-1')"
    ))
    .await;

    let types = admin.saga_types().await.unwrap();
    let types: Vec<(&str, u64)> = types.iter().map(|t| (t.saga_type.as_str(), t.instances)).collect();
    assert_eq!(types, vec![("OrderSaga", 4), ("ShippingSaga", 1)]);

    let all = admin.sagas("OrderSaga", &SagaFilter::default()).await.unwrap();
    assert_eq!(correlations(&all), vec!["order-3", "order-1", "order-4", "order-2"]);
    assert_eq!(all[1].pending_timeouts, 1);
    assert_eq!(all[1].updated_at, ago(120));
    let one = admin
        .sagas("OrderSaga", &SagaFilter::default().correlation("der-1"))
        .await
        .unwrap();
    assert_eq!(correlations(&one), vec!["order-1"]);
    let stuck = admin
        .sagas("OrderSaga", &SagaFilter::default().updated_before(ago(60)))
        .await
        .unwrap();
    assert_eq!(correlations(&stuck), vec!["order-3", "order-1", "order-4"]);
    let waiting = admin
        .sagas("OrderSaga", &SagaFilter::default().has_pending_timeout(false))
        .await
        .unwrap();
    assert_eq!(correlations(&waiting), vec!["order-2"]);
    let limited = admin
        .sagas("OrderSaga", &SagaFilter::default().has_pending_timeout(true).limit(2))
        .await
        .unwrap();
    assert_eq!(correlations(&limited), vec!["order-3", "order-1"]);

    let shown = admin.saga("OrderSaga", "order-1").await.unwrap();
    assert_eq!(shown.state, serde_json::json!({"step": "paid", "note": "<b>"}));
    assert_eq!((shown.summary.version, shown.state_version), (3, 1));
    assert_eq!(shown.timeouts.len(), 1);
    let t = &shown.timeouts[0];
    assert_eq!(
        (t.id.as_str(), t.state, t.due_at),
        ("t-1", TimeoutState::Waiting, ago(10))
    );
    assert_eq!(t.message_type.as_deref(), Some("orders.PaymentExpired"));
    assert!(matches!(
        admin.saga("OrderSaga", "order-404").await,
        Err(AdminError::NotFound { .. })
    ));

    let pending = admin.timeouts(&TimeoutFilter::default()).await.unwrap();
    let ids: Vec<&str> = pending.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, vec!["t-4", "t-1", "t-3"]);
    assert_eq!(pending[0].state, TimeoutState::Dispatched);
    let overdue = admin.timeouts(&TimeoutFilter::default().overdue()).await.unwrap();
    let ids: Vec<&str> = overdue.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, vec!["t-4", "t-1"]);
    let now = admin.now();
    assert!(overdue.iter().all(|t| t.is_overdue(now, chrono::Duration::seconds(60))));

    let refused = admin.complete_saga("OrderSaga", "order-1", "  ").await.unwrap_err();
    assert!(matches!(refused, AdminError::Refused { .. }), "{refused}");
    let done = admin
        .complete_saga("OrderSaga", "order-1", "customer cancelled by phone, ticket 42")
        .await
        .unwrap();
    assert_eq!((done.version, done.timeouts_removed), (3, 1));
    assert!(matches!(
        admin.saga("OrderSaga", "order-1").await,
        Err(AdminError::NotFound { .. })
    ));
    assert!(matches!(
        admin.complete_saga("OrderSaga", "order-1", "again").await,
        Err(AdminError::NotFound { .. })
    ));
    assert_eq!(db.count(format!("SELECT COUNT(*) FROM {property}")).await, 0);
    let ids: Vec<String> = admin
        .timeouts(&TimeoutFilter::default())
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(ids, vec!["t-4", "t-3"]);

    db.outbox(false, 0, "out-1").await;
    db.outbox(false, 0, "out-2").await;
    db.outbox(true, 77, "out-dead").await;
    let outbox = admin.outbox(10).await.unwrap();
    let ids: Vec<Option<&str>> = outbox.iter().map(|o| o.message_id.as_deref()).collect();
    assert_eq!(ids, vec![Some("out-1"), Some("out-2")]);
    assert_eq!(outbox[0].created_at, ago(5));
    assert_eq!(outbox[0].message_type.as_deref(), Some("orders.Shipped"));
    let dead = admin.outbox_dead_letters(10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!((dead[0].id, dead[0].message_id.as_deref()), (77, Some("out-dead")));
    assert_eq!(dead[0].dead_letter_reason.as_deref(), Some("courier.DispatchRefused"));
    assert_eq!(admin.outbox(1).await.unwrap().len(), 1);
}

fn clock() -> Arc<VirtualClock> {
    Arc::new(VirtualClock::new(start()))
}

#[tokio::test]
async fn postgres_sagas_timeouts_and_outbox() {
    let db = TestDatabase::create().await;
    let pool = db.pool().await;
    courier::PostgresStore::from_pool(pool.clone()).migrate().await.unwrap();
    let admin = PostgresAdmin::new(pool.clone()).clock(clock());
    sagas_timeouts_and_outbox(&admin, &Db::Pg(pool.clone())).await;
    pool.close().await;
    db.drop_now().await;
}

#[tokio::test]
async fn postgres_admin_names_the_server_without_its_password() {
    let err = PostgresAdmin::connect("postgres://app:hunter2@127.0.0.1:1/orders")
        .await
        .unwrap_err();
    assert!(matches!(err, AdminError::Unavailable { .. }), "{err}");
    assert!(err.is_transient());
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(shown.contains("app:***@127.0.0.1:1/orders"), "{shown}");
}

#[tokio::test]
async fn sqlite_sagas_timeouts_and_outbox() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("store.db")).await.unwrap();
    store.migrate().await.unwrap();
    let admin = SqliteAdmin::new(store.pool().clone()).clock(clock());
    sagas_timeouts_and_outbox(&admin, &Db::Lite(store.pool().clone())).await;
}

#[tokio::test]
async fn embedded_sagas_timeouts_and_outbox() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broker.db");
    let broker = Embedded::builder().path(&path).clock(clock()).open().await.unwrap();
    let writer = SqliteStore::open(&path).await.unwrap().pool().clone();
    let admin = EmbeddedAdmin::new(broker.clone());
    sagas_timeouts_and_outbox(&admin, &Db::Lite(writer)).await;
}
