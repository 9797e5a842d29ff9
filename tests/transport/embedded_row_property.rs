//! The property of `pg_row_property` (issue 30, "Make the class impossible") on the
//! embedded broker's file: no row another program writes into `courier_message` (while no
//! broker has the file open, as docs/embedded-broker.md says) stops the broker, stops a
//! queue, breaks a send, hides the message behind it or sits where no receive looks.
//!
//! The table is `STRICT`, with `CHECK` constraints for what no Courier sender writes
//! (`migrations/sqlite/20261129000002_embedded_row_checks.sql`; docs/embedded-broker.md,
//! "Rows written by another program"). The generator writes every value of the columns'
//! own types (NULLs, the extremes of every integer, times in microseconds near the virtual
//! clock's now, near the 100-year horizon and at `i64::MIN`/`MAX`, every state 0-4 and
//! others, text that is not UTF-8, empty, 128/129-byte and 1-MiB texts and bodies,
//! properties of any JSON shape), and in a third of the cases values of other types too
//! (a real, a text or a blob where an integer belongs, a blob in a text column, a text as
//! the body, NULL in a NOT NULL column): those the table refuses, which is a legal
//! outcome, so the other two thirds keep most rows for the broker to handle. Row ids are
//! `entity << 40 | seq` and the entity's `next_seq` is raised past the row, as
//! `tests/endpoint/corpus.rs` writes them; a case may also break that (an id of another
//! entity, a sequence number the broker will hand out next, the last one there is).
//!
//! Each case opens the broker on one file (kept for the run), creates the entities (a
//! queue, a topic with a subscription, or a queue that requires sessions), closes it,
//! writes the row with SQL, opens the broker again, sends a valid message through it, and
//! receives (PeekLock, completing what it gets; `accept_session(Next)` on the session
//! queue), moves the virtual clock 15 s and receives again. The oracle is
//! `pg_row_property`'s: the row is refused by SQLite (a constraint), or received, or
//! dead-lettered with a reason and a description, or scheduled within 100 years, or
//! locked until at most the lock duration + 5 min (the broker's own lock), or deferred
//! and got by `receive_deferred`; the valid message is received exactly once; the broker
//! opens; no receive fails; nothing is lost. A row of an entity that does not exist is
//! not judged (no queue holds it), but must not stop anything either.
//!
//! ```text
//! cargo test -p courier-tests --test transport embedded_row_property    # 300 cases, ~12 s
//! COURIER_FUZZ_CASES=20000 cargo test -p courier-tests --test transport \
//!     embedded_row_property -- --nocapture                            # a long run, ~12 min
//! ```
//!
//! `COURIER_ROW_SEED` and `COURIER_ROW_SURVEY` work as in `pg_row_property`. Each class it
//! found on the tree of 2026-11-28 has a regression test in `embedded_odd_rows.rs` (or,
//! for a file written before the table's rules, `framework/src/embedded/engine/opening.rs`).

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use courier::{
    Clock, Embedded, EntityPath, Envelope, QueueOptions, SenderOptions, TopicOptions, Transport, VirtualClock,
};
use proptest::prelude::*;
use sqlx::sqlite::{Sqlite, SqliteConnectOptions, SqliteConnection};
use sqlx::{ConnectOptions, Connection, Row as _};

use super::pg_row_property::{
    Failure, HORIZON_DAYS, Json, LOCK_GRACE_MS, MAX_TTL, Outcome, PAST_ONE_PERIOD, Seen, Shape, Target, abbreviate,
    cases, class, fail, offset, properties, round, run, runtime, shape, take_deferred, target, text_value,
};

/// Row ids are `entity << SEQ_BITS | seq` (the engine's `rows.rs`).
const SEQ_BITS: u32 = 40;
/// An entity id no entity has.
const MISSING_ENTITY: i64 = 4_000_000;

/// A value of any SQLite type.
#[derive(Clone, PartialEq)]
enum Cell {
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
enum Time {
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
enum Id {
    /// `entity << 40 | seq`.
    OfItsEntity,
    Value(i64),
}

/// The sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seq {
    /// The entity's `next_seq`, raised past it.
    Next,
    /// The entity's `next_seq`, left as it is (the broker hands it out again).
    NextNotRaised,
    Value(i64),
}

#[derive(Debug, Clone, PartialEq)]
enum Session {
    Cell(Cell),
    SameAsTheValidMessage,
}

#[derive(Debug, Clone)]
struct Row {
    shape: Shape,
    max_delivery_count: u32,
    default_ttl: Option<Duration>,
    target: Target,
    id: Id,
    seq: Seq,
    state: Cell,
    delivery_count: Cell,
    locked_until: Time,
    session_id: Session,
    enqueued_at: Time,
    scheduled_at: Time,
    expires_at: Time,
    ttl_ms: Cell,
    message_id: Cell,
    correlation_id: Cell,
    causation_id: Cell,
    message_type: Cell,
    content_type: Cell,
    reply_to: Cell,
    properties: Cell,
    dl_reason: Cell,
    dl_description: Cell,
    dl_source: Cell,
    body: Cell,
}

// ---------------------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------------------

/// A value of another type than the column's.
fn odd_type() -> impl Strategy<Value = Cell> {
    prop_oneof![
        prop::sample::select(vec![1.5_f64, -0.5, 1e300, -1e300, 0.0]).prop_map(Cell::Real),
        prop::sample::select(vec!["0", "1", "abc", "", "9223372036854775808"]).prop_map(|s| Cell::Text(s.into())),
        prop::collection::vec(any::<u8>(), 0..9).prop_map(Cell::Blob),
    ]
}

/// A NOT NULL integer column: `good`; with `refused`, sometimes NULL or another type.
fn int(good: impl Strategy<Value = i64> + 'static, refused: bool) -> BoxedStrategy<Cell> {
    if refused {
        prop_oneof![24 => good.prop_map(Cell::Int), 1 => Just(Cell::Null), 1 => odd_type()].boxed()
    } else {
        good.prop_map(Cell::Int).boxed()
    }
}

fn i64_edge() -> impl Strategy<Value = i64> {
    prop::sample::select(vec![
        0,
        -1,
        1,
        i64::MIN,
        i64::MAX,
        i64::from(i32::MAX),
        i64::from(u32::MAX),
        (1 << SEQ_BITS) - 1,
        1 << SEQ_BITS,
    ])
}

fn state(refused: bool) -> BoxedStrategy<Cell> {
    int(
        prop_oneof![
            8 => Just(0_i64),
            30 => 1_i64..=4,
            1 => prop::sample::select(vec![-1_i64, 5, i64::MAX]),
        ],
        refused,
    )
}

fn delivery_count(refused: bool) -> BoxedStrategy<Cell> {
    int(
        prop_oneof![8 => Just(0_i64), 12 => 1_i64..=12, 4 => i64_edge(), 1 => any::<i64>()],
        refused,
    )
}

fn ttl_ms(refused: bool) -> BoxedStrategy<Cell> {
    let admitted = prop_oneof![
        8 => Just(Cell::Null),
        4 => (1_i64..=3_600_000).prop_map(Cell::Int),
        2 => prop::sample::select(vec![
            i64::MIN,
            -1,
            0,
            1,
            3_162_240_000_000,
            3_162_240_000_001,
            10_000_000_000_000_000,
            i64::MAX,
        ])
        .prop_map(Cell::Int),
        1 => any::<i64>().prop_map(Cell::Int),
    ];
    if refused {
        prop_oneof![16 => admitted, 1 => odd_type()].boxed()
    } else {
        admitted.boxed()
    }
}

/// A time column: NULL (weight `null_weight`, 0 for none), times, and with `refused`
/// a value of another type.
fn time(null_weight: u32, refused: bool) -> BoxedStrategy<Time> {
    let times = prop_oneof![
        10 => offset().prop_map(Time::Now),
        1 => (-1_000_i64..=1_000).prop_map(Time::Horizon),
        2 => prop::sample::select(vec![i64::MIN, i64::MAX, 0, -1, i64::MAX / 2]).prop_map(Time::Micros),
    ];
    match (null_weight, refused) {
        (0, false) => times.boxed(),
        (0, true) => prop_oneof![13 => times, 1 => odd_type().prop_map(Time::Odd)].boxed(),
        (n, false) => prop_oneof![n => Just(Time::Null), 13 => times].boxed(),
        (n, true) => prop_oneof![
            n => Just(Time::Null),
            13 => times,
            1 => odd_type().prop_map(Time::Odd),
        ]
        .boxed(),
    }
}

/// A text column: a text, NULL (`nullable`), bytes that are not UTF-8 (as text), or an
/// integer (kept as its text); with `refused`, bytes as a blob, and NULL in a NOT NULL
/// column.
fn text(nullable: bool, refused: bool) -> BoxedStrategy<Cell> {
    let not_utf8 = || prop::sample::select(vec![vec![0xff_u8, 0xfe], b"corr-\xff".to_vec(), vec![0xc3]]);
    let admitted = prop_oneof![
        30 => text_value().prop_map(Cell::Text),
        2 => not_utf8().prop_map(Cell::NotUtf8),
        1 => any::<i64>().prop_map(Cell::Int),
    ];
    let value = if refused {
        prop_oneof![33 => admitted, 2 => not_utf8().prop_map(Cell::Blob)].boxed()
    } else {
        admitted.boxed()
    };
    match (nullable, refused) {
        (true, _) => prop_oneof![3 => Just(Cell::Null), 10 => value].boxed(),
        (false, true) => prop_oneof![40 => value, 1 => Just(Cell::Null)].boxed(),
        (false, false) => value,
    }
}

fn session(refused: bool) -> impl Strategy<Value = Session> {
    prop_oneof![3 => text(true, refused).prop_map(Session::Cell), 1 => Just(Session::SameAsTheValidMessage)]
}

fn props(refused: bool) -> BoxedStrategy<Cell> {
    let admitted = prop_oneof![
        10 => properties().prop_map(|Json(v)| v.map_or(Cell::Null, |v| Cell::Text(v.to_string()))),
        1 => Just(Cell::NotUtf8(b"{\"a\":\"\xff\"}".to_vec())),
        1 => Just(Cell::Text("{\"a\":".into())),
        1 => Just(Cell::Int(7)),
    ];
    if refused {
        prop_oneof![13 => admitted, 1 => Just(Cell::Blob(b"{\"a\":\"\xff\"}".to_vec()))].boxed()
    } else {
        admitted.boxed()
    }
}

fn body(refused: bool) -> BoxedStrategy<Cell> {
    let admitted = prop_oneof![
        10 => Just(Cell::Blob(b"{}".to_vec())),
        4 => prop::collection::vec(any::<u8>(), 0..32).prop_map(Cell::Blob),
        2 => Just(Cell::Blob(Vec::new())),
        1 => Just(Cell::Blob(vec![b'b'; 1 << 20])),
        1 => Just(Cell::Blob(vec![b'b'; (1 << 20) + 1])),
    ];
    if refused {
        prop_oneof![
            18 => admitted,
            1 => Just(Cell::Text("{}".into())),
            1 => prop_oneof![4 => Just(Cell::Int(0)), 1 => Just(Cell::Null)],
        ]
        .boxed()
    } else {
        admitted.boxed()
    }
}

/// A row: in a third of the cases any column may hold a value of a type the table refuses
/// (a real, a text or a blob where an integer belongs, a blob in a text column, text as the
/// body, NULL in a NOT NULL column); in the others every value has its column's type, so
/// that most rows get past the table's types to its CHECK constraints and the broker.
fn row() -> impl Strategy<Value = Row> {
    prop_oneof![1 => row_of(true), 2 => row_of(false)]
}

fn row_of(refused: bool) -> impl Strategy<Value = Row> {
    let entities = (
        shape(),
        prop::sample::select(vec![10_u32, 1, 3]),
        prop_oneof![4 => Just(None), 1 => Just(Some(Duration::from_secs(3600))), 1 => Just(Some(MAX_TTL))],
        target(),
        prop_oneof![12 => Just(Id::OfItsEntity), 1 => any::<i64>().prop_map(Id::Value)],
        prop_oneof![
            12 => Just(Seq::Next),
            1 => Just(Seq::NextNotRaised),
            1 => i64_edge().prop_map(Seq::Value),
        ],
    );
    let numbers = (state(refused), delivery_count(refused), ttl_ms(refused));
    let times = (
        time(12, refused),
        prop_oneof![6 => Just(Time::Now(0)), 4 => time(u32::from(refused), refused)],
        time(4, refused),
        time(4, refused),
    );
    let texts = (
        session(refused),
        text(false, refused),
        text(true, refused),
        text(true, refused),
        text(true, refused),
        text(true, refused),
        text(true, refused),
    );
    let rest = (
        props(refused),
        text(true, refused),
        text(true, refused),
        text(true, refused),
        body(refused),
    );
    (entities, numbers, times, texts, rest).prop_map(
        |(
            (shape, max_delivery_count, default_ttl, target, id, seq),
            (state, delivery_count, ttl_ms),
            (locked_until, enqueued_at, scheduled_at, expires_at),
            (session_id, message_id, correlation_id, causation_id, message_type, content_type, reply_to),
            (properties, dl_reason, dl_description, dl_source, body),
        )| Row {
            shape,
            max_delivery_count,
            default_ttl,
            target: if target == Target::Topic && shape != Shape::Topic {
                Target::Receiving
            } else {
                target
            },
            id,
            seq,
            state,
            delivery_count,
            locked_until,
            session_id,
            enqueued_at,
            scheduled_at,
            expires_at,
            ttl_ms,
            message_id,
            correlation_id,
            causation_id,
            message_type,
            content_type,
            reply_to,
            properties,
            dl_reason,
            dl_description,
            dl_source,
            body,
        },
    )
}

// ---------------------------------------------------------------------------------------
// The cases
// ---------------------------------------------------------------------------------------

/// The class of a broker that does not open on the file.
const OPEN_FAILED: &str = "the broker does not open the file";

struct Env {
    _dir: tempfile::TempDir,
    file: PathBuf,
    clock: VirtualClock,
    next: AtomicU64,
    tally: Mutex<BTreeMap<String, u64>>,
}

struct Case {
    ids: Vec<i64>,
    receiving: i64,
    topic: Option<i64>,
    send_to: String,
    path: EntityPath,
    valid_id: String,
    valid_session: String,
    lock_ms: i64,
}

/// A row of the case as the oracle reads it after the receives.
struct Found {
    entity_id: i64,
    /// `None` when the state is not an integer.
    state: Option<i64>,
    delivery_count: Option<i64>,
    seq: Option<i64>,
    session_id: Option<String>,
    is_valid: bool,
    dl_ok: bool,
    schedule_ok: bool,
    locked: bool,
    lock_in_bounds: bool,
    shown: String,
}

/// Every row of the case's entities (and the odd row, wherever it is), with what the
/// oracle asks of it computed in SQL: `?1` the entities as a JSON array, `?2` now, `?3`
/// the horizon, `?4` the lock duration + 5 min, `?5` the valid message's id, `?6` the odd
/// row's id.
const INSPECT: &str = "SELECT entity_id, \
       CASE WHEN typeof(state) = 'integer' THEN state END AS state, \
       CASE WHEN typeof(delivery_count) = 'integer' THEN delivery_count END AS delivery_count, \
       CASE WHEN typeof(seq) = 'integer' THEN seq END AS seq, \
       CAST(CASE WHEN typeof(session_id) = 'text' THEN session_id END AS BLOB) AS session_id, \
       coalesce(typeof(message_id) = 'text' AND message_id = ?5, 0) AS is_valid, \
       coalesce(dl_reason, '') <> '' AND coalesce(dl_description, '') <> '' AS dl_ok, \
       coalesce(typeof(scheduled_at) = 'integer' AND scheduled_at > ?2 AND scheduled_at <= ?3, 0) AS schedule_ok, \
       coalesce(locked_until > ?2, 0) AS locked, \
       coalesce(typeof(locked_until) = 'integer' AND locked_until <= ?2 + ?4, 0) AS lock_in_bounds, \
       CAST(printf('row %d of entity %s: state %s (%s), delivery_count %s (%s), seq %s, locked_until %s, \
scheduled_at %s (%s), expires_at %s, ttl_ms %s, enqueued_at %s, message_id %s (%s), session_id %s, dl_reason %s, \
dl_description %s', id, entity_id, quote(state), typeof(state), quote(delivery_count), typeof(delivery_count), \
         quote(seq), quote(locked_until), quote(scheduled_at), typeof(scheduled_at), quote(expires_at), \
         quote(ttl_ms), quote(enqueued_at), quote(substr(message_id, 1, 24)), typeof(message_id), \
         quote(substr(session_id, 1, 24)), quote(dl_reason), quote(substr(dl_description, 1, 160))) AS BLOB) AS shown \
     FROM courier_message WHERE entity_id IN (SELECT value FROM json_each(?1)) OR id = ?6 ORDER BY id";

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
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("broker.db");
        Self {
            _dir: dir,
            file,
            clock: VirtualClock::starting_now(),
            next: AtomicU64::new(1),
            tally: Mutex::new(BTreeMap::new()),
        }
    }

    fn count(&self, what: impl Into<String>) {
        *self.tally.lock().unwrap().entry(what.into()).or_default() += 1;
    }

    async fn open(&self) -> courier::Result<Embedded> {
        let clock: Arc<dyn Clock> = Arc::new(self.clock.clone());
        Embedded::builder().path(&self.file).clock(clock).open().await
    }

    /// A connection to the file, as another program has it (no broker open).
    async fn sql(&self) -> SqliteConnection {
        SqliteConnectOptions::new()
            .filename(&self.file)
            .busy_timeout(Duration::from_secs(5))
            .connect()
            .await
            .unwrap()
    }

    async fn entities(&self, broker: &Embedded, row: &Row) -> Case {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let name = format!("rowprop-{n}");
        let mut options = QueueOptions::default().max_delivery_count(row.max_delivery_count);
        if let Some(ttl) = row.default_ttl {
            options = options.default_time_to_live(ttl);
        }
        let path = match row.shape {
            Shape::Queue => {
                broker.create_queue(&name, &options).await.unwrap();
                EntityPath::queue(&name)
            }
            Shape::Sessions => {
                broker
                    .create_queue(&name, &options.clone().requires_session(true))
                    .await
                    .unwrap();
                EntityPath::queue(&name)
            }
            Shape::Topic => {
                broker.create_topic(&name, &TopicOptions::default()).await.unwrap();
                broker.create_subscription(&name, "sub", &options).await.unwrap();
                EntityPath::subscription(&name, "sub")
            }
        };
        let rows: Vec<(i64, i64)> = sqlx::query_as(
            "SELECT id, kind FROM courier_entity WHERE (parent = 0 AND name = ?1) \
             OR parent IN (SELECT id FROM courier_entity WHERE parent = 0 AND name = ?1 AND kind = 1)",
        )
        .bind(&name)
        .fetch_all(broker.read_pool())
        .await
        .unwrap();
        let receiving = rows.iter().find(|(_, k)| *k != 1).map(|(id, _)| *id).unwrap();
        let topic = rows.iter().find(|(_, k)| *k == 1).map(|(id, _)| *id);
        Case {
            ids: rows.iter().map(|(id, _)| *id).collect(),
            receiving,
            topic,
            send_to: name,
            path,
            valid_id: format!("valid-{n}"),
            valid_session: format!("s-valid-{n}"),
            lock_ms: i64::try_from(options.lock_duration.as_millis()).unwrap(),
        }
    }

    /// Writes the odd row: `Ok((id, None))` written, `Ok((id, Some(code)))` refused by
    /// SQLite with a constraint (or a type mismatch of the row id).
    async fn write(
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

    async fn inspect(&self, case: &Case, odd_id: i64) -> Vec<Found> {
        let now = self.clock.now();
        let mut conn = self.sql().await;
        let rows = sqlx::query(INSPECT)
            .bind(serde_json::to_string(&case.ids).unwrap())
            .bind(now.timestamp_micros())
            .bind((now + chrono::Duration::days(HORIZON_DAYS)).timestamp_micros())
            .bind((case.lock_ms + LOCK_GRACE_MS) * 1000)
            .bind(&case.valid_id)
            .bind(odd_id)
            .fetch_all(&mut conn)
            .await
            .unwrap();
        conn.close().await.unwrap();
        rows.iter()
            .map(|r| Found {
                entity_id: r.get("entity_id"),
                state: r.get("state"),
                delivery_count: r.get("delivery_count"),
                seq: r.get("seq"),
                session_id: r
                    .get::<Option<Vec<u8>>, _>("session_id")
                    .map(|b| String::from_utf8_lossy(&b).into_owned()),
                is_valid: r.get("is_valid"),
                dl_ok: r.get("dl_ok"),
                schedule_ok: r.get("schedule_ok"),
                locked: r.get("locked"),
                lock_in_bounds: r.get("lock_in_bounds"),
                shown: String::from_utf8_lossy(&r.get::<Vec<u8>, _>("shown")).into_owned(),
            })
            .collect()
    }

    /// Removes the case's rows and entities (no broker open), so that nothing of one case
    /// reaches the next.
    async fn clean(&self, case: &Case, odd_id: Option<i64>) {
        let mut conn = self.sql().await;
        let ids = serde_json::to_string(&case.ids).unwrap();
        for sql in [
            "DELETE FROM courier_message WHERE entity_id IN (SELECT value FROM json_each(?1)) OR id = ?2",
            "DELETE FROM courier_session WHERE entity_id IN (SELECT value FROM json_each(?1))",
            "DELETE FROM courier_entity WHERE id IN (SELECT value FROM json_each(?1))",
        ] {
            sqlx::query(sql)
                .bind(&ids)
                .bind(odd_id)
                .execute(&mut conn)
                .await
                .unwrap();
        }
        conn.close().await.unwrap();
    }

    async fn case(&self, row: &Row) -> Result<Outcome, Vec<Failure>> {
        let broker = self
            .open()
            .await
            .map_err(|e| vec![fail(OPEN_FAILED, format!("before the row was written: {e}"))])?;
        let case = self.entities(&broker, row).await;
        broker.close().await;
        let mut conn = self.sql().await;
        let written = self.write(&mut conn, row, &case).await;
        conn.close().await.unwrap();
        let (odd_id, refused) = match written {
            Ok(w) => w,
            Err(f) => {
                self.clean(&case, None).await;
                return Err(vec![f]);
            }
        };
        let result = match self.open().await {
            Ok(broker) => {
                let result = self.case_on(&broker, row, &case, odd_id, refused).await;
                broker.close().await;
                result
            }
            Err(e) => Err(vec![fail(OPEN_FAILED, e.to_string())]),
        };
        self.clean(&case, Some(odd_id)).await;
        result
    }

    async fn case_on(
        &self,
        broker: &Embedded,
        row: &Row,
        case: &Case,
        odd_id: i64,
        refused: Option<String>,
    ) -> Result<Outcome, Vec<Failure>> {
        let mut valid = Envelope::new("{}")
            .with_message_id(case.valid_id.clone())
            .with_message_type("rowprop.Valid")
            .with_content_type("application/json");
        if row.shape == Shape::Sessions {
            valid = valid.with_session_id(case.valid_session.clone());
        }
        let sender = broker.sender(&case.send_to, SenderOptions::default()).await.unwrap();
        let mut failures = Vec::new();
        if let Err(e) = sender.send(valid).await {
            failures.push(fail(class::SEND_FAILED, e.to_string()));
        }
        let receiver = broker.receiver(&case.path).await.unwrap();
        let mut seen = Seen::default();
        round(broker, row.shape, &case.path, &receiver, &case.valid_id, &mut seen).await;
        self.clock.advance(PAST_ONE_PERIOD);
        round(broker, row.shape, &case.path, &receiver, &case.valid_id, &mut seen).await;
        failures.append(&mut seen.failures);
        match seen.valid {
            1 => {}
            0 => failures.push(fail(class::VALID_MISSING, case.valid_id.clone())),
            n => failures.push(fail(class::VALID_TWICE, format!("{n} times"))),
        }
        let left = self.inspect(case, odd_id).await;
        let mut ends = Vec::new();
        let judged = refused.is_none() && row.target != Target::Missing;
        for f in left.iter().filter(|f| !f.is_valid) {
            if !case.ids.contains(&f.entity_id) {
                // Not on any entity of the case: no queue holds it (a row of an entity
                // that does not exist, kept as written).
                ends.push("on no entity");
                continue;
            }
            let locked_end = || {
                if f.lock_in_bounds {
                    None
                } else {
                    Some(fail(class::LOCK_TOO_LONG, f.shown.clone()))
                }
            };
            let (end, failure) = match f.state {
                Some(3) => (
                    "dead-lettered",
                    (!f.dl_ok).then(|| fail(class::DEAD_NO_REASON, f.shown.clone())),
                ),
                Some(1) => (
                    "scheduled",
                    (!f.schedule_ok).then(|| fail(class::BAD_SCHEDULE, f.shown.clone())),
                ),
                _ if f.locked => ("locked by the broker", locked_end()),
                Some(2) if f.delivery_count.unwrap_or(0) < 1 => {
                    ("deferred", Some(fail(class::DEFERRED_ZERO, f.shown.clone())))
                }
                Some(2) => {
                    let got = match (f.entity_id == case.receiving, f.seq) {
                        (true, Some(seq)) => {
                            take_deferred(broker, row.shape, &case.path, &receiver, f.session_id.as_deref(), seq).await
                        }
                        _ => Err("it is not on an entity a receiver reads".to_owned()),
                    };
                    (
                        "deferred, received by sequence number",
                        got.err()
                            .map(|e| fail(class::DEFERRED_UNREACHABLE, format!("{}: {e}", f.shown))),
                    )
                }
                _ => ("active", Some(fail(class::STUCK_ACTIVE, f.shown.clone()))),
            };
            ends.push(end);
            failures.extend(failure);
        }
        if judged && seen.odd.is_empty() && ends.is_empty() {
            failures.push(fail(class::LOST, "no row is left, and no receive got it"));
        }
        if failures.is_empty() {
            Ok(Outcome {
                refused,
                received: seen.odd.len(),
                ends,
            })
        } else {
            for f in &mut failures {
                f.detail = format!("{}\n      received: {:?}", f.detail, seen.odd);
            }
            Err(failures)
        }
    }
}

/// The property on the embedded broker's file (see the module's doc).
#[test]
fn any_row_written_into_the_file_is_refused_received_dead_lettered_or_explained_and_the_valid_message_is_received_once()
{
    let rt = runtime();
    let env = Env::new();
    let started = std::time::Instant::now();
    let result = run("embedded_row_property", cases(300), row(), |row| {
        let outcome = rt.block_on(env.case(row))?;
        match &outcome.refused {
            Some(code) => env.count(format!("refused ({code})")),
            None if outcome.received > 0 => env.count("received"),
            None => {}
        }
        for end in &outcome.ends {
            env.count(*end);
        }
        Ok(())
    });
    eprintln!(
        "embedded_row_property: {:.1} s; outcomes: {:?}",
        started.elapsed().as_secs_f64(),
        env.tally.lock().unwrap()
    );
    if let Err(report) = result {
        panic!("{report}");
    }
}
