//! A migrated store of each kind next to a broker on a virtual clock (the embedded one,
//! or for the two Postgres transport kinds the Postgres transport), with a way to run SQL
//! on the store's database: the environment of the store and saga tests.

use std::sync::Arc;

use courier::conformance::Fixture;
use courier::{Clock, Embedded, PostgresStore, PostgresTransport, SqliteStore, Store, Transport, VirtualClock};

use crate::pg::TestDatabase;

/// Which store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    /// `SqliteStore` in a file of its own.
    Sqlite,
    /// `PostgresStore` in a database of its own.
    Postgres,
    /// The embedded broker's own file (`Embedded::store`): one transaction for everything.
    Embedded,
    /// The Postgres transport's own store (`PostgresTransport::store`), the transport in
    /// the same database of its own: one transaction for everything.
    PgTransport,
    /// `PostgresStore` (inbox and outbox) in the database of the Postgres transport it
    /// receives from: settling and sending after the commit, as with another broker.
    PgTransportOutbox,
}

impl StoreKind {
    /// Every kind.
    pub const ALL: [StoreKind; 5] = [
        StoreKind::Sqlite,
        StoreKind::Postgres,
        StoreKind::Embedded,
        StoreKind::PgTransport,
        StoreKind::PgTransportOutbox,
    ];

    /// Whether settling the received message and sending are part of the store's
    /// transaction (no outbox, no dispatch after the commit).
    pub fn one_transaction(self) -> bool {
        matches!(self, StoreKind::Embedded | StoreKind::PgTransport)
    }

    /// Whether the store's database is Postgres (else SQLite): which SQL it speaks and
    /// which transaction type `Context::transaction` gives.
    pub fn postgres(self) -> bool {
        match self {
            StoreKind::Postgres | StoreKind::PgTransport | StoreKind::PgTransportOutbox => true,
            StoreKind::Sqlite | StoreKind::Embedded => false,
        }
    }

    /// The name of one of Courier's tables in this store (`inbox` → `courier.inbox` or
    /// `courier_inbox`).
    pub fn table(self, name: &str) -> String {
        if self.postgres() && name == "history_instance" {
            // The first instances (kept in the events' rows) and the others, as one.
            "courier.history_instance_all".to_owned()
        } else if self.postgres() {
            format!("courier.{name}")
        } else if matches!(name, "history" | "history_instance") {
            // The indexed table and the recent rows not moved there yet, as one.
            format!("courier_{name}_all")
        } else {
            format!("courier_{name}")
        }
    }
}

/// A broker and a migrated store.
pub struct StoreEnv {
    /// The broker (an in-memory one, or for [`StoreKind::Embedded`] the file of the store).
    pub fx: Fixture,
    /// Which store.
    pub kind: StoreKind,
    /// The store.
    pub store: Arc<dyn Store>,
    sqlite: Option<sqlx::SqlitePool>,
    pg: Option<(sqlx::PgPool, TestDatabase)>,
    pg_transport: Option<PostgresTransport>,
    _dir: tempfile::TempDir,
}

impl StoreEnv {
    /// A fresh environment.
    ///
    /// # Panics
    /// If the store cannot be opened (a test failure).
    #[allow(clippy::unwrap_used)]
    pub async fn new(kind: StoreKind) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut fx = None;
        let mut pg_transport = None;
        let (store, sqlite, pg): (Arc<dyn Store>, _, _) = match kind {
            StoreKind::Embedded => {
                let clock = VirtualClock::starting_now();
                let path = dir.path().join("app.db");
                let broker = Embedded::builder()
                    .path(&path)
                    .clock(Arc::new(clock.clone()))
                    .open()
                    .await
                    .unwrap();
                let store = broker.store();
                fx = Some(Fixture::new(Arc::new(broker), clock));
                let pool = SqliteStore::open(&path).await.unwrap().pool().clone();
                (Arc::new(store), Some(pool), None)
            }
            StoreKind::Sqlite => {
                let s = SqliteStore::open(dir.path().join("store.db")).await.unwrap();
                let pool = s.pool().clone();
                (Arc::new(s), Some(pool), None)
            }
            StoreKind::Postgres => {
                let db = TestDatabase::create().await;
                let pool = db.pool().await;
                (Arc::new(PostgresStore::from_pool(pool.clone())), None, Some((pool, db)))
            }
            StoreKind::PgTransport | StoreKind::PgTransportOutbox => {
                let db = TestDatabase::create().await;
                let pool = db.pool().await;
                let clock = VirtualClock::starting_now();
                let shared: Arc<dyn Clock> = Arc::new(clock.clone());
                // A pool of its own: its receivers do not wait for the test's statements.
                let transport = PostgresTransport::from_pool(db.pool().await)
                    .clock(shared)
                    .open()
                    .await
                    .unwrap();
                let store: Arc<dyn Store> = if kind == StoreKind::PgTransport {
                    Arc::new(transport.store())
                } else {
                    Arc::new(PostgresStore::from_pool(pool.clone()))
                };
                fx = Some(Fixture::new(Arc::new(transport.clone()), clock));
                pg_transport = Some(transport);
                (store, None, Some((pool, db)))
            }
        };
        store.migrate().await.unwrap();
        let fx = match fx {
            Some(fx) => fx,
            None => crate::embedded_fixture().await,
        };
        Self {
            fx,
            kind,
            store,
            sqlite,
            pg,
            pg_transport,
            _dir: dir,
        }
    }

    /// Runs a statement on the store's database.
    ///
    /// # Panics
    /// If it fails.
    #[allow(clippy::unwrap_used, clippy::panic)]
    pub async fn exec(&self, sql: &str) {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        match (&self.sqlite, &self.pg) {
            (Some(p), _) => drop(sqlx::query(sql).execute(p).await.unwrap()),
            (_, Some((p, _))) => drop(sqlx::query(sql).execute(p).await.unwrap()),
            _ => panic!("no database"),
        }
    }

    /// The one integer a query returns.
    ///
    /// # Panics
    /// If it fails.
    #[allow(clippy::unwrap_used, clippy::panic)]
    pub async fn count(&self, sql: &str) -> i64 {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        match (&self.sqlite, &self.pg) {
            (Some(p), _) => sqlx::query_scalar(sql).fetch_one(p).await.unwrap(),
            (_, Some((p, _))) => sqlx::query_scalar(sql).fetch_one(p).await.unwrap(),
            _ => panic!("no database"),
        }
    }

    /// The one text a query returns (`None` for no row or NULL).
    ///
    /// # Panics
    /// If it fails.
    #[allow(clippy::unwrap_used, clippy::panic)]
    pub async fn text(&self, sql: &str) -> Option<String> {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        match (&self.sqlite, &self.pg) {
            (Some(p), _) => sqlx::query_scalar(sql).fetch_optional(p).await.unwrap().flatten(),
            (_, Some((p, _))) => sqlx::query_scalar(sql).fetch_optional(p).await.unwrap().flatten(),
            _ => panic!("no database"),
        }
    }

    /// The texts of a query's first column, row by row (NULL as `None`).
    ///
    /// # Panics
    /// If it fails.
    #[allow(clippy::unwrap_used, clippy::panic)]
    pub async fn texts(&self, sql: &str) -> Vec<Option<String>> {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        match (&self.sqlite, &self.pg) {
            (Some(p), _) => sqlx::query_scalar(sql).fetch_all(p).await.unwrap(),
            (_, Some((p, _))) => sqlx::query_scalar(sql).fetch_all(p).await.unwrap(),
            _ => panic!("no database"),
        }
    }

    /// The message ids in queue `queue` (peeked, in queue order).
    ///
    /// # Panics
    /// If the broker cannot be read.
    #[allow(clippy::unwrap_used)]
    pub async fn queued_ids(&self, queue: &str) -> Vec<String> {
        self.fx
            .transport
            .peek(&courier::EntityPath::queue(queue), 0, 100)
            .await
            .unwrap()
            .into_iter()
            .map(|m| m.envelope.message_id)
            .collect()
    }

    /// The pool of the Postgres store's database.
    ///
    /// # Panics
    /// If the store is not Postgres.
    #[allow(clippy::panic)]
    pub fn pg(&self) -> &sqlx::PgPool {
        match &self.pg {
            Some((pool, _)) => pool,
            None => panic!("not a Postgres store"),
        }
    }

    /// Closes the transport and the pools and drops the Postgres database.
    pub async fn finish(self) {
        if let Some(transport) = &self.pg_transport {
            transport.close().await;
        }
        if let Some((pool, db)) = self.pg {
            pool.close().await;
            db.drop_now().await;
        }
    }
}
