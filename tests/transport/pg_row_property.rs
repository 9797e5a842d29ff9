//! Property tests over the whole row of `courier.message` on the real Postgres (issue 30,
//! "Make the class impossible"): no row a producer that is not Courier can insert stops a
//! queue, hides the messages behind it, sits somewhere no receive looks, or makes a
//! message skip its retry policy.
//!
//! Each case makes fresh entities (a queue, a topic with a subscription, or a queue that
//! requires sessions), inserts ONE generated row into `courier.message` as another program
//! would (any value the schema admits in every column: NULLs, the extremes of every
//! integer, `infinity`, `-infinity`, 4713 BC and 294276 AD, times near the virtual clock's
//! now and near the 100-year horizon, every state, dead, random and live lock holders,
//! empty, 128/129-byte and 1-MiB texts and bodies, properties of any JSON shape, the
//! entity id of the queue, its topic, its subscription or of nothing), then sends a valid
//! message through Courier behind it. A PeekLock receiver (for the session queue:
//! `accept_session(Next)`) takes and completes what it gets; the virtual clock moves 15 s
//! (past one 10-s maintenance period) and it receives again. The oracle:
//!
//! * the INSERT fails with a constraint violation (SQLSTATE class 23; or 54000, a session
//!   id too large for its index: refused), or succeeds;
//! * the valid message is received exactly once, and no receive returns an error;
//! * the odd row, if inserted, was received (and completed), or is dead-lettered (state 3
//!   with a reason and a description), or is in a state Courier explains: scheduled for a
//!   time after now and at most 100 years ahead; deferred (delivery count >= 1) and got by
//!   `receive_deferred` with its sequence number; locked by a live holder until at most
//!   the lock duration + 5 min from now. Anything else (active and unlocked but never
//!   taken, locked for ever, by a gone holder, deferred where no receiver finds it, gone
//!   without being received) fails the case, printed with the row.
//!
//! The second property runs an `Endpoint` (with `transport.store()`) on such a row whose
//! body is a valid message of its handler's type, the handler failing the first K times:
//! the odd message goes through the retry policy (one immediate retry, one delayed retry
//! after 5 s, then the dead-letter queue with `RetriesExhausted`): never more attempts than
//! the policy allows, never a delivery count of 0 seen by the handler, no delayed retry
//! skipped, not dead-lettered while a retry is due (but by the broker: expired, or at its
//! max delivery count), and the valid message beside it is handled once.
//!
//! Each test makes a database of its own (`TestDatabase`) and reuses it, one transport and
//! one virtual clock for all its cases, with new entities per case.
//!
//! Commands (`DATABASE_URL` or a Docker engine for the server):
//!
//! ```text
//! cargo test -p courier-tests --test transport pg_row_property    # 300 + 20 cases, ~10 s
//! COURIER_FUZZ_CASES=20000 cargo test -p courier-tests --test transport \
//!     pg_row_property -- --nocapture                                  # a long run, ~10 min
//! COURIER_ROW_SEED=123 ...        # replays the cases of a seed (each run prints its seed)
//! COURIER_ROW_SURVEY=1 ...        # runs every case and lists the failures by class, with
//!                                 # the shortest row of each, instead of stopping (and
//!                                 # shrinking) at the first
//! ```
//!
//! `COURIER_FUZZ_CASES` sets the number of cases of the first property; the endpoint
//! property runs a fifteenth of it (at least 20).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use courier::recoverability::RetryPolicy;
use courier::{
    Clock, Context, Endpoint, EntityPath, Envelope, ErrorKind, HandlerError, PostgresTransport, QueueOptions, Receiver,
    SenderOptions, SessionSelector, TopicOptions, Transport, VirtualClock,
};
use courier_tests::pg::TestDatabase;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestError, TestRunner};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use sqlx::Row as _;
use sqlx::postgres::PgRow;

/// How far the clock moves between the two receives: past one maintenance period (10 s).
pub(super) const PAST_ONE_PERIOD: Duration = Duration::from_secs(15);
/// The farthest a scheduled message may be due (`100 * 366` days, as `Sender::schedule`).
pub(super) const HORIZON_DAYS: i64 = 100 * 366;
/// How long past the lock duration a live holder's lock may still end.
pub(super) const LOCK_GRACE_MS: i64 = 5 * 60 * 1000;
/// The longest time-to-live a queue may have (100 years).
pub(super) const MAX_TTL: Duration = Duration::from_secs(100 * 366 * 24 * 3600);

// ---------------------------------------------------------------------------------------
// What a case is made of
// ---------------------------------------------------------------------------------------

/// The entities of a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shape {
    /// A queue.
    Queue,
    /// A topic with one subscription (the receiver reads the subscription).
    Topic,
    /// A queue that requires sessions.
    Sessions,
}

/// Which entity the row names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Target {
    /// The entity the receiver reads (the queue or the subscription).
    Receiving,
    /// The topic (only in `Shape::Topic`).
    Topic,
    /// An id no entity has.
    Missing,
}

/// A time column's value, rendered against the clock's now when the case runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Time {
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
enum Holder {
    Null,
    /// The key of a transport that lives (this test's), read when the case runs.
    Alive,
    Key(i64),
}

/// A text column's value; shown abbreviated.
#[derive(Clone, PartialEq, Eq)]
struct Text(Option<String>);

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
enum Session {
    Text(Text),
    SameAsTheValidMessage,
}

/// The body (`bytea`); shown abbreviated.
#[derive(Clone, PartialEq, Eq)]
struct Body(Option<Vec<u8>>);

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
pub(super) struct Json(pub(super) Option<serde_json::Value>);

impl fmt::Debug for Json {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            None => f.write_str("NULL"),
            Some(v) => f.write_str(&abbreviate(&v.to_string())),
        }
    }
}

pub(super) fn abbreviate(s: &str) -> String {
    if s.len() <= 48 {
        return format!("{s:?}");
    }
    let head: String = s.chars().take(16).collect();
    format!("<{} bytes: {head:?}...>", s.len())
}

/// One generated case: the entities' settings and every column of the odd row.
#[derive(Debug, Clone)]
struct Row {
    shape: Shape,
    max_delivery_count: u32,
    default_ttl: Option<Duration>,
    target: Target,
    /// `None`: `nextval('courier.message_seq')`.
    seq: Option<i64>,
    state: Option<i16>,
    delivery_count: Option<i32>,
    locked_until: Time,
    holder: Holder,
    session_id: Session,
    enqueued_at: Time,
    scheduled_at: Time,
    expires_at: Time,
    ttl_ms: Option<i64>,
    message_id: Text,
    correlation_id: Text,
    causation_id: Text,
    message_type: Text,
    content_type: Text,
    reply_to: Text,
    properties: Json,
    dl_reason: Text,
    dl_description: Text,
    dl_source: Text,
    body: Body,
}

// ---------------------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------------------

pub(super) fn shape() -> impl Strategy<Value = Shape> {
    prop_oneof![5 => Just(Shape::Queue), 3 => Just(Shape::Topic), 3 => Just(Shape::Sessions)]
}

pub(super) fn target() -> impl Strategy<Value = Target> {
    prop_oneof![16 => Just(Target::Receiving), 6 => Just(Target::Topic), 1 => Just(Target::Missing)]
}

/// Milliseconds from now: at it, around it, around a lock duration + 5 min, and up to
/// 100 years either way.
pub(super) fn offset() -> impl Strategy<Value = i64> {
    let years = HORIZON_DAYS * 24 * 3600 * 1000;
    prop_oneof![
        Just(0_i64),
        -2_000_i64..=2_000,
        -120_000_i64..=120_000,
        -400_000_i64..=400_000,
        -years..=years,
    ]
}

fn time(null_weight: u32) -> impl Strategy<Value = Time> {
    prop_oneof![
        null_weight => Just(Time::Null),
        8 => offset().prop_map(Time::Now),
        1 => (-1_000_i64..=1_000).prop_map(Time::Horizon),
        1 => Just(Time::Infinity),
        1 => Just(Time::MinusInfinity),
        1 => Just(Time::FarPast),
        1 => Just(Time::FarFuture),
        1 => Just(Time::BeyondChrono),
        1 => Just(Time::Epoch),
    ]
}

fn i64_edge() -> impl Strategy<Value = i64> {
    prop_oneof![
        Just(0_i64),
        Just(-1),
        Just(1),
        Just(i64::MIN),
        Just(i64::MAX),
        any::<i64>()
    ]
}

fn holder() -> impl Strategy<Value = Holder> {
    prop_oneof![2 => Just(Holder::Null), 3 => Just(Holder::Alive), 3 => i64_edge().prop_map(Holder::Key)]
}

fn state() -> impl Strategy<Value = Option<i16>> {
    prop_oneof![
        8 => Just(Some(0_i16)),
        24 => (1_i16..=3).prop_map(Some),
        1 => Just(None),
        1 => prop::sample::select(vec![i16::MIN, -1, 4, i16::MAX]).prop_map(Some),
    ]
}

fn delivery_count() -> impl Strategy<Value = Option<i32>> {
    prop_oneof![
        8 => Just(Some(0_i32)),
        12 => (1_i32..=12).prop_map(Some),
        3 => prop::sample::select(vec![i32::MIN, -1, i32::MAX - 1, i32::MAX]).prop_map(Some),
        1 => any::<i32>().prop_map(Some),
        1 => Just(None),
    ]
}

fn ttl_ms() -> impl Strategy<Value = Option<i64>> {
    prop_oneof![
        8 => Just(None),
        4 => (1_i64..=3_600_000).prop_map(Some),
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
        .prop_map(Some),
        1 => any::<i64>().prop_map(Some),
    ]
}

fn seq() -> impl Strategy<Value = Option<i64>> {
    prop_oneof![6 => Just(None), 1 => i64_edge().prop_map(Some)]
}

/// A text: short, empty, any Unicode (Postgres text holds no NUL), terminal escapes,
/// around 128 bytes (one- and two-byte characters), 70 KB and 1 MiB.
pub(super) fn text_value() -> impl Strategy<Value = String> {
    prop_oneof![
        20 => "[a-z0-9.-]{1,12}",
        4 => Just(String::new()),
        6 => any::<String>().prop_map(|s| s.replace('\0', "")),
        2 => Just("\u{1b}[31mred\u{1b}[0m\r\nnext".to_owned()),
        4 => (120_usize..=132).prop_map(|n| "a".repeat(n)),
        2 => (62_usize..=66).prop_map(|n| "é".repeat(n)),
        1 => Just("x".repeat(70_000)),
        1 => Just("y".repeat(1 << 20)),
    ]
}

fn text(nullable: bool) -> BoxedStrategy<Text> {
    if nullable {
        prop_oneof![3 => Just(Text(None)), 10 => text_value().prop_map(|s| Text(Some(s)))].boxed()
    } else {
        prop_oneof![40 => text_value().prop_map(|s| Text(Some(s))), 1 => Just(Text(None))].boxed()
    }
}

fn session() -> impl Strategy<Value = Session> {
    prop_oneof![3 => text(true).prop_map(Session::Text), 1 => Just(Session::SameAsTheValidMessage)]
}

fn body() -> impl Strategy<Value = Body> {
    prop_oneof![
        10 => Just(Body(Some(b"{}".to_vec()))),
        4 => prop::collection::vec(any::<u8>(), 0..32).prop_map(|b| Body(Some(b))),
        2 => Just(Body(Some(Vec::new()))),
        1 => Just(Body(Some(vec![b'b'; 1 << 20]))),
        1 => Just(Body(Some(vec![b'b'; (1 << 20) + 1]))),
        1 => prop_oneof![9 => Just(Body(Some(b"[]".to_vec()))), 1 => Just(Body(None))],
    ]
}

/// Text with no NUL, which neither `text` nor `jsonb` holds.
fn no_nul(v: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::String(s) => Value::String(s.replace('\0', "")),
        Value::Array(a) => Value::Array(a.into_iter().map(no_nul).collect()),
        Value::Object(o) => Value::Object(o.into_iter().map(|(k, v)| (k.replace('\0', ""), no_nul(v))).collect()),
        other => other,
    }
}

/// Any JSON value, nested a few levels.
fn json() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<u64>().prop_map(serde_json::Value::from),
        any::<f64>().prop_map(serde_json::Value::from),
        "[ -~]{0,8}".prop_map(serde_json::Value::from),
        any::<String>().prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            prop::collection::btree_map("[a-z]{1,3}", inner, 0..4)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

fn scalar() -> impl Strategy<Value = serde_json::Value> {
    prop_oneof![
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        (-1e300_f64..1e300).prop_map(serde_json::Value::from),
        "[ -~]{0,8}".prop_map(serde_json::Value::from),
    ]
}

/// Properties: none, Courier's (an object of scalars), Courier's own header names with odd
/// values, and any JSON.
pub(super) fn properties() -> impl Strategy<Value = Json> {
    let reserved = (
        prop::sample::select(vec![
            "courier.retry.delayed",
            "courier.failure.attempts",
            "courier.message.version",
            "courier.saga.timeout_due",
            "traceparent",
        ]),
        prop::sample::select(vec![
            serde_json::json!(-1),
            serde_json::json!(0),
            serde_json::json!(1),
            serde_json::json!(i64::MAX),
            serde_json::json!(u64::MAX),
            serde_json::json!(1.5),
            serde_json::json!("x"),
            serde_json::json!(true),
            serde_json::json!(null),
        ]),
    )
        .prop_map(|(k, v)| serde_json::json!({ k: v }));
    prop_oneof![
        4 => Just(Json(None)),
        3 => prop::collection::btree_map("[a-z.]{1,8}", scalar(), 0..4)
            .prop_map(|m| Json(Some(serde_json::Value::Object(m.into_iter().collect())))),
        2 => reserved.prop_map(|v| Json(Some(v))),
        2 => json().prop_map(|v| Json(Some(no_nul(v)))),
    ]
}

fn row() -> impl Strategy<Value = Row> {
    let entities = (
        shape(),
        prop::sample::select(vec![10_u32, 1, 3]),
        prop_oneof![4 => Just(None), 1 => Just(Some(Duration::from_secs(3600))), 1 => Just(Some(MAX_TTL))],
        target(),
    );
    let numbers = (seq(), state(), delivery_count(), ttl_ms());
    let times = (
        time(14),
        holder(),
        prop_oneof![6 => Just(Time::Now(0)), 4 => time(1)],
        time(4),
        time(4),
    );
    let texts = (
        session(),
        text(false),
        text(true),
        text(true),
        text(true),
        text(true),
        text(true),
    );
    let rest = (properties(), text(true), text(true), text(true), body());
    (entities, numbers, times, texts, rest).prop_map(
        |(
            (shape, max_delivery_count, default_ttl, target),
            (seq, state, delivery_count, ttl_ms),
            (locked_until, holder, enqueued_at, scheduled_at, expires_at),
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
            seq,
            state,
            delivery_count,
            locked_until,
            holder,
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
// Failures
// ---------------------------------------------------------------------------------------

/// The classes of failure (the survey groups by them).
pub(super) mod class {
    pub(crate) const INSERT_OTHER: &str = "the INSERT failed without a constraint violation";
    pub(crate) const SEND_FAILED: &str = "the valid message could not be sent";
    pub(crate) const RECEIVE_FAILED: &str = "a receive returned an error";
    pub(crate) const COMPLETE_FAILED: &str = "completing a received message failed";
    pub(crate) const VALID_MISSING: &str = "the valid message was never received";
    pub(crate) const VALID_TWICE: &str = "the valid message was received more than once";
    pub(crate) const DEAD_NO_REASON: &str = "dead-lettered without a reason or description";
    pub(crate) const BAD_SCHEDULE: &str = "scheduled, but not for a time after now and within 100 years";
    pub(crate) const LOCK_GONE_HOLDER: &str = "locked by a holder that is gone";
    pub(crate) const LOCK_TOO_LONG: &str = "locked past the lock duration + 5 min";
    pub(crate) const DEFERRED_ZERO: &str = "deferred with delivery count 0";
    pub(crate) const DEFERRED_UNREACHABLE: &str =
        "deferred, but receive_deferred by its sequence number does not get it";
    pub(crate) const STUCK_ACTIVE: &str = "active and unlocked, but no receive takes it";
    pub(crate) const LOST: &str = "gone without being received";
    pub(crate) const SESSION_SPIN: &str = "accept_session(Next) offers a session whose receive gets nothing";
    pub(crate) const RETRIED_BEYOND: &str = "handled more times than the retry policy allows";
    pub(crate) const DELAY_SKIPPED: &str = "a delayed retry came back before its delay";
    pub(crate) const AFTER_EXHAUSTED: &str = "handled again after the retry policy was exhausted";
    pub(crate) const HANDLED_TWICE: &str = "handled again after a successful handling";
    pub(crate) const SEEN_COUNT_ZERO: &str = "a handler saw delivery count 0 (the retry policy counts from it)";
    pub(crate) const DEAD_BEFORE_POLICY: &str = "dead-lettered before the retry policy was used up";
}

#[derive(Debug, Clone)]
pub(super) struct Failure {
    pub(super) class: &'static str,
    pub(super) detail: String,
}

pub(super) fn fail(class: &'static str, detail: impl Into<String>) -> Failure {
    Failure {
        class,
        detail: detail.into(),
    }
}

/// A row of the case as the oracle reads it after the receives.
#[derive(Debug, Clone)]
struct Found {
    entity_id: i64,
    state: i16,
    delivery_count: i32,
    seq: i64,
    session_id: Option<String>,
    is_valid: bool,
    dl_reason: Option<String>,
    dl_ok: bool,
    schedule_ok: bool,
    locked: bool,
    lock_in_bounds: bool,
    holder_alive: bool,
    shown: String,
}

impl Found {
    fn read(r: &PgRow) -> Self {
        Self {
            entity_id: r.get("entity_id"),
            state: r.get("state"),
            delivery_count: r.get("delivery_count"),
            seq: r.get("seq"),
            session_id: r.get("session_id"),
            is_valid: r.get("is_valid"),
            dl_reason: r.get("dl_reason"),
            dl_ok: r.get("dl_ok"),
            schedule_ok: r.get("schedule_ok"),
            locked: r.get("locked"),
            lock_in_bounds: r.get("lock_in_bounds"),
            holder_alive: r.get("holder_alive"),
            shown: r.get("shown"),
        }
    }
}

/// Every row of the case's entities, with what the oracle asks of it computed in SQL (the
/// times may be ones chrono cannot hold). `$1` entities, `$2` now, `$3` the lock
/// duration + 5 min in ms, `$4` the valid message's id.
const INSPECT: &str = "SELECT m.id, m.entity_id, m.state, m.delivery_count, m.seq, m.session_id, \
       m.message_id = $4 AS is_valid, m.dl_reason, \
       m.dl_reason IS NOT NULL AND m.dl_description IS NOT NULL AS dl_ok, \
       coalesce(m.scheduled_at > $2 AND m.scheduled_at <= $2 + interval '36600 days', false) AS schedule_ok, \
       coalesce(m.locked_until > $2, false) AS locked, \
       coalesce(m.locked_until <= $2 + $3 * interval '1 millisecond', false) AS lock_in_bounds, \
       m.holder IS NOT NULL AND EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted \
         AND l.objsubid = 1 AND l.classid::bigint = m.holder >> 32 AND l.objid::bigint = m.holder & 2147483647) \
         AS holder_alive, \
       format('row %s of %s %s: state %s, delivery_count %s, seq %s, locked_until %s, holder %s, \
scheduled_at %s, expires_at %s, ttl_ms %s, enqueued_at %s, message_id %s (%s bytes), session_id %s, \
dl_reason %s, dl_description %s', m.id, \
         (SELECT CASE e.kind WHEN 0 THEN 'queue' WHEN 1 THEN 'topic' ELSE 'subscription' END \
          FROM courier.entity e WHERE e.id = m.entity_id), m.entity_id, m.state, m.delivery_count, m.seq, \
         coalesce(m.locked_until::text, 'NULL'), coalesce(m.holder::text, 'NULL'), \
         coalesce(m.scheduled_at::text, 'NULL'), coalesce(m.expires_at::text, 'NULL'), \
         coalesce(m.ttl_ms::text, 'NULL'), m.enqueued_at::text, quote_literal(left(m.message_id, 24)), \
         octet_length(m.message_id), coalesce(quote_literal(left(m.session_id, 24)), 'NULL'), \
         coalesce(quote_literal(m.dl_reason), 'NULL'), coalesce(quote_literal(left(m.dl_description, 160)), 'NULL')) \
         AS shown \
     FROM courier.message m WHERE m.entity_id = ANY($1) ORDER BY m.id";

/// The columns of the odd row, bound in order; the times are text cast by Postgres.
const INSERT: &str = "INSERT INTO courier.message (entity_id, seq, state, delivery_count, locked_until, holder, \
       session_id, enqueued_at, scheduled_at, expires_at, ttl_ms, message_id, correlation_id, causation_id, \
       message_type, content_type, reply_to, properties, dl_reason, dl_description, dl_source, body) \
     VALUES ($1, coalesce($2, nextval('courier.message_seq')), $3, $4, $5::timestamptz, $6, $7, \
       $8::timestamptz, $9::timestamptz, $10::timestamptz, $11, $12, $13, $14, $15, $16, $17, $18::jsonb, $19, \
       $20, $21, $22)";

/// What one case found, for the tally.
#[derive(Debug, Default)]
pub(super) struct Outcome {
    pub(super) refused: Option<String>,
    pub(super) received: usize,
    pub(super) ends: Vec<&'static str>,
}

// ---------------------------------------------------------------------------------------
// The environment shared by the cases: one database, one transport, one clock
// ---------------------------------------------------------------------------------------

/// One database of the test's own: the only live lock holder in it is this test's
/// transport (another test's, closed in the middle of a case, would make a lock the row
/// was given look forged).
struct Env {
    db: TestDatabase,
    clock: VirtualClock,
    transport: Arc<PostgresTransport>,
    pool: PgPool,
    next: AtomicU64,
    tally: Mutex<BTreeMap<String, u64>>,
}

/// The entities of one case.
struct Case {
    /// Every entity id of the case (queue, or topic and subscription).
    ids: Vec<i64>,
    receiving: i64,
    topic: Option<i64>,
    /// The queue or topic the valid message is sent to.
    send_to: String,
    path: EntityPath,
    valid_id: String,
    valid_session: String,
    lock_ms: i64,
}

/// What the receives saw.
#[derive(Default)]
pub(super) struct Seen {
    pub(super) valid: u32,
    pub(super) odd: Vec<String>,
    pub(super) failures: Vec<Failure>,
}

impl Seen {
    async fn took(&mut self, d: courier::Delivery, valid_id: &str) {
        let m = d.message();
        let is_valid = m.message_id() == valid_id;
        let shown = format!(
            "seq {} id {} delivery_count {}",
            m.sequence_number(),
            abbreviate(m.message_id()),
            m.delivery_count()
        );
        if is_valid {
            self.valid += 1;
        } else {
            self.odd.push(shown.clone());
        }
        if let Err(e) = d.complete().await {
            self.failures
                .push(fail(class::COMPLETE_FAILED, format!("{shown}: {e}")));
        }
    }
}

/// Receives (PeekLock, no waiting) and completes until a receive comes back empty.
pub(super) async fn drain<R: Receiver + ?Sized>(r: &R, valid_id: &str, seen: &mut Seen) -> usize {
    let mut taken = 0;
    for _ in 0..10 {
        match r.receive(100, Duration::ZERO).await {
            Ok(got) if got.is_empty() => break,
            Ok(got) => {
                for d in got {
                    taken += 1;
                    seen.took(d, valid_id).await;
                }
            }
            Err(e) => {
                seen.failures.push(fail(class::RECEIVE_FAILED, format!("receive: {e}")));
                break;
            }
        }
    }
    taken
}

/// One round of receives on `t`: the plain receiver, or every session
/// `accept_session(Next)` offers (`Shape::Sessions`).
pub(super) async fn round(
    t: &dyn Transport,
    shape: Shape,
    path: &EntityPath,
    receiver: &Arc<dyn Receiver>,
    valid_id: &str,
    seen: &mut Seen,
) {
    if shape != Shape::Sessions {
        drain(&**receiver, valid_id, seen).await;
        return;
    }
    let mut empty = 0;
    for _ in 0..12 {
        match t.accept_session(path, SessionSelector::Next, Duration::ZERO).await {
            Ok(s) => {
                let id = abbreviate(s.session_id());
                if drain(&*s, valid_id, seen).await == 0 {
                    empty += 1;
                }
                if let Err(e) = s.release().await {
                    seen.failures
                        .push(fail(class::RECEIVE_FAILED, format!("release of session {id}: {e}")));
                }
                if empty >= 3 {
                    seen.failures.push(fail(class::SESSION_SPIN, format!("session {id}")));
                    return;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::SessionNotAvailable { .. }) => return,
            Err(e) => {
                seen.failures
                    .push(fail(class::RECEIVE_FAILED, format!("accept_session: {e}")));
                return;
            }
        }
    }
}

/// Gets a deferred message by its sequence number (in its session, on a session queue)
/// and completes it.
pub(super) async fn take_deferred(
    t: &dyn Transport,
    shape: Shape,
    path: &EntityPath,
    receiver: &Arc<dyn Receiver>,
    session: Option<&str>,
    seq: i64,
) -> Result<(), String> {
    let got = match (session, shape) {
        (Some(s), Shape::Sessions) => {
            let session = t
                .accept_session(path, SessionSelector::Named(s.to_owned()), Duration::ZERO)
                .await
                .map_err(|e| format!("accept_session: {e}"))?;
            let got = match session.receive_deferred(&[seq]).await {
                Ok(got) => {
                    let mut n = 0;
                    for d in got {
                        d.complete().await.map_err(|e| format!("complete: {e}"))?;
                        n += 1;
                    }
                    Ok(n)
                }
                Err(e) => Err(format!("receive_deferred: {e}")),
            };
            let _ = session.release().await;
            got?
        }
        _ => {
            let got = receiver
                .receive_deferred(&[seq])
                .await
                .map_err(|e| format!("receive_deferred: {e}"))?;
            let n = got.len();
            for d in got {
                d.complete().await.map_err(|e| format!("complete: {e}"))?;
            }
            n
        }
    };
    if got == 1 {
        Ok(())
    } else {
        Err(format!("receive_deferred returned {got} messages"))
    }
}

impl Env {
    async fn open() -> Self {
        let db = TestDatabase::create().await;
        let clock = VirtualClock::starting_now();
        let shared: Arc<dyn Clock> = Arc::new(clock.clone());
        // `open` applies the migrations (the transport's and the store's).
        let transport = PostgresTransport::from_pool(db.pool().await)
            .clock(shared)
            .poll_interval(Duration::from_millis(50))
            .open()
            .await
            .unwrap();
        let pool = db.pool().await;
        Self {
            db,
            clock,
            transport: Arc::new(transport),
            pool,
            next: AtomicU64::new(1),
            tally: Mutex::new(BTreeMap::new()),
        }
    }

    fn count(&self, what: impl Into<String>) {
        *self.tally.lock().unwrap().entry(what.into()).or_default() += 1;
    }

    async fn close(self) {
        self.transport.close().await;
        self.pool.close().await;
        self.db.drop_now().await;
    }

    /// Creates the entities of `row.shape`.
    async fn entities(&self, row: &Row, prefix: &str) -> Case {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let name = format!("{prefix}-{n}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let mut options = QueueOptions::default().max_delivery_count(row.max_delivery_count);
        if let Some(ttl) = row.default_ttl {
            options = options.default_time_to_live(ttl);
        }
        let t = &self.transport;
        let path = match row.shape {
            Shape::Queue => {
                t.create_queue(&name, &options).await.unwrap();
                EntityPath::queue(&name)
            }
            Shape::Sessions => {
                t.create_queue(&name, &options.clone().requires_session(true))
                    .await
                    .unwrap();
                EntityPath::queue(&name)
            }
            Shape::Topic => {
                t.create_topic(&name, &TopicOptions::default()).await.unwrap();
                t.create_subscription(&name, "sub", &options).await.unwrap();
                EntityPath::subscription(&name, "sub")
            }
        };
        let rows: Vec<(i64, i16)> = sqlx::query_as(
            "SELECT id, kind FROM courier.entity WHERE (parent = 0 AND name = $1) \
             OR parent IN (SELECT id FROM courier.entity WHERE parent = 0 AND name = $1 AND kind = 1)",
        )
        .bind(&name)
        .fetch_all(&self.pool)
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
            valid_id: format!("valid-{n}-{}", uuid::Uuid::new_v4().simple()),
            valid_session: format!("s-valid-{n}"),
            lock_ms: i64::try_from(options.lock_duration.as_millis()).unwrap(),
        }
    }

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
    async fn insert(&self, row: &Row, case: &Case) -> Result<Option<String>, Failure> {
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

    async fn send_valid(&self, case: &Case, body: &str, message_type: &str, session: bool) -> Result<(), Failure> {
        let mut valid = Envelope::new(body.to_owned())
            .with_message_id(case.valid_id.clone())
            .with_message_type(message_type)
            .with_content_type("application/json");
        if session {
            valid = valid.with_session_id(case.valid_session.clone());
        }
        let sender = self
            .transport
            .sender(&case.send_to, SenderOptions::default())
            .await
            .map_err(|e| fail(class::SEND_FAILED, e.to_string()))?;
        sender
            .send(valid)
            .await
            .map_err(|e| fail(class::SEND_FAILED, e.to_string()))
    }

    async fn inspect(&self, case: &Case) -> Vec<Found> {
        let rows = sqlx::query(INSPECT)
            .bind(&case.ids)
            .bind(self.clock.now())
            .bind(case.lock_ms + LOCK_GRACE_MS)
            .bind(&case.valid_id)
            .fetch_all(&self.pool)
            .await
            .unwrap();
        rows.iter().map(Found::read).collect()
    }

    /// Judges the rows left after the receives: each must be dead-lettered with a reason,
    /// scheduled within the horizon, locked by a live holder within bounds, or deferred and
    /// reachable by its sequence number. Returns how each ended (for the tally).
    async fn judge(
        &self,
        row: &Row,
        case: &Case,
        receiver: &Arc<dyn Receiver>,
        left: &[Found],
        failures: &mut Vec<Failure>,
    ) -> Vec<&'static str> {
        let mut ends = Vec::new();
        for f in left.iter().filter(|f| !f.is_valid) {
            let end = if f.state == 3 {
                if !f.dl_ok {
                    failures.push(fail(class::DEAD_NO_REASON, f.shown.clone()));
                }
                "dead-lettered"
            } else if f.state == 1 {
                if !f.schedule_ok {
                    failures.push(fail(class::BAD_SCHEDULE, f.shown.clone()));
                }
                "scheduled"
            } else if f.locked {
                if !f.holder_alive {
                    failures.push(fail(class::LOCK_GONE_HOLDER, f.shown.clone()));
                } else if !f.lock_in_bounds {
                    failures.push(fail(class::LOCK_TOO_LONG, f.shown.clone()));
                }
                "locked by a live holder"
            } else if f.state == 2 {
                if f.delivery_count < 1 {
                    failures.push(fail(class::DEFERRED_ZERO, f.shown.clone()));
                } else if f.entity_id != case.receiving {
                    failures.push(fail(
                        class::DEFERRED_UNREACHABLE,
                        format!("{}: it is not on an entity a receiver reads", f.shown),
                    ));
                } else if let Err(e) = take_deferred(
                    &*self.transport,
                    row.shape,
                    &case.path,
                    receiver,
                    f.session_id.as_deref(),
                    f.seq,
                )
                .await
                {
                    failures.push(fail(class::DEFERRED_UNREACHABLE, format!("{}: {e}", f.shown)));
                }
                "deferred, received by sequence number"
            } else {
                failures.push(fail(class::STUCK_ACTIVE, f.shown.clone()));
                "active"
            };
            ends.push(end);
        }
        ends
    }

    async fn drop_entities(&self, case: &Case) {
        sqlx::query("DELETE FROM courier.entity WHERE id = ANY($1)")
            .bind(&case.ids)
            .execute(&self.pool)
            .await
            .unwrap();
    }

    /// One case of the row property.
    async fn case(&self, row: &Row) -> Result<Outcome, Vec<Failure>> {
        let case = self.entities(row, "rowprop").await;
        let result = self.case_on(row, &case).await;
        self.drop_entities(&case).await;
        result
    }

    async fn case_on(&self, row: &Row, case: &Case) -> Result<Outcome, Vec<Failure>> {
        let refused = self.insert(row, case).await.map_err(|f| vec![f])?;
        self.send_valid(case, "{}", "rowprop.Valid", row.shape == Shape::Sessions)
            .await
            .map_err(|f| vec![f])?;
        let receiver = self.transport.receiver(&case.path).await.unwrap();
        let mut seen = Seen::default();
        let t = &*self.transport;
        round(t, row.shape, &case.path, &receiver, &case.valid_id, &mut seen).await;
        self.clock.advance(PAST_ONE_PERIOD);
        round(t, row.shape, &case.path, &receiver, &case.valid_id, &mut seen).await;

        let mut failures = std::mem::take(&mut seen.failures);
        match seen.valid {
            1 => {}
            0 => failures.push(fail(class::VALID_MISSING, case.valid_id.clone())),
            n => failures.push(fail(class::VALID_TWICE, format!("{n} times"))),
        }
        let left = self.inspect(case).await;
        let ends = self.judge(row, case, &receiver, &left, &mut failures).await;
        let inserted = refused.is_none();
        if inserted && seen.odd.is_empty() && ends.is_empty() {
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

/// `COURIER_FUZZ_CASES`, or `default`.
pub(super) fn cases(default: u32) -> u32 {
    std::env::var("COURIER_FUZZ_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

/// The seed of this run: `COURIER_ROW_SEED`, or a random one (printed).
pub(super) fn seed() -> u64 {
    std::env::var("COURIER_ROW_SEED")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| uuid::Uuid::new_v4().as_u64_pair().0)
}

pub(super) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Runs `check` on `cases` rows of `strategy`: stops at the first failure and shrinks it
/// (then fails with the smallest row found), or, with `COURIER_ROW_SURVEY`, runs them
/// all and fails with every class of failure and its shortest row.
pub(super) fn run<S, F>(name: &str, cases: u32, strategy: S, check: F) -> Result<(), String>
where
    S: Strategy,
    S::Value: fmt::Debug,
    F: Fn(&S::Value) -> Result<(), Vec<Failure>>,
{
    let seed = seed();
    eprintln!("{name}: {cases} cases, seed {seed} (COURIER_ROW_SEED={seed} runs them again)");
    let config = Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 400,
        max_shrink_time: 180_000,
        rng_seed: RngSeed::Fixed(seed),
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    if std::env::var_os("COURIER_ROW_SURVEY").is_some() {
        use proptest::strategy::ValueTree;
        let mut classes: BTreeMap<&'static str, (u64, String)> = BTreeMap::new();
        for _ in 0..cases {
            let value = strategy.new_tree(&mut runner).unwrap().current();
            if let Err(failures) = check(&value) {
                let shown = format!("{value:#?}");
                for f in failures {
                    eprintln!("FAILURE {}: {}\n  in {value:?}", f.class, f.detail);
                    let example = format!("{shown}\n  FAILURE: {}", f.detail);
                    let entry = classes.entry(f.class).or_insert((0, example.clone()));
                    entry.0 += 1;
                    if example.len() < entry.1.len() {
                        entry.1 = example;
                    }
                }
            }
        }
        if classes.is_empty() {
            return Ok(());
        }
        let mut report = format!("{name}: failures by class (seed {seed}):\n");
        for (class, (n, example)) in &classes {
            report.push_str(&format!("\n=== {class}: {n} cases; the shortest:\n{example}\n"));
        }
        return Err(report);
    }
    let result = runner.run(&strategy, |value| {
        check(&value).map_err(|failures| {
            let mut s = String::new();
            for f in &failures {
                s.push_str(&format!("\n  FAILURE: {}: {}", f.class, f.detail));
            }
            TestCaseError::fail(s)
        })
    });
    match result {
        Ok(()) => Ok(()),
        Err(TestError::Fail(why, value)) => Err(format!(
            "{name} (seed {seed}): the smallest failing case found:\n{value:#?}{why}"
        )),
        Err(TestError::Abort(why)) => Err(format!("{name} (seed {seed}): aborted: {why}")),
    }
}

/// The property: any row a producer can insert into `courier.message` is refused at INSERT,
/// received, dead-lettered with a reason, or in a state Courier explains, within one
/// maintenance period; the valid message behind it is received exactly once; no receive
/// fails; nothing is lost.
#[test]
fn any_row_is_refused_received_dead_lettered_or_explained_and_the_valid_message_behind_it_is_received_once() {
    let rt = runtime();
    let env = rt.block_on(Env::open());
    let started = std::time::Instant::now();
    let result = run("pg_row_property::any_row", cases(300), row(), |row| {
        let outcome = rt.block_on(env.case(row))?;
        match &outcome.refused {
            Some(code) => env.count(format!("refused at INSERT ({code})")),
            None if outcome.received > 0 => env.count("received"),
            None => {}
        }
        for end in &outcome.ends {
            env.count(*end);
        }
        Ok(())
    });
    eprintln!(
        "pg_row_property::any_row: {:.1} s; outcomes: {:?}",
        started.elapsed().as_secs_f64(),
        env.tally.lock().unwrap()
    );
    rt.block_on(env.close());
    if let Err(report) = result {
        panic!("{report}");
    }
}

// ---------------------------------------------------------------------------------------
// The endpoint property
// ---------------------------------------------------------------------------------------

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "rowprop.Job")]
struct Job {
    /// 0: the valid message; 1: the odd row.
    n: i64,
    /// How many of its first attempts fail.
    fail: u32,
}

/// One call of the handler.
#[derive(Debug, Clone)]
struct Attempt {
    n: i64,
    at: DateTime<Utc>,
    delivery_count: u32,
    delayed: u32,
    ok: bool,
}

#[derive(Clone, Default)]
struct Probe(Arc<Mutex<Vec<Attempt>>>);

impl Probe {
    fn of(&self, n: i64) -> Vec<Attempt> {
        self.0.lock().unwrap().iter().filter(|a| a.n == n).cloned().collect()
    }
}

#[courier::handler]
async fn handle_job(job: Job, ctx: &mut Context) -> Result<(), HandlerError> {
    let probe = ctx.state::<Probe>()?.clone();
    let mut all = probe.0.lock().unwrap();
    let before = all.iter().filter(|a| a.n == job.n).count();
    let ok = before >= usize::try_from(job.fail).unwrap_or(usize::MAX);
    all.push(Attempt {
        n: job.n,
        at: ctx.clock().now(),
        delivery_count: ctx.delivery_count(),
        delayed: ctx.delayed_retries(),
        ok,
    });
    drop(all);
    if ok {
        Ok(())
    } else {
        Err(HandlerError::msg("fails on purpose"))
    }
}

/// The endpoint's policy: one immediate retry, one delayed retry after 5 s (4 attempts).
const DELAY: Duration = Duration::from_secs(5);

fn policy() -> RetryPolicy {
    RetryPolicy::none().immediate(1).delayed([DELAY])
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decision {
    Immediate,
    Delayed,
    Exhausted,
}

/// What the policy decides after a failed attempt (as `RetryPolicy::decide`).
fn decide(a: &Attempt) -> Decision {
    let p = policy();
    if a.delivery_count <= p.immediate_retries {
        Decision::Immediate
    } else if usize::try_from(a.delayed).unwrap_or(usize::MAX) < p.delayed_retries.len() {
        Decision::Delayed
    } else {
        Decision::Exhausted
    }
}

/// The odd message's attempts against the policy, and where it ended (`left`, the rows of
/// the case): one that failed its last attempt with a retry to come may be dead-lettered
/// only by the broker (expired, or at the queue's max delivery count), never before.
fn check_attempts(attempts: &[Attempt], left: &[Found], max_delivery_count: u32, failures: &mut Vec<Failure>) {
    let shown = || format!("{attempts:?}");
    if attempts.len() > usize::try_from(policy().max_attempts()).unwrap() {
        failures.push(fail(class::RETRIED_BEYOND, shown()));
    }
    if attempts.iter().any(|a| a.delivery_count == 0) {
        failures.push(fail(class::SEEN_COUNT_ZERO, shown()));
    }
    if let Some(last) = attempts.last().filter(|a| !a.ok)
        && decide(last) != Decision::Exhausted
    {
        for f in left.iter().filter(|f| !f.is_valid && f.state == 3) {
            let by_the_broker = match f.dl_reason.as_deref() {
                Some(courier::reasons::TTL_EXPIRED) => true,
                Some(courier::reasons::MAX_DELIVERY_COUNT_EXCEEDED) => last.delivery_count >= max_delivery_count,
                _ => false,
            };
            if !by_the_broker {
                failures.push(fail(class::DEAD_BEFORE_POLICY, format!("{}; {}", f.shown, shown())));
            }
        }
    }
    for pair in attempts.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if a.ok {
            failures.push(fail(class::HANDLED_TWICE, shown()));
            break;
        }
        match decide(a) {
            Decision::Immediate => {}
            Decision::Delayed => {
                let waited = b.at - a.at;
                if waited < chrono::Duration::from_std(DELAY).unwrap() || b.delayed != a.delayed + 1 {
                    failures.push(fail(class::DELAY_SKIPPED, shown()));
                    break;
                }
            }
            Decision::Exhausted => {
                failures.push(fail(class::AFTER_EXHAUSTED, shown()));
                break;
            }
        }
    }
}

/// A row as `courier.send` writes it: what the endpoint property starts from.
fn plain() -> Row {
    let none = || Text(None);
    Row {
        shape: Shape::Queue,
        max_delivery_count: 10,
        default_ttl: None,
        target: Target::Receiving,
        seq: None,
        state: Some(0),
        delivery_count: Some(0),
        locked_until: Time::Null,
        holder: Holder::Null,
        session_id: Session::Text(none()),
        enqueued_at: Time::Now(0),
        scheduled_at: Time::Null,
        expires_at: Time::Null,
        ttl_ms: None,
        message_id: Text(Some("odd".into())),
        correlation_id: none(),
        causation_id: none(),
        message_type: none(),
        content_type: none(),
        reply_to: none(),
        properties: Json(None),
        dl_reason: none(),
        dl_description: none(),
        dl_source: none(),
        body: Body(None),
    }
}

/// An odd row for the endpoint: a plain row with the columns that steer the retry policy
/// (delivery count, time-to-live, properties such as `courier.retry.delayed`) odd half of
/// the time, each other column taken from a generated row with probability 0.15, and a
/// body its handler reads; and how many of its handler's first attempts fail.
fn endpoint_row() -> impl Strategy<Value = (Row, u32)> {
    let steering = (
        prop::option::weighted(
            0.5,
            prop::sample::select(vec![0_i32, 1, 3, 9, 10, 11, -1, i32::MIN, i32::MAX]).prop_map(Some),
        ),
        prop::option::weighted(
            0.5,
            prop::sample::select(vec![
                1_i64,
                5_000,
                3_600_000,
                3_162_240_000_000,
                0,
                -1,
                3_162_240_000_001,
                i64::MAX,
            ])
            .prop_map(Some),
        ),
        prop::option::weighted(0.5, properties()),
    );
    (
        row(),
        steering,
        prop::collection::vec(prop::bool::weighted(0.15), 12),
        prop::sample::select(vec![1_u32, 2, 4]),
        prop::sample::select(vec![Some("application/json"), None]),
    )
        .prop_map(|(odd, (count, ttl, props), take, fails, content_type)| {
            let mut row = plain();
            if let Some(c) = count {
                row.delivery_count = c;
            }
            if let Some(t) = ttl {
                row.ttl_ms = t;
            }
            if let Some(p) = props {
                row.properties = p;
            }
            let mut i = 0;
            let mut next = || {
                i += 1;
                take[i - 1]
            };
            if next() {
                row.max_delivery_count = odd.max_delivery_count;
                row.default_ttl = odd.default_ttl;
            }
            if next() {
                row.seq = odd.seq;
            }
            if next() {
                row.state = odd.state;
                row.scheduled_at = odd.scheduled_at;
            }
            if next() {
                row.locked_until = odd.locked_until;
                row.holder = odd.holder;
            }
            if next() {
                row.session_id = odd.session_id;
            }
            if next() {
                row.enqueued_at = odd.enqueued_at;
            }
            if next() {
                row.expires_at = odd.expires_at;
            }
            if next() {
                row.message_id = odd.message_id;
            }
            if next() {
                row.correlation_id = odd.correlation_id;
                row.causation_id = odd.causation_id;
                row.reply_to = odd.reply_to;
            }
            if next() {
                row.dl_reason = odd.dl_reason;
                row.dl_description = odd.dl_description;
                row.dl_source = odd.dl_source;
            }
            if next() && odd.target == Target::Missing {
                row.target = Target::Missing;
            }
            row.message_type = Text(Some("rowprop.Job".into()));
            row.content_type = Text(content_type.map(str::to_owned));
            row.body = Body(Some(format!(r#"{{"n":1,"fail":{fails}}}"#).into_bytes()));
            (row, fails)
        })
}

impl Env {
    /// Rows of the case the endpoint may still take: active and unlocked, or scheduled and
    /// due within a minute.
    async fn pending(&self, case: &Case) -> i64 {
        let now = self.clock.now();
        sqlx::query_scalar(
            "SELECT count(*) FROM courier.message WHERE entity_id = ANY($1) \
             AND ((state = 0 AND (locked_until IS NULL OR locked_until <= $2)) \
               OR (state = 1 AND scheduled_at <= $3))",
        )
        .bind(&case.ids)
        .bind(now)
        .bind(now + chrono::Duration::seconds(60))
        .fetch_one(&self.pool)
        .await
        .unwrap()
    }

    async fn endpoint_case(&self, row: &Row) -> Result<(), Vec<Failure>> {
        let case = self.entities(row, "rowprop-ep").await;
        let result = self.endpoint_case_on(row, &case).await;
        self.drop_entities(&case).await;
        result
    }

    async fn endpoint_case_on(&self, row: &Row, case: &Case) -> Result<(), Vec<Failure>> {
        let refused = self.insert(row, case).await.map_err(|f| vec![f])?;
        self.send_valid(case, r#"{"n":0,"fail":0}"#, "rowprop.Job", false)
            .await
            .map_err(|f| vec![f])?;
        let probe = Probe::default();
        let endpoint = Endpoint::builder(case.send_to.clone())
            .transport(self.transport.clone())
            .store(self.transport.store())
            .state(probe.clone())
            .recoverability(policy())
            .handler(handle_job)
            .start()
            .await
            .unwrap();
        // Up to 40 s of virtual time, in steps of 500 ms taken only while no handling runs
        // (a slow machine does not make time pass under a handler): the delayed retry
        // (5 s) comes back, and anything left is due later than that. Then (or at most 15 s
        // of real time) the handlings are let finish.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        let (mut steps, mut idle) = (0, 0);
        while tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(25)).await;
            let running = endpoint.stats().running;
            idle = if running == 0 { idle + 1 } else { 0 };
            let odd_ok = probe.of(1).iter().any(|a| a.ok);
            let valid_ok = probe.of(0).iter().any(|a| a.ok);
            if running == 0 && valid_ok && (odd_ok || self.pending(case).await == 0) {
                break;
            }
            if steps < 80 {
                if running == 0 {
                    self.clock.advance(Duration::from_millis(500));
                    steps += 1;
                }
            } else if idle >= 10 && valid_ok {
                break;
            }
        }
        let left = self.inspect(case).await;
        endpoint.shutdown().await.unwrap();

        let mut failures = Vec::new();
        let valid = probe.of(0);
        if valid.len() != 1 || !valid[0].ok {
            failures.push(fail(
                if valid.is_empty() {
                    class::VALID_MISSING
                } else {
                    class::VALID_TWICE
                },
                format!("{valid:?}"),
            ));
        }
        let odd = probe.of(1);
        check_attempts(&odd, &left, row.max_delivery_count, &mut failures);
        let receiver = self.transport.receiver(&case.path).await.unwrap();
        let ends = self.judge(row, case, &receiver, &left, &mut failures).await;
        if refused.is_none() && odd.is_empty() && ends.is_empty() {
            failures.push(fail(class::LOST, "no row is left, and the handler never saw it"));
        }
        if let Some(code) = refused {
            self.count(format!("refused at INSERT ({code})"));
        } else if odd.iter().any(|a| a.ok) {
            self.count(format!("handled after {} failed attempts", odd.len() - 1));
        }
        for end in ends {
            self.count(end);
        }
        if failures.is_empty() {
            Ok(())
        } else {
            for f in &mut failures {
                f.detail = format!("{}\n      attempts: {odd:?}", f.detail);
            }
            Err(failures)
        }
    }
}

/// The property at the endpoint: an odd row the endpoint receives goes through the retry
/// policy (immediate retry, delayed retry after its delay) or to the dead-letter queue
/// with a reason; never more attempts than the policy allows, never a delayed retry
/// skipped, never the valid message blocked.
#[test]
fn a_received_odd_row_goes_through_the_retry_policy_and_never_blocks_the_valid_message() {
    let rt = runtime();
    let env = rt.block_on(Env::open());
    let started = std::time::Instant::now();
    let cases = (cases(300) / 15).max(20);
    let result = run("pg_row_property::endpoint", cases, endpoint_row(), |(row, _)| {
        rt.block_on(env.endpoint_case(row))
    });
    eprintln!(
        "pg_row_property::endpoint: {:.1} s; outcomes: {:?}",
        started.elapsed().as_secs_f64(),
        env.tally.lock().unwrap()
    );
    rt.block_on(env.close());
    if let Err(report) = result {
        panic!("{report}");
    }
}
