//! Volatile locks (S2.7): each transport instance holds a session-level advisory lock,
//! keyed by a random number, on a connection of its own for as long as it lives, and
//! stamps that key on the messages it locks. When the process dies (or the connection
//! drops), Postgres releases the advisory lock, and the next receive of an entity releases
//! the message locks whose holder is gone (see `receive::maintain`). A keeper task checks
//! the connection (every interval, and at once when the transport's `LISTEN` connection,
//! if it has one, was lost, which a restart or terminated backends do to both) and, when it was lost,
//! opens another, takes the lock again and wakes every waiting receiver of the transport:
//! while the lock was gone their receives locked nothing.

use std::sync::Weak;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool};
use sqlx::{ConnectOptions, PgConnection};

use super::wake::Wakers;
use crate::error::Result;
use crate::store::db_error;

/// A fresh holder key: both halves non-negative 31-bit numbers, so that they compare
/// with `pg_locks.classid` and `objid` (the halves of a bigint advisory key) as bigints.
pub(crate) fn new_key() -> i64 {
    let (a, b) = uuid::Uuid::new_v4().as_u64_pair();
    let high = i64::try_from(a & 0x7fff_ffff).unwrap_or(0);
    let low = i64::try_from(b & 0x7fff_ffff).unwrap_or(0);
    (high << 32) | low
}

async fn lock(options: &PgConnectOptions, key: i64) -> Result<PgConnection> {
    let mut conn = options
        .connect()
        .await
        .map_err(|e| db_error("cannot open the lock holder's connection", e))?;
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(key)
        .execute(&mut conn)
        .await
        .map_err(|e| db_error("cannot take the lock holder's advisory lock", e))?;
    Ok(conn)
}

/// Takes the advisory lock `key` on a connection of its own and keeps it (checked every
/// `every`, and when `wakers` asks) until the returned task is aborted, which closes the
/// connection.
pub(crate) async fn hold(
    pool: &PgPool,
    key: i64,
    every: Duration,
    wakers: Weak<Wakers>,
) -> Result<tokio::task::JoinHandle<()>> {
    let options = pool.connect_options().as_ref().clone();
    let mut conn = Some(lock(&options, key).await?);
    Ok(tokio::spawn(async move {
        let mut failing = false;
        loop {
            let Some(w) = wakers.upgrade() else { return };
            if failing {
                // Back off while the server is away, unless asked again.
                tokio::select! {
                    () = tokio::time::sleep(every.min(Duration::from_secs(1))) => {}
                    () = w.holder_check.notified() => {}
                }
            } else {
                tokio::select! {
                    () = tokio::time::sleep(every) => {}
                    () = w.holder_check.notified() => {}
                }
            }
            drop(w);
            let alive = match conn.as_mut() {
                Some(c) => sqlx::query("SELECT 1").execute(c).await.is_ok(),
                None => false,
            };
            if alive {
                failing = false;
                continue;
            }
            conn = match lock(&options, key).await {
                Ok(c) => {
                    failing = false;
                    // Their receives locked nothing while the lock was gone.
                    if let Some(w) = wakers.upgrade() {
                        w.wake_all();
                    }
                    Some(c)
                }
                Err(e) => {
                    failing = true;
                    tracing::warn!(error = %e, "the Postgres transport lost its lock holder's connection; retrying");
                    None
                }
            };
        }
    }))
}
