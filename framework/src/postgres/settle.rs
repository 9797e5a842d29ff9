//! Settling and renewing locks. Every statement is fenced by the lock token: the row, its
//! entity, the delivery count of the lock (raised by every lock, so an older lock of the
//! same message does not match) and a lock that has not expired by the clock's now. A
//! settlement that matches no row is `LockLost`.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::receive::Link;
use super::rows::{Lock, props_json, read_token};
use crate::entity::SubQueue;
use crate::error::{Error, ErrorKind, Result};
use crate::message::{LockToken, ReceivedMessage, reasons};
use crate::store::db_error;
use crate::transport::{Settlement, Settler};

/// The fence of a settlement: lock `($1 row, $2 entity, $3 delivery count)` still held at
/// `$4`.
macro_rules! fence {
    ($states:literal) => {
        concat!(
            " WHERE id = $1 AND entity_id = $2 AND (delivery_count & 65535) = $3 AND locked_until > $4 \
             AND state IN ",
            $states
        )
    };
}
/// Merges the properties `$5` (JSON, or NULL for none) into the message's. Properties
/// that hold `courier.failure.endpoint` are an endpoint's record of a failure
/// (`runtime/failures.rs`): they replace every `courier.failure.*` property the message
/// has, so that none a producer wrote stays beside Courier's (issue 31, point 6).
macro_rules! merge_props {
    () => {
        "properties = CASE WHEN $5::text IS NULL THEN properties \
         WHEN jsonb_typeof(properties) = 'object' AND $5::text::jsonb ? 'courier.failure.endpoint' \
         THEN (SELECT COALESCE(jsonb_object_agg(k, v), '{}'::jsonb) FROM jsonb_each(properties) AS e(k, v) \
               WHERE NOT starts_with(k, 'courier.failure.')) || $5::text::jsonb \
         ELSE COALESCE(properties, '{}'::jsonb) || $5::text::jsonb END"
    };
}
/// Tells waiting receivers of the entity that a message is receivable again.
macro_rules! notify {
    () => {
        " RETURNING pg_notify('courier_transport', entity_id::text)"
    };
}

fn lock_lost() -> Error {
    Error::new(ErrorKind::LockLost)
}

impl Link {
    /// The lock a token names, if this link issued it (same database, same entity).
    pub(crate) fn lock_of(&self, token: Option<LockToken>) -> Result<Lock> {
        let token = token.ok_or_else(|| {
            Error::new(ErrorKind::InvalidOperation {
                reason: "the message was not received in PeekLock mode".into(),
            })
        })?;
        let unknown = || {
            Error::new(ErrorKind::UnknownLockToken {
                token: token.to_string(),
            })
        };
        let lock = read_token(self.shared.tag, token).ok_or_else(unknown)?;
        if lock.entity != self.entity.id {
            return Err(unknown());
        }
        Ok(lock)
    }

    pub(crate) async fn settle_token(&self, token: Option<LockToken>, settlement: Settlement) -> Result<()> {
        let lock = self.lock_of(token)?;
        self.shared.check_open()?;
        let now = self.shared.clock.now();
        let dead = self.path.sub_queue() == SubQueue::DeadLetter;
        let invalid = |what: &str| {
            Err(Error::new(ErrorKind::InvalidOperation {
                reason: format!("a message in a dead-letter sub-queue cannot be {what}"),
            }))
        };
        let query = |sql: &'static str| {
            sqlx::query(sql)
                .bind(lock.id)
                .bind(lock.entity)
                .bind(lock.delivery_count)
                .bind(now)
        };
        let done = match settlement {
            Settlement::Complete => {
                let sql = if dead {
                    concat!("DELETE FROM courier.message", fence!("(3)"))
                } else {
                    concat!("DELETE FROM courier.message", fence!("(0, 2)"))
                };
                query(sql).execute(&self.shared.pool).await
            }
            Settlement::Abandon { properties } => {
                if dead {
                    query(concat!(
                        "UPDATE courier.message SET locked_until = NULL, ",
                        merge_props!(),
                        fence!("(3)"),
                        notify!()
                    ))
                    .bind(props_json(&properties))
                    .execute(&self.shared.pool)
                    .await
                } else {
                    // Back to the front: an active message is receivable again, a deferred
                    // one stays deferred; at the max delivery count it is dead-lettered
                    // (S2.6).
                    query(concat!(
                        "UPDATE courier.message SET locked_until = NULL, \
                         state = CASE WHEN state = 2 THEN 2 WHEN delivery_count >= $6 THEN 3 ELSE 0 END, \
                         dl_reason = CASE WHEN state = 0 AND delivery_count >= $6 THEN $7 ELSE dl_reason END, \
                         dl_description = CASE WHEN state = 0 AND delivery_count >= $6 \
                             THEN 'the message was delivered ' || delivery_count || ' times without being settled' \
                             ELSE dl_description END, \
                         dl_source = CASE WHEN state = 0 AND delivery_count >= $6 THEN $8 ELSE dl_source END, ",
                        merge_props!(),
                        fence!("(0, 2)"),
                        notify!()
                    ))
                    .bind(props_json(&properties))
                    .bind(self.entity.max_delivery_count)
                    .bind(reasons::MAX_DELIVERY_COUNT_EXCEEDED)
                    .bind(self.entity.path.clone())
                    .execute(&self.shared.pool)
                    .await
                }
            }
            Settlement::DeadLetter {
                reason,
                description,
                properties,
            } => {
                if dead {
                    return invalid("dead-lettered again");
                }
                query(concat!(
                    "UPDATE courier.message SET state = 3, locked_until = NULL, dl_reason = $6, \
                     dl_description = $7, dl_source = $8, ",
                    merge_props!(),
                    fence!("(0, 2)"),
                    notify!()
                ))
                .bind(props_json(&properties))
                .bind(reason)
                .bind(description)
                .bind(self.entity.path.clone())
                .execute(&self.shared.pool)
                .await
            }
            Settlement::Defer { properties } => {
                if dead {
                    return invalid("deferred");
                }
                query(concat!(
                    "UPDATE courier.message SET state = 2, locked_until = NULL, ",
                    merge_props!(),
                    fence!("(0, 2)")
                ))
                .bind(props_json(&properties))
                .execute(&self.shared.pool)
                .await
            }
        };
        let done = done.map_err(|e| self.shared.closed_or(db_error("cannot settle the message", e)))?;
        if done.rows_affected() == 1 {
            Ok(())
        } else {
            Err(lock_lost())
        }
    }

    /// Renews a message lock for another lock duration (in a session: the session lock).
    async fn renew_token(&self, token: Option<LockToken>) -> Result<DateTime<Utc>> {
        let lock = self.lock_of(token)?;
        if let Some(key) = &self.session {
            return super::sessions::renew_session(self, key).await;
        }
        self.shared.check_open()?;
        let now = self.shared.clock.now();
        let until = self.entity.lock_until(now);
        let done = sqlx::query(concat!(
            "UPDATE courier.message SET locked_until = $5",
            fence!("(0, 2, 3)")
        ))
        .bind(lock.id)
        .bind(lock.entity)
        .bind(lock.delivery_count)
        .bind(now)
        .bind(until)
        .execute(&self.shared.pool)
        .await
        .map_err(|e| self.shared.closed_or(db_error("cannot renew the lock", e)))?;
        if done.rows_affected() == 1 {
            Ok(until)
        } else {
            Err(lock_lost())
        }
    }
}

#[async_trait]
impl Settler for Link {
    async fn settle(&self, message: &ReceivedMessage, settlement: Settlement) -> Result<()> {
        self.settle_token(message.broker.lock_token, settlement).await
    }

    async fn renew(&self, message: &ReceivedMessage) -> Result<DateTime<Utc>> {
        self.renew_token(message.broker.lock_token).await
    }
}
