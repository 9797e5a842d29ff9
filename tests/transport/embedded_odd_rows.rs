//! Rows another program writes into the embedded broker's file while no broker has it open
//! (issue 30, the classes `embedded_row_property` found): what no Courier sender writes is
//! refused at the INSERT by the table itself (a STRICT table with CHECK constraints), and
//! every other row is handled on its own when the broker opens or receives, never stopping
//! the broker, a queue or a send.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use courier::prelude::*;
use courier::reasons::{INVALID_WIRE_FORMAT, MAX_DELIVERY_COUNT_EXCEEDED};
use courier::{ErrorKind, SessionSelector};
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use sqlx::{ConnectOptions, Connection};

/// Columns of a row: `(name, SQL literal)`.
type Columns<'a> = &'a [(&'a str, &'a str)];

/// A broker file of its own, and the clock every broker opened on it reads.
struct File {
    _dir: tempfile::TempDir,
    path: PathBuf,
    clock: VirtualClock,
}

impl File {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("broker.db");
        Self {
            _dir: dir,
            path,
            clock: VirtualClock::starting_now(),
        }
    }

    async fn open(&self) -> Embedded {
        Embedded::builder()
            .path(&self.path)
            .clock(Arc::new(self.clock.clone()))
            .open()
            .await
            .unwrap()
    }

    /// The file as another program has it (no broker open).
    async fn sql(&self) -> SqliteConnection {
        sql(&self.path).await
    }

    fn now(&self) -> i64 {
        self.clock.now().timestamp_micros()
    }
}

async fn sql(path: &Path) -> SqliteConnection {
    SqliteConnectOptions::new()
        .filename(path)
        .busy_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap()
}

/// `(id, next_seq)` of the entity `name` (with `parent`: a subscription of that topic).
async fn entity(conn: &mut SqliteConnection, name: &str) -> (i64, i64) {
    sqlx::query_as("SELECT id, next_seq FROM courier_entity WHERE name = ?1")
        .bind(name)
        .fetch_one(&mut *conn)
        .await
        .unwrap()
}

/// Writes a message row of `entity` at `seq` with the given extra columns (SQL literals of
/// the test's own), as another program would.
async fn write(conn: &mut SqliteConnection, entity: i64, seq: i64, columns: Columns<'_>, now: i64) {
    let mut names = String::from("id, entity_id, seq, enqueued_at");
    let mut values = format!("{}, {entity}, {seq}, {now}", (entity << 40) | seq);
    let defaults = [("state", "0"), ("message_id", "'odd'"), ("body", "CAST('{}' AS BLOB)")];
    for (name, value) in defaults.iter().filter(|(n, _)| !columns.iter().any(|(c, _)| c == n)) {
        names.push_str(&format!(", {name}"));
        values.push_str(&format!(", {value}"));
    }
    for (name, value) in columns {
        names.push_str(&format!(", {name}"));
        values.push_str(&format!(", {value}"));
    }
    let sql = format!("INSERT INTO courier_message ({names}) VALUES ({values})");
    sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&mut *conn).await.unwrap();
}

async fn raise(conn: &mut SqliteConnection, entity: i64, next: i64) {
    sqlx::query("UPDATE courier_entity SET next_seq = ?2 WHERE id = ?1")
        .bind(entity)
        .bind(next)
        .execute(&mut *conn)
        .await
        .unwrap();
}

async fn dead_letters(broker: &Embedded, path: &EntityPath) -> Vec<ReceivedMessage> {
    broker.peek(&path.clone().dead_letter(), 0, 100).await.unwrap()
}

/// Receives and completes everything there is; the message ids in order.
async fn drain<R: Receiver + ?Sized>(receiver: &R) -> Vec<String> {
    let mut ids = Vec::new();
    loop {
        let got = receiver.receive(100, Duration::ZERO).await.unwrap();
        if got.is_empty() {
            return ids;
        }
        for d in got {
            ids.push(d.message().message_id().to_owned());
            d.complete().await.unwrap();
        }
    }
}

/// What no Courier sender writes is refused by SQLite at the INSERT, naming the rule or
/// the column (before: written, then the broker did not open, or the row sat for ever, or
/// a receive could not complete it). The broker opens on the file afterwards and serves it.
#[tokio::test]
async fn what_no_sender_writes_is_refused_at_the_insert() {
    let file = File::new();
    let broker = file.open().await;
    broker.create_queue("q", &QueueOptions::default()).await.unwrap();
    broker.close().await;
    let mut conn = file.sql().await;
    let (q, next) = entity(&mut conn, "q").await;
    let now = file.now();
    // (the case, its columns, what the refusal names)
    let cases: &[(&str, Columns<'_>, &str)] = &[
        (
            "text in a time column",
            &[("scheduled_at", "'abc'")],
            "INTEGER column courier_message.scheduled_at",
        ),
        (
            "a real in a time column",
            &[("expires_at", "1.5")],
            "INTEGER column courier_message.expires_at",
        ),
        (
            "a blob in a time column",
            &[("locked_until", "x'00'")],
            "INTEGER column courier_message.locked_until",
        ),
        (
            "a blob session id",
            &[("session_id", "x'ff'")],
            "TEXT column courier_message.session_id",
        ),
        (
            "a blob message id",
            &[("message_id", "x'6869'")],
            "TEXT column courier_message.message_id",
        ),
        ("a text body", &[("body", "'{}'")], "BLOB column courier_message.body"),
        ("a state no broker knows", &[("state", "5")], "message_state_known"),
        (
            "a negative delivery count",
            &[("delivery_count", "-1")],
            "message_delivery_count_in_range",
        ),
        (
            "a delivery count over 32 bits",
            &[("delivery_count", "4294967296")],
            "message_delivery_count_in_range",
        ),
        ("a time-to-live of 0", &[("ttl_ms", "0")], "message_ttl_in_range"),
        (
            "scheduled without a time",
            &[("state", "1")],
            "message_scheduled_has_time",
        ),
        (
            "deferred, never delivered",
            &[("state", "2")],
            "message_deferred_was_delivered",
        ),
        (
            "dead-lettered without a reason",
            &[("state", "3")],
            "message_dead_letter_has_reason",
        ),
        (
            "dead-lettered with an empty reason",
            &[("state", "3"), ("dl_reason", "''"), ("dl_description", "'x'")],
            "message_dead_letter_has_reason",
        ),
    ];
    for (case, columns, named) in cases {
        let mut names = String::from("id, entity_id, seq, enqueued_at, state, message_id, body");
        let mut values = format!("{}, {q}, {next}, {now}", (q << 40) | next);
        for default in [("state", "0"), ("message_id", "'odd'"), ("body", "x'7b7d'")] {
            let value = columns
                .iter()
                .find(|(c, _)| *c == default.0)
                .map_or(default.1, |(_, v)| *v);
            values.push_str(&format!(", {value}"));
        }
        for (name, value) in columns
            .iter()
            .filter(|(c, _)| !["state", "message_id", "body"].contains(c))
        {
            names.push_str(&format!(", {name}"));
            values.push_str(&format!(", {value}"));
        }
        let sql = format!("INSERT INTO courier_message ({names}) VALUES ({values})");
        let e = sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await
            .expect_err(case);
        let db = e.as_database_error().unwrap();
        let primary = db.code().unwrap().parse::<i64>().unwrap() & 0xff;
        assert_eq!(primary, 19, "{case}: SQLITE_CONSTRAINT, got {e}");
        assert!(db.message().contains(named), "{case}: {e}");
    }
    // An id that is not entity << 40 | seq (a scheduled one was deleted when due, lost).
    for (case, id, seq) in [
        ("an id of another entity", (q + 1) << 40 | next, next),
        ("seq 0", q << 40, 0),
    ] {
        let e = sqlx::query(
            "INSERT INTO courier_message (id, entity_id, seq, state, scheduled_at, enqueued_at, message_id, body) \
             VALUES (?1, ?2, ?3, 1, ?4, ?4, 'odd', x'7b7d')",
        )
        .bind(id)
        .bind(q)
        .bind(seq)
        .bind(now)
        .execute(&mut conn)
        .await
        .expect_err(case);
        assert!(e.to_string().contains("message_id_is_entity_and_seq"), "{case}: {e}");
    }
    conn.close().await.unwrap();
    let broker = file.open().await;
    let sender = broker.sender("q", SenderOptions::default()).await.unwrap();
    sender.send(Envelope::new("{}").with_message_id("valid")).await.unwrap();
    let receiver = broker.receiver(&EntityPath::queue("q")).await.unwrap();
    assert_eq!(drain(&*receiver).await, ["valid"]);
    broker.close().await;
}

/// A row written at the entity's next sequence number without raising `next_seq` made the
/// next send fail on the row id (`UNIQUE constraint failed: courier_message.id`); it is
/// numbered after the counter when the broker opens, and both are received in order.
#[tokio::test]
async fn a_row_at_the_next_sequence_number_does_not_break_the_next_send() {
    let file = File::new();
    let broker = file.open().await;
    broker.create_queue("q", &QueueOptions::default()).await.unwrap();
    broker.create_topic("t", &TopicOptions::default()).await.unwrap();
    broker
        .create_subscription("t", "s", &QueueOptions::default())
        .await
        .unwrap();
    broker.close().await;
    let mut conn = file.sql().await;
    let (q, next) = entity(&mut conn, "q").await;
    let now = file.now();
    write(&mut conn, q, next, &[("message_id", "'odd-1'")], now).await;
    // And one at the last number a row may hold: the counter stays usable.
    write(&mut conn, q, (1 << 40) - 1, &[("message_id", "'odd-2'")], now).await;
    // A subscription's copy at its topic's next number.
    let (t, t_next) = entity(&mut conn, "t").await;
    let (s, _) = entity(&mut conn, "s").await;
    assert!(t < s);
    write(&mut conn, s, t_next, &[("message_id", "'odd-copy'")], now).await;
    conn.close().await.unwrap();

    let broker = file.open().await;
    let sender = broker.sender("q", SenderOptions::default()).await.unwrap();
    sender.send(Envelope::new("{}").with_message_id("valid")).await.unwrap();
    let receiver = broker.receiver(&EntityPath::queue("q")).await.unwrap();
    assert_eq!(drain(&*receiver).await, ["odd-1", "odd-2", "valid"]);
    let publisher = broker.sender("t", SenderOptions::default()).await.unwrap();
    publisher
        .send(Envelope::new("{}").with_message_id("valid-event"))
        .await
        .unwrap();
    let sub = broker.receiver(&EntityPath::subscription("t", "s")).await.unwrap();
    assert_eq!(drain(&*sub).await, ["odd-copy", "valid-event"]);
    broker.close().await;
}

/// A ready row at or over its queue's max delivery count was never received (the receive
/// takes only rows under it) nor dead-lettered, and on a session queue
/// `accept_session(Next)` offered its session again and again, empty. Found when the
/// broker opens: dead-lettered as `MaxDeliveryCountExceeded`.
#[tokio::test]
async fn a_ready_row_at_the_max_delivery_count_is_dead_lettered_when_the_broker_opens() {
    let file = File::new();
    let broker = file.open().await;
    let once = QueueOptions::default().max_delivery_count(1);
    broker.create_queue("q", &once).await.unwrap();
    broker
        .create_queue("s", &once.clone().requires_session(true))
        .await
        .unwrap();
    broker.close().await;
    let mut conn = file.sql().await;
    let now = file.now();
    for name in ["q", "s"] {
        let (id, next) = entity(&mut conn, name).await;
        write(
            &mut conn,
            id,
            next,
            &[("delivery_count", "1"), ("session_id", "'odd-session'")],
            now,
        )
        .await;
        raise(&mut conn, id, next + 1).await;
    }
    conn.close().await.unwrap();

    let broker = file.open().await;
    let mut valid = Envelope::new("{}").with_message_id("valid");
    valid.session_id = Some("valid-session".into());
    for name in ["q", "s"] {
        let sender = broker.sender(name, SenderOptions::default()).await.unwrap();
        sender.send(valid.clone()).await.unwrap();
        let dead = dead_letters(&broker, &EntityPath::queue(name)).await;
        assert_eq!(dead.len(), 1, "{name}");
        assert_eq!(dead[0].message_id(), "odd");
        assert_eq!(
            dead[0].broker.dead_letter_reason.as_deref(),
            Some(MAX_DELIVERY_COUNT_EXCEEDED)
        );
        let description = dead[0].broker.dead_letter_description.clone().unwrap();
        assert!(description.contains("delivery count of 1"), "{description}");
    }
    let receiver = broker.receiver(&EntityPath::queue("q")).await.unwrap();
    assert_eq!(drain(&*receiver).await, ["valid"]);
    let session = broker
        .accept_session(&EntityPath::queue("s"), SessionSelector::Next, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(session.session_id(), "valid-session");
    assert_eq!(drain(&*session).await, ["valid"]);
    session.release().await.unwrap();
    let Err(none) = broker
        .accept_session(&EntityPath::queue("s"), SessionSelector::Next, Duration::ZERO)
        .await
    else {
        panic!("no other session has messages");
    };
    assert!(matches!(none.kind(), ErrorKind::SessionNotAvailable { .. }), "{none}");
    broker.close().await;
}

/// A message whose last delivery was locked when its process died (a crash loop at the
/// max delivery count) became ready with its count kept, which no receive takes: it sat
/// for ever. The lock ends as an expired lock does there: dead-lettered (S2.6).
#[tokio::test]
async fn a_lock_left_at_the_last_delivery_is_dead_lettered_when_the_broker_opens() {
    let file = File::new();
    let path = EntityPath::queue("q");
    let broker = file.open().await;
    broker
        .create_queue("q", &QueueOptions::default().max_delivery_count(2))
        .await
        .unwrap();
    let sender = broker.sender("q", SenderOptions::default()).await.unwrap();
    sender
        .send(Envelope::new("{}").with_message_id("crashes"))
        .await
        .unwrap();
    broker.close().await;
    for delivery in 1..=2 {
        let broker = file.open().await;
        let receiver = broker.receiver(&path).await.unwrap();
        let got = receiver.receive(1, Duration::ZERO).await.unwrap();
        assert_eq!(got.len(), 1, "delivery {delivery}");
        assert_eq!(got[0].message().delivery_count(), delivery);
        // The process dies holding the lock: the lock stays in the file.
        std::mem::forget(got);
        broker.close().await;
    }
    let broker = file.open().await;
    let receiver = broker.receiver(&path).await.unwrap();
    assert!(receiver.receive(1, Duration::ZERO).await.unwrap().is_empty());
    let dead = dead_letters(&broker, &path).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].message_id(), "crashes");
    assert_eq!(
        dead[0].broker.dead_letter_reason.as_deref(),
        Some(MAX_DELIVERY_COUNT_EXCEEDED)
    );
    assert_eq!(dead[0].delivery_count(), 2);
    broker.close().await;
}

/// Rows of a queue that requires sessions which no session receiver can take: without a
/// session id (ready, deferred, or scheduled and then due), with one that is not UTF-8
/// (it closed the broker at `accept_session(Next)`: every later call was "closed"), empty
/// or over 128 bytes. Dead-lettered, the session id named; the valid session is offered.
#[tokio::test]
async fn rows_no_session_receiver_can_take_are_dead_lettered() {
    let file = File::new();
    let broker = file.open().await;
    broker
        .create_queue("s", &QueueOptions::default().requires_session(true))
        .await
        .unwrap();
    broker.close().await;
    let mut conn = file.sql().await;
    let (s, next) = entity(&mut conn, "s").await;
    let now = file.now();
    let long = format!("'{}'", "x".repeat(129));
    let rows: [Columns<'_>; 7] = [
        &[("message_id", "'no-session'")],
        &[
            ("message_id", "'no-session-deferred'"),
            ("state", "2"),
            ("delivery_count", "1"),
        ],
        &[("message_id", "'not-utf8'"), ("session_id", "CAST(x'ff' AS TEXT)")],
        &[
            ("message_id", "'not-utf8-deferred'"),
            ("state", "2"),
            ("delivery_count", "1"),
            ("session_id", "CAST(x'fffe' AS TEXT)"),
        ],
        &[("message_id", "'empty'"), ("session_id", "''")],
        &[("message_id", "'long'"), ("session_id", long.as_str())],
        &[
            ("message_id", "'no-session-scheduled'"),
            ("state", "1"),
            ("scheduled_at", "0"),
        ],
    ];
    for (i, columns) in rows.iter().enumerate() {
        write(&mut conn, s, next + i as i64, columns, now).await;
    }
    raise(&mut conn, s, next + rows.len() as i64).await;
    conn.close().await.unwrap();

    let broker = file.open().await;
    let sender = broker.sender("s", SenderOptions::default()).await.unwrap();
    let mut valid = Envelope::new("{}").with_message_id("valid");
    valid.session_id = Some("valid-session".into());
    sender.send(valid).await.unwrap();
    let path = EntityPath::queue("s");
    let session = broker
        .accept_session(&path, SessionSelector::Next, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(session.session_id(), "valid-session");
    assert_eq!(drain(&*session).await, ["valid"]);
    session.release().await.unwrap();
    let Err(none) = broker
        .accept_session(&path, SessionSelector::Next, Duration::ZERO)
        .await
    else {
        panic!("no other session has messages");
    };
    assert!(matches!(none.kind(), ErrorKind::SessionNotAvailable { .. }), "{none}");
    let mut dead: Vec<(String, String, String)> = dead_letters(&broker, &path)
        .await
        .into_iter()
        .map(|m| {
            (
                m.message_id().to_owned(),
                m.broker.dead_letter_reason.clone().unwrap(),
                m.broker.dead_letter_description.clone().unwrap(),
            )
        })
        .collect();
    dead.sort();
    let reasons: Vec<(&str, &str)> = dead.iter().map(|(id, r, _)| (id.as_str(), r.as_str())).collect();
    assert_eq!(
        reasons,
        [
            ("empty", INVALID_WIRE_FORMAT),
            ("long", INVALID_WIRE_FORMAT),
            ("no-session", "SessionIdMissing"),
            ("no-session-deferred", "SessionIdMissing"),
            ("no-session-scheduled", "SessionIdMissing"),
            ("not-utf8", INVALID_WIRE_FORMAT),
            ("not-utf8-deferred", INVALID_WIRE_FORMAT),
        ]
    );
    for (id, _, description) in &dead {
        let named = if id.starts_with("no-session") {
            "no session id"
        } else {
            "session_id"
        };
        assert!(description.contains(named), "{id}: {description}");
    }
    for (_, _, description) in &dead[5..] {
        assert!(
            description.contains("not UTF-8") && description.contains("\\xff"),
            "{description}"
        );
    }
    broker.close().await;
}

/// A topic holds only scheduled messages; another program's row written to the topic
/// itself sat there for ever. It is published to the subscriptions when the broker opens
/// (a dead letter written there is dead-lettered to them, with its reason).
#[tokio::test]
async fn a_row_written_to_a_topic_itself_is_published_to_its_subscriptions() {
    let file = File::new();
    let broker = file.open().await;
    broker.create_topic("t", &TopicOptions::default()).await.unwrap();
    broker
        .create_subscription("t", "s", &QueueOptions::default())
        .await
        .unwrap();
    broker.close().await;
    let mut conn = file.sql().await;
    let (t, next) = entity(&mut conn, "t").await;
    let now = file.now();
    write(&mut conn, t, next, &[("message_id", "'ready-on-topic'")], now).await;
    write(
        &mut conn,
        t,
        next + 1,
        &[
            ("message_id", "'dead-on-topic'"),
            ("state", "3"),
            ("dl_reason", "'producer.Refused'"),
            ("dl_description", "'written dead'"),
        ],
        now,
    )
    .await;
    raise(&mut conn, t, next + 2).await;
    conn.close().await.unwrap();

    let broker = file.open().await;
    let path = EntityPath::subscription("t", "s");
    let sub = broker.receiver(&path).await.unwrap();
    assert_eq!(drain(&*sub).await, ["ready-on-topic"]);
    let dead = dead_letters(&broker, &path).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].message_id(), "dead-on-topic");
    assert_eq!(dead[0].broker.dead_letter_reason.as_deref(), Some("producer.Refused"));
    assert_eq!(dead[0].broker.dead_letter_description.as_deref(), Some("written dead"));
    broker.close().await;
}

/// A scheduled row written to a subscription itself took its number from the
/// subscription's own counter when due, which its topic's copies already used: the
/// activation failed on the row id, and with it every batch of the broker. It is numbered
/// by its topic's counter.
#[tokio::test]
async fn a_scheduled_row_on_a_subscription_is_numbered_by_its_topic() {
    let file = File::new();
    let broker = file.open().await;
    broker.create_topic("t", &TopicOptions::default()).await.unwrap();
    broker
        .create_subscription("t", "s", &QueueOptions::default())
        .await
        .unwrap();
    let publisher = broker.sender("t", SenderOptions::default()).await.unwrap();
    publisher
        .send(Envelope::new("{}").with_message_id("first"))
        .await
        .unwrap();
    broker.close().await;
    let mut conn = file.sql().await;
    let (t, next) = entity(&mut conn, "t").await;
    let (s, _) = entity(&mut conn, "s").await;
    let now = file.now();
    write(
        &mut conn,
        s,
        next,
        &[
            ("message_id", "'scheduled-on-sub'"),
            ("state", "1"),
            ("scheduled_at", &(now + 1_000_000).to_string()),
        ],
        now,
    )
    .await;
    raise(&mut conn, t, next + 1).await;
    conn.close().await.unwrap();

    let broker = file.open().await;
    file.clock.advance(Duration::from_secs(2));
    let publisher = broker.sender("t", SenderOptions::default()).await.unwrap();
    publisher
        .send(Envelope::new("{}").with_message_id("second"))
        .await
        .unwrap();
    let sub = broker.receiver(&EntityPath::subscription("t", "s")).await.unwrap();
    let mut got = drain(&*sub).await;
    got.sort();
    assert_eq!(got, ["first", "scheduled-on-sub", "second"]);
    broker.close().await;
}

/// A deferred row at the largest delivery count a row holds could be received, but its
/// lock (one more) could not be counted, so it could never be completed. Dead-lettered
/// when the broker opens.
#[tokio::test]
async fn a_deferred_row_at_the_largest_delivery_count_is_dead_lettered_when_the_broker_opens() {
    let file = File::new();
    let broker = file.open().await;
    broker.create_queue("q", &QueueOptions::default()).await.unwrap();
    broker.close().await;
    let mut conn = file.sql().await;
    let (q, next) = entity(&mut conn, "q").await;
    write(
        &mut conn,
        q,
        next,
        &[("state", "2"), ("delivery_count", "4294967295")],
        file.now(),
    )
    .await;
    raise(&mut conn, q, next + 1).await;
    conn.close().await.unwrap();
    let broker = file.open().await;
    let dead = dead_letters(&broker, &EntityPath::queue("q")).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(
        dead[0].broker.dead_letter_reason.as_deref(),
        Some(MAX_DELIVERY_COUNT_EXCEEDED)
    );
    broker.close().await;
}

/// A dead letter says why (S2.5): a receiver's empty reason or description is stored as
/// one that says none was given (before: stored empty, which the table now refuses).
#[tokio::test]
async fn an_empty_dead_letter_reason_is_stored_as_none_given() {
    let file = File::new();
    let broker = file.open().await;
    broker.create_queue("q", &QueueOptions::default()).await.unwrap();
    let sender = broker.sender("q", SenderOptions::default()).await.unwrap();
    sender.send(Envelope::new("{}").with_message_id("m")).await.unwrap();
    let receiver = broker.receiver(&EntityPath::queue("q")).await.unwrap();
    let got = receiver.receive(1, Duration::ZERO).await.unwrap();
    got.into_iter().next().unwrap().dead_letter("", "").await.unwrap();
    let dead = dead_letters(&broker, &EntityPath::queue("q")).await;
    assert_eq!(
        dead[0].broker.dead_letter_reason.as_deref(),
        Some("courier.NoReasonGiven")
    );
    assert!(
        dead[0]
            .broker
            .dead_letter_description
            .as_deref()
            .is_some_and(|d| d.contains("no description")),
        "{:?}",
        dead[0].broker.dead_letter_description
    );
    broker.close().await;
}

/// Abandoning a dead letter with properties merged them into the row's with `json_patch`,
/// which fails on properties that are not JSON (another program's row, kept as written
/// in the dead-letter sub-queue): the statement failed, and with it every command of its
/// batch. The row keeps what it holds; the abandon succeeds.
#[tokio::test]
async fn abandoning_a_dead_letter_whose_properties_are_not_json_does_not_fail() {
    let file = File::new();
    let broker = file.open().await;
    broker.create_queue("q", &QueueOptions::default()).await.unwrap();
    broker.close().await;
    let mut conn = file.sql().await;
    let (q, next) = entity(&mut conn, "q").await;
    write(
        &mut conn,
        q,
        next,
        &[
            ("state", "3"),
            ("properties", "'{\"a\":'"),
            ("dl_reason", "'producer.Refused'"),
            ("dl_description", "'written dead'"),
        ],
        file.now(),
    )
    .await;
    raise(&mut conn, q, next + 1).await;
    conn.close().await.unwrap();
    let broker = file.open().await;
    let dlq = broker.receiver(&EntityPath::queue("q").dead_letter()).await.unwrap();
    let got = dlq.receive(1, Duration::ZERO).await.unwrap();
    let d = got.into_iter().next().unwrap();
    let mut properties = courier::Properties::new();
    properties.insert("seen".into(), courier::PropertyValue::Bool(true));
    d.settle(Settlement::Abandon { properties }).await.unwrap();
    let dead = dead_letters(&broker, &EntityPath::queue("q")).await;
    assert_eq!(dead.len(), 1);
    broker.close().await;
    let mut conn = file.sql().await;
    let kept: String = sqlx::query_scalar("SELECT properties FROM courier_message WHERE entity_id = ?1")
        .bind(q)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(kept, "{\"a\":");
    conn.close().await.unwrap();
}
