//! The SQLite statements of saga instances and timeouts, on a connection: the SQLite
//! store runs them in its transactions, the embedded broker's store on the broker's own
//! connection.

use chrono::{DateTime, Utc};
use sqlx::{Row, SqliteConnection};

use crate::endpoint::recoverability::reasons;
use crate::endpoint::timeout_seal::TimeoutSeal;
use crate::error::{Error, ErrorKind, Result};
use crate::store::sqlite::endpoint_secret;
use crate::store::{Claimed, StoredEnvelope, StoredSaga, TakenTimeout, Timeout, TimeoutClaim, db_error};

fn micros(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

fn conflict(saga_type: &str, correlation: &str) -> Error {
    Error::new(ErrorKind::Conflict {
        detail: format!("saga {saga_type} instance {correlation:?} was created or changed concurrently"),
    })
}

pub(crate) async fn load(
    conn: &mut SqliteConnection,
    saga_type: &str,
    correlation: &str,
) -> Result<Option<StoredSaga>> {
    let row =
        sqlx::query("SELECT state, version, state_version FROM courier_saga WHERE saga_type = ?1 AND correlation = ?2")
            .bind(saga_type)
            .bind(correlation)
            .fetch_optional(conn)
            .await
            .map_err(|e| db_error("cannot load a saga instance", e))?;
    row.map(|r| {
        let get = |e| db_error("cannot read a saga instance", e);
        Ok(StoredSaga {
            state: r.try_get(0).map_err(get)?,
            version: r.try_get(1).map_err(get)?,
            state_version: r.try_get(2).map_err(get)?,
        })
    })
    .transpose()
}

pub(crate) async fn save(
    conn: &mut SqliteConnection,
    saga_type: &str,
    correlation: &str,
    state: &str,
    state_version: u32,
    version: Option<i64>,
    now: DateTime<Utc>,
) -> Result<()> {
    let done = match version {
        None => sqlx::query(
            "INSERT INTO courier_saga (saga_type, correlation, state, version, created_at, updated_at, state_version) \
             VALUES (?1, ?2, ?3, 1, ?4, ?4, ?5) ON CONFLICT DO NOTHING",
        )
        .bind(saga_type)
        .bind(correlation)
        .bind(state)
        .bind(micros(now))
        .bind(i64::from(state_version))
        .execute(conn)
        .await
        .map_err(|e| db_error("cannot create a saga instance", e))?,
        Some(v) => sqlx::query(
            "UPDATE courier_saga SET state = ?3, version = version + 1, updated_at = ?4, state_version = ?6 \
             WHERE saga_type = ?1 AND correlation = ?2 AND version = ?5",
        )
        .bind(saga_type)
        .bind(correlation)
        .bind(state)
        .bind(micros(now))
        .bind(v)
        .bind(i64::from(state_version))
        .execute(conn)
        .await
        .map_err(|e| db_error("cannot save a saga instance", e))?,
    };
    if done.rows_affected() == 1 {
        Ok(())
    } else {
        Err(conflict(saga_type, correlation))
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) async fn complete(
    conn: &mut SqliteConnection,
    saga_type: &str,
    correlation: &str,
    state: &str,
    state_version: u32,
    version: Option<i64>,
    archive: bool,
    now: DateTime<Utc>,
) -> Result<()> {
    let created = match version {
        None => micros(now),
        Some(v) => sqlx::query_scalar::<_, i64>(
            "DELETE FROM courier_saga WHERE saga_type = ?1 AND correlation = ?2 AND version = ?3 RETURNING created_at",
        )
        .bind(saga_type)
        .bind(correlation)
        .bind(v)
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| db_error("cannot delete a saga instance", e))?
        .ok_or_else(|| conflict(saga_type, correlation))?,
    };
    if archive {
        sqlx::query(
            "INSERT INTO courier_saga_archive \
             (saga_type, correlation, state, version, created_at, completed_at, state_version) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )
        .bind(saga_type)
        .bind(correlation)
        .bind(state)
        .bind(version.unwrap_or(0) + 1)
        .bind(created)
        .bind(micros(now))
        .bind(i64::from(state_version))
        .execute(&mut *conn)
        .await
        .map_err(|e| db_error("cannot archive a saga instance", e))?;
    }
    sqlx::query("DELETE FROM courier_saga_timeout WHERE saga_type = ?1 AND correlation = ?2")
        .bind(saga_type)
        .bind(correlation)
        .execute(&mut *conn)
        .await
        .map_err(|e| db_error("cannot delete a completed saga's timeouts", e))?;
    sqlx::query("DELETE FROM courier_saga_property WHERE saga_type = ?1 AND correlation = ?2")
        .bind(saga_type)
        .bind(correlation)
        .execute(conn)
        .await
        .map_err(|e| db_error("cannot delete a completed saga's correlation properties", e))?;
    Ok(())
}

pub(crate) async fn find_by_property(
    conn: &mut SqliteConnection,
    saga_type: &str,
    name: &str,
    value: &str,
) -> Result<Option<String>> {
    sqlx::query_scalar(
        "SELECT correlation FROM courier_saga_property WHERE saga_type = ?1 AND name = ?2 AND value = ?3",
    )
    .bind(saga_type)
    .bind(name)
    .bind(value)
    .fetch_optional(conn)
    .await
    .map_err(|e| db_error("cannot find a saga instance by a correlation property", e))
}

pub(crate) async fn set_properties(
    conn: &mut SqliteConnection,
    saga_type: &str,
    correlation: &str,
    properties: &[(String, String)],
) -> Result<Option<(String, String)>> {
    for (name, value) in properties {
        sqlx::query("DELETE FROM courier_saga_property WHERE saga_type = ?1 AND correlation = ?2 AND name = ?3")
            .bind(saga_type)
            .bind(correlation)
            .bind(name)
            .execute(&mut *conn)
            .await
            .map_err(|e| db_error("cannot replace a saga correlation property", e))?;
        sqlx::query(
            "INSERT INTO courier_saga_property (saga_type, name, value, correlation) VALUES (?1, ?2, ?3, ?4) \
             ON CONFLICT DO NOTHING",
        )
        .bind(saga_type)
        .bind(name)
        .bind(value)
        .bind(correlation)
        .execute(&mut *conn)
        .await
        .map_err(|e| db_error("cannot set a saga correlation property", e))?;
        let holder = find_by_property(&mut *conn, saga_type, name, value).await?;
        if let Some(holder) = holder
            && holder != correlation
        {
            return Ok(Some((name.clone(), holder)));
        }
    }
    Ok(None)
}

pub(crate) async fn add_timeouts(
    conn: &mut SqliteConnection,
    endpoint: &str,
    saga_type: &str,
    correlation: &str,
    timeouts: Vec<Timeout>,
    now: DateTime<Utc>,
) -> Result<()> {
    for t in timeouts {
        let (json, body) = StoredEnvelope::split(t.envelope)?;
        sqlx::query(
            "INSERT INTO courier_saga_timeout \
             (id, endpoint, saga_type, correlation, due_at, envelope, body, created_at, timeout_key) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        )
        .bind(&t.id)
        .bind(endpoint)
        .bind(saga_type)
        .bind(correlation)
        .bind(micros(t.due))
        .bind(json)
        .bind(body.as_ref())
        .bind(micros(now))
        .bind(&t.key)
        .execute(&mut *conn)
        .await
        .map_err(|e| db_error("cannot store a saga timeout", e))?;
    }
    Ok(())
}

pub(crate) async fn cancel_timeouts(conn: &mut SqliteConnection, ids: &[String]) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    let list = serde_json::to_string(ids).unwrap_or_else(|_| "[]".to_owned());
    sqlx::query("DELETE FROM courier_saga_timeout WHERE id IN (SELECT value FROM json_each(?1))")
        .bind(list)
        .execute(conn)
        .await
        .map_err(|e| db_error("cannot cancel saga timeouts", e))?;
    Ok(())
}

pub(crate) async fn cancel_timeout_keys(
    conn: &mut SqliteConnection,
    saga_type: &str,
    correlation: &str,
    keys: &[String],
) -> Result<()> {
    if keys.is_empty() {
        return Ok(());
    }
    let list = serde_json::to_string(keys).unwrap_or_else(|_| "[]".to_owned());
    sqlx::query(
        "DELETE FROM courier_saga_timeout WHERE saga_type = ?1 AND correlation = ?2 \
         AND timeout_key IN (SELECT value FROM json_each(?3)) AND dead_lettered_at IS NULL",
    )
    .bind(saga_type)
    .bind(correlation)
    .bind(list)
    .execute(conn)
    .await
    .map_err(|e| db_error("cannot cancel saga timeouts by key", e))?;
    Ok(())
}

pub(crate) async fn take_timeout(conn: &mut SqliteConnection, id: &str) -> Result<bool> {
    let done = sqlx::query("DELETE FROM courier_saga_timeout WHERE id = ?1")
        .bind(id)
        .execute(conn)
        .await
        .map_err(|e| db_error("cannot take a fired saga timeout", e))?;
    Ok(done.rows_affected() == 1)
}

/// Marks due (and long unhandled) timeouts dispatched at `mark` and returns their
/// messages, sealed with the endpoint's secret (made now if it has none;
/// `endpoint/timeout_seal.rs`); and, in the same statement, marks those already sent
/// `claim.max_dispatches` times dead-lettered instead, returning their ids; and every row
/// taken, for the history.
pub(crate) async fn claim_due(
    conn: &mut SqliteConnection,
    endpoint: &str,
    claim: TimeoutClaim,
    mark: DateTime<Utc>,
) -> Result<Claimed> {
    // SET reads the row as it was: a row sent its most times keeps its claim time and
    // count and gets the dead-letter mark; RETURNING reads it as it is now.
    let rows = sqlx::query(
        "UPDATE courier_saga_timeout SET \
           dispatched_at = CASE WHEN dispatches >= ?6 THEN dispatched_at ELSE ?2 END, \
           dispatches = CASE WHEN dispatches >= ?6 THEN dispatches ELSE dispatches + 1 END, \
           dead_lettered_at = CASE WHEN dispatches >= ?6 THEN ?7 ELSE dead_lettered_at END, \
           dead_letter_reason = CASE WHEN dispatches >= ?6 THEN ?8 ELSE dead_letter_reason END \
         WHERE id IN ( \
           SELECT id FROM ( \
             SELECT id, due_at FROM courier_saga_timeout \
               WHERE endpoint = ?1 AND dispatched_at IS NULL AND dead_lettered_at IS NULL AND due_at <= ?5 \
             UNION ALL \
             SELECT id, due_at FROM courier_saga_timeout \
               WHERE endpoint = ?1 AND dispatched_at IS NOT NULL AND dead_lettered_at IS NULL \
                 AND dispatched_at < ?3) \
           ORDER BY due_at LIMIT ?4) \
         RETURNING envelope, body, due_at, id, dead_lettered_at IS NOT NULL, saga_type, correlation, timeout_key, \
           dispatches",
    )
    .bind(endpoint)
    .bind(micros(mark))
    .bind(micros(claim.reclaim_before))
    .bind(claim.limit)
    .bind(micros(claim.due_until))
    .bind(i64::from(claim.max_dispatches.max(1)))
    .bind(micros(claim.now))
    .bind(reasons::TIMEOUT_DISPATCHES_EXHAUSTED)
    .fetch_all(&mut *conn)
    .await
    .map_err(|e| db_error("cannot claim due saga timeouts", e))?;
    let mut claimed = Claimed::default();
    let mut seal = None;
    for r in rows {
        let get = |e| db_error("cannot read a saga timeout", e);
        let json: String = r.try_get(0).map_err(get)?;
        let body: Vec<u8> = r.try_get(1).map_err(get)?;
        let due: i64 = r.try_get(2).map_err(get)?;
        let due = DateTime::from_timestamp_micros(due).unwrap_or(claim.now);
        let id: String = r.try_get(3).map_err(get)?;
        let dead = r.try_get::<i64, _>(4).map_err(get)? != 0;
        let mut envelope = StoredEnvelope::join(&json, body)?;
        claimed.taken.push(TakenTimeout::of_row(
            id.clone(),
            r.try_get(5).map_err(get)?,
            r.try_get(6).map_err(get)?,
            r.try_get(7).map_err(get)?,
            due,
            r.try_get(8).map_err(get)?,
            dead,
            &envelope,
        ));
        if dead {
            claimed.dead_lettered.push(id);
            continue;
        }
        let seal = match &mut seal {
            Some(seal) => seal,
            None => seal.insert(TimeoutSeal::new(
                &endpoint_secret(&mut *conn, endpoint, claim.now).await?,
            )?),
        };
        seal.seal(endpoint, &mut envelope, due);
        claimed.due.push(claim.schedule(envelope, due));
    }
    Ok(claimed)
}

pub(crate) async fn next_due(conn: &mut SqliteConnection, endpoint: &str) -> Result<Option<DateTime<Utc>>> {
    let at: Option<i64> = sqlx::query_scalar(
        "SELECT MIN(due_at) FROM courier_saga_timeout WHERE endpoint = ?1 AND dispatched_at IS NULL",
    )
    .bind(endpoint)
    .fetch_one(conn)
    .await
    .map_err(|e| db_error("cannot read the next saga timeout", e))?;
    Ok(at.and_then(DateTime::from_timestamp_micros))
}

/// Confirms claimed timeouts sent at `at` (see
/// [`Store::timeouts_sent`](crate::store::Store::timeouts_sent)).
pub(crate) async fn confirm_sent(conn: &mut SqliteConnection, ids: &[String], at: DateTime<Utc>) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    let list = serde_json::to_string(ids).unwrap_or_else(|_| "[]".to_owned());
    sqlx::query(
        "UPDATE courier_saga_timeout SET dispatched_at = MAX(dispatched_at, ?2) \
         WHERE id IN (SELECT value FROM json_each(?1)) AND dispatched_at IS NOT NULL AND dead_lettered_at IS NULL",
    )
    .bind(list)
    .bind(micros(at))
    .execute(conn)
    .await
    .map_err(|e| db_error("cannot confirm that saga timeouts were sent", e))?;
    Ok(())
}

pub(crate) async fn unclaim(conn: &mut SqliteConnection, ids: &[String]) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    let list = serde_json::to_string(ids).unwrap_or_else(|_| "[]".to_owned());
    // The send failed: the claim does not count as a dispatch.
    sqlx::query(
        "UPDATE courier_saga_timeout SET dispatched_at = NULL, dispatches = MAX(dispatches - 1, 0) \
         WHERE id IN (SELECT value FROM json_each(?1))",
    )
    .bind(list)
    .execute(conn)
    .await
    .map_err(|e| db_error("cannot release saga timeouts", e))?;
    Ok(())
}

/// Marks a timeout whose message was dead-lettered (see
/// [`Store::dead_letter_timeout`](crate::store::Store::dead_letter_timeout)).
pub(crate) async fn dead_letter(
    conn: &mut SqliteConnection,
    endpoint: &str,
    id: &str,
    reason: &str,
    now: DateTime<Utc>,
) -> Result<bool> {
    let done = sqlx::query(
        "UPDATE courier_saga_timeout SET dead_lettered_at = ?3, dead_letter_reason = ?4 \
         WHERE id = ?1 AND endpoint = ?2",
    )
    .bind(id)
    .bind(endpoint)
    .bind(micros(now))
    .bind(reason)
    .execute(conn)
    .await
    .map_err(|e| db_error("cannot mark a saga timeout dead-lettered", e))?;
    Ok(done.rows_affected() == 1)
}

/// Moves a claimed timeout's claim time to `until` (see
/// [`Store::postpone_timeout_reclaim`](crate::store::Store::postpone_timeout_reclaim)).
pub(crate) async fn postpone_reclaim(
    conn: &mut SqliteConnection,
    endpoint: &str,
    id: &str,
    until: DateTime<Utc>,
) -> Result<()> {
    sqlx::query(
        "UPDATE courier_saga_timeout SET dispatched_at = MAX(dispatched_at, ?3) \
         WHERE id = ?1 AND endpoint = ?2 AND dispatched_at IS NOT NULL AND dead_lettered_at IS NULL",
    )
    .bind(id)
    .bind(endpoint)
    .bind(micros(until))
    .execute(conn)
    .await
    .map_err(|e| db_error("cannot postpone a saga timeout's reclaim", e))?;
    Ok(())
}

/// How many expired completion markers one completion deletes at most.
const MARKERS_PURGED: i64 = 100;

pub(crate) async fn mark_completed(
    conn: &mut SqliteConnection,
    saga_type: &str,
    correlation: &str,
    now: DateTime<Utc>,
    expires: DateTime<Utc>,
) -> Result<()> {
    sqlx::query(
        "DELETE FROM courier_saga_completed WHERE (saga_type, correlation) IN \
         (SELECT saga_type, correlation FROM courier_saga_completed WHERE expires_at <= ?1 LIMIT ?2)",
    )
    .bind(micros(now))
    .bind(MARKERS_PURGED)
    .execute(&mut *conn)
    .await
    .map_err(|e| db_error("cannot delete expired saga completion markers", e))?;
    sqlx::query(
        "INSERT INTO courier_saga_completed (saga_type, correlation, completed_at, expires_at) \
         VALUES (?1, ?2, ?3, ?4) \
         ON CONFLICT (saga_type, correlation) DO UPDATE SET completed_at = excluded.completed_at, \
         expires_at = excluded.expires_at",
    )
    .bind(saga_type)
    .bind(correlation)
    .bind(micros(now))
    .bind(micros(expires))
    .execute(conn)
    .await
    .map_err(|e| db_error("cannot mark a saga instance completed", e))?;
    Ok(())
}

pub(crate) async fn completed_at(
    conn: &mut SqliteConnection,
    saga_type: &str,
    correlation: &str,
    now: DateTime<Utc>,
) -> Result<Option<DateTime<Utc>>> {
    let at: Option<i64> = sqlx::query_scalar(
        "SELECT completed_at FROM courier_saga_completed WHERE saga_type = ?1 AND correlation = ?2 AND expires_at > ?3",
    )
    .bind(saga_type)
    .bind(correlation)
    .bind(micros(now))
    .fetch_optional(conn)
    .await
    .map_err(|e| db_error("cannot read a saga completion marker", e))?;
    Ok(at.map(|us| DateTime::from_timestamp_micros(us).unwrap_or(DateTime::UNIX_EPOCH)))
}

/// `impl UnitOfWork for $ty { $methods + the saga methods on SQLite }`, for a type with
/// `fn sqlite_conn(&mut self) -> Result<&mut Connection>` (and `record_history`: see
/// [`unit_of_work_with_sagas!`](crate::store::unit_of_work_with_sagas)).
macro_rules! sqlite_unit_of_work {
    ($ty:ty, { $($methods:tt)* }) => {
        $crate::store::unit_of_work_with_sagas!($ty, crate::store::sqlite_saga, sqlite_conn, { $($methods)* });
    };
}
pub(crate) use sqlite_unit_of_work;
