//! How messages are stored and read back: row ids (entity and sequence number in one
//! integer), lock tokens, times in microseconds, the rows a send inserts (`NewRow`,
//! `Fields`), reading a row into a `ReceivedMessage`, allocating sequence numbers and
//! fanning a topic's message out to its subscriptions; and how SQLite errors become
//! Courier errors (`storage`, `storage_error`).
//!
//! No statement runs here: these are the pure conversions the other files share.

use std::sync::Arc;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::sqlite::SqliteRow;
use uuid::Uuid;

use crate::error::{Error, ErrorKind, Result};
use crate::message::{
    BrokerProperties, Envelope, LockToken, MessageState, Properties, ReceivedMessage, SequenceNumber,
};

use super::commands::{EntityInfo, Kind};
use super::{DEAD, DEFERRED, LOCKED, READY, SCHEDULED, State};

/// Row ids are `entity << SEQ_BITS | seq`.
pub(super) const SEQ_BITS: u32 = 40;

pub(super) type Sql<T = ()> = Result<T, sqlx::Error>;

pub(super) fn storage(e: &sqlx::Error) -> ErrorKind {
    let transient = match e {
        sqlx::Error::Database(db) => {
            // SQLITE_BUSY, SQLITE_LOCKED, SQLITE_IOERR, SQLITE_FULL and their extended codes.
            let primary = db.code().and_then(|c| c.parse::<i64>().ok()).map(|c| c & 0xff);
            matches!(primary, Some(5 | 6 | 10 | 13))
        }
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::WorkerCrashed => true,
        _ => false,
    };
    ErrorKind::Storage {
        detail: e.to_string(),
        transient,
    }
}

pub(crate) fn storage_error(e: sqlx::Error) -> Error {
    let kind = storage(&e);
    Error::with_source(kind, e)
}

pub(crate) fn micros(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

pub(super) fn from_micros(v: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(v).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

pub(super) fn row_id(entity: i64, seq: SequenceNumber) -> i64 {
    (entity << SEQ_BITS) | seq
}

pub(super) fn entity_of(id: i64) -> i64 {
    id >> SEQ_BITS
}

pub(super) fn min_opt(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

pub(super) fn after_ms(now: i64, ms: i64) -> i64 {
    now.saturating_add(ms.saturating_mul(1000))
}

/// Lock tokens: 32 bits of broker epoch, 32 bits of delivery count, 64 bits of row id. The
/// delivery count rises with every lock, so a token names one lock.
pub(super) fn make_token(epoch: u32, id: i64, delivery_count: i64) -> LockToken {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&epoch.to_be_bytes());
    b[4..8].copy_from_slice(&u32::try_from(delivery_count).unwrap_or(u32::MAX).to_be_bytes());
    b[8..16].copy_from_slice(&id.to_be_bytes());
    LockToken::from_uuid(Uuid::from_bytes(b))
}

/// `(entity, row id, delivery count)` of a token this broker issued.
pub(crate) fn read_token(epoch: u32, token: LockToken) -> Option<(i64, i64, i64)> {
    let b = token.as_uuid().into_bytes();
    let (e, rest) = b.split_at(4);
    let (dc, id) = rest.split_at(4);
    if u32::from_be_bytes(e.try_into().ok()?) != epoch {
        return None;
    }
    let id = i64::from_be_bytes(id.try_into().ok()?);
    let dc = i64::from(u32::from_be_bytes(dc.try_into().ok()?));
    Some((entity_of(id), id, dc))
}

pub(super) fn props_json(p: &Properties) -> Option<String> {
    if p.is_empty() {
        None
    } else {
        serde_json::to_string(p).ok()
    }
}

pub(super) fn corrupt(detail: impl Into<String>) -> Error {
    Error::new(ErrorKind::Corrupt { detail: detail.into() })
}

pub(super) fn lock_lost() -> Error {
    Error::new(ErrorKind::LockLost)
}

/// A message row to insert.
pub(super) struct NewRow {
    pub(super) id: i64,
    pub(super) entity: i64,
    pub(super) seq: SequenceNumber,
    pub(super) state: i64,
    pub(super) enqueued_at: i64,
    pub(super) scheduled_at: Option<i64>,
    pub(super) expires_at: Option<i64>,
    pub(super) ttl_ms: Option<i64>,
    /// For a copy that is dead-lettered on arrival (a session subscription, no session id).
    pub(super) dead: Option<String>,
    pub(super) fields: Arc<Fields>,
}

/// The sender-set fields of a message, shared by its copies.
pub(super) struct Fields {
    pub(super) session_id: Option<String>,
    pub(super) message_id: String,
    pub(super) correlation_id: Option<String>,
    pub(super) causation_id: Option<String>,
    pub(super) message_type: Option<String>,
    pub(super) content_type: Option<String>,
    pub(super) reply_to: Option<String>,
    pub(super) properties: Option<String>,
    pub(super) body: Bytes,
}

impl Fields {
    pub(super) fn from_envelope(m: Envelope) -> Self {
        Self {
            properties: props_json(&m.properties),
            session_id: m.session_id,
            message_id: m.message_id,
            correlation_id: m.correlation_id,
            causation_id: m.causation_id,
            message_type: m.message_type,
            content_type: m.content_type,
            reply_to: m.reply_to,
            body: m.body,
        }
    }

    pub(super) fn from_message(m: ReceivedMessage) -> Self {
        Self::from_envelope(m.envelope)
    }
}

impl State {
    pub(super) fn now(&self) -> i64 {
        micros(self.clock.now())
    }

    pub(super) fn entity(&self, id: i64) -> Result<&EntityInfo> {
        self.entities.get(&id).ok_or_else(|| {
            Error::new(ErrorKind::EntityNotFound {
                path: format!("entity #{id} (deleted)"),
            })
        })
    }

    pub(super) fn row_to_message(&self, row: &SqliteRow, now: i64, locked: bool) -> Result<ReceivedMessage> {
        let get = |e: sqlx::Error| corrupt(e.to_string());
        let id: i64 = row.try_get(0).map_err(get)?;
        let seq: i64 = row.try_get(1).map_err(get)?;
        let state = match row.try_get::<i64, _>(2).map_err(get)? {
            READY | LOCKED => MessageState::Active,
            SCHEDULED => MessageState::Scheduled,
            DEFERRED => MessageState::Deferred,
            DEAD => MessageState::DeadLettered,
            other => return Err(corrupt(format!("message {seq} has unknown state {other}"))),
        };
        let delivery_count: i64 = row.try_get(3).map_err(get)?;
        let locked_until: Option<i64> = row.try_get::<Option<i64>, _>(4).map_err(get)?.filter(|t| *t > now);
        let ttl_ms: Option<i64> = row.try_get(9).map_err(get)?;
        let properties = match row.try_get::<Option<String>, _>(16).map_err(get)? {
            Some(json) => serde_json::from_str::<Properties>(&json)
                .map_err(|e| corrupt(format!("properties of message {seq}: {e}")))?,
            None => Properties::new(),
        };
        let body: Vec<u8> = row.try_get(20).map_err(get)?;
        let envelope = Envelope {
            message_id: row.try_get(10).map_err(get)?,
            correlation_id: row.try_get(11).map_err(get)?,
            causation_id: row.try_get(12).map_err(get)?,
            message_type: row.try_get(13).map_err(get)?,
            content_type: row.try_get(14).map_err(get)?,
            body: Bytes::from(body),
            properties,
            session_id: row.try_get(5).map_err(get)?,
            reply_to: row.try_get(15).map_err(get)?,
            time_to_live: ttl_ms.map(|ms| std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
            scheduled_enqueue_time: row.try_get::<Option<i64>, _>(7).map_err(get)?.map(from_micros),
        };
        let broker = BrokerProperties {
            sequence_number: seq,
            enqueued_time: from_micros(row.try_get(6).map_err(get)?),
            delivery_count: u32::try_from(delivery_count).unwrap_or(u32::MAX),
            lock_token: locked.then(|| make_token(self.epoch, id, delivery_count)),
            locked_until: locked_until.map(from_micros),
            state,
            expires_at: row.try_get::<Option<i64>, _>(8).map_err(get)?.map(from_micros),
            dead_letter_reason: row.try_get(17).map_err(get)?,
            dead_letter_description: row.try_get(18).map_err(get)?,
            dead_letter_source: row.try_get(19).map_err(get)?,
        };
        Ok(ReceivedMessage { envelope, broker })
    }

    pub(super) fn rows_to_messages(&self, rows: &[SqliteRow], now: i64, locked: bool) -> Result<Vec<ReceivedMessage>> {
        let mut out = rows
            .iter()
            .map(|r| self.row_to_message(r, now, locked))
            .collect::<Result<Vec<_>>>()?;
        out.sort_by_key(|m| m.broker.sequence_number);
        Ok(out)
    }

    pub(super) fn alloc_seq(&mut self, entity: i64, n: i64) -> Result<i64> {
        let info = self
            .entities
            .get_mut(&entity)
            .ok_or_else(|| corrupt("sequence of unknown entity"))?;
        let first = info.next_seq;
        if first + n >= 1 << SEQ_BITS {
            return Err(Error::new(ErrorKind::InvalidOperation {
                reason: format!("{} has used up its sequence numbers", info.display),
            }));
        }
        info.next_seq += n;
        self.dirty_seq.insert(entity);
        Ok(first)
    }

    pub(super) fn note(slot: &mut Option<i64>, at: Option<i64>) {
        if let Some(at) = at {
            *slot = Some(slot.map_or(at, |n| n.min(at)));
        }
    }

    /// The rows for one message sent to `entity` (a queue, or a topic's subscriptions).
    pub(super) fn rows_for(
        &self,
        info: &EntityInfo,
        seq: SequenceNumber,
        msg: Envelope,
        now: i64,
        out: &mut Vec<NewRow>,
    ) {
        let scheduled = msg.scheduled_enqueue_time.map(micros).filter(|t| *t > now);
        let msg_ttl = msg
            .time_to_live
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let ttl = min_opt(msg_ttl, info.default_ttl_ms);
        let fields = Arc::new(Fields::from_envelope(msg));
        if scheduled.is_some() || info.kind != Kind::Topic {
            // A queue's message, or a topic's scheduled message (fanned out on activation).
            out.push(NewRow {
                id: row_id(info.id, seq),
                entity: info.id,
                seq,
                state: if scheduled.is_some() { SCHEDULED } else { READY },
                enqueued_at: now,
                scheduled_at: scheduled,
                expires_at: if scheduled.is_some() {
                    None
                } else {
                    ttl.map(|ms| after_ms(now, ms))
                },
                ttl_ms: ttl,
                dead: None,
                fields,
            });
            return;
        }
        self.fan_out(info.id, seq, ttl, None, &fields, now, out);
    }

    /// Copies of a topic message for each subscription.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn fan_out(
        &self,
        topic: i64,
        seq: SequenceNumber,
        ttl: Option<i64>,
        scheduled_at: Option<i64>,
        fields: &Arc<Fields>,
        now: i64,
        out: &mut Vec<NewRow>,
    ) {
        for sub in self.subscriptions.get(&topic).into_iter().flatten() {
            let Some(s) = self.entities.get(sub) else { continue };
            let ttl = min_opt(ttl, s.default_ttl_ms);
            let dead = (s.requires_session && fields.session_id.is_none()).then(|| s.display.clone());
            out.push(NewRow {
                id: row_id(s.id, seq),
                entity: s.id,
                seq,
                state: if dead.is_some() { DEAD } else { READY },
                enqueued_at: now,
                scheduled_at,
                expires_at: ttl.map(|ms| after_ms(now, ms)),
                ttl_ms: ttl,
                dead,
                fields: fields.clone(),
            });
        }
    }
}
