//! Queues, topics and subscriptions: created, looked up and deleted in `courier.entity`.
//! Every process reads the table itself (no cache), so an entity created or deleted by
//! one process is seen by the others at their next lookup.

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::postgres::PgRow;

use super::Shared;
use crate::entity::{EntityPath, QueueOptions};
use crate::error::{Error, ErrorKind, Result};
use crate::store::db_error;

/// The columns of `courier.entity` that hold `options`: lock duration and default
/// time-to-live in milliseconds, and the max delivery count.
pub(crate) fn stored_options(options: &QueueOptions) -> (i64, Option<i64>, i32) {
    let lock_ms = i64::try_from(options.lock_duration.as_millis()).unwrap_or(i64::MAX);
    let ttl_ms = options
        .default_time_to_live
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let max = i32::try_from(options.max_delivery_count).unwrap_or(i32::MAX);
    (lock_ms, ttl_ms, max)
}

/// What an entity is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Queue = 0,
    Topic = 1,
    Subscription = 2,
}

impl Kind {
    fn from_i16(v: i16) -> Option<Self> {
        match v {
            0 => Some(Kind::Queue),
            1 => Some(Kind::Topic),
            2 => Some(Kind::Subscription),
            _ => None,
        }
    }
}

/// An entity's row.
#[derive(Debug, Clone)]
pub(crate) struct EntityInfo {
    pub(crate) id: i64,
    pub(crate) kind: Kind,
    /// The topic of a subscription; 0 otherwise.
    pub(crate) parent: i64,
    /// As shown in errors and dead-letter sources.
    pub(crate) path: String,
    pub(crate) lock_ms: i64,
    pub(crate) max_delivery_count: i32,
    pub(crate) requires_session: bool,
}

impl EntityInfo {
    /// Where the entity's scheduled messages wait: a subscription's are its topic's.
    pub(crate) fn schedule_owner(&self) -> i64 {
        if self.kind == Kind::Subscription {
            self.parent
        } else {
            self.id
        }
    }

    /// The end of a lock taken at `now`.
    pub(crate) fn lock_until(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        now + chrono::Duration::milliseconds(self.lock_ms)
    }
}

/// `SELECT` of an entity row, as [`read`] expects it.
macro_rules! select_entity {
    ($where:literal) => {
        concat!(
            "SELECT id, kind, parent, path, lock_duration_ms, max_delivery_count, requires_session \
             FROM courier.entity WHERE ",
            $where
        )
    };
}

fn read(row: &PgRow) -> Result<EntityInfo> {
    let get = |e| db_error("cannot read an entity row", e);
    let kind: i16 = row.try_get(1).map_err(get)?;
    Ok(EntityInfo {
        id: row.try_get(0).map_err(get)?,
        kind: Kind::from_i16(kind).ok_or_else(|| {
            Error::new(ErrorKind::Corrupt {
                detail: format!("an entity has unknown kind {kind}"),
            })
        })?,
        parent: row.try_get(2).map_err(get)?,
        path: row.try_get(3).map_err(get)?,
        lock_ms: row.try_get(4).map_err(get)?,
        max_delivery_count: row.try_get(5).map_err(get)?,
        requires_session: row.try_get(6).map_err(get)?,
    })
}

fn not_found(path: &EntityPath) -> Error {
    Error::new(ErrorKind::EntityNotFound { path: path.to_string() })
}

/// The id of topic `name`, if it exists.
async fn topic_id(shared: &Shared, name: &str) -> Result<Option<i64>> {
    sqlx::query_scalar("SELECT id FROM courier.entity WHERE parent = 0 AND name = $1 AND kind = 1")
        .bind(name)
        .fetch_optional(&shared.pool)
        .await
        .map_err(|e| db_error("cannot look up a topic", e))
}

/// Creates an entity unless one of the same kind has the name (an existing one keeps its
/// settings).
pub(crate) async fn create(
    shared: &Shared,
    kind: Kind,
    topic: Option<&str>,
    name: &str,
    options: &QueueOptions,
) -> Result<()> {
    shared.check_open()?;
    let (parent, path) = match topic {
        Some(t) => match topic_id(shared, t).await? {
            Some(id) => (id, format!("{t}/subscriptions/{name}")),
            None => return Err(Error::new(ErrorKind::EntityNotFound { path: t.to_owned() })),
        },
        None => (0, name.to_owned()),
    };
    let (lock_ms, ttl_ms, max) = stored_options(options);
    let created: Option<i64> = sqlx::query_scalar(
        "INSERT INTO courier.entity (kind, parent, name, path, lock_duration_ms, max_delivery_count, \
         default_ttl_ms, requires_session, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
         ON CONFLICT (parent, name) DO NOTHING RETURNING id",
    )
    .bind(kind as i16)
    .bind(parent)
    .bind(name)
    .bind(&path)
    .bind(lock_ms)
    .bind(max)
    .bind(ttl_ms)
    .bind(options.requires_session)
    .bind(shared.clock.now())
    .fetch_optional(&shared.pool)
    .await
    .map_err(|e| db_error("cannot create the entity", e))?;
    if created.is_some() {
        return Ok(());
    }
    let existing: Option<i16> = sqlx::query_scalar("SELECT kind FROM courier.entity WHERE parent = $1 AND name = $2")
        .bind(parent)
        .bind(name)
        .fetch_optional(&shared.pool)
        .await
        .map_err(|e| db_error("cannot look up an entity", e))?;
    match existing {
        Some(k) if k == kind as i16 => Ok(()),
        // Deleted between the insert and the lookup: create it again.
        None => Box::pin(create(shared, kind, topic, name, options)).await,
        Some(_) => Err(Error::new(ErrorKind::InvalidOperation {
            reason: format!("the name {name:?} is taken by an entity of another kind"),
        })),
    }
}

/// Looks an entity up: one to send to (`for_send`: a queue or topic) or to receive from
/// (a queue or subscription).
pub(crate) async fn resolve(shared: &Shared, path: &EntityPath, for_send: bool) -> Result<EntityInfo> {
    path.validate()?;
    shared.check_open()?;
    let row = match path.topic() {
        None => {
            sqlx::query(select_entity!("parent = 0 AND name = $1"))
                .bind(path.name())
                .fetch_optional(&shared.pool)
                .await
        }
        Some(t) => {
            sqlx::query(select_entity!(
                "name = $2 AND kind = 2 AND parent = \
             (SELECT id FROM courier.entity WHERE parent = 0 AND name = $1 AND kind = 1)"
            ))
            .bind(t)
            .bind(path.name())
            .fetch_optional(&shared.pool)
            .await
        }
    }
    .map_err(|e| db_error("cannot look up an entity", e))?;
    let info = read(&row.ok_or_else(|| not_found(path))?)?;
    if !for_send && info.kind == Kind::Topic {
        return Err(Error::new(ErrorKind::InvalidOperation {
            reason: format!("{path} is a topic: receive from one of its subscriptions"),
        }));
    }
    if for_send && info.kind == Kind::Subscription {
        return Err(Error::new(ErrorKind::InvalidOperation {
            reason: format!("{path} is a subscription: send to its topic"),
        }));
    }
    Ok(info)
}

/// Deletes an entity with its messages and sessions (a topic with its subscriptions).
pub(crate) async fn delete(shared: &Shared, path: &EntityPath) -> Result<()> {
    path.validate()?;
    shared.check_open()?;
    let id: Option<i64> = match path.topic() {
        None => {
            sqlx::query_scalar("SELECT id FROM courier.entity WHERE parent = 0 AND name = $1")
                .bind(path.name())
                .fetch_optional(&shared.pool)
                .await
        }
        Some(t) => {
            sqlx::query_scalar(
                "SELECT id FROM courier.entity WHERE name = $2 AND kind = 2 AND parent = \
             (SELECT id FROM courier.entity WHERE parent = 0 AND name = $1 AND kind = 1)",
            )
            .bind(t)
            .bind(path.name())
            .fetch_optional(&shared.pool)
            .await
        }
    }
    .map_err(|e| db_error("cannot look up an entity", e))?;
    let id = id.ok_or_else(|| not_found(path))?;
    // Messages and sessions go with their entity (ON DELETE CASCADE); a topic's
    // subscriptions have it as parent.
    let done = sqlx::query("DELETE FROM courier.entity WHERE id = $1 OR (parent = $1 AND kind = 2)")
        .bind(id)
        .execute(&shared.pool)
        .await
        .map_err(|e| db_error("cannot delete the entity", e))?;
    if done.rows_affected() == 0 {
        return Err(not_found(path));
    }
    Ok(())
}
