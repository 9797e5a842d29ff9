//! A write transaction of the SQLite store on one of its pool's connections, begun with
//! `BEGIN IMMEDIATE` and ended by its own `COMMIT` or `ROLLBACK` statements, not by sqlx's
//! `Transaction`: the `COMMIT` can then ride in the query of the statements before it
//! (a handling's history events: one trip to the connection's thread, not two), which
//! sqlx's `Transaction`, counting its own `BEGIN`s and `COMMIT`s, does not allow.
//!
//! Dropped before it ended (a handler failed, or its task was stopped), it is rolled back
//! on a task of its own, which gives the connection back to the pool and the process's
//! write turn back only after the `ROLLBACK`: no other writer meets the transaction, and
//! no one else gets the connection inside it. Without a runtime to run that task (a
//! process shutting down), the connection is taken out of the pool and closed, which
//! ends the transaction in SQLite as well.

use sqlx::pool::PoolConnection;
use sqlx::{Sqlite, SqliteConnection, SqlitePool};
use tokio::sync::OwnedMutexGuard;

use crate::error::{Error, ErrorKind, Result};
use crate::store::db_error;
use crate::store::sqlite_history::{Rendered, record_then};

pub(crate) struct WriteTx {
    /// The connection inside its transaction; `None` once the transaction ended.
    conn: Option<PoolConnection<Sqlite>>,
    /// This process's write turn, given back once the transaction ended.
    turn: Option<OwnedMutexGuard<()>>,
}

impl WriteTx {
    /// Takes a connection of `pool` and begins a write transaction on it (`what`: the
    /// error's words when it cannot be begun), holding `turn` until it ends.
    pub(crate) async fn begin(pool: &SqlitePool, turn: OwnedMutexGuard<()>, what: &'static str) -> Result<Self> {
        let mut conn = pool.acquire().await.map_err(|e| db_error(what, e))?;
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut *conn)
            .await
            .map_err(|e| db_error(what, e))?;
        Ok(Self {
            conn: Some(conn),
            turn: Some(turn),
        })
    }

    /// The connection, inside the transaction.
    pub(crate) fn conn(&mut self) -> Result<&mut SqliteConnection> {
        self.conn.as_deref_mut().ok_or_else(|| Error::new(ErrorKind::Closed))
    }

    /// The connection, for a handler's own statements (`Context::transaction`).
    pub(crate) fn as_any(&mut self) -> Option<&mut (dyn std::any::Any + Send)> {
        self.conn.as_deref_mut().map(|c| c as &mut (dyn std::any::Any + Send))
    }

    /// Writes `history` and commits, in one query when SQLite's bound on parameters
    /// allows; rolled back if either fails.
    pub(crate) async fn commit_with(mut self, history: &[Rendered], what: &'static str) -> Result<()> {
        let done = record_then(self.conn()?, history, Some("COMMIT")).await;
        match done {
            Ok(()) => {
                // Ended: given back to the pool as it is, then the turn.
                self.conn = None;
                self.turn = None;
                Ok(())
            }
            Err(e) => {
                self.roll_back().await;
                Err(db_error(what, e))
            }
        }
    }

    /// Rolls the transaction back now, then gives the connection and the turn back.
    pub(crate) async fn roll_back(mut self) {
        if let Some(mut conn) = self.conn.take() {
            // A failure leaves nothing to do: a failed COMMIT's transaction, or a broken
            // connection, which the pool tests before lending it again.
            let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
        }
        self.turn = None;
    }
}

impl Drop for WriteTx {
    fn drop(&mut self) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        let turn = self.turn.take();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
                    drop(conn);
                    drop(turn);
                });
            }
            Err(_) => {
                // Out of the pool: dropping the connection closes it, without a task.
                drop(conn.detach());
                drop(turn);
            }
        }
    }
}
