//! Saga instances and timeouts on Postgres, on the connection of a handler's transaction
//! (its own, or its share of a commit group's).

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Row};

use crate::error::{Error, ErrorKind, Result};
use crate::store::{StoredEnvelope, StoredSaga, Timeout, db_error};

pub(crate) async fn load(conn: &mut PgConnection, saga_type: &str, correlation: &str) -> Result<Option<StoredSaga>> {
    let row = sqlx::query(
        "SELECT state::text, version, state_version FROM courier.saga WHERE saga_type = $1 AND correlation = $2",
    )
    .bind(saga_type)
    .bind(correlation)
    .fetch_optional(&mut *conn)
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
    conn: &mut PgConnection,
    saga_type: &str,
    correlation: &str,
    state: &str,
    state_version: u32,
    version: Option<i64>,
    now: DateTime<Utc>,
) -> Result<()> {
    // A concurrent creation of the same instance makes this INSERT wait for the other
    // transaction, then do nothing: a conflict, and the message is retried.
    let done = match version {
        None => sqlx::query(
            "INSERT INTO courier.saga (saga_type, correlation, state, version, created_at, updated_at, state_version) \
             VALUES ($1, $2, $3::jsonb, 1, $4, $4, $5) ON CONFLICT DO NOTHING",
        )
        .bind(saga_type)
        .bind(correlation)
        .bind(state)
        .bind(now)
        .bind(i64::from(state_version))
        .execute(&mut *conn)
        .await
        .map_err(|e| db_error("cannot create a saga instance", e))?,
        Some(v) => sqlx::query(
            "UPDATE courier.saga SET state = $3::jsonb, version = version + 1, updated_at = $4, state_version = $6 \
             WHERE saga_type = $1 AND correlation = $2 AND version = $5",
        )
        .bind(saga_type)
        .bind(correlation)
        .bind(state)
        .bind(now)
        .bind(v)
        .bind(i64::from(state_version))
        .execute(&mut *conn)
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
    conn: &mut PgConnection,
    saga_type: &str,
    correlation: &str,
    state: &str,
    state_version: u32,
    version: Option<i64>,
    archive: bool,
    now: DateTime<Utc>,
) -> Result<()> {
    let created = match version {
        None => now,
        Some(v) => sqlx::query_scalar::<_, DateTime<Utc>>(
            "DELETE FROM courier.saga WHERE saga_type = $1 AND correlation = $2 AND version = $3 \
             RETURNING created_at",
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
            "INSERT INTO courier.saga_archive \
             (saga_type, correlation, state, version, created_at, completed_at, state_version) \
             VALUES ($1, $2, $3::jsonb, $4, $5, $6, $7)",
        )
        .bind(saga_type)
        .bind(correlation)
        .bind(state)
        .bind(version.unwrap_or(0) + 1)
        .bind(created)
        .bind(now)
        .bind(i64::from(state_version))
        .execute(&mut *conn)
        .await
        .map_err(|e| db_error("cannot archive a saga instance", e))?;
    }
    sqlx::query("DELETE FROM courier.saga_timeout WHERE saga_type = $1 AND correlation = $2")
        .bind(saga_type)
        .bind(correlation)
        .execute(&mut *conn)
        .await
        .map_err(|e| db_error("cannot delete a completed saga's timeouts", e))?;
    sqlx::query("DELETE FROM courier.saga_property WHERE saga_type = $1 AND correlation = $2")
        .bind(saga_type)
        .bind(correlation)
        .execute(&mut *conn)
        .await
        .map_err(|e| db_error("cannot delete a completed saga's correlation properties", e))?;
    Ok(())
}

pub(crate) async fn find_by_property(
    conn: &mut PgConnection,
    saga_type: &str,
    name: &str,
    value: &str,
) -> Result<Option<String>> {
    sqlx::query_scalar(
        "SELECT correlation FROM courier.saga_property WHERE saga_type = $1 AND name = $2 AND value = $3",
    )
    .bind(saga_type)
    .bind(name)
    .bind(value)
    .fetch_optional(&mut *conn)
    .await
    .map_err(|e| db_error("cannot find a saga instance by a correlation property", e))
}

pub(crate) async fn set_properties(
    conn: &mut PgConnection,
    saga_type: &str,
    correlation: &str,
    properties: &[(String, String)],
) -> Result<Option<(String, String)>> {
    for (name, value) in properties {
        // The instance's earlier value of the name goes; a value another instance holds
        // stays its (the insert does nothing, and the check below reports it).
        sqlx::query("DELETE FROM courier.saga_property WHERE saga_type = $1 AND correlation = $2 AND name = $3")
            .bind(saga_type)
            .bind(correlation)
            .bind(name)
            .execute(&mut *conn)
            .await
            .map_err(|e| db_error("cannot replace a saga correlation property", e))?;
        let holder: String = sqlx::query_scalar(
            "WITH ins AS (INSERT INTO courier.saga_property (saga_type, name, value, correlation) \
             VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING RETURNING correlation) \
             SELECT correlation FROM ins UNION ALL \
             SELECT correlation FROM courier.saga_property WHERE saga_type = $1 AND name = $2 AND value = $3 \
             LIMIT 1",
        )
        .bind(saga_type)
        .bind(name)
        .bind(value)
        .bind(correlation)
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| db_error("cannot set a saga correlation property", e))?;
        if holder != correlation {
            return Ok(Some((name.clone(), holder)));
        }
    }
    Ok(None)
}

pub(crate) async fn add_timeouts(
    conn: &mut PgConnection,
    endpoint: &str,
    saga_type: &str,
    correlation: &str,
    timeouts: Vec<Timeout>,
    now: DateTime<Utc>,
) -> Result<()> {
    for t in timeouts {
        let (json, body) = StoredEnvelope::split(t.envelope)?;
        sqlx::query(
            "INSERT INTO courier.saga_timeout \
             (id, endpoint, saga_type, correlation, due_at, envelope, body, created_at, timeout_key) \
             VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, $8, $9)",
        )
        .bind(&t.id)
        .bind(endpoint)
        .bind(saga_type)
        .bind(correlation)
        .bind(t.due)
        .bind(json)
        .bind(body.as_ref())
        .bind(now)
        .bind(&t.key)
        .execute(&mut *conn)
        .await
        .map_err(|e| db_error("cannot store a saga timeout", e))?;
    }
    Ok(())
}

pub(crate) async fn cancel_timeouts(conn: &mut PgConnection, ids: &[String]) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    sqlx::query("DELETE FROM courier.saga_timeout WHERE id = ANY($1)")
        .bind(ids)
        .execute(&mut *conn)
        .await
        .map_err(|e| db_error("cannot cancel saga timeouts", e))?;
    Ok(())
}

pub(crate) async fn cancel_timeout_keys(
    conn: &mut PgConnection,
    saga_type: &str,
    correlation: &str,
    keys: &[String],
) -> Result<()> {
    if keys.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "DELETE FROM courier.saga_timeout WHERE saga_type = $1 AND correlation = $2 \
         AND timeout_key = ANY($3) AND dead_lettered_at IS NULL",
    )
    .bind(saga_type)
    .bind(correlation)
    .bind(keys)
    .execute(&mut *conn)
    .await
    .map_err(|e| db_error("cannot cancel saga timeouts by key", e))?;
    Ok(())
}

pub(crate) async fn take_timeout(conn: &mut PgConnection, id: &str) -> Result<bool> {
    let done = sqlx::query("DELETE FROM courier.saga_timeout WHERE id = $1")
        .bind(id)
        .execute(&mut *conn)
        .await
        .map_err(|e| db_error("cannot take a fired saga timeout", e))?;
    Ok(done.rows_affected() == 1)
}

/// How many expired completion markers one completion deletes at most.
const MARKERS_PURGED: i64 = 100;

pub(crate) async fn mark_completed(
    conn: &mut PgConnection,
    saga_type: &str,
    correlation: &str,
    now: DateTime<Utc>,
    expires: DateTime<Utc>,
) -> Result<()> {
    // SKIP LOCKED: two completions purging at once do not wait for each other.
    sqlx::query(
        "DELETE FROM courier.saga_completed WHERE (saga_type, correlation) IN \
         (SELECT saga_type, correlation FROM courier.saga_completed WHERE expires_at <= $1 LIMIT $2 \
          FOR UPDATE SKIP LOCKED)",
    )
    .bind(now)
    .bind(MARKERS_PURGED)
    .execute(&mut *conn)
    .await
    .map_err(|e| db_error("cannot delete expired saga completion markers", e))?;
    sqlx::query(
        "INSERT INTO courier.saga_completed (saga_type, correlation, completed_at, expires_at) \
         VALUES ($1, $2, $3, $4) \
         ON CONFLICT (saga_type, correlation) DO UPDATE SET completed_at = excluded.completed_at, \
         expires_at = excluded.expires_at",
    )
    .bind(saga_type)
    .bind(correlation)
    .bind(now)
    .bind(expires)
    .execute(conn)
    .await
    .map_err(|e| db_error("cannot mark a saga instance completed", e))?;
    Ok(())
}

pub(crate) async fn completed_at(
    conn: &mut PgConnection,
    saga_type: &str,
    correlation: &str,
    now: DateTime<Utc>,
) -> Result<Option<DateTime<Utc>>> {
    sqlx::query_scalar(
        "SELECT completed_at FROM courier.saga_completed WHERE saga_type = $1 AND correlation = $2 AND expires_at > $3",
    )
    .bind(saga_type)
    .bind(correlation)
    .bind(now)
    .fetch_optional(conn)
    .await
    .map_err(|e| db_error("cannot read a saga completion marker", e))
}

fn conflict(saga_type: &str, correlation: &str) -> Error {
    Error::new(ErrorKind::Conflict {
        detail: format!("saga {saga_type} instance {correlation:?} was created or changed concurrently"),
    })
}

/// `impl UnitOfWork for $ty { $methods + the saga methods on Postgres }`, for a type with
/// `fn pg_conn(&mut self) -> Result<&mut Connection>` (and `record_history`: see
/// [`unit_of_work_with_sagas!`](crate::store::unit_of_work_with_sagas)).
macro_rules! pg_unit_of_work {
    ($ty:ty, { $($methods:tt)* }) => {
        $crate::store::unit_of_work_with_sagas!($ty, crate::store::pg_saga, pg_conn, { $($methods)* });
    };
}
pub(crate) use pg_unit_of_work;
