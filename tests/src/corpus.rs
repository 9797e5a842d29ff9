//! The bad-input corpus (issue 18, point 3): ONE list of what a producer that is not
//! Courier can put in a queue, the same for every transport, each case with the outcome
//! Courier must give it, and a valid message behind each one that must be handled at its
//! first delivery.
//!
//! A case says what is sent, abstractly (a message id that is missing, empty, 10,000
//! characters or normal; a type; a content type; a body; headers; a scheduled time; a
//! saga row to store first). Each transport's test renders it as its foreign producer
//! writes it: raw rows in the embedded broker's SQLite file (`tests/endpoint/corpus.rs`),
//! raw `INSERT INTO courier.message` for the Postgres transport
//! (`tests/transport/pg_corpus.rs`), raw AMQP frames for RabbitMQ
//! (`tests/amqp/corpus.rs`). All three run [`endpoint`]: a plain handler ([`Ping`]) and a
//! saga with a timeout ([`Booking`]) on an endpoint with a store, and [`check`] the same
//! way: every bad case dead-lettered with its Courier reason and a description naming
//! the problem, every valid message handled once at delivery count 1.
//!
//! Where a producer cannot send a case as written, the case says what happens instead
//! (`Case::on`): a table refuses a row without a message id (`NOT NULL`); an AMQP short
//! string holds at most 255 bytes, so the 10,000-character id is sent as 255 and a 100 KB
//! correlation id cannot be sent at all; AMQP has no scheduled time a producer can set.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use courier::reasons::{INVALID_WIRE_FORMAT, MESSAGE_TOO_LARGE};
use courier::recoverability::reasons;
use courier::saga::SagaContext;
use courier::{Context, EndpointBuilder, HandlerError, ReceivedMessage, RetryPolicy, Routes};
use serde::{Deserialize, Serialize};

/// The property every corpus message carries: which case, or which valid message, it is
/// (`case-3`, `valid-3`). The dead letters are matched to their cases by it.
pub const LABEL: &str = "corpus-label";
/// The header the saga finds its instance by.
pub const BOOKING: &str = "booking";
/// The saga instance the valid messages open and close.
pub const VALID_BOOKING: &str = "valid-booking";
/// The saga instance whose stored state no longer deserialises.
pub const BROKEN_BOOKING: &str = "broken-booking";
/// The message size limit of every transport in the corpus runs: the default, 1 MiB.
pub const LIMIT: usize = courier::DEFAULT_MAX_MESSAGE_SIZE;
/// The longest short string of AMQP 0-9-1 (`message_id`, `correlation_id`).
pub const AMQP_SHORT_STRING: usize = 255;

/// The plain handler's message.
#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "corpus.Ping")]
pub struct Ping {
    /// Any number.
    pub n: u32,
}

/// Starts a booking (the saga), found by the header [`BOOKING`]; requests a timeout.
#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "corpus.OpenBooking")]
pub struct OpenBooking {
    /// Nights booked.
    pub nights: u32,
}

/// Closes a booking: cancels its timeout and completes it.
#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "corpus.CloseBooking")]
pub struct CloseBooking {
    /// Any number.
    pub n: u32,
}

/// The booking's timeout.
#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "corpus.BookingExpired")]
pub struct BookingExpired;

/// The saga: opened, then closed or expired.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Booking {
    /// Nights booked.
    pub nights: u32,
}

#[courier::saga(name = "corpus.Booking")]
impl Booking {
    #[start(header = "booking")]
    async fn opened(&mut self, msg: OpenBooking, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        ctx.state::<Seen>()?.record("opened", ctx);
        self.nights = msg.nights;
        ctx.request_timeout(Duration::from_secs(3600), &BookingExpired)?;
        Ok(())
    }

    #[handle(header = "booking")]
    async fn closed(&mut self, _msg: CloseBooking, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        ctx.state::<Seen>()?.record("closed", ctx);
        ctx.cancel_timeout::<BookingExpired>();
        ctx.complete();
        Ok(())
    }

    #[timeout]
    async fn expired(&mut self, _t: BookingExpired, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        ctx.state::<Seen>()?.record("expired", ctx);
        ctx.complete();
        Ok(())
    }
}

#[courier::handler]
async fn ping(_msg: Ping, ctx: &mut Context) -> Result<(), HandlerError> {
    ctx.state::<Seen>()?.record("ping", ctx);
    Ok(())
}

/// One handler call: the message's label, its id, the handler, its delivery count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The [`LABEL`] property.
    pub label: String,
    /// The message id as the handler saw it.
    pub message_id: String,
    /// Which handler.
    pub handler: &'static str,
    /// The delivery count.
    pub delivery_count: u32,
}

/// The handlers' calls, shared with the test.
#[derive(Clone, Default)]
pub struct Seen(Arc<Mutex<Vec<Call>>>);

impl Seen {
    fn record(&self, handler: &'static str, ctx: &Context) {
        let label = match ctx.header(LABEL) {
            Some(courier::PropertyValue::String(s)) => s.clone(),
            _ => String::new(),
        };
        self.0.lock().unwrap_or_else(PoisonError::into_inner).push(Call {
            label,
            message_id: ctx.message_id().to_owned(),
            handler,
            delivery_count: ctx.delivery_count(),
        });
    }

    /// Every call so far.
    pub fn calls(&self) -> Vec<Call> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

/// The corpus's endpoint on `builder` (transport and store set): the plain handler, the
/// saga, one message at a time, two immediate retries and no delayed ones (a failure
/// that is not refused at once shows as `courier.RetriesExhausted`, never as a stall).
pub fn endpoint(builder: EndpointBuilder, queue: &str, seen: &Seen) -> EndpointBuilder {
    builder
        .routes(
            Routes::new()
                .send::<Ping>(queue)
                .send::<OpenBooking>(queue)
                .send::<CloseBooking>(queue),
        )
        .handler(ping)
        .saga::<Booking>()
        .state(seen.clone())
        .concurrency(1)
        .recoverability(RetryPolicy::none().immediate(2))
}

/// A message id as a producer sets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Id {
    /// Not set at all.
    Missing,
    /// Set, empty.
    Empty,
    /// This many characters (no two neighbours alike, so nothing compresses it).
    Long(usize),
    /// The message's label.
    Label,
}

/// A header value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Header {
    /// A string.
    Text(String),
    /// An integer.
    Int(i64),
}

/// A scheduled enqueue time a producer stores with the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheduled {
    /// 0001-01-01.
    FarPast,
    /// 9999-12-31.
    FarFuture,
}

impl Scheduled {
    /// The time.
    pub fn at(self) -> DateTime<Utc> {
        let (y, m, d) = match self {
            Scheduled::FarPast => (1, 1, 1),
            Scheduled::FarFuture => (9999, 12, 31),
        };
        Utc.with_ymd_and_hms(y, m, d, 0, 0, 0)
            .single()
            .unwrap_or(DateTime::<Utc>::MIN_UTC)
    }
}

/// What a foreign producer sends.
#[derive(Debug, Clone)]
pub struct Raw {
    /// The [`LABEL`] property's value.
    pub label: String,
    /// The message id.
    pub id: Id,
    /// The type.
    pub message_type: Option<String>,
    /// The content type.
    pub content_type: Option<String>,
    /// The correlation id.
    pub correlation_id: Option<String>,
    /// Headers (application properties) besides [`LABEL`], in order.
    pub headers: Vec<(String, Header)>,
    /// The body.
    pub body: Vec<u8>,
    /// A scheduled enqueue time.
    pub scheduled: Option<Scheduled>,
}

impl Raw {
    /// The message id as text (`None` for [`Id::Missing`]).
    pub fn message_id(&self) -> Option<String> {
        match self.id {
            Id::Missing => None,
            Id::Empty => Some(String::new()),
            Id::Long(n) => Some(long_text(n)),
            Id::Label => Some(self.label.clone()),
        }
    }

    /// Every header with [`LABEL`] first.
    pub fn all_headers(&self) -> Vec<(String, Header)> {
        let mut all = vec![(LABEL.to_owned(), Header::Text(self.label.clone()))];
        all.extend(self.headers.iter().cloned());
        all
    }

    /// The headers as the JSON object of properties a row stores.
    pub fn properties_json(&self) -> String {
        let map: BTreeMap<String, serde_json::Value> = self
            .all_headers()
            .into_iter()
            .map(|(k, v)| {
                let v = match v {
                    Header::Text(s) => serde_json::Value::String(s),
                    Header::Int(i) => serde_json::Value::from(i),
                };
                (k, v)
            })
            .collect();
        serde_json::Value::Object(map.into_iter().collect()).to_string()
    }
}

/// `n` characters of `a`..`z` and `0`..`9` in a sequence that does not repeat soon.
pub fn long_text(n: usize) -> String {
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(CHARS[usize::try_from(x % 36).unwrap_or(0)])
        })
        .collect()
}

/// The outcome a case must have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// Handled by its handler once, at delivery count 1.
    Handled,
    /// Completed without a handler call (a timeout whose row does not exist is discarded).
    Discarded,
    /// In the dead-letter queue with `reason`, its description holding each of `mentions`.
    DeadLettered {
        /// The Courier reason.
        reason: &'static str,
        /// Words the description must hold.
        mentions: Vec<&'static str>,
    },
    /// The producer's channel refuses it: it never reaches the queue.
    Refused {
        /// Who refuses, and why.
        by: &'static str,
    },
}

fn dead(reason: &'static str, mentions: &[&'static str]) -> Expect {
    Expect::DeadLettered {
        reason,
        mentions: mentions.to_vec(),
    }
}

/// A transport's foreign producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Producer {
    /// Rows written into the embedded broker's SQLite file.
    EmbeddedRows,
    /// Rows inserted into the Postgres transport's `courier.message`.
    PostgresRows,
    /// Raw AMQP frames to RabbitMQ.
    RawAmqp,
}

/// One case of the corpus.
#[derive(Debug, Clone)]
pub struct Case {
    /// What it is.
    pub name: &'static str,
    /// What the producer sends.
    pub raw: Raw,
    /// A saga instance to store before the message is sent: its correlation and state.
    pub saga_row: Option<(&'static str, &'static str)>,
    expect: Expect,
    /// Where a producer sends it differently: what it sends instead, and the outcome.
    on: Vec<(Producer, Option<Raw>, Expect)>,
}

impl Case {
    /// What `producer` sends for this case.
    pub fn raw(&self, producer: Producer) -> &Raw {
        self.on
            .iter()
            .find(|(p, _, _)| *p == producer)
            .and_then(|(_, raw, _)| raw.as_ref())
            .unwrap_or(&self.raw)
    }

    /// The outcome on `producer`'s transport.
    pub fn expect(&self, producer: Producer) -> Expect {
        self.on
            .iter()
            .find(|(p, _, _)| *p == producer)
            .map_or_else(|| self.expect.clone(), |(_, _, e)| e.clone())
    }
}

/// A valid message: a `Ping` with its label as id.
pub fn valid(label: String) -> Raw {
    Raw {
        id: Id::Label,
        message_type: Some("corpus.Ping".into()),
        content_type: Some("application/json".into()),
        correlation_id: None,
        headers: Vec::new(),
        body: br#"{"n":1}"#.to_vec(),
        scheduled: None,
        label,
    }
}

/// What is sent, in order: a valid `OpenBooking`, then each case followed by a valid
/// `Ping`, then a valid `CloseBooking` (it cancels the timeout and completes the saga).
pub struct Corpus {
    /// The cases.
    pub cases: Vec<Case>,
    /// The valid messages, in order of sending: the first before the first case, one
    /// after each case, the last after them all.
    pub valid: Vec<Raw>,
}

impl Corpus {
    /// Everything to send, in order: `(Some(case), raw)` or `(None, valid raw)`.
    pub fn sequence(&self, producer: Producer) -> Vec<(Option<&Case>, &Raw)> {
        let mut out = vec![(None, &self.valid[0])];
        for (i, case) in self.cases.iter().enumerate() {
            out.push((Some(case), case.raw(producer)));
            out.push((None, &self.valid[i + 1]));
        }
        out.push((None, &self.valid[self.cases.len() + 1]));
        out
    }
}

/// The corpus.
pub fn corpus() -> Corpus {
    let mut cases = Vec::new();
    let mut add = |name, edit: &dyn Fn(&mut Raw), expect: Expect| {
        let label = format!("case-{}", cases.len() + 1);
        let mut raw = valid(label);
        edit(&mut raw);
        cases.push(Case {
            name,
            raw,
            saga_row: None,
            expect,
            on: Vec::new(),
        });
    };
    let decode = |what: &'static str| dead(reasons::DESERIALIZATION_FAILED, &["corpus.Ping", what]);
    add("malformed JSON", &|r| r.body = br#"{"n":"#.to_vec(), decode("EOF"));
    add(
        "valid JSON of the wrong shape",
        &|r| r.body = br#"{"name":"x"}"#.to_vec(),
        decode("missing field `n`"),
    );
    add("an empty body", &|r| r.body.clear(), decode("EOF"));
    add(
        "a body over the size limit",
        &|r| r.body = format!(r#"{{"n":4,"pad":"{}"}}"#, "x".repeat(LIMIT)).into_bytes(),
        dead(MESSAGE_TOO_LARGE, &["1048576"]),
    );
    add(
        "an unknown message type",
        &|r| r.message_type = Some("corpus.NoSuchThing".into()),
        dead(reasons::UNKNOWN_MESSAGE_TYPE, &["corpus.NoSuchThing", "corpus.Ping"]),
    );
    add(
        "no message type",
        &|r| r.message_type = None,
        dead(reasons::UNKNOWN_MESSAGE_TYPE, &["no type"]),
    );
    add(
        "a content type no codec reads",
        &|r| r.content_type = Some("application/x-protobuf".into()),
        decode("application/x-protobuf"),
    );
    add("no content type", &|r| r.content_type = None, Expect::Handled);
    add(
        "no message id",
        &|r| r.id = Id::Missing,
        dead(
            reasons::MISSING_MESSAGE_ID,
            &["message_id", "accept_messages_without_id"],
        ),
    );
    add(
        "an empty message id",
        &|r| r.id = Id::Empty,
        dead(
            reasons::MISSING_MESSAGE_ID,
            &["message_id", "accept_messages_without_id"],
        ),
    );
    add(
        "a message id of 10,000 characters",
        &|r| r.id = Id::Long(10_000),
        dead(INVALID_WIRE_FORMAT, &["message_id", "128"]),
    );
    add(
        "a correlation id of 100 KB",
        &|r| r.correlation_id = Some(long_text(100 * 1024)),
        Expect::Handled,
    );
    add(
        "Courier headers of the wrong types",
        &|r| {
            r.headers = vec![
                ("courier.retry.delayed".into(), Header::Text("three".into())),
                (courier::TRACEPARENT.into(), Header::Int(42)),
            ];
        },
        Expect::Handled,
    );
    add(
        "a message version that is not a version",
        &|r| r.headers = vec![("courier.message.version".into(), Header::Text("two".into()))],
        dead(
            reasons::UNSUPPORTED_MESSAGE_VERSION,
            &["corpus.Ping", "courier.message.version"],
        ),
    );
    add(
        "a saga correlation header of 100 KB",
        &|r| {
            r.message_type = Some("corpus.OpenBooking".into());
            r.body = br#"{"nights":1}"#.to_vec();
            r.headers = vec![(BOOKING.into(), Header::Text(long_text(100 * 1024)))];
        },
        dead(reasons::PERMANENT_FAILURE, &["corpus.Booking", "102400 bytes"]),
    );
    add(
        "a saga timeout forged without its saga headers",
        &|r| {
            r.message_type = Some("corpus.BookingExpired".into());
            r.body = b"null".to_vec();
        },
        dead(
            reasons::FORGED_TIMEOUT,
            &["corpus.BookingExpired", "without the headers"],
        ),
    );
    add(
        "a saga timeout forged with headers naming no stored timeout",
        &|r| {
            r.message_type = Some("corpus.BookingExpired".into());
            r.body = b"null".to_vec();
            r.headers = vec![
                ("courier.saga.timeout".into(), Header::Text("forged-timeout".into())),
                ("courier.saga.type".into(), Header::Text("corpus.Booking".into())),
                ("courier.saga.correlation".into(), Header::Text(VALID_BOOKING.into())),
            ];
        },
        // Not the dispatcher's copy (no seal): refused before the saga looks for the
        // timeout (issue 31; it was discarded as a timeout with no row).
        dead(
            reasons::FORGED_TIMEOUT,
            &["corpus.BookingExpired", "forged-timeout", "forged"],
        ),
    );
    add(
        "a message for a saga whose stored state no longer deserialises",
        &|r| {
            r.message_type = Some("corpus.CloseBooking".into());
            r.headers = vec![(BOOKING.into(), Header::Text(BROKEN_BOOKING.into()))];
        },
        dead(
            reasons::PERMANENT_FAILURE,
            &["corpus.Booking", BROKEN_BOOKING, "does not decode"],
        ),
    );
    add(
        "a scheduled time in the far past",
        &|r| r.scheduled = Some(Scheduled::FarPast),
        Expect::Handled,
    );
    add(
        "a scheduled time in the far future",
        &|r| r.scheduled = Some(Scheduled::FarFuture),
        dead(INVALID_WIRE_FORMAT, &["9999-12-31", "100 years"]),
    );
    let no_null = Expect::Refused {
        by: "the table: message_id is NOT NULL",
    };
    let short = Expect::Refused {
        by: "AMQP: a short string holds at most 255 bytes",
    };
    let no_schedule = Expect::Refused {
        by: "AMQP: a producer cannot set a scheduled time",
    };
    for case in &mut cases {
        let sql = |e: Expect| {
            vec![
                (Producer::EmbeddedRows, None, e.clone()),
                (Producer::PostgresRows, None, e),
            ]
        };
        match case.name {
            "no message id" => case.on = sql(no_null.clone()),
            "a message id of 10,000 characters" => {
                let mut raw = case.raw.clone();
                raw.id = Id::Long(AMQP_SHORT_STRING);
                case.on = vec![(Producer::RawAmqp, Some(raw), dead(INVALID_WIRE_FORMAT, &["message_id"]))];
            }
            "a correlation id of 100 KB" => case.on = vec![(Producer::RawAmqp, None, short.clone())],
            "a message for a saga whose stored state no longer deserialises" => {
                case.saga_row = Some((BROKEN_BOOKING, r#"{"nights":"many"}"#));
            }
            "a scheduled time in the far past" | "a scheduled time in the far future" => {
                case.on = vec![(Producer::RawAmqp, None, no_schedule.clone())];
            }
            _ => {}
        }
    }
    let n = cases.len();
    let mut valid_msgs: Vec<Raw> = (0..=n + 1).map(|i| valid(format!("valid-{i}"))).collect();
    for (i, message_type, body) in [
        (0, "corpus.OpenBooking", br#"{"nights":2}"#.as_slice()),
        (n + 1, "corpus.CloseBooking", br#"{"n":1}"#.as_slice()),
    ] {
        let raw = &mut valid_msgs[i];
        raw.message_type = Some(message_type.into());
        raw.body = body.to_vec();
        raw.headers = vec![(BOOKING.into(), Header::Text(VALID_BOOKING.into()))];
    }
    Corpus {
        cases,
        valid: valid_msgs,
    }
}

/// Waits (real time, at most 30 s) until `done` holds; returns whether it did. A run
/// that does not settle is still checked case by case, which names what went wrong.
pub async fn settle<F, Fut>(mut done: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::time::Instant::now() < deadline {
        if done().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// How many messages a run must hand to a handler, and how many it must dead-letter.
pub fn totals(corpus: &Corpus, producer: Producer) -> (usize, usize) {
    let of = |want: fn(&Expect) -> bool| corpus.cases.iter().filter(|c| want(&c.expect(producer))).count();
    (
        corpus.valid.len() + of(|e| *e == Expect::Handled),
        of(|e| matches!(e, Expect::DeadLettered { .. })),
    )
}

/// What a transport's run produced.
pub struct Outcome {
    /// The handlers' calls.
    pub calls: Vec<Call>,
    /// Everything in the queue's dead-letter queue.
    pub dead: Vec<ReceivedMessage>,
    /// The labels of the cases the producer could not send.
    pub refused: Vec<String>,
}

fn label_of(m: &ReceivedMessage) -> Option<&str> {
    match m.envelope.properties.get(LABEL) {
        Some(courier::PropertyValue::String(s)) => Some(s),
        _ => None,
    }
}

/// Checks a run of the corpus on `producer`'s transport: each case as expected, each
/// valid message handled once at delivery count 1, nothing dead-lettered that should not
/// be. Returns a line per case (name, outcome, description) for the test's output.
///
/// # Panics
/// When anything is not as expected (a test failure), naming every case that is not.
#[allow(clippy::panic)]
pub fn check(corpus: &Corpus, producer: Producer, outcome: &Outcome) -> Vec<String> {
    let mut report = Vec::new();
    let mut wrong = Vec::new();
    let calls_of = |label: &str| -> Vec<&Call> { outcome.calls.iter().filter(|c| c.label == label).collect() };
    for raw in &corpus.valid {
        let calls = calls_of(&raw.label);
        let once_at_first = calls.len() == 1 && calls[0].delivery_count == 1 && calls[0].message_id == raw.label;
        if !once_at_first {
            wrong.push(format!(
                "valid message {}: not handled once at delivery count 1: {calls:?}",
                raw.label
            ));
        }
    }
    let mut expected_dead = 0;
    for case in &corpus.cases {
        let label = &case.raw.label;
        let what = format!("{label} ({})", case.name);
        let calls = calls_of(label);
        let dead: Vec<&ReceivedMessage> = outcome
            .dead
            .iter()
            .filter(|m| label_of(m) == Some(label.as_str()))
            .collect();
        let refused = outcome.refused.contains(label);
        let got = match (dead.as_slice(), refused, calls.as_slice()) {
            ([m], false, []) => format!(
                "dead-lettered {}: {}",
                m.broker.dead_letter_reason.as_deref().unwrap_or("(no reason)"),
                m.broker
                    .dead_letter_description
                    .as_deref()
                    .unwrap_or("(no description)")
            ),
            ([], true, []) => "refused at send".to_owned(),
            ([], false, [c]) => format!("handled at delivery count {}", c.delivery_count),
            ([], false, []) => "neither handled nor dead-lettered (completed, or still in the queue)".to_owned(),
            _ => format!("{} dead letters, refused {refused}, calls {calls:?}", dead.len()),
        };
        let expect = case.expect(producer);
        let fine = match &expect {
            Expect::Handled => dead.is_empty() && !refused && calls.len() == 1 && calls[0].delivery_count == 1,
            Expect::Discarded => dead.is_empty() && !refused && calls.is_empty(),
            Expect::Refused { .. } => refused && dead.is_empty() && calls.is_empty(),
            Expect::DeadLettered { reason, mentions } => {
                expected_dead += 1;
                dead.len() == 1 && calls.is_empty() && {
                    let m = dead[0];
                    let description = m.broker.dead_letter_description.as_deref().unwrap_or_default();
                    m.broker.dead_letter_reason.as_deref() == Some(*reason)
                        && mentions.iter().all(|w| description.contains(w))
                        && m.broker.dead_letter_source.is_some()
                }
            }
        };
        let shown: String = got.chars().take(400).collect();
        if fine {
            report.push(format!("{what}: {shown}"));
        } else {
            wrong.push(format!("{what}: expected {expect:?}, got {shown}"));
        }
    }
    if outcome.dead.len() != expected_dead {
        let all: Vec<_> = outcome
            .dead
            .iter()
            .map(|m| (label_of(m), m.broker.dead_letter_reason.clone()))
            .collect();
        wrong.push(format!(
            "{expected_dead} dead letters expected, found {}: {all:?}",
            outcome.dead.len()
        ));
    }
    if !wrong.is_empty() {
        panic!("the corpus on {producer:?}:\n{}", wrong.join("\n"));
    }
    report
}
