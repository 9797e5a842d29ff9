//! The generated row and how it is written into the file: every column of
//! `courier_message` as a value of any SQLite type (`Cell`, the times against the clock's
//! now, the row id and sequence number as the broker numbers them or not), and the INSERT
//! another program makes with it while no broker has the file open.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use courier::Clock;
use sqlx::sqlite::{Sqlite, SqliteConnection};

use super::env::{Case, Env};
use super::{Failure, HORIZON_DAYS, Shape, Target, abbreviate, class, fail};

/// Row ids are `entity << SEQ_BITS | seq` (the engine's `rows.rs`).
pub(super) const SEQ_BITS: u32 = 40;
/// An entity id no entity has.
const MISSING_ENTITY: i64 = 4_000_000;

/// A value of any SQLite type.
#[derive(Clone, PartialEq)]
pub(super) enum Cell {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
    /// A text whose bytes are not UTF-8 (`CAST(x'..' AS TEXT)`: SQLite does not check
    /// the encoding of a text, and a STRICT table's text column takes it).
    NotUtf8(Vec<u8>),
    Blob(Vec<u8>),
}

impl fmt::Debug for Cell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cell::Null => f.write_str("NULL"),
            Cell::Int(v) => write!(f, "{v}"),
            Cell::Real(v) => write!(f, "{v:?} (real)"),
            Cell::Text(s) => write!(f, "{} (text)", abbreviate(s)),
            Cell::NotUtf8(b) => write!(f, "CAST(x'{}' AS TEXT)", hex(b)),
            Cell::Blob(b) if b.len() <= 24 => write!(f, "x'{}' (blob)", hex(b)),
            Cell::Blob(b) => write!(f, "<{} bytes> (blob)", b.len()),
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

type Query<'q> = sqlx::query::Query<'q, Sqlite, <Sqlite as sqlx::Database>::Arguments>;

fn bind<'q>(q: Query<'q>, c: &Cell) -> Query<'q> {
    match c {
        Cell::Null => q.bind(None::<i64>),
        Cell::Int(v) => q.bind(*v),
        Cell::Real(v) => q.bind(*v),
        Cell::Text(s) => q.bind(s.clone()),
        // Cast to text by the INSERT (`insert_sql`).
        Cell::NotUtf8(b) | Cell::Blob(b) => q.bind(b.clone()),
    }
}

/// A time column's value: microseconds since the epoch, rendered against the clock's now.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Time {
    Null,
    /// Now plus this many milliseconds.
    Now(i64),
    /// Now + 100 * 366 days plus this many milliseconds.
    Horizon(i64),
    Micros(i64),
    /// Not an integer at all.
    Odd(Cell),
}

impl Time {
    fn cell(&self, now: DateTime<Utc>) -> Cell {
        let at = |t: DateTime<Utc>| Cell::Int(t.timestamp_micros());
        match self {
            Time::Null => Cell::Null,
            Time::Now(ms) => at(now + chrono::Duration::milliseconds(*ms)),
            Time::Horizon(ms) => at(now + chrono::Duration::days(HORIZON_DAYS) + chrono::Duration::milliseconds(*ms)),
            Time::Micros(v) => Cell::Int(*v),
            Time::Odd(c) => c.clone(),
        }
    }
}

/// The row id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Id {
    /// `entity << 40 | seq`.
    OfItsEntity,
    Value(i64),
}

/// The sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Seq {
    /// The entity's `next_seq`, raised past it.
    Next,
    /// The entity's `next_seq`, left as it is (the broker hands it out again).
    NextNotRaised,
    Value(i64),
}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Session {
    Cell(Cell),
    SameAsTheValidMessage,
}

#[derive(Debug, Clone)]
pub(super) struct Row {
    pub(super) shape: Shape,
    pub(super) max_delivery_count: u32,
    pub(super) default_ttl: Option<Duration>,
    pub(super) target: Target,
    pub(super) id: Id,
    pub(super) seq: Seq,
    pub(super) state: Cell,
    pub(super) delivery_count: Cell,
    pub(super) locked_until: Time,
    pub(super) session_id: Session,
    pub(super) enqueued_at: Time,
    pub(super) scheduled_at: Time,
    pub(super) expires_at: Time,
    pub(super) ttl_ms: Cell,
    pub(super) message_id: Cell,
    pub(super) correlation_id: Cell,
    pub(super) causation_id: Cell,
    pub(super) message_type: Cell,
    pub(super) content_type: Cell,
    pub(super) reply_to: Cell,
    pub(super) properties: Cell,
    pub(super) dl_reason: Cell,
    pub(super) dl_description: Cell,
    pub(super) dl_source: Cell,
    pub(super) body: Cell,
}

/// The INSERT of the odd row: the id, entity and sequence number, then `cells` in column
/// order, each a parameter (cast to text for a text that is not UTF-8).
fn insert_sql(cells: &[Cell]) -> String {
    let mut sql = String::from(
        "INSERT INTO courier_message (id, entity_id, seq, state, delivery_count, locked_until, session_id, \
         enqueued_at, scheduled_at, expires_at, ttl_ms, message_id, correlation_id, causation_id, message_type, \
         content_type, reply_to, properties, dl_reason, dl_description, dl_source, body) VALUES (?1, ?2, ?3",
    );
    for (i, c) in cells.iter().enumerate() {
        let n = i + 4;
        match c {
            Cell::NotUtf8(_) => sql.push_str(&format!(", CAST(?{n} AS TEXT)")),
            _ => sql.push_str(&format!(", ?{n}")),
        }
    }
    sql.push(')');
    sql
}

impl Env {
    /// Writes the odd row: `Ok((id, None))` written, `Ok((id, Some(code)))` refused by
    /// SQLite with a constraint (or a type mismatch of the row id).
    pub(super) async fn write(
        &self,
        conn: &mut SqliteConnection,
        row: &Row,
        case: &Case,
    ) -> Result<(i64, Option<String>), Failure> {
        let now = self.clock.now();
        let entity = match row.target {
            Target::Receiving => case.receiving,
            Target::Topic => case.topic.unwrap_or(case.receiving),
            Target::Missing => MISSING_ENTITY,
        };
        // A subscription's copies take the topic's numbers.
        let numbered_by = match (row.target, case.topic) {
            (Target::Missing, _) => entity,
            (_, Some(topic)) => topic,
            (_, None) => case.receiving,
        };
        let next: i64 = sqlx::query_scalar("SELECT coalesce((SELECT next_seq FROM courier_entity WHERE id = ?1), 1)")
            .bind(numbered_by)
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        let seq = match row.seq {
            Seq::Next | Seq::NextNotRaised => next,
            Seq::Value(v) => v,
        };
        let id = match row.id {
            Id::OfItsEntity => (entity << SEQ_BITS) | seq,
            Id::Value(v) => v,
        };
        let session = match &row.session_id {
            Session::Cell(c) => c.clone(),
            Session::SameAsTheValidMessage => Cell::Text(case.valid_session.clone()),
        };
        let cells = [
            row.state.clone(),
            row.delivery_count.clone(),
            row.locked_until.cell(now),
            session,
            row.enqueued_at.cell(now),
            row.scheduled_at.cell(now),
            row.expires_at.cell(now),
            row.ttl_ms.clone(),
            row.message_id.clone(),
            row.correlation_id.clone(),
            row.causation_id.clone(),
            row.message_type.clone(),
            row.content_type.clone(),
            row.reply_to.clone(),
            row.properties.clone(),
            row.dl_reason.clone(),
            row.dl_description.clone(),
            row.dl_source.clone(),
            row.body.clone(),
        ];
        let sql = insert_sql(&cells);
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(id).bind(entity).bind(seq);
        for c in &cells {
            q = bind(q, c);
        }
        match q.execute(&mut *conn).await {
            Ok(_) => {}
            Err(e) => {
                let code = e.as_database_error().and_then(|d| d.code()).map(|c| c.into_owned());
                let primary = code.as_deref().and_then(|c| c.parse::<i64>().ok()).map(|c| c & 0xff);
                return match primary {
                    // SQLITE_CONSTRAINT (NOT NULL, the row id taken), SQLITE_MISMATCH (a
                    // row id that is not an integer).
                    Some(19 | 20) => Ok((id, Some(format!("SQLite {}", code.unwrap_or_default())))),
                    _ => Err(fail(class::INSERT_OTHER, e.to_string())),
                };
            }
        }
        if row.seq == Seq::Next {
            sqlx::query("UPDATE courier_entity SET next_seq = max(next_seq, ?2 + 1) WHERE id = ?1")
                .bind(numbered_by)
                .bind(seq)
                .execute(&mut *conn)
                .await
                .unwrap();
        }
        Ok((id, None))
    }
}
