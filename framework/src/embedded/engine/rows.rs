//! How messages are stored and read back: row ids (entity and sequence number in one
//! integer), lock tokens, times in microseconds, the rows a send inserts (`NewRow`,
//! `Fields`), reading a row into a `ReceivedMessage`, allocating sequence numbers and
//! fanning a topic's message out to its subscriptions; and how SQLite errors become
//! Courier errors (`storage`, `storage_error`).
//!
//! No statement runs here: these are the pure conversions the other files share.

use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::sqlite::SqliteRow;
use uuid::Uuid;

use crate::checks::{quoted, unreadable_properties};
use crate::error::{Error, ErrorKind, Result};
use crate::message::{
    BrokerProperties, Envelope, LockToken, MessageState, Properties, ReceivedMessage, SequenceNumber,
};

use super::commands::{EntityInfo, Kind};
use super::{DEAD, DEFERRED, LOCKED, READY, SCHEDULED, State};

/// Row ids are `entity << SEQ_BITS | seq`.
pub(super) const SEQ_BITS: u32 = 40;

/// The largest delivery count a row holds (`message_delivery_count_in_range`): a lock
/// token holds 32 bits of it.
pub(super) const MAX_STORED_DELIVERY_COUNT: i64 = u32::MAX as i64;

/// The reason of a message in an entity that requires sessions without a session id.
pub(super) const SESSION_ID_MISSING: &str = "SessionIdMissing";
/// Its description.
pub(super) const SESSION_ID_MISSING_DESCRIPTION: &str =
    "the entity requires sessions and the message has no session id";

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
        detail: crate::store::db_cause(e),
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
    /// For a copy that is dead-lettered on arrival (a session subscription and no session
    /// id; a scheduled message that could not be read when it became due).
    pub(super) dead: Option<DeadMark>,
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

/// A message row read back, and what in it could not be read as written.
pub(super) struct ReadMessage {
    pub(super) message: ReceivedMessage,
    /// `Some(description)` when a text column was not UTF-8 or the properties were not a
    /// JSON object of property values: the message is shown lossily.
    pub(super) unreadable: Option<String>,
}

impl ReadMessage {
    /// The message, whatever could not be read in it (browsing, the dead-letter
    /// sub-queue: what is there can always be read).
    pub(super) fn lossy(read: Vec<ReadMessage>) -> Vec<ReceivedMessage> {
        read.into_iter().map(|r| r.message).collect()
    }
}

fn read_error(e: &sqlx::Error) -> Error {
    corrupt(e.to_string())
}

/// An integer column. Read unchecked: SQLite converts what a column holds, as its own
/// functions do, rather than fail the read of the whole batch.
fn int(row: &SqliteRow, i: usize) -> Result<i64> {
    row.try_get_unchecked(i).map_err(|e| read_error(&e))
}

fn opt_int(row: &SqliteRow, i: usize) -> Result<Option<i64>> {
    row.try_get_unchecked(i).map_err(|e| read_error(&e))
}

/// A text column, read as bytes: bytes that are not UTF-8 are replaced (U+FFFD) and
/// named in `problems` with the bytes themselves.
fn text(row: &SqliteRow, i: usize, name: &str, problems: &mut Vec<String>) -> Result<Option<String>> {
    let bytes: Option<Vec<u8>> = row.try_get_unchecked(i).map_err(|e| read_error(&e))?;
    Ok(bytes.map(|b| match String::from_utf8(b) {
        Ok(s) => s,
        Err(e) => {
            let b = e.into_bytes();
            problems.push(format!("{name} is not UTF-8: \"{}\"", quoted(&b)));
            String::from_utf8_lossy(&b).into_owned()
        }
    }))
}

/// Why a row is stored dead-lettered on insert.
pub(super) struct DeadMark {
    pub(super) reason: Cow<'static, str>,
    pub(super) description: Option<String>,
    /// The entity it was dead-lettered from.
    pub(super) source: String,
}

/// Reads a message row. It never fails on what a row holds: a text column that is not
/// UTF-8 is read with U+FFFD in place of the bad bytes, properties that are not a JSON
/// object of property values are left out, and each such problem is named in
/// [`ReadMessage::unreadable`] so that the receive dead-letters the row at once
/// (`courier.InvalidWireFormat`) instead of failing every receive of its queue.
fn read_row(row: &SqliteRow, epoch: u32, now: i64, locked: bool) -> Result<ReadMessage> {
    let mut problems = Vec::new();
    let id: i64 = int(row, 0)?;
    let seq: i64 = int(row, 1)?;
    let state = match int(row, 2)? {
        READY | LOCKED => MessageState::Active,
        SCHEDULED => MessageState::Scheduled,
        DEFERRED => MessageState::Deferred,
        DEAD => MessageState::DeadLettered,
        other => {
            problems.push(format!("its state {other} is unknown"));
            MessageState::Active
        }
    };
    let delivery_count: i64 = int(row, 3)?;
    let locked_until: Option<i64> = opt_int(row, 4)?.filter(|t| *t > now);
    let ttl_ms: Option<i64> = opt_int(row, 9)?;
    let properties = match text(row, 16, "properties", &mut problems)? {
        Some(json) => serde_json::from_str::<Properties>(&json).unwrap_or_else(|e| {
            problems.push(unreadable_properties(&e, &json));
            Properties::new()
        }),
        None => Properties::new(),
    };
    let body: Option<Vec<u8>> = row.try_get_unchecked(20).map_err(|e| read_error(&e))?;
    let envelope = Envelope {
        message_id: text(row, 10, "message_id", &mut problems)?.unwrap_or_default(),
        correlation_id: text(row, 11, "correlation_id", &mut problems)?,
        causation_id: text(row, 12, "causation_id", &mut problems)?,
        message_type: text(row, 13, "message_type", &mut problems)?,
        content_type: text(row, 14, "content_type", &mut problems)?,
        body: Bytes::from(body.unwrap_or_default()),
        properties,
        session_id: text(row, 5, "session_id", &mut problems)?,
        reply_to: text(row, 15, "reply_to", &mut problems)?,
        time_to_live: ttl_ms.map(|ms| std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
        scheduled_enqueue_time: opt_int(row, 7)?.map(from_micros),
    };
    let broker = BrokerProperties {
        sequence_number: seq,
        enqueued_time: from_micros(int(row, 6)?),
        delivery_count: u32::try_from(delivery_count).unwrap_or(u32::MAX),
        lock_token: locked.then(|| make_token(epoch, id, delivery_count)),
        locked_until: locked_until.map(from_micros),
        state,
        expires_at: opt_int(row, 8)?.map(from_micros),
        dead_letter_reason: text(row, 17, "dl_reason", &mut problems)?,
        dead_letter_description: text(row, 18, "dl_description", &mut problems)?,
        dead_letter_source: text(row, 19, "dl_source", &mut problems)?,
    };
    let unreadable = (!problems.is_empty()).then(|| {
        format!(
            "the stored message could not be read as written: {}; the fields are shown with U+FFFD in place of \
             bytes that are not UTF-8",
            problems.join("; ")
        )
    });
    Ok(ReadMessage {
        message: ReceivedMessage { envelope, broker },
        unreadable,
    })
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

    /// Reads a message row: see [`read_row`].
    pub(super) fn row_to_message(&self, row: &SqliteRow, now: i64, locked: bool) -> Result<ReadMessage> {
        read_row(row, self.epoch, now, locked)
    }

    /// Reads rows in sequence order.
    pub(super) fn rows_to_messages(&self, rows: &[SqliteRow], now: i64, locked: bool) -> Result<Vec<ReadMessage>> {
        let mut out = rows
            .iter()
            .map(|r| self.row_to_message(r, now, locked))
            .collect::<Result<Vec<_>>>()?;
        out.sort_by_key(|m| m.message.broker.sequence_number);
        Ok(out)
    }

    /// The entity whose counter numbers `entity`'s messages: a subscription's copies take
    /// its topic's numbers (so that a scheduled message found on a subscription itself is
    /// numbered where its topic's copies are).
    pub(super) fn numbering(&self, entity: i64) -> i64 {
        match self.entities.get(&entity) {
            Some(e) if e.kind == Kind::Subscription => e.parent,
            _ => entity,
        }
    }

    pub(super) fn alloc_seq(&mut self, entity: i64, n: i64) -> Result<i64> {
        let numbering = self.numbering(entity);
        let info = self
            .entities
            .get_mut(&numbering)
            .ok_or_else(|| corrupt("sequence of unknown entity"))?;
        let first = info.next_seq;
        if first + n >= 1 << SEQ_BITS {
            return Err(Error::new(ErrorKind::InvalidOperation {
                reason: format!("{} has used up its sequence numbers", info.display),
            }));
        }
        info.next_seq += n;
        self.dirty_seq.insert(numbering);
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
            let dead = (s.requires_session && fields.session_id.is_none()).then(|| DeadMark {
                reason: Cow::Borrowed(SESSION_ID_MISSING),
                description: Some(SESSION_ID_MISSING_DESCRIPTION.to_owned()),
                source: s.display.clone(),
            });
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

/// Property test: a row holding any bytes in its text columns and any text as properties
/// is read, never an error, and named unreadable exactly when a text is not UTF-8 or the
/// properties are not Courier's. `COURIER_FUZZ_CASES` sets the number of cases (256).
/// A text column, read lossily (another program may have written bytes that are not
/// UTF-8): for counting and logging only.
pub(super) fn lossy_text(row: &sqlx::sqlite::SqliteRow, i: usize) -> Sql<String> {
    use sqlx::Row;
    let bytes: Option<Vec<u8>> = row.try_get_unchecked(i)?;
    Ok(bytes
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default())
}

#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;
    use sqlx::sqlite::SqlitePoolOptions;

    use super::{READY, read_row};
    use crate::message::Properties;

    use crate::fuzz::cases;

    /// Text near what a column holds, or any bytes.
    fn text() -> impl Strategy<Value = Option<Vec<u8>>> {
        prop_oneof![
            Just(None),
            "[ -~]{0,20}".prop_map(|s| Some(s.into_bytes())),
            any::<String>().prop_map(|s| Some(s.into_bytes())),
            proptest::collection::vec(any::<u8>(), 0..40).prop_map(Some),
        ]
    }

    fn properties() -> impl Strategy<Value = Option<Vec<u8>>> {
        prop_oneof![
            Just(None),
            r#"\{("[a-z]{1,4}":(-?[0-9]{1,20}|"[ -~]{0,6}"|true|null|\[1\]|\{\}|1\.5e[0-9]{1,3})(,)?){0,3}\}"#
                .prop_map(|s| Some(s.into_bytes())),
            text(),
        ]
    }

    #[test]
    fn any_row_is_read_and_named_unreadable_exactly_when_it_is() {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
            panic!("a runtime");
        };
        // One connection, kept: the in-memory database lives as long as it does.
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None);
        let Ok(conn) = rt.block_on(pool.connect("sqlite::memory:")) else {
            panic!("an in-memory database");
        };
        let schema = include_str!("../../../../migrations/sqlite/20261122000001_embedded_broker.sql");
        if let Err(e) = rt.block_on(sqlx::raw_sql(schema).execute(&conn)) {
            panic!("the schema: {e}");
        }
        let config = ProptestConfig {
            cases: cases(),
            ..ProptestConfig::default()
        };
        let next = std::sync::atomic::AtomicI64::new(1);
        proptest!(config, |(texts in proptest::collection::vec(text(), 8), props in properties(), body in proptest::collection::vec(any::<u8>(), 0..20))| {
            let id = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let row = rt.block_on(async {
                sqlx::query(
                    "INSERT INTO courier_message (id, entity_id, seq, state, enqueued_at, message_id, correlation_id, \
                     causation_id, message_type, content_type, reply_to, session_id, dl_reason, properties, body) \
                     VALUES (?1, 1, ?1, ?2, 0, COALESCE(CAST(?3 AS TEXT), ''), CAST(?4 AS TEXT), CAST(?5 AS TEXT), \
                     CAST(?6 AS TEXT), CAST(?7 AS TEXT), CAST(?8 AS TEXT), CAST(?9 AS TEXT), CAST(?10 AS TEXT), \
                     CAST(?11 AS TEXT), ?12)",
                )
                .bind(id)
                .bind(READY)
                .bind(texts[0].clone())
                .bind(texts[1].clone())
                .bind(texts[2].clone())
                .bind(texts[3].clone())
                .bind(texts[4].clone())
                .bind(texts[5].clone())
                .bind(texts[6].clone())
                .bind(texts[7].clone())
                .bind(props.clone())
                .bind(body.clone())
                .execute(&conn)
                .await?;
                sqlx::query(concat!("SELECT ", columns!(), " FROM courier_message WHERE id = ?1"))
                    .bind(id)
                    .fetch_one(&conn)
                    .await
            });
            let row = row.map_err(|e| TestCaseError::fail(e.to_string()))?;
            let read = read_row(&row, 7, 0, true).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let texts_ok = texts.iter().all(|t| t.as_ref().is_none_or(|b| std::str::from_utf8(b).is_ok()));
            let props_ok = match &props {
                None => true,
                Some(b) => std::str::from_utf8(b).is_ok_and(|s| serde_json::from_str::<Properties>(s).is_ok()),
            };
            prop_assert_eq!(read.unreadable.is_none(), texts_ok && props_ok, "{:?}", read.unreadable);
            prop_assert_eq!(&read.message.envelope.body[..], &body[..]);
            if texts_ok {
                let id_text = texts[0].clone().map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
                prop_assert_eq!(&read.message.envelope.message_id, &id_text);
            }
            prop_assert!(read.message.broker.lock_token.is_some());
        });
    }
}
