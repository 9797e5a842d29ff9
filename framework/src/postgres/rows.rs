//! Reading message rows and naming locks: the column list every statement returns, the
//! conversion of a row to a [`ReceivedMessage`], and the lock tokens (which row, which
//! lock of it, issued on which database).

use bytes::Bytes;
use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::postgres::PgRow;
use uuid::Uuid;

use crate::checks::{check_envelope, unreadable_properties};
use crate::error::{Error, ErrorKind, Result};
use crate::message::{BrokerProperties, Envelope, LockToken, MessageState, Properties, ReceivedMessage};
use crate::store::pg_outbox::check_storable;

/// Message states as stored.
pub(crate) const ACTIVE: i16 = 0;
pub(crate) const SCHEDULED: i16 = 1;
pub(crate) const DEFERRED: i16 = 2;
pub(crate) const DEAD: i16 = 3;

/// The notification channel: the payload is the id of an entity that got receivable
/// messages (sent, abandoned, unlocked, activated, dead-lettered).
pub(crate) const CHANNEL: &str = "courier_transport";

/// A time column of the table aliased `m`, read so that it always decodes: Postgres
/// stores `infinity`, `-infinity` and years up to 294276, which the decoding of sqlx
/// (chrono) cannot represent and panics on ("`NaiveDateTime + TimeDelta` overflowed").
/// Another program may write such a time; it is read as the nearest time chrono holds
/// (year 262142, or 4713 BC), and its comparisons in SQL are untouched.
macro_rules! time_column {
    ($c:literal) => {
        concat!(
            "CASE WHEN m.",
            $c,
            " > '262142-01-01 00:00:00+00' THEN '262142-01-01 00:00:00+00'::timestamptz \
             WHEN m.",
            $c,
            " = '-infinity' THEN '4713-01-01 00:00:00+00 BC'::timestamptz ELSE m.",
            $c,
            " END"
        )
    };
}

/// The columns a message is read with, of the table aliased `m`, in the order
/// [`row_to_message`] expects. SQL is built only from literals (`concat!`), never input.
macro_rules! columns {
    () => {
        concat!(
            "m.id, m.seq, m.state, m.delivery_count, ",
            $crate::postgres::rows::time_column!("locked_until"),
            ", m.session_id, ",
            $crate::postgres::rows::time_column!("enqueued_at"),
            ", ",
            $crate::postgres::rows::time_column!("scheduled_at"),
            ", ",
            $crate::postgres::rows::time_column!("expires_at"),
            ", m.ttl_ms, m.message_id, m.correlation_id, m.causation_id, m.message_type, m.content_type, \
             m.reply_to, m.properties::text, m.dl_reason, m.dl_description, m.dl_source, m.body, m.entity_id"
        )
    };
}
pub(crate) use columns;
pub(crate) use time_column;

fn corrupt(detail: String) -> Error {
    Error::new(ErrorKind::Corrupt { detail })
}

/// A message row read back, and what in it could not be read as written.
pub(crate) struct ReadMessage {
    pub(crate) message: ReceivedMessage,
    /// The row's id.
    pub(crate) id: i64,
    /// The properties as stored (JSON text), kept when they could not be read.
    pub(crate) raw_properties: Option<String>,
    /// `Some(description)` when the properties were not a JSON object of property values
    /// (a row written by another program): the message is shown without them, and a
    /// receive dead-letters it at once (`courier.InvalidWireFormat`).
    pub(crate) unreadable: Option<String>,
}

/// A message row as a receiver (`token` set: locked by this receive) or a browser sees it.
/// It does not fail on the properties a row holds: see [`ReadMessage::unreadable`].
pub(crate) fn read_row(row: &PgRow, now: DateTime<Utc>, token: Option<u32>) -> Result<ReadMessage> {
    let get = |e: sqlx::Error| corrupt(format!("an unreadable message row: {e}"));
    let id: i64 = row.try_get(0).map_err(get)?;
    let seq: i64 = row.try_get(1).map_err(get)?;
    let state = match row.try_get::<i16, _>(2).map_err(get)? {
        ACTIVE => MessageState::Active,
        SCHEDULED => MessageState::Scheduled,
        DEFERRED => MessageState::Deferred,
        DEAD => MessageState::DeadLettered,
        other => return Err(corrupt(format!("message {seq} has unknown state {other}"))),
    };
    let delivery_count: i32 = row.try_get(3).map_err(get)?;
    let locked_until: Option<DateTime<Utc>> = row
        .try_get::<Option<DateTime<Utc>>, _>(4)
        .map_err(get)?
        .filter(|t| *t > now);
    let ttl_ms: Option<i64> = row.try_get(9).map_err(get)?;
    let raw_properties: Option<String> = row.try_get(16).map_err(get)?;
    let mut unreadable = None;
    let properties = match &raw_properties {
        Some(json) => serde_json::from_str::<Properties>(json).unwrap_or_else(|e| {
            unreadable = Some(format!(
                "the stored message could not be read as written: {}",
                unreadable_properties(&e, json)
            ));
            Properties::new()
        }),
        None => Properties::new(),
    };
    let body: Vec<u8> = row.try_get(20).map_err(get)?;
    let entity: i64 = row.try_get(21).map_err(get)?;
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
        scheduled_enqueue_time: row.try_get(7).map_err(get)?,
    };
    let broker = BrokerProperties {
        sequence_number: seq,
        enqueued_time: row.try_get(6).map_err(get)?,
        delivery_count: u32::try_from(delivery_count).unwrap_or(0),
        lock_token: token.map(|tag| make_token(tag, entity, id, delivery_count)),
        locked_until,
        state,
        expires_at: row.try_get(8).map_err(get)?,
        dead_letter_reason: row.try_get(17).map_err(get)?,
        dead_letter_description: row.try_get(18).map_err(get)?,
        dead_letter_source: row.try_get(19).map_err(get)?,
    };
    Ok(ReadMessage {
        message: ReceivedMessage { envelope, broker },
        id,
        raw_properties: if unreadable.is_some() { raw_properties } else { None },
        unreadable,
    })
}

/// Rows read back, in sequence order (`RETURNING` of an `UPDATE` has no order).
pub(crate) fn read_rows(rows: &[PgRow], now: DateTime<Utc>, token: Option<u32>) -> Result<Vec<ReadMessage>> {
    let mut out = rows
        .iter()
        .map(|r| read_row(r, now, token))
        .collect::<Result<Vec<_>>>()?;
    out.sort_by_key(|m| m.message.broker.sequence_number);
    Ok(out)
}

/// Rows to messages, in sequence order, whatever could not be read in them (browsing,
/// deferred messages, the dead-letter sub-queue: what is there can always be read).
pub(crate) fn rows_to_messages(rows: &[PgRow], now: DateTime<Utc>, token: Option<u32>) -> Result<Vec<ReceivedMessage>> {
    Ok(read_rows(rows, now, token)?.into_iter().map(|r| r.message).collect())
}

/// What a lock token names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lock {
    /// The entity the message was received from.
    pub(crate) entity: i64,
    /// The message row.
    pub(crate) id: i64,
    /// The low 16 bits of the delivery count at the lock: it rises with every lock, so
    /// it tells this lock from older locks of the same row.
    pub(crate) delivery_count: i32,
}

const ID_BITS: u32 = 48;

/// Lock tokens: 32 bits of the database's token tag, 32 bits of entity id, 16 bits of
/// delivery count and 48 bits of row id. A token of an older lock of the same message has
/// a lower delivery count and fails with `LockLost`, whatever process holds it.
pub(crate) fn make_token(tag: u32, entity: i64, id: i64, delivery_count: i32) -> LockToken {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&tag.to_be_bytes());
    b[4..8].copy_from_slice(&u32::try_from(entity).unwrap_or(u32::MAX).to_be_bytes());
    let dc = u16::try_from(delivery_count & 0xffff).unwrap_or(0);
    b[8..10].copy_from_slice(&dc.to_be_bytes());
    let id = u64::try_from(id).unwrap_or(0) & ((1 << ID_BITS) - 1);
    b[10..16].copy_from_slice(&id.to_be_bytes()[2..8]);
    LockToken::from_uuid(Uuid::from_bytes(b))
}

/// The lock a token of this database names; `None` for a token issued elsewhere.
pub(crate) fn read_token(tag: u32, token: LockToken) -> Option<Lock> {
    let b = token.as_uuid().into_bytes();
    if b[0..4] != tag.to_be_bytes() {
        return None;
    }
    let entity = i64::from(u32::from_be_bytes([b[4], b[5], b[6], b[7]]));
    let delivery_count = i32::from(u16::from_be_bytes([b[8], b[9]]));
    let mut id = [0u8; 8];
    id[2..8].copy_from_slice(&b[10..16]);
    Some(Lock {
        entity,
        id: i64::try_from(u64::from_be_bytes(id)).ok()?,
        delivery_count,
    })
}

/// Every check a message passes before this transport stores it: those of every
/// transport ([`check_envelope`]) and what Postgres can store ([`check_storable`]).
///
/// # Errors
/// As [`check_envelope`] and [`check_storable`].
pub(crate) fn check_outgoing(
    max_message_size: usize,
    m: &Envelope,
    entity: &str,
    requires_session: bool,
    now: DateTime<Utc>,
) -> Result<()> {
    check_envelope(max_message_size, m, entity, requires_session, now)?;
    check_storable(m)
}

/// The properties to merge into a message, as JSON (`None`: nothing to merge).
pub(crate) fn props_json(p: &Properties) -> Option<String> {
    if p.is_empty() {
        None
    } else {
        serde_json::to_string(p).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_names_its_lock_and_its_database() {
        let t = make_token(7, 42, 123_456_789, 70_000);
        let lock = read_token(7, t).unwrap();
        assert_eq!(lock.entity, 42);
        assert_eq!(lock.id, 123_456_789);
        assert_eq!(lock.delivery_count, 70_000 & 0xffff);
        assert!(read_token(8, t).is_none(), "another database's token");
        assert_ne!(
            make_token(7, 42, 1, 1),
            make_token(7, 42, 1, 2),
            "each lock its own token"
        );
    }
}
