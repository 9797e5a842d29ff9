//! The outbox on Postgres, shared by the plain Postgres store (`store/postgres.rs`), its
//! group commit (`store/pg_group.rs`) and the Postgres transport's own store
//! (`postgres/store.rs`): the rows a handling stores, written in one statement and read
//! back by the handling's id; the check that a handler did not leave its transaction
//! aborted before Courier commits it; and the check of what Postgres cannot store in a
//! message (`check_storable`), which the Postgres transport's sends run too.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Row};

use crate::error::{Error, ErrorKind, Result};
use crate::message::{Envelope, PropertyValue};
use crate::store::{OutboxMessage, StoredEnvelope, db_error};

/// What a handler that swallowed the error of a failed statement is told.
pub(crate) const ABORTED_BY_HANDLER: &str = "the handler returned success, but a statement of its transaction had \
     failed and its error was not returned (return it, with `?`), so the transaction was aborted; its work was \
     rolled back and the message will be retried";

/// Fails if the transaction was aborted by a failed statement (SQLSTATE 25P02, a
/// transient error). Sent before a COMMIT that no statement of Courier's precedes: COMMIT
/// of an aborted transaction rolls back without an error, and the message would be
/// completed with none of its effects.
pub(crate) async fn ensure_not_aborted(conn: &mut PgConnection) -> Result<()> {
    sqlx::query("SELECT 1")
        .execute(conn)
        .await
        .map_err(|e| db_error(ABORTED_BY_HANDLER, e))?;
    Ok(())
}

/// One message to store in the outbox: sent by the handling of `source_id`.
#[derive(Debug, Clone)]
pub(crate) struct OutboxRow {
    pub(crate) source_id: String,
    pub(crate) destination: String,
    pub(crate) is_topic: bool,
    pub(crate) envelope: Envelope,
}

/// The outbox insert, its parameters `$1` to `$7`.
const INSERT_OUTBOX: &str = "INSERT INTO courier.outbox (endpoint, source_id, destination, is_topic, envelope, body, \
     created_at) \
     SELECT $1, s, d, t, e::jsonb, b, $7 \
     FROM unnest($2::text[], $3::text[], $4::bool[], $5::text[], $6::bytea[]) WITH ORDINALITY AS r(s, d, t, e, b, ord) \
     ORDER BY ord RETURNING id";

/// The outbox insert after the history events' inserts (their parameters from `$8`).
static INSERT_OUTBOX_WITH_EVENTS: std::sync::LazyLock<crate::store::pg_history::WithEvents> =
    std::sync::LazyLock::new(|| crate::store::pg_history::WithEvents::new(8, INSERT_OUTBOX));

/// Refuses a message Postgres cannot store: a NUL character (U+0000) in one of its texts,
/// a property's name or a property's string. Postgres' `text` cannot hold one (SQLSTATE
/// 22021) nor can `jsonb` (22P05): the insert into a queue of the Postgres transport or
/// into the outbox would fail with a storage error, and in a commit group, whose members'
/// messages go in one statement at its commit (`store::pg_group`), it would fail every
/// member. Refused before, it fails its own send, or its own handling (a member at its
/// turn), with a reason that names the field: the handling's message is dead-lettered
/// with it, as for any message a transport refuses.
///
/// # Errors
/// [`ErrorKind::InvalidMessage`] naming the first field that holds one.
pub(crate) fn check_storable(m: &Envelope) -> Result<()> {
    let texts = [
        ("message id", Some(m.message_id.as_str())),
        ("correlation id", m.correlation_id.as_deref()),
        ("causation id", m.causation_id.as_deref()),
        ("message type", m.message_type.as_deref()),
        ("content type", m.content_type.as_deref()),
        ("session id", m.session_id.as_deref()),
        ("reply-to address", m.reply_to.as_deref()),
    ];
    let refuse = |field: String| {
        Err(Error::new(ErrorKind::InvalidMessage {
            reason: format!(
                "the {field} contains a NUL character (U+0000), which Postgres cannot store in text: remove it or encode the value (for example as hexadecimal)"
            ),
        }))
    };
    if let Some((field, _)) = texts.iter().find(|(_, t)| t.is_some_and(|t| t.contains('\0'))) {
        return refuse((*field).to_owned());
    }
    for (name, value) in &m.properties {
        if name.contains('\0') {
            return refuse(format!("name of property {name:?}"));
        }
        if let PropertyValue::String(v) = value
            && v.contains('\0')
        {
            return refuse(format!("value of property {name:?}"));
        }
    }
    Ok(())
}

/// Stores outgoing messages in one statement; returns them with their outbox ids, in
/// order.
pub(crate) async fn insert_outbox(
    conn: &mut PgConnection,
    endpoint: &str,
    rows: Vec<OutboxRow>,
    now: DateTime<Utc>,
) -> Result<Vec<OutboxMessage>> {
    insert_outbox_with_history(conn, endpoint, rows, now, &[]).await
}

/// Stores outgoing messages and handled events (with the saga instances each touched) in
/// one statement, one round trip where each took one; returns the messages with their
/// outbox ids, in order. Either may be empty (none: no statement).
pub(crate) async fn insert_outbox_with_history(
    conn: &mut PgConnection,
    endpoint: &str,
    rows: Vec<OutboxRow>,
    now: DateTime<Utc>,
    events: &[crate::store::pg_history::Prepared],
) -> Result<Vec<OutboxMessage>> {
    for row in &rows {
        check_storable(&row.envelope)?;
    }
    if rows.is_empty() {
        crate::store::pg_history::record_many(conn, events).await?;
        return Ok(Vec::new());
    }
    let n = rows.len();
    let (mut sources, mut destinations, mut topics, mut envelopes, mut bodies) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let mut kept = Vec::with_capacity(n);
    for row in rows {
        let (json, body) = StoredEnvelope::split(row.envelope.clone())?;
        sources.push(row.source_id);
        destinations.push(row.destination.clone());
        topics.push(row.is_topic);
        envelopes.push(json);
        bodies.push(body.to_vec());
        kept.push((row.destination, row.is_topic, row.envelope));
    }
    // The ids come from the sequence in the order of `ord`, so sorted they pair with the
    // rows in the order given.
    let sql = INSERT_OUTBOX_WITH_EVENTS.sql(events).unwrap_or(INSERT_OUTBOX);
    let query = sqlx::query(sql)
        .bind(endpoint)
        .bind(&sources)
        .bind(&destinations)
        .bind(&topics)
        .bind(&envelopes)
        .bind(&bodies)
        .bind(now);
    let what = if events.is_empty() {
        "cannot store outgoing messages"
    } else {
        "cannot store outgoing messages and the history of their handling"
    };
    let found = crate::store::pg_history::bind_events_if_any(query, events)
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| db_error(what, e))?;
    let mut ids = found
        .iter()
        .map(|r| r.try_get::<i64, _>(0))
        .collect::<std::result::Result<Vec<i64>, _>>()
        .map_err(|e| db_error("cannot read the outbox ids", e))?;
    ids.sort_unstable();
    if ids.len() != kept.len() {
        return Err(Error::new(ErrorKind::Corrupt {
            detail: format!("the outbox stored {} of {} messages", ids.len(), kept.len()),
        }));
    }
    Ok(ids
        .into_iter()
        .zip(kept)
        .map(|(id, (destination, is_topic, envelope))| OutboxMessage {
            id,
            destination,
            is_topic,
            envelope,
        })
        .collect())
}

/// The outbox messages stored by the handling of `source_id` and not dispatched yet.
pub(crate) async fn outbox_of<'c>(
    conn: impl sqlx::PgExecutor<'c>,
    endpoint: &str,
    source_id: &str,
) -> Result<Vec<OutboxMessage>> {
    let rows = sqlx::query(
        "SELECT id, destination, is_topic, envelope::text, body FROM courier.outbox \
         WHERE endpoint = $1 AND source_id = $2 ORDER BY id",
    )
    .bind(endpoint)
    .bind(source_id)
    .fetch_all(conn)
    .await
    .map_err(|e| db_error("cannot read the outbox", e))?;
    outbox_rows(rows)
}

pub(crate) fn outbox_rows(rows: Vec<sqlx::postgres::PgRow>) -> Result<Vec<OutboxMessage>> {
    rows.into_iter()
        .map(|r| {
            let get = |e| db_error("cannot read an outbox row", e);
            let json: String = r.try_get(3).map_err(get)?;
            let body: Vec<u8> = r.try_get(4).map_err(get)?;
            Ok(OutboxMessage {
                id: r.try_get(0).map_err(get)?,
                destination: r.try_get(1).map_err(get)?,
                is_topic: r.try_get(2).map_err(get)?,
                envelope: StoredEnvelope::join(&json, body)?,
            })
        })
        .collect()
}

/// Records the ids of a batch's members in the inbox on `conn`, in one statement; per
/// member, in order: `None` when it was recorded now, or the undispatched outbox messages
/// of its earlier handling (`Store::begin_batch`). The ids are distinct.
pub(crate) async fn record_batch(
    conn: &mut PgConnection,
    endpoint: &str,
    ids: &[String],
    now: DateTime<Utc>,
) -> Result<Vec<Option<Vec<OutboxMessage>>>> {
    let recorded: Vec<String> = sqlx::query_scalar(
        "INSERT INTO courier.inbox (endpoint, message_id, processed_at) \
         SELECT $1, id, $3 FROM unnest($2::text[]) AS id ON CONFLICT DO NOTHING RETURNING message_id",
    )
    .bind(endpoint)
    .bind(ids)
    .bind(now)
    .fetch_all(&mut *conn)
    .await
    .map_err(|e| db_error("cannot record the batch's messages in the inbox", e))?;
    // An id given twice was inserted once: its first member is fresh, a later one a
    // duplicate (taken out of `recorded` by the first).
    let mut recorded: std::collections::HashSet<String> = recorded.into_iter().collect();
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        if recorded.remove(id) {
            out.push(None);
        } else {
            out.push(Some(outbox_of(&mut *conn, endpoint, id).await?));
        }
    }
    Ok(out)
}
