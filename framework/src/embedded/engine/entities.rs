//! Queues, topics and subscriptions as the engine knows them: creating, finding and
//! deleting them, and loading them into memory at start and after a rollback.
//!
//! Holds: `create`, `lookup`, `resolve`, `delete`, `not_found` and `load_entities`.
//! Messages of an entity are not read or written here (except that a delete removes them).

use std::collections::HashMap;
use std::sync::Arc;

use sqlx::Row;
use sqlx::sqlite::SqliteConnection;

use crate::entity::{EntityPath, QueueOptions};
use crate::error::{Error, ErrorKind, Result};

use super::commands::{EntityInfo, Kind};
use super::rows::{Sql, row_id};
use super::{Engine, State};

/// Entity ids must stay below this so that row ids fit in an i64.
pub(super) const MAX_ENTITY_ID: i64 = 1 << 22;

impl Engine {
    pub(super) async fn create(
        &mut self,
        kind: Kind,
        topic: Option<String>,
        name: String,
        options: &QueueOptions,
        now: i64,
    ) -> Sql<Result<()>> {
        let parent = match &topic {
            Some(t) => match self.state.by_name.get(&(0, t.clone())) {
                Some(id) if self.state.entities.get(id).is_some_and(|e| e.kind == Kind::Topic) => *id,
                _ => return Ok(Err(Error::new(ErrorKind::EntityNotFound { path: t.clone() }))),
            },
            None => 0,
        };
        if let Some(id) = self.state.by_name.get(&(parent, name.clone())) {
            let existing = self.state.entities.get(id).map(|e| e.kind);
            return Ok(if existing == Some(kind) {
                Ok(())
            } else {
                Err(Error::new(ErrorKind::InvalidOperation {
                    reason: format!("the name {name:?} is taken by an entity of another kind"),
                }))
            });
        }
        let lock_ms = i64::try_from(options.lock_duration.as_millis()).unwrap_or(i64::MAX);
        let ttl_ms = options
            .default_time_to_live
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO courier_entity (kind, parent, name, lock_duration_ms, max_delivery_count, default_ttl_ms, \
             requires_session, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) RETURNING id",
        )
        .bind(kind as i64)
        .bind(parent)
        .bind(&name)
        .bind(lock_ms)
        .bind(i64::from(options.max_delivery_count))
        .bind(ttl_ms)
        .bind(options.requires_session)
        .bind(now)
        .fetch_one(self.conn.get()?)
        .await?;
        if id >= MAX_ENTITY_ID {
            return Ok(Err(Error::new(ErrorKind::InvalidOperation {
                reason: "the broker has run out of entity ids".into(),
            })));
        }
        let display = match &topic {
            Some(t) => format!("{t}/subscriptions/{name}"),
            None => name.clone(),
        };
        self.state.entities.insert(
            id,
            EntityInfo {
                id,
                kind,
                parent,
                name: name.clone(),
                display,
                lock_ms,
                max_delivery_count: i64::from(options.max_delivery_count),
                default_ttl_ms: ttl_ms,
                requires_session: options.requires_session,
                next_seq: 1,
            },
        );
        self.state.by_name.insert((parent, name), id);
        if kind == Kind::Subscription {
            self.state.subscriptions.entry(parent).or_default().push(id);
        }
        // Rows another program wrote for this id before the entity existed: numbered
        // after the counter, so that its first sends do not meet them.
        self.sync_sequence(self.state.numbering(id)).await?;
        Ok(Ok(()))
    }

    pub(super) fn lookup(&self, path: &EntityPath) -> Option<i64> {
        match path.topic() {
            None => self.state.by_name.get(&(0, path.name().to_owned())).copied(),
            Some(t) => {
                let topic = self.state.by_name.get(&(0, t.to_owned()))?;
                self.state.by_name.get(&(*topic, path.name().to_owned())).copied()
            }
        }
    }

    pub(super) fn not_found(path: &EntityPath) -> Error {
        Error::new(ErrorKind::EntityNotFound { path: path.to_string() })
    }

    pub(super) fn resolve(&self, path: &EntityPath, for_send: bool) -> Result<Arc<EntityInfo>> {
        let id = self.lookup(path).ok_or_else(|| Self::not_found(path))?;
        let info = self.state.entity(id)?;
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
        Ok(Arc::new(info.clone()))
    }

    pub(super) async fn delete(&mut self, path: &EntityPath) -> Sql<Result<()>> {
        let Some(id) = self.lookup(path) else {
            return Ok(Err(Self::not_found(path)));
        };
        let mut ids = vec![id];
        ids.extend(self.state.subscriptions.remove(&id).unwrap_or_default());
        for e in &ids {
            sqlx::query("DELETE FROM courier_message WHERE id >= ?1 AND id < ?2")
                .bind(row_id(*e, 0))
                .bind(row_id(*e + 1, 0))
                .execute(self.conn.get()?)
                .await?;
            for q in [
                "DELETE FROM courier_session WHERE entity_id = ?1",
                "DELETE FROM courier_entity WHERE id = ?1",
            ] {
                sqlx::query(q).bind(e).execute(self.conn.get()?).await?;
            }
            if let Some(info) = self.state.entities.remove(e) {
                self.state.by_name.remove(&(info.parent, info.name));
                if let Some(subs) = self.state.subscriptions.get_mut(&info.parent) {
                    subs.retain(|s| s != e);
                }
            }
            for w in self.state.waiters.remove(e).unwrap_or_default() {
                w.fail(|| Self::not_found(path));
            }
        }
        Ok(Ok(()))
    }
}

pub(super) async fn load_entities(conn: &mut SqliteConnection, state: &mut State) -> Sql {
    let rows = sqlx::query(
        "SELECT id, kind, parent, name, lock_duration_ms, max_delivery_count, default_ttl_ms, requires_session, \
         next_seq FROM courier_entity ORDER BY id",
    )
    .fetch_all(&mut *conn)
    .await?;
    state.entities.clear();
    state.by_name.clear();
    state.subscriptions.clear();
    let mut names: HashMap<i64, String> = HashMap::new();
    for row in rows {
        let id: i64 = row.try_get(0)?;
        let Some(kind) = Kind::from_i64(row.try_get(1)?) else {
            continue;
        };
        let parent: i64 = row.try_get(2)?;
        let name: String = row.try_get(3)?;
        let display = match names.get(&parent) {
            Some(t) if parent != 0 => format!("{t}/subscriptions/{name}"),
            _ => name.clone(),
        };
        names.insert(id, name.clone());
        state.entities.insert(
            id,
            EntityInfo {
                id,
                kind,
                parent,
                name: name.clone(),
                display,
                lock_ms: row.try_get(4)?,
                max_delivery_count: row.try_get(5)?,
                default_ttl_ms: row.try_get(6)?,
                requires_session: row.try_get(7)?,
                next_seq: row.try_get(8)?,
            },
        );
        state.by_name.insert((parent, name), id);
        if kind == Kind::Subscription {
            state.subscriptions.entry(parent).or_default().push(id);
        }
    }
    Ok(())
}
