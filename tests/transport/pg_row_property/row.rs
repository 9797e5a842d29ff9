//! The generated row and its SQL: the entities of a case (`Shape`, `Target`), every column
//! of the odd row as a value the schema admits (`Row` and the types of its columns, each
//! shown abbreviated), and the INSERT that writes it into `courier.message` as another
//! program would.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use courier::Clock;

use super::HORIZON_DAYS;
use super::env::{Case, Env};
use super::oracle::{Failure, class, fail};

/// The entities of a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// A queue.
    Queue,
    /// A topic with one subscription (the receiver reads the subscription).
    Topic,
    /// A queue that requires sessions.
    Sessions,
}

/// Which entity the row names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// The entity the receiver reads (the queue or the subscription).
    Receiving,
    /// The topic (only in `Shape::Topic`).
    Topic,
    /// An id no entity has.
    Missing,
}

/// A time column's value, rendered against the clock's now when the case runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Time {
    Null,
    /// Now plus this many milliseconds.
    Now(i64),
    /// Now + 100 * 366 days plus this many milliseconds.
    Horizon(i64),
    Infinity,
    MinusInfinity,
    /// 4713-01-01 BC.
    FarPast,
    /// The last microsecond Postgres stores (294276 AD).
    FarFuture,
    /// Past the last year chrono holds (262143 AD).
    BeyondChrono,
    Epoch,
}

impl Time {
    fn sql(self, now: DateTime<Utc>) -> Option<String> {
        let at = |t: DateTime<Utc>| Some(t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true));
        match self {
            Time::Null => None,
            Time::Now(ms) => at(now + chrono::Duration::milliseconds(ms)),
            Time::Horizon(ms) => at(now + chrono::Duration::days(HORIZON_DAYS) + chrono::Duration::milliseconds(ms)),
            Time::Infinity => Some("infinity".into()),
            Time::MinusInfinity => Some("-infinity".into()),
            Time::FarPast => Some("4713-01-01 00:00:00+00 BC".into()),
            Time::FarFuture => Some("294276-12-31 23:59:59.999999+00".into()),
            Time::BeyondChrono => Some("262143-06-01 00:00:00+00".into()),
            Time::Epoch => Some("1970-01-01 00:00:00+00".into()),
        }
    }
}

/// A lock holder (`courier.message.holder`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Holder {
    Null,
    /// The key of a transport that lives (this test's), read when the case runs.
    Alive,
    Key(i64),
}

/// A text column's value; shown abbreviated.
#[derive(Clone, PartialEq, Eq)]
pub(super) struct Text(pub(super) Option<String>);

impl fmt::Debug for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            None => f.write_str("NULL"),
            Some(s) => f.write_str(&abbreviate(s)),
        }
    }
}

/// The session id: a text of its own, or the valid message's session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Session {
    Text(Text),
    SameAsTheValidMessage,
}

/// The body (`bytea`); shown abbreviated.
#[derive(Clone, PartialEq, Eq)]
pub(super) struct Body(pub(super) Option<Vec<u8>>);

impl fmt::Debug for Body {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            None => f.write_str("NULL"),
            Some(b) if b.len() <= 40 => write!(f, "{:?}", String::from_utf8_lossy(b)),
            Some(b) => write!(f, "<{} bytes>", b.len()),
        }
    }
}

/// The properties (`jsonb`); shown abbreviated.
#[derive(Clone, PartialEq)]
pub(crate) struct Json(pub(crate) Option<serde_json::Value>);

impl fmt::Debug for Json {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            None => f.write_str("NULL"),
            Some(v) => f.write_str(&abbreviate(&v.to_string())),
        }
    }
}

pub(crate) fn abbreviate(s: &str) -> String {
    if s.len() <= 48 {
        return format!("{s:?}");
    }
    let head: String = s.chars().take(16).collect();
    format!("<{} bytes: {head:?}...>", s.len())
}

/// One generated case: the entities' settings and every column of the odd row.
#[derive(Debug, Clone)]
pub(super) struct Row {
    pub(super) shape: Shape,
    pub(super) max_delivery_count: u32,
    pub(super) default_ttl: Option<Duration>,
    pub(super) target: Target,
    /// `None`: `nextval('courier.message_seq')`.
    pub(super) seq: Option<i64>,
    pub(super) state: Option<i16>,
    pub(super) delivery_count: Option<i32>,
    pub(super) locked_until: Time,
    pub(super) holder: Holder,
    pub(super) session_id: Session,
    pub(super) enqueued_at: Time,
    pub(super) scheduled_at: Time,
    pub(super) expires_at: Time,
    pub(super) ttl_ms: Option<i64>,
    pub(super) message_id: Text,
    pub(super) correlation_id: Text,
    pub(super) causation_id: Text,
    pub(super) message_type: Text,
    pub(super) content_type: Text,
    pub(super) reply_to: Text,
    pub(super) properties: Json,
    pub(super) dl_reason: Text,
    pub(super) dl_description: Text,
    pub(super) dl_source: Text,
    pub(super) body: Body,
}

/// The columns of the odd row, bound in order; the times are text cast by Postgres.
const INSERT: &str = "INSERT INTO courier.message (entity_id, seq, state, delivery_count, locked_until, holder, \
       session_id, enqueued_at, scheduled_at, expires_at, ttl_ms, message_id, correlation_id, causation_id, \
       message_type, content_type, reply_to, properties, dl_reason, dl_description, dl_source, body) \
     VALUES ($1, coalesce($2, nextval('courier.message_seq')), $3, $4, $5::timestamptz, $6, $7, \
       $8::timestamptz, $9::timestamptz, $10::timestamptz, $11, $12, $13, $14, $15, $16, $17, $18::jsonb, $19, \
       $20, $21, $22)";

impl Env {
    /// The key of a live lock holder (a transport of this process).
    async fn alive_holder(&self) -> i64 {
        sqlx::query_scalar(
            "SELECT (l.classid::bigint << 32) | l.objid::bigint FROM pg_locks l WHERE l.locktype = 'advisory' \
             AND l.granted AND l.objsubid = 1 \
             AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) LIMIT 1",
        )
        .fetch_one(&self.pool)
        .await
        .unwrap()
    }

    /// Inserts the odd row: `Ok(None)` inserted, `Ok(Some(sqlstate))` refused with a
    /// constraint violation.
    pub(super) async fn insert(&self, row: &Row, case: &Case) -> Result<Option<String>, Failure> {
        let now = self.clock.now();
        let entity = match row.target {
            Target::Receiving => case.receiving,
            Target::Topic => case.topic.unwrap_or(case.receiving),
            Target::Missing => -1,
        };
        let holder = match row.holder {
            Holder::Null => None,
            Holder::Alive => Some(self.alive_holder().await),
            Holder::Key(k) => Some(k),
        };
        let session = match &row.session_id {
            Session::Text(t) => t.0.clone(),
            Session::SameAsTheValidMessage => Some(case.valid_session.clone()),
        };
        let done = sqlx::query(INSERT)
            .bind(entity)
            .bind(row.seq)
            .bind(row.state)
            .bind(row.delivery_count)
            .bind(row.locked_until.sql(now))
            .bind(holder)
            .bind(session)
            .bind(row.enqueued_at.sql(now))
            .bind(row.scheduled_at.sql(now))
            .bind(row.expires_at.sql(now))
            .bind(row.ttl_ms)
            .bind(row.message_id.0.as_deref())
            .bind(row.correlation_id.0.as_deref())
            .bind(row.causation_id.0.as_deref())
            .bind(row.message_type.0.as_deref())
            .bind(row.content_type.0.as_deref())
            .bind(row.reply_to.0.as_deref())
            .bind(row.properties.0.as_ref().map(ToString::to_string))
            .bind(row.dl_reason.0.as_deref())
            .bind(row.dl_description.0.as_deref())
            .bind(row.dl_source.0.as_deref())
            .bind(row.body.0.as_deref())
            .execute(&self.pool)
            .await;
        match done {
            Ok(_) => Ok(None),
            Err(e) => {
                let code = e.as_database_error().and_then(|d| d.code()).map(|c| c.into_owned());
                match code {
                    // A constraint violation; or 54000, a value too large for an index
                    // (a session id of more than about 8 KB after compression, for
                    // `message_sessions`): the table refuses the row either way.
                    Some(c) if c.starts_with("23") || c == "54000" => Ok(Some(c)),
                    _ => Err(fail(class::INSERT_OTHER, e.to_string())),
                }
            }
        }
    }
}
