//! A write transaction of the SQLite store, begun with `BEGIN IMMEDIATE` and ended by its
//! own `COMMIT` or `ROLLBACK` statements, not by sqlx's `Transaction`: the `COMMIT` can
//! then ride in the query of the statements before it (a handling's history events: one
//! trip to the connection's thread, not two), which sqlx's `Transaction`, counting its own
//! `BEGIN`s and `COMMIT`s, does not allow.
//!
//! The writer's turn holds the connection the transactions are written on: one
//! connection, taken out of the pool the first time (`detach`, so that the pool may open
//! another in its place) and kept. SQLite drops a connection's page cache whenever
//! another connection changed the file since its last transaction; with the writers
//! taking turns on the pool's connections, each transaction read again every page it
//! touched. One writer connection keeps its pages: the handler transactions and every
//! other write of the store in its turn ([`writer_conn`]: the outbox's and the inbox's
//! clean-ups, the timeout claims, the history's). A connection that failed to begin or to
//! roll back is closed, and the next turn takes a new one.
//!
//! Dropped before it ended (a handler failed, or its task was stopped), the transaction
//! is rolled back on a task of its own, which gives the write turn (and its connection)
//! back only after the `ROLLBACK`: no other writer meets the transaction. Without a
//! runtime to run that task (a process shutting down), the connection is closed, which
//! ends the transaction in SQLite as well.

use std::sync::Arc;
use std::time::Duration;

use sqlx::{SqliteConnection, SqlitePool};
use tokio::sync::OwnedMutexGuard;

use crate::error::{Error, ErrorKind, Result};
use crate::store::db_error;
use crate::store::sqlite_history::{Rendered, move_recent, record_then};

/// How long a writer waits for its turn in this process, as long as SQLite's busy
/// timeout: a turn that does not come means a transaction is stuck.
const WRITER_WAIT: Duration = Duration::from_secs(10);

/// This process's turn to write, with the writer connection (none before the first
/// transaction, or after one failed).
pub(crate) type Turn = OwnedMutexGuard<Option<SqliteConnection>>;

/// The turn of one writer of the store in this process (see
/// [`SqliteStore`](crate::SqliteStore)): a fair (first come, first served) lock, held
/// until the transaction ends, over the writer connection.
#[derive(Debug, Clone, Default)]
pub(crate) struct WriterTurn(Arc<tokio::sync::Mutex<Option<SqliteConnection>>>);

impl WriterTurn {
    pub(crate) async fn take(&self) -> Result<Turn> {
        tokio::time::timeout(WRITER_WAIT, self.0.clone().lock_owned())
            .await
            .map_err(|_| {
                Error::new(ErrorKind::Storage {
                    detail: format!(
                        "the SQLite store's write lock was not free within {} s: a transaction is stuck",
                        WRITER_WAIT.as_secs()
                    ),
                    transient: true,
                })
            })
    }
}

/// The connection of `turn` (taken out of `pool` if it has none), for the statements a
/// writer runs in autocommit during its turn (each its own transaction).
pub(crate) async fn writer_conn<'t>(turn: &'t mut Turn, pool: &SqlitePool) -> Result<&'t mut SqliteConnection> {
    let slot: &'t mut Option<SqliteConnection> = turn;
    if slot.is_none() {
        let conn = pool
            .acquire()
            .await
            .map_err(|e| db_error("cannot get a connection to the SQLite store", e))?
            .detach();
        *slot = Some(conn);
    }
    slot.as_mut().ok_or_else(|| Error::new(ErrorKind::Closed))
}

pub(crate) struct WriteTx {
    /// The turn, with the connection inside the transaction; `None` once it ended.
    turn: Option<Turn>,
}

impl WriteTx {
    /// Begins a write transaction on the turn's connection (taken out of `pool` if the
    /// turn has none), holding the turn until it ends (`what`: the error's words when it
    /// cannot be begun).
    pub(crate) async fn begin(pool: &SqlitePool, mut turn: Turn, what: &'static str) -> Result<Self> {
        let begun = sqlx::query("BEGIN IMMEDIATE")
            .execute(writer_conn(&mut turn, pool).await?)
            .await;
        if let Err(e) = begun {
            // The connection is closed: the next turn takes a new one.
            *turn = None;
            return Err(db_error(what, e));
        }
        Ok(Self { turn: Some(turn) })
    }

    /// The connection, inside the transaction.
    pub(crate) fn conn(&mut self) -> Result<&mut SqliteConnection> {
        self.turn
            .as_mut()
            .and_then(|t| t.as_mut())
            .ok_or_else(|| Error::new(ErrorKind::Closed))
    }

    /// The connection, for a handler's own statements (`Context::transaction`).
    pub(crate) fn as_any(&mut self) -> Option<&mut (dyn std::any::Any + Send)> {
        self.turn
            .as_mut()
            .and_then(|t| t.as_mut())
            .map(|c| c as &mut (dyn std::any::Any + Send))
    }

    /// Writes `history` and commits, in one query when SQLite's bound on parameters
    /// allows; rolled back if either fails.
    pub(crate) async fn commit_with(mut self, history: Vec<Rendered>, what: &'static str) -> Result<()> {
        match record_then(self.conn()?, history, Some("COMMIT")).await {
            Ok(due) => {
                if due {
                    // Still the writer's turn, out of the committed transaction.
                    move_recent(self.conn()?).await;
                }
                // Ended: the turn goes back with its connection.
                self.turn = None;
                Ok(())
            }
            Err(e) => {
                self.roll_back().await;
                Err(db_error(what, e))
            }
        }
    }

    /// Rolls the transaction back now, then gives the turn back.
    pub(crate) async fn roll_back(mut self) {
        if let Some(turn) = self.turn.take() {
            roll_back(turn).await;
        }
    }
}

/// Rolls back the transaction on `turn`'s connection, then gives the turn back. If the
/// `ROLLBACK` fails (a failed `COMMIT` may have ended the transaction already, or the
/// connection is broken), the connection is closed, which ends any transaction left, and
/// the next turn takes a new one.
async fn roll_back(mut turn: Turn) {
    if let Some(conn) = turn.as_mut()
        && sqlx::query("ROLLBACK").execute(&mut *conn).await.is_err()
    {
        *turn = None;
    }
}

impl Drop for WriteTx {
    fn drop(&mut self) {
        let Some(mut turn) = self.turn.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(roll_back(turn));
            }
            Err(_) => {
                // Closing the connection ends its transaction.
                *turn = None;
            }
        }
    }
}
