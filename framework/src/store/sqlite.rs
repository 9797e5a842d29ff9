//! The SQLite store: the inbox and outbox in a SQLite file, tables prefixed `courier_`.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, Sqlite, SqliteConnection, SqlitePool};

use crate::error::Result;
use crate::message::Envelope;
use crate::message::LockToken;
use crate::store::sqlite_tx::{WriteTx, writer_conn};
use crate::store::{
    Begin, BeginBatch, Committed, DueTimeouts, EndpointSecret, OutboxDeadLetter, OutboxMessage, Store, StoreBacklog,
    StoredEnvelope, TimeoutClaim, db_error, sqlite_saga,
};

fn micros(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

/// The inbox and outbox in SQLite, through a sqlx pool. Handler transactions begin with
/// `BEGIN IMMEDIATE` (SQLite has one writer at a time; taking the write lock first means
/// no transaction fails half-way for lack of it).
///
/// The store's own writers (handler transactions, timeout claims, outbox and inbox
/// clean-up) take turns in this process first, in arrival order, and only then ask
/// SQLite for its write lock. Left to SQLite, a writer that finds the lock taken polls
/// for it with growing sleeps (1, 2, 5, 10 ... 100 ms), so under load some wait hundreds
/// of milliseconds while the lock is free most of that time. Writers of other processes,
/// or of the application on the same pool, still meet SQLite's busy timeout (10 s).
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    writer: crate::store::sqlite_tx::WriterTurn,
    /// Held by a RabbitMQ transport's round of publishing the scheduled messages kept
    /// here, and by a cancel: a cancel never deletes the row of a message being published
    /// (it would report success for a message that is delivered).
    #[cfg(feature = "amqp")]
    schedule_round: std::sync::Arc<tokio::sync::Mutex<()>>,
}

impl SqliteStore {
    /// Opens (creating it if needed) a SQLite file in WAL mode, synchronous NORMAL.
    ///
    /// # Errors
    /// [`ErrorKind::Storage`](crate::ErrorKind::Storage) if the file cannot be opened.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal);
        Self::with_options(options).await
    }

    /// Opens a SQLite URL (`sqlite://app.db`, `sqlite::memory:`).
    ///
    /// # Errors
    /// As [`open`](Self::open).
    pub async fn connect(url: &str) -> Result<Self> {
        Self::with_options(SqliteConnectOptions::from_str(url).map_err(|e| db_error("invalid SQLite URL", e))?).await
    }

    /// The one place a pool is made: creates the file if missing, waits up to 10 s for
    /// the write lock. Connections are not pinged when taken from the pool: a SQLite
    /// connection is a file and a thread of this process, and the ping was one more round
    /// trip to that thread inside a writer's turn, which the other writers wait for.
    async fn with_options(options: SqliteConnectOptions) -> Result<Self> {
        let options = options.create_if_missing(true).busy_timeout(Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .test_before_acquire(false)
            .max_connections(8)
            .connect_with(options)
            .await
            .map_err(|e| db_error("cannot open the SQLite store", e))?;
        Ok(Self::from_pool(pool))
    }

    /// Waits for this process's turn to write (see [`SqliteStore`]); the turn lasts as
    /// long as the guard.
    #[cfg(feature = "amqp")]
    pub(crate) async fn write_turn(&self) -> Result<crate::store::sqlite_tx::Turn> {
        self.writer.take().await
    }

    /// Waits for the end of a round of publishing due scheduled messages (see the
    /// field); the guard keeps the next round out.
    #[cfg(feature = "amqp")]
    pub(crate) async fn schedule_round(&self) -> tokio::sync::OwnedMutexGuard<()> {
        self.schedule_round.clone().lock_owned().await
    }

    /// A store over the application's own pool.
    pub fn from_pool(pool: SqlitePool) -> Self {
        Self {
            pool,
            writer: crate::store::sqlite_tx::WriterTurn::default(),
            #[cfg(feature = "amqp")]
            schedule_round: std::sync::Arc::default(),
        }
    }

    /// The pool.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }
}

struct SqliteWork {
    /// The transaction, holding this process's write turn until it ends.
    tx: WriteTx,
    endpoint: String,
    source_id: String,
    /// History events, written with the `COMMIT` (one trip to the connection's thread).
    history: Vec<crate::store::sqlite_history::Rendered>,
}

crate::store::sqlite_saga::sqlite_unit_of_work!(SqliteWork, {
    fn transaction(&mut self) -> Option<&mut (dyn std::any::Any + Send)> {
        self.tx.as_any()
    }

    async fn store_outgoing(
        &mut self,
        messages: Vec<(String, bool, Envelope)>,
        now: DateTime<Utc>,
    ) -> Result<Vec<OutboxMessage>> {
        insert_outbox(self.tx.conn()?, &self.endpoint, &self.source_id, messages, now).await
    }

    /// Kept for the commit, which writes it with the `COMMIT`.
    async fn record_history(&mut self, event: &crate::store::history::HistoryEvent) -> Result<()> {
        self.history.push(crate::store::sqlite_history::Rendered::new(event)?);
        Ok(())
    }

    async fn commit(self: Box<Self>) -> Result<Committed> {
        let SqliteWork { tx, history, .. } = *self;
        tx.commit_with(history, "cannot commit the handler's transaction")
            .await?;
        Ok(Committed::Pending)
    }
});

impl SqliteWork {
    fn new(tx: WriteTx, endpoint: &str, source_id: String) -> Self {
        Self {
            tx,
            endpoint: endpoint.to_owned(),
            source_id,
            history: Vec::new(),
        }
    }

    fn sqlite_conn(&mut self) -> Result<&mut SqliteConnection> {
        self.tx.conn()
    }
}

// The statements of the SQLite inbox and outbox, on a connection: the SQLite store runs
// them on its pool, the embedded broker's store on the broker's own connection.

/// Records `(endpoint, message_id)` in the inbox; `false` if it was there.
pub(crate) async fn record_inbox(
    conn: &mut SqliteConnection,
    endpoint: &str,
    message_id: &str,
    now: DateTime<Utc>,
) -> Result<bool> {
    let recorded = sqlx::query(
        "INSERT INTO courier_inbox (endpoint, message_id, processed_at) VALUES (?1, ?2, ?3) \
         ON CONFLICT DO NOTHING",
    )
    .bind(endpoint)
    .bind(message_id)
    .bind(micros(now))
    .execute(conn)
    .await
    .map_err(|e| db_error("cannot record the message in the inbox", e))?
    .rows_affected();
    Ok(recorded == 1)
}

/// Records the ids of a batch's members in the inbox on `conn`; per member, in order:
/// `None` when it was recorded now, or the undispatched outbox messages of its earlier
/// handling (`Store::begin_batch`). One statement for up to 1,000 members (a trip to the
/// connection's thread each, where each member took one); their ids are distinct.
pub(crate) async fn record_batch(
    conn: &mut SqliteConnection,
    endpoint: &str,
    ids: &[String],
    now: DateTime<Utc>,
) -> Result<Vec<Option<Vec<OutboxMessage>>>> {
    let mut recorded = std::collections::HashSet::with_capacity(ids.len());
    for chunk in ids.chunks(1_000) {
        let values = vec!["(?, ?, ?)"; chunk.len()].join(", ");
        let mut query = sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(format!(
            "INSERT INTO courier_inbox (endpoint, message_id, processed_at) VALUES {values} \
             ON CONFLICT DO NOTHING RETURNING message_id"
        )));
        for id in chunk {
            query = query.bind(endpoint).bind(id).bind(micros(now));
        }
        recorded.extend(
            query
                .fetch_all(&mut *conn)
                .await
                .map_err(|e| db_error("cannot record the batch's messages in the inbox", e))?,
        );
    }
    // An id given twice was inserted once: its first member is fresh, a later one a
    // duplicate (taken out of `recorded` by the first).
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        if recorded.remove(id) {
            out.push(None);
        } else {
            out.push(Some(left_over(&mut *conn, endpoint, id).await?));
        }
    }
    Ok(out)
}

/// The outbox rows an earlier handling of `message_id` stored and did not dispatch.
pub(crate) async fn left_over(
    conn: &mut SqliteConnection,
    endpoint: &str,
    message_id: &str,
) -> Result<Vec<OutboxMessage>> {
    let rows = sqlx::query(
        "SELECT id, destination, is_topic, envelope, body FROM courier_outbox \
         WHERE endpoint = ?1 AND source_id = ?2 ORDER BY id",
    )
    .bind(endpoint)
    .bind(message_id)
    .fetch_all(conn)
    .await
    .map_err(|e| db_error("cannot read the outbox", e))?;
    outbox_rows(rows)
}

/// Inserts the messages a handling of `source_id` sent into the outbox.
pub(crate) async fn insert_outbox(
    conn: &mut SqliteConnection,
    endpoint: &str,
    source_id: &str,
    messages: Vec<(String, bool, Envelope)>,
    now: DateTime<Utc>,
) -> Result<Vec<OutboxMessage>> {
    let mut out = Vec::with_capacity(messages.len());
    for (destination, is_topic, envelope) in messages {
        let kept = envelope.clone();
        let (json, body) = StoredEnvelope::split(envelope)?;
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO courier_outbox (endpoint, source_id, destination, is_topic, envelope, body, created_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) RETURNING id",
        )
        .bind(endpoint)
        .bind(source_id)
        .bind(&destination)
        .bind(is_topic)
        .bind(json)
        .bind(body.as_ref())
        .bind(micros(now))
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| db_error("cannot store an outgoing message", e))?;
        out.push(OutboxMessage {
            id,
            destination,
            is_topic,
            envelope: kept,
        });
    }
    Ok(out)
}

/// Removes dispatched rows from the outbox.
pub(crate) async fn delete_outbox(conn: &mut SqliteConnection, ids: &[i64]) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    let list = serde_json::to_string(ids).unwrap_or_else(|_| "[]".to_owned());
    sqlx::query("DELETE FROM courier_outbox WHERE id IN (SELECT value FROM json_each(?1))")
        .bind(list)
        .execute(conn)
        .await
        .map_err(|e| db_error("cannot remove dispatched messages from the outbox", e))?;
    Ok(())
}

/// Outbox rows of `endpoint` stored before `older_than`, oldest first.
pub(crate) async fn outbox_older_than(
    conn: &mut SqliteConnection,
    endpoint: &str,
    older_than: DateTime<Utc>,
    limit: i64,
) -> Result<Vec<OutboxMessage>> {
    let rows = sqlx::query(
        "SELECT id, destination, is_topic, envelope, body FROM courier_outbox \
         WHERE endpoint = ?3 AND created_at < ?1 ORDER BY id LIMIT ?2",
    )
    .bind(micros(older_than))
    .bind(limit)
    .bind(endpoint)
    .fetch_all(conn)
    .await
    .map_err(|e| db_error("cannot read the outbox", e))?;
    outbox_rows(rows)
}

/// What `endpoint` has in the outbox and the inbox.
pub(crate) async fn count_backlog(conn: &mut SqliteConnection, endpoint: &str) -> Result<StoreBacklog> {
    let row = sqlx::query(
        "SELECT (SELECT count(*) FROM courier_outbox WHERE endpoint = ?1), \
                (SELECT min(created_at) FROM courier_outbox WHERE endpoint = ?1), \
                (SELECT count(*) FROM courier_inbox WHERE endpoint = ?1)",
    )
    .bind(endpoint)
    .fetch_one(conn)
    .await
    .map_err(|e| db_error("cannot count the outbox and the inbox", e))?;
    let count = |i: usize| row.try_get::<i64, _>(i).map(|n| u64::try_from(n).unwrap_or(0));
    let oldest: Option<i64> = row
        .try_get(1)
        .map_err(|e| db_error("cannot read the outbox count", e))?;
    Ok(StoreBacklog {
        outbox: count(0).map_err(|e| db_error("cannot read the outbox count", e))?,
        oldest_outbox: oldest.and_then(DateTime::from_timestamp_micros),
        inbox: count(2).map_err(|e| db_error("cannot read the inbox count", e))?,
    })
}

/// Deletes at most `limit` inbox records of `endpoint` processed before `before`.
pub(crate) async fn delete_inbox(
    conn: &mut SqliteConnection,
    endpoint: &str,
    before: DateTime<Utc>,
    limit: i64,
) -> Result<u64> {
    let done = sqlx::query(
        "DELETE FROM courier_inbox WHERE endpoint = ?3 AND message_id IN \
         (SELECT message_id FROM courier_inbox WHERE endpoint = ?3 AND processed_at < ?1 LIMIT ?2)",
    )
    .bind(micros(before))
    .bind(limit)
    .bind(endpoint)
    .execute(conn)
    .await
    .map_err(|e| db_error("cannot purge the inbox", e))?;
    Ok(done.rows_affected())
}

/// Moves the outbox row `id` to the outbox dead letters; the caller holds a write
/// transaction, so the two statements take effect together. Returns whether the row was
/// there.
pub(crate) async fn dead_letter_outbox_row(
    conn: &mut SqliteConnection,
    id: i64,
    reason: &str,
    description: &str,
    now: DateTime<Utc>,
) -> Result<bool> {
    let moved = sqlx::query(
        "INSERT OR IGNORE INTO courier_outbox_dead_letters \
           (id, endpoint, source_id, destination, is_topic, envelope, body, created_at, \
            dead_lettered_at, reason, description) \
         SELECT id, endpoint, source_id, destination, is_topic, envelope, body, created_at, ?2, ?3, ?4 \
         FROM courier_outbox WHERE id = ?1",
    )
    .bind(id)
    .bind(micros(now))
    .bind(reason)
    .bind(description)
    .execute(&mut *conn)
    .await
    .map_err(|e| db_error("cannot move an outbox message to the dead letters", e))?;
    sqlx::query("DELETE FROM courier_outbox WHERE id = ?1")
        .bind(id)
        .execute(&mut *conn)
        .await
        .map_err(|e| db_error("cannot move an outbox message to the dead letters", e))?;
    Ok(moved.rows_affected() > 0)
}

/// `endpoint`'s outbox dead letters, oldest first.
pub(crate) async fn outbox_dead_letters(
    conn: &mut SqliteConnection,
    endpoint: &str,
    limit: i64,
) -> Result<Vec<OutboxDeadLetter>> {
    let rows = sqlx::query(
        "SELECT id, destination, is_topic, envelope, body, source_id, reason, description, dead_lettered_at \
         FROM courier_outbox_dead_letters WHERE endpoint = ?1 ORDER BY id LIMIT ?2",
    )
    .bind(endpoint)
    .bind(limit)
    .fetch_all(conn)
    .await
    .map_err(|e| db_error("cannot read the outbox dead letters", e))?;
    rows.into_iter()
        .map(|r| {
            let get = |e| db_error("cannot read an outbox dead letter", e);
            let json: String = r.try_get(3).map_err(get)?;
            let body: Vec<u8> = r.try_get(4).map_err(get)?;
            let at: i64 = r.try_get(8).map_err(get)?;
            Ok(OutboxDeadLetter {
                message: OutboxMessage {
                    id: r.try_get(0).map_err(get)?,
                    destination: r.try_get(1).map_err(get)?,
                    is_topic: r.try_get(2).map_err(get)?,
                    envelope: StoredEnvelope::join(&json, body)?,
                },
                source_id: r.try_get(5).map_err(get)?,
                reason: r.try_get(6).map_err(get)?,
                description: r.try_get(7).map_err(get)?,
                dead_lettered_at: DateTime::<Utc>::from_timestamp_micros(at).unwrap_or_default(),
            })
        })
        .collect()
}

/// `endpoint`'s secret in `courier_endpoint_secret`, made now if it has none (read; when
/// there is no row, a new random secret is inserted unless one is there by then, and the
/// row is read again); the caller holds the store's write turn. The timeout dispatcher's
/// claims read it too (`sqlite_saga::claim_due`): the read first spares them a write.
pub(crate) async fn endpoint_secret(
    conn: &mut SqliteConnection,
    endpoint: &str,
    now: DateTime<Utc>,
) -> Result<EndpointSecret> {
    let found: Option<Vec<u8>> = sqlx::query_scalar("SELECT secret FROM courier_endpoint_secret WHERE endpoint = ?1")
        .bind(endpoint)
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| db_error("cannot read the endpoint's secret in courier_endpoint_secret (were Courier's migrations applied? Store::migrate)", e))?;
    if let Some(stored) = found {
        return EndpointSecret::stored(&stored, "courier_endpoint_secret", endpoint);
    }
    sqlx::query(
        "INSERT INTO courier_endpoint_secret (endpoint, secret, created_at) VALUES (?1, ?2, ?3) \
         ON CONFLICT (endpoint) DO NOTHING",
    )
    .bind(endpoint)
    .bind(EndpointSecret::random().as_bytes().as_slice())
    .bind(micros(now))
    .execute(&mut *conn)
    .await
    .map_err(|e| db_error("cannot make the endpoint's secret in courier_endpoint_secret (were Courier's migrations applied? Store::migrate)", e))?;
    let stored: Vec<u8> = sqlx::query_scalar("SELECT secret FROM courier_endpoint_secret WHERE endpoint = ?1")
        .bind(endpoint)
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| db_error("cannot read the endpoint's secret in courier_endpoint_secret", e))?;
    EndpointSecret::stored(&stored, "courier_endpoint_secret", endpoint)
}

fn outbox_rows(rows: Vec<sqlx::sqlite::SqliteRow>) -> Result<Vec<OutboxMessage>> {
    rows.into_iter()
        .map(|r| {
            let get = |e| db_error("cannot read an outbox row", e);
            let json: String = r.try_get(3).map_err(get)?;
            let body: Vec<u8> = r.try_get(4).map_err(get)?;
            Ok(OutboxMessage {
                id: r.try_get(0).map_err(get)?,
                destination: r.try_get(1).map_err(get)?,
                is_topic: r.try_get(2).map_err(get)?,
                envelope: StoredEnvelope::join(&json, body)?,
            })
        })
        .collect()
}

/// The migrations of Courier's SQLite tables (the store's and the embedded broker's).
pub(crate) fn migrator() -> sqlx::migrate::Migrator {
    let mut migrator = sqlx::migrate!("../migrations/sqlite");
    migrator.dangerous_set_table_name("courier_migrations");
    migrator
}

impl SqliteStore {
    async fn conn(&self) -> Result<sqlx::pool::PoolConnection<Sqlite>> {
        self.pool
            .acquire()
            .await
            .map_err(|e| db_error("cannot get a connection to the SQLite store", e))
    }
}

#[async_trait]
impl Store for SqliteStore {
    fn name(&self) -> &'static str {
        "sqlite"
    }

    async fn migrate(&self) -> Result<()> {
        migrator().run(&self.pool).await.map_err(|e| {
            crate::error::Error::with_source(
                crate::error::ErrorKind::Storage {
                    detail: "cannot apply Courier's SQLite migrations".into(),
                    transient: false,
                },
                e,
            )
        })
    }

    async fn begin(
        &self,
        endpoint: &str,
        message_id: &str,
        _lock: Option<LockToken>,
        now: DateTime<Utc>,
    ) -> Result<Begin> {
        let turn = self.writer.take().await?;
        let mut tx = WriteTx::begin(&self.pool, turn, "cannot begin the handler's transaction").await?;
        if record_inbox(tx.conn()?, endpoint, message_id, now).await? {
            return Ok(Begin::Fresh(Box::new(SqliteWork::new(
                tx,
                endpoint,
                message_id.to_owned(),
            ))));
        }
        let left = left_over(tx.conn()?, endpoint, message_id).await?;
        tx.roll_back().await;
        Ok(Begin::Duplicate(left))
    }

    async fn begin_batch(
        &self,
        endpoint: &str,
        members: Vec<(String, Option<LockToken>)>,
        now: DateTime<Utc>,
    ) -> Result<BeginBatch> {
        if members.is_empty() {
            return Ok(BeginBatch::empty());
        }
        let ids: Vec<String> = members.into_iter().map(|(id, _)| id).collect();
        let turn = self.writer.take().await?;
        let mut tx = WriteTx::begin(&self.pool, turn, "cannot begin the batch's transaction").await?;
        let duplicates = record_batch(tx.conn()?, endpoint, &ids, now).await?;
        let first_fresh = BeginBatch::first_fresh(&ids, &duplicates);
        let Some(id) = first_fresh else {
            // Every member was processed before: roll back, then give the turn back.
            tx.roll_back().await;
            return Ok(BeginBatch { work: None, duplicates });
        };
        Ok(BeginBatch {
            work: Some(Box::new(SqliteWork::new(tx, endpoint, id))),
            duplicates,
        })
    }

    async fn mark_dispatched(&self, ids: &[i64]) -> Result<()> {
        let mut turn = self.writer.take().await?;
        delete_outbox(writer_conn(&mut turn, &self.pool).await?, ids).await
    }

    async fn undispatched(&self, endpoint: &str, older_than: DateTime<Utc>, limit: i64) -> Result<Vec<OutboxMessage>> {
        outbox_older_than(&mut *self.conn().await?, endpoint, older_than, limit).await
    }

    async fn backlog(&self, endpoint: &str) -> Result<Option<StoreBacklog>> {
        count_backlog(&mut *self.conn().await?, endpoint).await.map(Some)
    }

    async fn purge_inbox(&self, endpoint: &str, before: DateTime<Utc>, limit: i64) -> Result<u64> {
        let mut turn = self.writer.take().await?;
        delete_inbox(writer_conn(&mut turn, &self.pool).await?, endpoint, before, limit).await
    }

    async fn claim_due_timeouts(&self, endpoint: &str, claim: TimeoutClaim) -> Result<DueTimeouts> {
        let mut turn = self.writer.take().await?;
        let c = sqlite_saga::claim_due(
            writer_conn(&mut turn, &self.pool).await?,
            endpoint,
            claim,
            claim.marked_at,
        )
        .await?;
        Ok(DueTimeouts {
            claimed: c.due.len(),
            to_send: c.due,
            dead_lettered: c.dead_lettered,
            taken: c.taken,
            recorded: false,
        })
    }

    async fn next_timeout_due(&self, endpoint: &str) -> Result<Option<DateTime<Utc>>> {
        sqlite_saga::next_due(&mut *self.conn().await?, endpoint).await
    }

    async fn timeouts_sent(&self, ids: &[String], at: DateTime<Utc>) -> Result<()> {
        let mut turn = self.writer.take().await?;
        sqlite_saga::confirm_sent(writer_conn(&mut turn, &self.pool).await?, ids, at).await
    }

    async fn unclaim_timeouts(&self, ids: &[String]) -> Result<()> {
        let mut turn = self.writer.take().await?;
        sqlite_saga::unclaim(writer_conn(&mut turn, &self.pool).await?, ids).await
    }

    async fn dead_letter_timeout(&self, endpoint: &str, id: &str, reason: &str, now: DateTime<Utc>) -> Result<bool> {
        let mut turn = self.writer.take().await?;
        sqlite_saga::dead_letter(writer_conn(&mut turn, &self.pool).await?, endpoint, id, reason, now).await
    }

    async fn postpone_timeout_reclaim(&self, endpoint: &str, id: &str, until: DateTime<Utc>) -> Result<()> {
        let mut turn = self.writer.take().await?;
        sqlite_saga::postpone_reclaim(writer_conn(&mut turn, &self.pool).await?, endpoint, id, until).await
    }

    async fn dead_letter_outbox(&self, id: i64, reason: &str, description: &str, now: DateTime<Utc>) -> Result<bool> {
        let turn = self.writer.take().await?;
        let mut tx = WriteTx::begin(
            &self.pool,
            turn,
            "cannot begin moving an outbox message to the dead letters",
        )
        .await?;
        let moved = dead_letter_outbox_row(tx.conn()?, id, reason, description, now).await?;
        tx.commit_with(Vec::new(), "cannot move an outbox message to the dead letters")
            .await?;
        Ok(moved)
    }

    async fn dead_lettered_outbox(&self, endpoint: &str, limit: i64) -> Result<Vec<OutboxDeadLetter>> {
        outbox_dead_letters(&mut *self.conn().await?, endpoint, limit).await
    }

    fn keeps_history(&self) -> bool {
        true
    }

    /// An event of its own (a failed attempt's, a duplicate's, a timeout's): its row and
    /// its instance rows in one transaction, whose `COMMIT` rides with them.
    async fn record_history(&self, event: &crate::store::history::HistoryEvent) -> Result<()> {
        let rendered = vec![crate::store::sqlite_history::Rendered::new(event)?];
        let turn = self.writer.take().await?;
        WriteTx::begin(&self.pool, turn, "cannot begin recording the history of a message")
            .await?
            .commit_with(rendered, "cannot record the history of a message")
            .await
    }

    async fn purge_history(&self, endpoint: &str, before: DateTime<Utc>, limit: i64) -> Result<u64> {
        let turn = self.writer.take().await?;
        let mut tx = WriteTx::begin(&self.pool, turn, "cannot begin purging the history").await?;
        let purged = crate::store::sqlite_history::purge(tx.conn()?, endpoint, before, limit).await?;
        tx.commit_with(Vec::new(), "cannot purge the history").await?;
        Ok(purged)
    }

    async fn endpoint_secret(&self, endpoint: &str, now: DateTime<Utc>) -> Result<Option<EndpointSecret>> {
        let mut turn = self.writer.take().await?;
        endpoint_secret(writer_conn(&mut turn, &self.pool).await?, endpoint, now)
            .await
            .map(Some)
    }
}
