//! Dead letters of RabbitMQ as the transport's schedule store knows them
//! (`courier.amqp_dead_letter` with `courier.amqp_dead_letter_message` /
//! `courier_amqp_dead_letter`, migrations `20261126210001_amqp_dead_letters.sql` and
//! `20261130000201_amqp_dead_letter_seen.sql`).
//!
//! * **Seen** rows (`in_rabbitmq`): a dead letter the operations API
//!   ([`AmqpAdmin`](super::admin::AmqpAdmin)) read in a DLQ and left there. The row gives
//!   it its number (the row's id, what pages, `show`, `resubmit` and `delete` take), the
//!   same at every listing, and the identity that finds it in the DLQ again
//!   (`catalog.rs`). Unique per (queue, identity).
//! * **Parked** rows: a dead letter an earlier Courier moved out of the DLQ (it parked a
//!   DLQ to page it). The row holds the message exactly as RabbitMQ delivered it (its AMQP
//!   basic properties, headers included, in their wire encoding, and its body; in Postgres
//!   in a table of its own), and is listed, shown, resubmitted (a copy published, then the
//!   row deleted) and deleted as before. Nothing parks any more.

use chrono::{DateTime, Utc};
use lapin::BasicProperties;
#[cfg(test)]
use lapin::protocol::basic::gen_properties;
use lapin::protocol::basic::parse_properties;

use super::schedule::ScheduleStore;
use super::wire::from_millis;
use crate::admin::DeadLetterSummary;
use crate::error::{Error, ErrorKind, Result};
use crate::store::db_error;

/// A dead letter seen in a DLQ: what a listing shows of it, and its identity.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Seen {
    /// A hash of what a redelivery does not change (`dead_letters::identify`).
    pub(crate) identity: i64,
    pub(crate) message_id: String,
    pub(crate) message_type: Option<String>,
    pub(crate) reason: Option<String>,
    pub(crate) description: Option<String>,
    pub(crate) error: Option<String>,
    pub(crate) delivery_count: u32,
    pub(crate) enqueued_at: DateTime<Utc>,
    pub(crate) size: usize,
}

impl Seen {
    /// What a listing shows of it, under its number.
    pub(crate) fn summary(&self, number: i64) -> DeadLetterSummary {
        summary(
            number,
            self.message_id.clone(),
            self.message_type.clone(),
            self.enqueued_at,
            self.delivery_count,
            self.reason.clone(),
            self.error.clone(),
        )
    }
}

/// A parked dead letter read back: its number and the message.
#[derive(Debug, Clone)]
pub(crate) struct Parked {
    pub(crate) id: i64,
    pub(crate) properties: BasicProperties,
    pub(crate) body: Vec<u8>,
}

/// The AMQP basic properties (content type ... cluster id, and the headers table) in the
/// encoding of an AMQP 0-9-1 content header: every field and header value type is kept
/// (how an earlier Courier parked them).
#[cfg(test)]
pub(crate) fn encode_properties(p: &BasicProperties) -> Result<Vec<u8>> {
    gen_properties(p)(Vec::new().into()).map(|ctx| ctx.write).map_err(|e| {
        Error::new(ErrorKind::InvalidMessage {
            reason: format!("a dead letter's AMQP properties cannot be encoded for parking: {e:?}"),
        })
    })
}

/// The AMQP basic properties of a parked row, in the encoding of a content header.
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
pub(crate) fn json_ids(ids: &[i64]) -> String {
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
pub(crate) fn failed(what: &'static str) -> impl Fn(sqlx::Error) -> Error {
    move |e| db_error(what, e)
}

impl ScheduleStore {
    /// How many dead letters of `queue` are parked.
    pub(crate) async fn parked_count(&self, queue: &str) -> Result<u64> {
        let failed = failed("cannot count parked dead letters (a store of an older Courier: run its migrate())");
        let n: i64 = match self {
            #[cfg(feature = "postgres")]
            Self::Postgres(pool) => {
                sqlx::query_scalar("SELECT count(*) FROM courier.amqp_dead_letter WHERE queue = $1 AND NOT in_rabbitmq")
                    .bind(queue)
                    .fetch_one(pool)
                    .await
                    .map_err(failed)?
            }
            Self::Sqlite(store) => {
                sqlx::query_scalar("SELECT count(*) FROM courier_amqp_dead_letter WHERE queue = ? AND NOT in_rabbitmq")
                    .bind(queue)
                    .fetch_one(store.pool())
                    .await
                    .map_err(failed)?
            }
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
                     FROM courier.amqp_dead_letter WHERE queue = $1 AND id > $2 AND NOT in_rabbitmq ORDER BY id LIMIT $3",
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
                     FROM courier_amqp_dead_letter WHERE queue = ? AND id > ? AND NOT in_rabbitmq ORDER BY id LIMIT ?",
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
                "SELECT id, properties, body FROM courier_amqp_dead_letter WHERE queue = ? AND NOT in_rabbitmq \
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
            Self::Postgres(pool) => sqlx::query_scalar(
                "SELECT id FROM courier.amqp_dead_letter WHERE queue = $1 AND NOT in_rabbitmq ORDER BY id",
            )
            .bind(queue)
            .fetch_all(pool)
            .await
            .map_err(failed),
            Self::Sqlite(store) => sqlx::query_scalar(
                "SELECT id FROM courier_amqp_dead_letter WHERE queue = ? AND NOT in_rabbitmq ORDER BY id",
            )
            .bind(queue)
            .fetch_all(store.pool())
            .await
            .map_err(failed),
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
        resubmit_refused: None,
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
