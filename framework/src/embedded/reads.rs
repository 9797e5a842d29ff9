//! Reading the application's tables in the broker's file outside handlers: a pool of
//! query-only connections beside the engine's single writer ([`Embedded::read_pool`]).

use std::path::Path;
use std::time::Duration;

use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};

use super::Embedded;

/// How many connections [`Embedded::read_pool`] opens at most, unless
/// [`EmbeddedBuilder::read_connections`](super::EmbeddedBuilder::read_connections) says
/// otherwise.
pub const DEFAULT_READ_CONNECTIONS: u32 = 4;

/// How long a reader waits for a lock before SQLite says the database is busy (in WAL
/// mode, only while the file is being recovered or its WAL reset).
const READ_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The read pool of a broker in `path`, or, in memory, on the database the engine's
/// `options` open: nothing connects until the first query.
pub(super) fn pool(path: Option<&Path>, engine: &SqliteConnectOptions, max_connections: u32) -> SqlitePool {
    let options = match path {
        // WAL readers: each reads the last committed state, and neither waits for the
        // engine's transaction nor holds it up.
        Some(path) => SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(false)
            .busy_timeout(READ_BUSY_TIMEOUT),
        // `sqlite::memory:` is a named database in SQLite's shared cache: connections of
        // this process with its name share it, and lock it table by table.
        None => engine.clone(),
    }
    .foreign_keys(false)
    // Every statement that would write fails with SQLITE_READONLY ("attempt to write a
    // readonly database"): the engine's connection stays the only writer.
    .pragma("query_only", "ON");
    SqlitePoolOptions::new()
        .max_connections(max_connections)
        .min_connections(0)
        .test_before_acquire(false)
        .connect_lazy_with(options)
}

impl Embedded {
    /// A pool of read-only connections to the broker's database, to read the
    /// application's tables outside handlers: serve `GET /orders/:id` from the rows that
    /// handlers wrote with
    /// [`ctx.transaction::<courier::sqlx::Sqlite>()`](crate::Context::transaction).
    ///
    /// Writes go through handlers, never through this pool: the broker's engine is the
    /// file's single writer (it lends its connection to each handling, so that the
    /// handler's rows, the inbox record, the messages sent and the completion commit
    /// together). Every connection of the pool has `PRAGMA query_only` on, so a write
    /// fails with SQLite's `attempt to write a readonly database`. To change data from
    /// outside (an HTTP `POST`), send a message whose handler does it.
    ///
    /// - **In a file** the connections are WAL readers: a query sees what was committed
    ///   when it began, never a handling in progress, and neither waits for the engine
    ///   nor makes it wait. A read transaction held open for long keeps the WAL from
    ///   being checkpointed (it grows until the reader ends): keep reads short.
    /// - **In memory** ([`Embedded::in_memory`], and
    ///   [`TestEndpoint`](crate::testing::TestEndpoint)) they share the broker's
    ///   database through SQLite's shared cache, which locks table by table: a read of a
    ///   table that a handling is writing waits until that transaction ends, and the
    ///   broker waits for a read in progress. Fine for tests; use a file to serve reads
    ///   under load.
    ///
    /// The pool connects on first use, at most
    /// [`read_connections`](super::EmbeddedBuilder::read_connections) connections
    /// ([`DEFAULT_READ_CONNECTIONS`] by default), and keeps working after the broker
    /// closed (it reads what was committed). Cloning it is cheap.
    ///
    /// # Examples
    ///
    /// ```
    /// use courier::Embedded;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let broker = Embedded::in_memory().await?;
    /// let queues: i64 = courier::sqlx::query_scalar("SELECT COUNT(*) FROM courier_entity")
    ///     .fetch_one(broker.read_pool())
    ///     .await?;
    /// assert_eq!(queues, 0);
    ///
    /// let refused = courier::sqlx::query("CREATE TABLE notes (body TEXT)")
    ///     .execute(broker.read_pool())
    ///     .await;
    /// assert!(refused.unwrap_err().to_string().contains("readonly"));
    /// # Ok(()) }
    /// ```
    pub fn read_pool(&self) -> &SqlitePool {
        &self.shared.read_pool
    }
}
