//! Lending the engine's connection to a store transaction: the handler's inbox record, its
//! writes, the completion of the received message and the messages it sent commit in ONE
//! SQLite transaction (`EmbeddedStore`).
//!
//! Holds the engine's side: `Conn` (the connection, while it is not lent), `lend`,
//! `finish` and `rollback_lease`. The lease itself (`Lease`, `Finish`) is carried by a
//! command: `commands.rs`. While a lease is out the engine serves nothing else; it may
//! not begin transactions of its own here.

use sqlx::Connection;
use sqlx::sqlite::SqliteConnection;
use tokio::sync::oneshot;

use crate::entity::{EntityPath, QueueOptions};
use crate::error::{Error, ErrorKind, Result};

use super::Engine;
use super::commands::{Finish, Kind, Lease, Reply, Returned, answer};
use super::rows::{Sql, from_micros, lock_lost, storage_error};

/// The engine's connection, lent out only to a store transaction.
pub(super) struct Conn(pub(super) Option<SqliteConnection>);

impl Conn {
    pub(super) fn get(&mut self) -> Sql<&mut SqliteConnection> {
        self.0
            .as_mut()
            .ok_or_else(|| sqlx::Error::Protocol("the embedded broker's connection is lent out".into()))
    }

    pub(super) async fn close(&mut self) -> Sql {
        match self.0.take() {
            Some(c) => c.close().await,
            None => Ok(()),
        }
    }
}

impl Engine {
    /// Lends the connection to a store transaction and waits for it to come back, then
    /// finishes (or rolls back) that transaction.
    pub(super) async fn lend(&mut self, reply: Reply<Lease>) {
        if reply.is_closed() {
            return;
        }
        let Some(conn) = self.conn.0.take() else {
            answer(
                reply,
                &ErrorKind::Storage {
                    detail: "the embedded broker's connection is lent out".into(),
                    transient: true,
                },
            );
            return;
        };
        let (back, returned) = oneshot::channel();
        let lease = Lease {
            conn: Some(conn),
            back: Some(back),
        };
        // A requester that went away drops the lease, which sends the connection back.
        let _ = reply.send(Ok(lease));
        match returned.await {
            Ok(Returned { conn, finish }) => {
                self.conn.0 = Some(conn);
                match finish {
                    Some(f) => self.finish(f).await,
                    None => {
                        // The holder may have begun a transaction: roll it back (an error
                        // only says there was none).
                        if let Ok(c) = self.conn.get()
                            && let Err(e) = sqlx::query("ROLLBACK").execute(c).await
                        {
                            tracing::trace!(error = %e, "no transaction to roll back after a lease");
                        }
                    }
                }
            }
            Err(_) => {
                tracing::error!("a lease of the embedded broker's connection was lost; the broker stops serving");
            }
        }
    }

    /// Ends a lease's transaction: completes its lock and inserts its messages, then
    /// commits; anything failing rolls the whole transaction back (the holder's writes too).
    pub(super) async fn finish(&mut self, f: Finish) {
        let now = self.state.now();
        let mut outcomes = Vec::new();
        let Finish {
            complete,
            sends,
            put_back,
            max_message_size,
            history,
            reply,
        } = f;
        let result: Sql<Result<bool>> = async {
            // Each lock is the message's row at its delivery count, still locked: one
            // statement for up to 500 (a batch's), all found or the lock is lost (and
            // the transaction rolled back).
            for chunk in complete.chunks(500) {
                let done = if let [(_, id, dc)] = chunk {
                    sqlx::query(
                        "DELETE FROM courier_message WHERE id = ?1 AND delivery_count = ?2 AND state IN (2, 4) \
                         AND locked_until > ?3",
                    )
                    .bind(id)
                    .bind(dc)
                    .bind(now)
                    .execute(self.conn.get()?)
                    .await?
                } else {
                    let ids = vec!["?"; chunk.len()].join(", ");
                    let pairs = vec!["(id = ? AND delivery_count = ?)"; chunk.len()].join(" OR ");
                    let mut query = sqlx::query(sqlx::AssertSqlSafe(format!(
                        "DELETE FROM courier_message WHERE state IN (2, 4) AND locked_until > ? \
                         AND id IN ({ids}) AND ({pairs})"
                    )))
                    .bind(now);
                    for (_, id, _) in chunk {
                        query = query.bind(id);
                    }
                    for (_, id, dc) in chunk {
                        query = query.bind(id).bind(dc);
                    }
                    query.execute(self.conn.get()?).await?
                };
                if done.rows_affected() != chunk.len() as u64 {
                    return Ok(Err(lock_lost()));
                }
            }
            let mut rows = Vec::new();
            for (destination, is_topic, messages) in sends {
                let entity = match self.state.by_name.get(&(0, destination.clone())).copied() {
                    Some(id) => id,
                    None if is_topic => {
                        let options = QueueOptions::default();
                        if let Err(e) = self
                            .create(Kind::Topic, None, destination.clone(), &options, now)
                            .await?
                        {
                            return Ok(Err(e));
                        }
                        match self.state.by_name.get(&(0, destination.clone())).copied() {
                            Some(id) => id,
                            None => return Ok(Err(Self::not_found(&EntityPath::queue(&destination)))),
                        }
                    }
                    None => return Ok(Err(Self::not_found(&EntityPath::queue(&destination)))),
                };
                let info = match self.state.entity(entity) {
                    Ok(i) => i,
                    Err(e) => return Ok(Err(e)),
                };
                if info.kind == Kind::Subscription {
                    return Ok(Err(Error::new(ErrorKind::InvalidOperation {
                        reason: format!("{destination} is a subscription: send to its topic"),
                    })));
                }
                let requires_session = info.requires_session;
                if let Some(e) = messages.iter().find_map(|m| {
                    crate::embedded::check_envelope(
                        max_message_size,
                        m,
                        &destination,
                        requires_session,
                        from_micros(now),
                    )
                    .err()
                }) {
                    return Ok(Err(e));
                }
                if let Err(e) = self.rows_for_send(entity, messages, now, &mut rows) {
                    return Ok(Err(e));
                }
            }
            self.insert_rows(&rows).await?;
            if let Some((entity, seqs)) = put_back
                && let Err(e) = self.put_back(entity, &seqs, now).await?
            {
                return Ok(Err(e));
            }
            self.serve_waiters(now, &mut outcomes).await?;
            self.flush_sequences().await?;
            let due = crate::store::sqlite_history::record_then(self.conn.get()?, history, Some("COMMIT")).await?;
            Ok(Ok(due))
        }
        .await;
        match result {
            Ok(Ok(due)) => {
                self.deliver(outcomes);
                let _ = reply.send(Ok(()));
                if due && let Ok(c) = self.conn.get() {
                    // After the handling's answer: its commit does not wait for the move.
                    crate::store::sqlite_history::move_recent(c).await;
                }
            }
            Ok(Err(e)) => {
                self.rollback_lease().await;
                let _ = reply.send(Err(e));
            }
            Err(e) => {
                tracing::error!(error = %e, "a store transaction on the embedded broker's file failed");
                self.rollback_lease().await;
                let _ = reply.send(Err(storage_error(e)));
            }
        }
        self.expire_waiters();
    }

    pub(super) async fn rollback_lease(&mut self) {
        if let Ok(c) = self.conn.get()
            && let Err(e) = sqlx::query("ROLLBACK").execute(c).await
        {
            tracing::warn!(error = %e, "rolling back a store transaction on the embedded broker's file failed");
        }
        self.after_rollback().await;
    }
}
