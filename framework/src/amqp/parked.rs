//! Dead letters of RabbitMQ parked in the transport's schedule store
//! (`courier.amqp_dead_letter` with `courier.amqp_dead_letter_message` /
//! `courier_amqp_dead_letter`, migration
//! `20261126210001_amqp_dead_letters.sql`): the rows the operations API
//! ([`AmqpAdmin`](super::admin::AmqpAdmin)) pages, shows, resubmits and deletes.
//!
//! A row holds the message exactly as RabbitMQ delivered it (its AMQP basic properties,
//! headers included, in their wire encoding, and its body), so a resubmit publishes the
//! same message, whoever produced it (in Postgres in a table of its own, so the rows a
//! page counts stay narrow); and the columns a listing shows, decoded once when the
//! message is parked, so a page is one indexed query. Rows are unique per (queue,
//! identity): parking a message again (a redelivery after a crash between the commit and
//! the acknowledgement) inserts nothing.

use chrono::{DateTime, Utc};
use lapin::BasicProperties;
use lapin::protocol::basic::{gen_properties, parse_properties};

use super::schedule::ScheduleStore;
use super::wire::{from_millis, millis};
use crate::admin::DeadLetterSummary;
use crate::error::{Error, ErrorKind, Result};
use crate::store::db_error;

/// A dead letter to park: what a listing shows, and the message itself.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Parking {
    /// The sequence number the sender stamped, or a hash (`admin::identify`).
    pub(crate) identity: i64,
    pub(crate) message_id: String,
    pub(crate) message_type: Option<String>,
    pub(crate) reason: Option<String>,
    pub(crate) description: Option<String>,
    pub(crate) error: Option<String>,
    pub(crate) delivery_count: u32,
    pub(crate) enqueued_at: DateTime<Utc>,
    /// The AMQP basic properties in their wire encoding ([`encode_properties`]).
    pub(crate) properties: Vec<u8>,
    pub(crate) body: Vec<u8>,
}

/// A parked dead letter read back: its number and the message.
#[derive(Debug, Clone)]
pub(crate) struct Parked {
    pub(crate) id: i64,
    pub(crate) properties: BasicProperties,
    pub(crate) body: Vec<u8>,
}

/// The AMQP basic properties (content type ... cluster id, and the headers table) in the
/// encoding of an AMQP 0-9-1 content header: every field and header value type is kept.
pub(crate) fn encode_properties(p: &BasicProperties) -> Result<Vec<u8>> {
    gen_properties(p)(Vec::new().into()).map(|ctx| ctx.write).map_err(|e| {
        Error::new(ErrorKind::InvalidMessage {
            reason: format!("a dead letter's AMQP properties cannot be encoded for parking: {e:?}"),
        })
    })
}

/// The AMQP basic properties [`encode_properties`] wrote.
pub(crate) fn decode_properties(bytes: &[u8]) -> Result<BasicProperties> {
    match parse_properties(bytes) {
        Ok((_, p)) => Ok(p),
        Err(e) => Err(Error::new(ErrorKind::Corrupt {
            detail: format!(
                "a parked dead letter's AMQP properties do not parse ({e:?}); delete it \
                 (courier dlq delete) or restore the row"
            ),
        })),
    }
}

/// A parked row of the Postgres table: id, properties, body.
type MessageRow = (i64, Vec<u8>, Vec<u8>);

/// A listed row: id, message id, type, enqueued time, delivery count, reason, error.
#[cfg(feature = "postgres")]
type PgSummaryRow = (
    i64,
    String,
    Option<String>,
    DateTime<Utc>,
    i32,
    Option<String>,
    Option<String>,
);
/// The same in SQLite (time in milliseconds).
type LiteSummaryRow = (i64, String, Option<String>, i64, i64, Option<String>, Option<String>);

/// The ids as a JSON array, for SQLite's `json_each` (one bound value for a whole batch).
fn json_ids(ids: &[i64]) -> String {
    let mut s = String::from("[");
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&id.to_string());
    }
    s.push(']');
    s
}

fn to_messages(rows: Vec<MessageRow>) -> Result<Vec<Parked>> {
    rows.into_iter()
        .map(|(id, properties, body)| {
            Ok(Parked {
                id,
                properties: decode_properties(&properties)?,
                body,
            })
        })
        .collect()
}

/// What a failed statement of the table says: with a store older than this Courier, the
/// table is missing until its migrations run.
fn failed(what: &'static str) -> impl Fn(sqlx::Error) -> Error {
    move |e| db_error(what, e)
}

impl ScheduleStore {
    /// Parks `rows` of `queue` in one transaction; rows already parked (the same identity)
    /// are skipped. Returns how many were new.
    pub(crate) async fn park(&self, queue: &str, rows: &[Parking], now: DateTime<Utc>) -> Result<u64> {
        if rows.is_empty() {
            return Ok(0);
        }
        let failed =
            failed("cannot park dead letters in the schedule store (a store of an older Courier: run its migrate())");
        match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) => {
                let col = |f: fn(&Parking) -> Option<String>| rows.iter().map(f).collect::<Vec<_>>();
                let identity: Vec<i64> = rows.iter().map(|r| r.identity).collect();
                let message_id: Vec<String> = rows.iter().map(|r| r.message_id.clone()).collect();
                let count: Vec<i32> = rows
                    .iter()
                    .map(|r| i32::try_from(r.delivery_count).unwrap_or(i32::MAX))
                    .collect();
                let enqueued: Vec<DateTime<Utc>> = rows.iter().map(|r| r.enqueued_at).collect();
                let size: Vec<i32> = rows
                    .iter()
                    .map(|r| i32::try_from(r.body.len()).unwrap_or(i32::MAX))
                    .collect();
                let properties: Vec<&[u8]> = rows.iter().map(|r| r.properties.as_slice()).collect();
                let body: Vec<&[u8]> = rows.iter().map(|r| r.body.as_slice()).collect();
                // One statement (its own transaction): all of the batch or none of it.
                // The rows and their messages in one statement (one transaction); a
                // message already parked inserts neither.
                let done = sqlx::query(
                    "WITH u AS (SELECT * FROM unnest($3::bigint[], $4::text[], $5::text[], $6::text[], \
                     $7::text[], $8::text[], $9::int[], $10::timestamptz[], $11::int[], $12::bytea[], \
                     $13::bytea[]) WITH ORDINALITY AS u(i, m, t, r, d, e, c, q, s, p, b, n)), \
                     ins AS (INSERT INTO courier.amqp_dead_letter (queue, identity, parked_at, message_id, \
                     message_type, reason, description, error, delivery_count, enqueued_at, size) \
                     SELECT $1, i, $2, m, t, r, d, e, c, q, s FROM u ORDER BY n \
                     ON CONFLICT (queue, identity) DO NOTHING RETURNING id, identity) \
                     INSERT INTO courier.amqp_dead_letter_message (id, properties, body) \
                     SELECT DISTINCT ON (ins.id) ins.id, u.p, u.b FROM ins JOIN u ON u.i = ins.identity \
                     ORDER BY ins.id, u.n",
                )
                .bind(queue)
                .bind(now)
                .bind(identity)
                .bind(message_id)
                .bind(col(|r| r.message_type.clone()))
                .bind(col(|r| r.reason.clone()))
                .bind(col(|r| r.description.clone()))
                .bind(col(|r| r.error.clone()))
                .bind(count)
                .bind(enqueued)
                .bind(size)
                .bind(properties)
                .bind(body)
                .execute(pool)
                .await
                .map_err(failed)?;
                Ok(done.rows_affected())
            }
            Self::Sqlite(store) => {
                let _turn = store.write_turn().await?;
                let mut tx = store.pool().begin_with("BEGIN IMMEDIATE").await.map_err(&failed)?;
                let mut new = 0;
                for r in rows {
                    new += sqlx::query(
                        "INSERT INTO courier_amqp_dead_letter (queue, identity, parked_at, message_id, \
                         message_type, reason, description, error, delivery_count, enqueued_at, size, properties, \
                         body) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (queue, identity) DO NOTHING",
                    )
                    .bind(queue)
                    .bind(r.identity)
                    .bind(millis(now))
                    .bind(&r.message_id)
                    .bind(&r.message_type)
                    .bind(&r.reason)
                    .bind(&r.description)
                    .bind(&r.error)
                    .bind(i64::from(r.delivery_count))
                    .bind(millis(r.enqueued_at))
                    .bind(i64::try_from(r.body.len()).unwrap_or(i64::MAX))
                    .bind(&r.properties)
                    .bind(&r.body)
                    .execute(&mut *tx)
                    .await
                    .map_err(&failed)?
                    .rows_affected();
                }
                tx.commit().await.map_err(&failed)?;
                Ok(new)
            }
        }
    }

    /// How many dead letters of `queue` are parked.
    pub(crate) async fn parked_count(&self, queue: &str) -> Result<u64> {
        let failed = failed("cannot count parked dead letters (a store of an older Courier: run its migrate())");
        let n: i64 = match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) => {
                sqlx::query_scalar("SELECT count(*) FROM courier.amqp_dead_letter WHERE queue = $1")
                    .bind(queue)
                    .fetch_one(pool)
                    .await
                    .map_err(failed)?
            }
            Self::Sqlite(store) => sqlx::query_scalar("SELECT count(*) FROM courier_amqp_dead_letter WHERE queue = ?")
                .bind(queue)
                .fetch_one(store.pool())
                .await
                .map_err(failed)?,
        };
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// Up to `limit` parked dead letters of `queue` numbered after `after`, in order.
    pub(crate) async fn parked_page(&self, queue: &str, after: i64, limit: i64) -> Result<Vec<DeadLetterSummary>> {
        let failed = failed("cannot list parked dead letters");
        let clamp = |n: i64| u32::try_from(n.max(0)).unwrap_or(u32::MAX);
        match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) => {
                let rows: Vec<PgSummaryRow> = sqlx::query_as(
                    "SELECT id, message_id, message_type, enqueued_at, delivery_count, reason, error \
                     FROM courier.amqp_dead_letter WHERE queue = $1 AND id > $2 ORDER BY id LIMIT $3",
                )
                .bind(queue)
                .bind(after)
                .bind(limit)
                .fetch_all(pool)
                .await
                .map_err(failed)?;
                Ok(rows
                    .into_iter()
                    .map(|(id, message_id, message_type, at, count, reason, error)| {
                        summary(id, message_id, message_type, at, clamp(count.into()), reason, error)
                    })
                    .collect())
            }
            Self::Sqlite(store) => {
                let rows: Vec<LiteSummaryRow> = sqlx::query_as(
                    "SELECT id, message_id, message_type, enqueued_at, delivery_count, reason, error \
                     FROM courier_amqp_dead_letter WHERE queue = ? AND id > ? ORDER BY id LIMIT ?",
                )
                .bind(queue)
                .bind(after)
                .bind(limit)
                .fetch_all(store.pool())
                .await
                .map_err(failed)?;
                Ok(rows
                    .into_iter()
                    .map(|(id, message_id, message_type, at, count, reason, error)| {
                        let at = from_millis(at).unwrap_or(DateTime::<Utc>::UNIX_EPOCH);
                        summary(id, message_id, message_type, at, clamp(count), reason, error)
                    })
                    .collect())
            }
        }
    }

    /// The parked dead letters of `queue` among `ids` (in id order; unknown ids are left
    /// out).
    pub(crate) async fn parked(&self, queue: &str, ids: &[i64]) -> Result<Vec<Parked>> {
        let failed = failed("cannot read parked dead letters");
        let rows: Vec<MessageRow> = match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) => sqlx::query_as(
                "SELECT d.id, m.properties, m.body FROM courier.amqp_dead_letter d \
                 JOIN courier.amqp_dead_letter_message m ON m.id = d.id \
                 WHERE d.queue = $1 AND d.id = ANY($2) ORDER BY d.id",
            )
            .bind(queue)
            .bind(ids)
            .fetch_all(pool)
            .await
            .map_err(failed)?,
            Self::Sqlite(store) => sqlx::query_as(
                "SELECT id, properties, body FROM courier_amqp_dead_letter WHERE queue = ? \
                 AND id IN (SELECT value FROM json_each(?)) ORDER BY id",
            )
            .bind(queue)
            .bind(json_ids(ids))
            .fetch_all(store.pool())
            .await
            .map_err(failed)?,
        };
        to_messages(rows)
    }

    /// Deletes the parked dead letters of `queue` among `ids` in one transaction; returns
    /// the ids it deleted (another operator may have taken some first).
    pub(crate) async fn unpark(&self, queue: &str, ids: &[i64]) -> Result<Vec<i64>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let failed = failed("cannot delete parked dead letters");
        let mut gone: Vec<i64> = match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) => sqlx::query_scalar(
                "DELETE FROM courier.amqp_dead_letter WHERE queue = $1 AND id = ANY($2) RETURNING id",
            )
            .bind(queue)
            .bind(ids)
            .fetch_all(pool)
            .await
            .map_err(failed)?,
            Self::Sqlite(store) => {
                let _turn = store.write_turn().await?;
                sqlx::query_scalar(
                    "DELETE FROM courier_amqp_dead_letter WHERE queue = ? \
                     AND id IN (SELECT value FROM json_each(?)) RETURNING id",
                )
                .bind(queue)
                .bind(json_ids(ids))
                .fetch_all(store.pool())
                .await
                .map_err(failed)?
            }
        };
        gone.sort_unstable();
        Ok(gone)
    }

    /// Every parked dead letter's number of `queue`, in order.
    pub(crate) async fn parked_ids(&self, queue: &str) -> Result<Vec<i64>> {
        let failed = failed("cannot list parked dead letters");
        match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) => {
                sqlx::query_scalar("SELECT id FROM courier.amqp_dead_letter WHERE queue = $1 ORDER BY id")
                    .bind(queue)
                    .fetch_all(pool)
                    .await
                    .map_err(failed)
            }
            Self::Sqlite(store) => {
                sqlx::query_scalar("SELECT id FROM courier_amqp_dead_letter WHERE queue = ? ORDER BY id")
                    .bind(queue)
                    .fetch_all(store.pool())
                    .await
                    .map_err(failed)
            }
        }
    }

    /// Deletes every parked dead letter of a deleted queue.
    pub(crate) async fn unpark_all(&self, queue: &str) -> Result<()> {
        self.delete_rows_of(
            queue,
            "DELETE FROM courier.amqp_dead_letter WHERE queue = $1",
            "DELETE FROM courier_amqp_dead_letter WHERE queue = ?",
            "cannot delete the parked dead letters of a deleted queue",
        )
        .await
    }

    /// Runs `postgres` or `sqlite` (a delete with the queue as its one parameter) on this
    /// store (on SQLite in the store's write turn).
    #[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
    pub(crate) async fn delete_rows_of(
        &self,
        queue: &str,
        postgres: &'static str,
        sqlite: &'static str,
        what: &'static str,
    ) -> Result<()> {
        let failed = failed(what);
        match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) => sqlx::query(postgres)
                .bind(queue)
                .execute(pool)
                .await
                .map(drop)
                .map_err(failed),
            Self::Sqlite(store) => {
                let _turn = store.write_turn().await?;
                sqlx::query(sqlite)
                    .bind(queue)
                    .execute(store.pool())
                    .await
                    .map(drop)
                    .map_err(failed)
            }
        }
    }
}

fn summary(
    id: i64,
    message_id: String,
    message_type: Option<String>,
    enqueued_at: DateTime<Utc>,
    delivery_count: u32,
    reason: Option<String>,
    error: Option<String>,
) -> DeadLetterSummary {
    DeadLetterSummary {
        sequence_number: id,
        message_id,
        message_type,
        enqueued_at,
        delivery_count,
        reason,
        error,
    }
}

#[cfg(test)]
mod tests {
    use lapin::types::{AMQPValue, ByteArray, FieldArray, FieldTable, LongString};

    use super::*;

    #[test]
    fn every_property_and_header_type_survives_parking() {
        let mut nested = FieldTable::default();
        nested.insert("queue".into(), AMQPValue::LongString(LongString::from("orders")));
        // Every value type RabbitMQ delivers in a table (no short string: RabbitMQ reads
        // an `s` as a short int and never sends one).
        let mut headers = FieldTable::default();
        headers.insert(
            "s".into(),
            AMQPValue::LongString(LongString::from(&b"\xff\x00bytes"[..])),
        );
        headers.insert("i8".into(), AMQPValue::ShortShortInt(-3));
        headers.insert("u32".into(), AMQPValue::LongUInt(7));
        headers.insert("i64".into(), AMQPValue::LongLongInt(-9));
        headers.insert("f".into(), AMQPValue::Float(1.5));
        headers.insert("d".into(), AMQPValue::Double(2.25));
        headers.insert("b".into(), AMQPValue::Boolean(true));
        headers.insert("t".into(), AMQPValue::Timestamp(1_700_000_000));
        headers.insert("bytes".into(), AMQPValue::ByteArray(ByteArray::from(vec![0_u8, 1, 2])));
        headers.insert("void".into(), AMQPValue::Void);
        headers.insert(
            "x-death".into(),
            AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::FieldTable(nested)])),
        );
        let p = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_content_encoding("gzip".into())
            .with_headers(headers)
            .with_delivery_mode(2)
            .with_priority(4)
            .with_correlation_id("c-1".into())
            .with_reply_to("replies".into())
            .with_expiration("60000".into())
            .with_message_id("m-1".into())
            .with_timestamp(1_700_000_001)
            .with_type("shop.Order".into())
            .with_user_id("guest".into())
            .with_app_id("legacy".into())
            .with_cluster_id("c".into());
        let bytes = encode_properties(&p).unwrap_or_default();
        let back = decode_properties(&bytes).map_err(|e| e.to_string());
        assert_eq!(back.as_ref(), Ok(&p));
        let empty = BasicProperties::default();
        let back = decode_properties(&encode_properties(&empty).unwrap_or_default()).ok();
        assert_eq!(back, Some(empty));
        assert!(
            decode_properties(&[0xff]).is_err(),
            "a torn row is an error, not a panic"
        );
    }

    #[test]
    fn ids_are_bound_as_one_json_array() {
        assert_eq!(json_ids(&[]), "[]");
        assert_eq!(json_ids(&[3, 10, -1]), "[3,10,-1]");
    }
}
