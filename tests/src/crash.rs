//! What the crash tests share: a child process killed (SIGKILL) once it printed its
//! first line, and the store's database as the test sees it, for each kind of store.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use courier::{Embedded, PostgresStore, SqliteStore, Store, Transport};

use crate::pg::TestDatabase;
use crate::stores::StoreKind;

/// Inserts `id` into the application's `orders` table in the handling's transaction (on
/// Postgres or SQLite): the effect the crash tests count.
///
/// # Errors
/// The context's or the statement's error, as the handler's.
pub async fn insert_order(ctx: &mut courier::Context, postgres: bool, id: &str) -> Result<(), courier::HandlerError> {
    if postgres {
        let tx = ctx.transaction::<sqlx::Postgres>()?;
        sqlx::query("INSERT INTO orders (id) VALUES ($1)")
            .bind(id)
            .execute(&mut *tx)
            .await?;
    } else {
        let tx = ctx.transaction::<sqlx::Sqlite>()?;
        sqlx::query("INSERT INTO orders (id) VALUES (?1)")
            .bind(id)
            .execute(&mut *tx)
            .await?;
    }
    Ok(())
}

/// Runs `program` with `args`, waits for the first line it prints, kills it with SIGKILL
/// and returns the line.
///
/// # Panics
/// If the child cannot be started or prints nothing (a test failure).
#[allow(clippy::unwrap_used)]
pub async fn kill_after_first_line(program: &str, args: &[&str]) -> String {
    let mut child = Command::new(program)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    tokio::task::spawn_blocking(move || {
        let line = BufReader::new(stdout).lines().next().unwrap().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        line
    })
    .await
    .unwrap()
}

/// The database of a crash test's store, and what the child needs to open the store.
pub enum StoreDb {
    /// A SQLite file (a store of its own, or the broker's).
    Sqlite(sqlx::SqlitePool),
    /// A Postgres database of the test's own.
    Postgres(sqlx::PgPool, Box<TestDatabase>),
}

impl StoreDb {
    /// Makes and migrates a store of `kind` beside the broker file `broker_db` in `dir`.
    /// Returns the child's store argument (`sqlite:<file>`, a Postgres URL, `embedded`)
    /// and the database.
    ///
    /// # Panics
    /// If the store cannot be made, or `kind` is one of the Postgres transport's.
    #[allow(clippy::unwrap_used, clippy::panic)]
    pub async fn prepare(kind: StoreKind, dir: &Path, broker_db: &Path) -> (String, Self) {
        match kind {
            StoreKind::Sqlite => {
                let path = dir.join("store.db");
                let store = SqliteStore::open(&path).await.unwrap();
                store.migrate().await.unwrap();
                (format!("sqlite:{}", path.display()), Self::Sqlite(store.pool().clone()))
            }
            StoreKind::Embedded => {
                // The store's tables are in the broker's schema, made when it opens.
                Embedded::open(broker_db).await.unwrap().close().await;
                let pool = SqliteStore::open(broker_db).await.unwrap().pool().clone();
                ("embedded".to_owned(), Self::Sqlite(pool))
            }
            StoreKind::Postgres => {
                let test_db = TestDatabase::create().await;
                let pool = test_db.pool().await;
                PostgresStore::from_pool(pool.clone()).migrate().await.unwrap();
                (test_db.url(), Self::Postgres(pool, Box::new(test_db)))
            }
            StoreKind::PgTransport | StoreKind::PgTransportOutbox => {
                panic!("the crash children receive from an embedded broker file: no {kind:?} store there")
            }
        }
    }

    /// The store for an endpoint of this process on `broker` (opened on the same file).
    pub fn store(&self, kind: StoreKind, broker: &Embedded) -> Arc<dyn Store> {
        match self {
            _ if kind == StoreKind::Embedded => Arc::new(broker.store()),
            Self::Sqlite(p) => Arc::new(SqliteStore::from_pool(p.clone())),
            Self::Postgres(p, _) => Arc::new(PostgresStore::from_pool(p.clone())),
        }
    }

    /// The name of one of Courier's tables here (`outbox` → `courier.outbox` or
    /// `courier_outbox`).
    pub fn table(&self, name: &str) -> String {
        match self {
            Self::Sqlite(_) => format!("courier_{name}"),
            Self::Postgres(..) => format!("courier.{name}"),
        }
    }

    /// Where the history's events are read: on SQLite the indexed table and the recent
    /// events not moved there yet, as one view.
    pub fn history_table(&self) -> &'static str {
        match self {
            Self::Sqlite(_) => "courier_history_all",
            Self::Postgres(..) => "courier.history",
        }
    }

    /// Runs a statement.
    ///
    /// # Panics
    /// If it fails.
    #[allow(clippy::unwrap_used)]
    pub async fn exec(&self, sql: &str) {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        match self {
            Self::Sqlite(p) => drop(sqlx::query(sql).execute(p).await.unwrap()),
            Self::Postgres(p, _) => drop(sqlx::query(sql).execute(p).await.unwrap()),
        }
    }

    /// The one integer a query returns.
    ///
    /// # Panics
    /// If it fails.
    #[allow(clippy::unwrap_used)]
    pub async fn count(&self, sql: &str) -> i64 {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        match self {
            Self::Sqlite(p) => sqlx::query_scalar(sql).fetch_one(p).await.unwrap(),
            Self::Postgres(p, _) => sqlx::query_scalar(sql).fetch_one(p).await.unwrap(),
        }
    }

    /// Rows in one of Courier's tables.
    pub async fn rows(&self, table: &str) -> i64 {
        self.count(&format!("SELECT COUNT(*) FROM {}", self.table(table))).await
    }

    /// Closes the pool and drops the Postgres database.
    pub async fn finish(self) {
        if let Self::Postgres(pool, test_db) = self {
            pool.close().await;
            test_db.drop_now().await;
        }
    }
}
