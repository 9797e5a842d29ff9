//! Sessions (S4): a session lock is a row of `courier.session` held until its
//! `locked_until`, named by a generation raised at each accept, so a receiver whose lock
//! expired and was taken by another cannot renew or use it. The messages a session
//! receiver locks are locked until the session lock ends, and renewed with it.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, Utc};

use super::Shared;
use super::entities::EntityInfo;
use super::receive::{Link, SessionKey, receive_through_link};
use crate::entity::{EntityPath, SubQueue};
use crate::error::{Error, ErrorKind, Result};
use crate::message::{LockToken, ReceivedMessage, SequenceNumber};
use crate::store::db_error;
use crate::transport::{Delivery, Receiver, SessionReceiver, SessionSelector, Settlement};

fn lost<T>() -> Result<T> {
    Err(Error::new(ErrorKind::SessionLockLost))
}

/// Locks session `session` of `entity` if nobody holds it; returns the lock's generation.
async fn try_lock(shared: &Shared, entity: &EntityInfo, session: &str, now: DateTime<Utc>) -> Result<Option<i64>> {
    sqlx::query_scalar(
        "INSERT INTO courier.session (entity_id, session_id, locked_until, lock_gen) VALUES ($1, $2, $3, 1) \
         ON CONFLICT (entity_id, session_id) DO UPDATE SET locked_until = excluded.locked_until, \
         lock_gen = courier.session.lock_gen + 1 \
         WHERE courier.session.locked_until IS NULL OR courier.session.locked_until <= $4 \
         RETURNING lock_gen",
    )
    .bind(entity.id)
    .bind(session)
    .bind(entity.lock_until(now))
    .bind(now)
    .fetch_optional(&shared.pool)
    .await
    .map_err(|e| shared.closed_or(db_error("cannot lock the session", e)))
}

/// One attempt to lock a session as `selector` says.
async fn try_accept(shared: &Shared, entity: &EntityInfo, selector: &SessionSelector) -> Result<Option<SessionKey>> {
    let now = shared.clock.now();
    match selector {
        SessionSelector::Named(s) => Ok(try_lock(shared, entity, s, now).await?.map(|generation| SessionKey {
            id: s.clone(),
            generation,
        })),
        SessionSelector::Next => {
            super::upkeep::run(shared, entity, now).await?;
            // A few candidates: one taken by a competing receiver meanwhile is skipped.
            let candidates: Vec<String> = sqlx::query_scalar(
                "SELECT session_id FROM ( \
                   SELECT m.session_id, min(m.seq) AS first FROM courier.message m \
                   WHERE m.entity_id = $1 AND m.state = 0 AND m.session_id IS NOT NULL \
                     AND (m.locked_until IS NULL OR m.locked_until <= $2) AND m.delivery_count < $3 \
                     AND NOT EXISTS (SELECT 1 FROM courier.session s WHERE s.entity_id = $1 \
                       AND s.session_id = m.session_id AND s.locked_until > $2) \
                   GROUP BY m.session_id ORDER BY first LIMIT 8) c",
            )
            .bind(entity.id)
            .bind(now)
            .bind(entity.max_delivery_count)
            .fetch_all(&shared.pool)
            .await
            .map_err(|e| shared.closed_or(db_error("cannot look for a session", e)))?;
            for s in candidates {
                if let Some(generation) = try_lock(shared, entity, &s, now).await? {
                    return Ok(Some(SessionKey { id: s, generation }));
                }
            }
            Ok(None)
        }
    }
}

/// Accepts a session, waiting up to `max_wait` for one.
pub(crate) async fn accept(
    shared: &Arc<Shared>,
    entity: EntityInfo,
    path: &EntityPath,
    selector: &SessionSelector,
    max_wait: Duration,
) -> Result<Arc<dyn SessionReceiver>> {
    if path.sub_queue() == SubQueue::DeadLetter {
        return Err(Error::new(ErrorKind::InvalidOperation {
            reason: "dead-letter sub-queues have no sessions: use a plain receiver".into(),
        }));
    }
    if !entity.requires_session {
        return Err(Error::new(ErrorKind::InvalidOperation {
            reason: format!("{} does not require sessions: use a plain receiver", entity.path),
        }));
    }
    let deadline = tokio::time::Instant::now() + max_wait.min(Duration::from_secs(24 * 3600));
    let waker = shared.wakers.entity(entity.id);
    loop {
        let notified = waker.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        shared.check_open()?;
        if let Some(key) = try_accept(shared, &entity, selector).await? {
            let until = entity.lock_until(shared.clock.now());
            return Ok(Arc::new(PgSessionReceiver {
                link: Arc::new(Link::new(shared.clone(), entity, path.clone(), Some(key))),
                locked_until: Mutex::new(until),
            }));
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            let reason = match selector {
                SessionSelector::Next => "no unlocked session has messages".to_owned(),
                SessionSelector::Named(s) => format!("session {s:?} is held by another receiver"),
            };
            return Err(Error::new(ErrorKind::SessionNotAvailable { reason }));
        }
        tokio::select! {
            () = &mut notified => {}
            () = tokio::time::sleep_until((now + shared.poll_interval).min(deadline)) => {}
        }
    }
}

/// Renews the session lock of `link` and the locks of the messages it holds.
pub(crate) async fn renew_session(link: &Link, key: &SessionKey) -> Result<DateTime<Utc>> {
    link.shared.check_open()?;
    let now = link.shared.clock.now();
    let until = link.entity.lock_until(now);
    let renewed: i64 = sqlx::query_scalar(
        "WITH s AS (UPDATE courier.session SET locked_until = $5 WHERE entity_id = $1 AND session_id = $2 \
                    AND lock_gen = $3 AND locked_until > $4 RETURNING 1), \
         m AS (UPDATE courier.message SET locked_until = $5 WHERE entity_id = $1 AND session_id = $2 \
                    AND state <> 1 AND locked_until > $4 AND EXISTS (SELECT 1 FROM s) RETURNING 1) \
         SELECT count(*) FROM s",
    )
    .bind(link.entity.id)
    .bind(&key.id)
    .bind(key.generation)
    .bind(now)
    .bind(until)
    .fetch_one(&link.shared.pool)
    .await
    .map_err(|e| link.shared.closed_or(db_error("cannot renew the session lock", e)))?;
    if renewed == 1 { Ok(until) } else { lost() }
}

/// Releases a session lock; the messages still locked under it go back as if abandoned.
async fn release(shared: &Shared, entity: i64, key: &SessionKey, now: DateTime<Utc>) -> Result<()> {
    sqlx::query(
        "WITH s AS (UPDATE courier.session SET locked_until = NULL WHERE entity_id = $1 AND session_id = $2 \
                    AND lock_gen = $3 AND locked_until > $4 RETURNING 1), \
         m AS (UPDATE courier.message SET locked_until = NULL WHERE entity_id = $1 AND session_id = $2 \
                    AND state <> 1 AND locked_until > $4 AND EXISTS (SELECT 1 FROM s) RETURNING 1) \
         SELECT pg_notify('courier_transport', $1::text) FROM s",
    )
    .bind(entity)
    .bind(&key.id)
    .bind(key.generation)
    .bind(now)
    .execute(&shared.pool)
    .await
    .map_err(|e| shared.closed_or(db_error("cannot release the session", e)))?;
    Ok(())
}

/// A receiver holding one session's lock.
pub(crate) struct PgSessionReceiver {
    link: Arc<Link>,
    locked_until: Mutex<DateTime<Utc>>,
}

impl PgSessionReceiver {
    fn key(&self) -> Result<&SessionKey> {
        self.link
            .session
            .as_ref()
            .ok_or_else(|| Error::new(ErrorKind::SessionLockLost))
    }

    /// The session lock, checked at the clock's now.
    async fn check_lock(&self) -> Result<&SessionKey> {
        let key = self.key()?;
        self.link.shared.check_open()?;
        match self.link.session_lock(key, self.link.shared.clock.now()).await? {
            Some(_) => Ok(key),
            None => lost(),
        }
    }
}

impl Drop for PgSessionReceiver {
    fn drop(&mut self) {
        // Give the session back at once rather than when its lock expires.
        let (Some(key), Ok(runtime)) = (self.link.session.clone(), tokio::runtime::Handle::try_current()) else {
            return;
        };
        if self.link.shared.check_open().is_err() {
            return;
        }
        let (shared, entity) = (self.link.shared.clone(), self.link.entity.id);
        runtime.spawn(async move {
            let now = shared.clock.now();
            let _ = release(&shared, entity, &key, now).await;
        });
    }
}

receive_through_link!(PgSessionReceiver);

#[async_trait]
impl SessionReceiver for PgSessionReceiver {
    fn session_id(&self) -> &str {
        self.link.session.as_ref().map_or("", |k| k.id.as_str())
    }

    fn session_locked_until(&self) -> DateTime<Utc> {
        *self.locked_until.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn renew_session_lock(&self) -> Result<DateTime<Utc>> {
        let until = renew_session(&self.link, self.key()?).await?;
        *self.locked_until.lock().unwrap_or_else(PoisonError::into_inner) = until;
        Ok(until)
    }

    async fn session_state(&self) -> Result<Option<Bytes>> {
        let key = self.check_lock().await?;
        let state: Option<Vec<u8>> =
            sqlx::query_scalar("SELECT state FROM courier.session WHERE entity_id = $1 AND session_id = $2")
                .bind(self.link.entity.id)
                .bind(&key.id)
                .fetch_optional(&self.link.shared.pool)
                .await
                .map_err(|e| self.link.shared.closed_or(db_error("cannot read the session state", e)))?
                .flatten();
        Ok(state.map(Bytes::from))
    }

    async fn set_session_state(&self, state: Option<Bytes>) -> Result<()> {
        let key = self.key()?;
        self.link.shared.check_open()?;
        let done = sqlx::query(
            "UPDATE courier.session SET state = $5 WHERE entity_id = $1 AND session_id = $2 AND lock_gen = $3 \
             AND locked_until > $4",
        )
        .bind(self.link.entity.id)
        .bind(&key.id)
        .bind(key.generation)
        .bind(self.link.shared.clock.now())
        .bind(state.as_deref())
        .execute(&self.link.shared.pool)
        .await
        .map_err(|e| {
            self.link
                .shared
                .closed_or(db_error("cannot write the session state", e))
        })?;
        if done.rows_affected() == 1 { Ok(()) } else { lost() }
    }

    async fn release(&self) -> Result<()> {
        let key = self.key()?;
        self.link.shared.check_open()?;
        release(
            &self.link.shared,
            self.link.entity.id,
            key,
            self.link.shared.clock.now(),
        )
        .await
    }
}
