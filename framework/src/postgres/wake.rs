//! Waking waiting receivers: one `LISTEN` connection per transport turns notifications
//! (payload: an entity id) into wake-ups of the receivers of that entity in this process.
//! It is opened when the transport gets its first receiver (`Shared::listen`), not before:
//! a process that only sends reads no notifications.
//! Notifications are a hint only: they are lost while the listener reconnects (then every
//! waiter is woken to look again), and waiters also poll at a bounded interval.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use sqlx::postgres::{PgListener, PgPool};
use tokio::sync::Notify;

use super::rows::CHANNEL;
use crate::error::Result;
use crate::store::db_error;

/// The wake-up of each entity some receiver of this process waited on.
#[derive(Debug, Default)]
pub(crate) struct Wakers {
    entities: Mutex<HashMap<i64, Arc<Notify>>>,
    /// Fired when the `LISTEN` connection was lost: the lock holder's connection most
    /// likely went with it (a restart, backends terminated), so its keeper checks it now
    /// instead of at its next interval (see `holder.rs`).
    pub(crate) holder_check: Notify,
}

impl Wakers {
    /// The wake-up of `entity`.
    pub(crate) fn entity(&self, entity: i64) -> Arc<Notify> {
        self.entities
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(entity)
            .or_default()
            .clone()
    }

    fn wake(&self, entity: i64) {
        let n = self
            .entities
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&entity)
            .cloned();
        if let Some(n) = n {
            n.notify_waiters();
        }
    }

    pub(crate) fn wake_all(&self) {
        let all: Vec<Arc<Notify>> = self
            .entities
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        for n in all {
            n.notify_waiters();
        }
    }
}

/// Starts listening on `pool` (one of its connections, held while the transport lives);
/// returns once `LISTEN` is in place.
pub(crate) async fn listen(pool: &PgPool, wakers: Weak<Wakers>) -> Result<tokio::task::JoinHandle<()>> {
    let mut listener = PgListener::connect_with(pool)
        .await
        .map_err(|e| db_error("cannot open the LISTEN connection", e))?;
    listener
        .listen(CHANNEL)
        .await
        .map_err(|e| db_error("cannot LISTEN for new messages", e))?;
    Ok(tokio::spawn(async move {
        loop {
            let next = listener.try_recv().await;
            let Some(wakers) = wakers.upgrade() else { return };
            match next {
                Ok(Some(n)) => match n.payload().parse::<i64>() {
                    Ok(entity) => wakers.wake(entity),
                    Err(_) => wakers.wake_all(),
                },
                // The connection was lost (and is reopened by the next call): what was
                // notified meanwhile is lost, so everyone looks again.
                Ok(None) => {
                    wakers.holder_check.notify_one();
                    wakers.wake_all();
                }
                Err(e) => {
                    if pool_closed(&e) {
                        return;
                    }
                    let e = crate::store::db_error("the LISTEN connection failed", e);
                    tracing::warn!(error = %e, "the Postgres transport's LISTEN connection failed; retrying");
                    wakers.holder_check.notify_one();
                    wakers.wake_all();
                    drop(wakers);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }))
}

fn pool_closed(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::PoolClosed)
}
