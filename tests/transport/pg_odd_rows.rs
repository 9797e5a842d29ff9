//! Rows another program writes into `courier.message` that stopped a queue, sat in it for
//! ever or defeated the retry policy (issue 30), and the way in that checks every
//! argument, `courier.send` (docs/postgres.md, "Messages from other producers"): each
//! test failed on the code before the fix.

use std::time::Duration;

use courier::reasons::{INVALID_WIRE_FORMAT, MAX_DELIVERY_COUNT_EXCEEDED};
use courier::{
    Clock, EntityPath, Envelope, ErrorKind, PostgresTransport, QueueOptions, ReceivedMessage, SenderOptions,
    SubscriptionOptions, TopicOptions, Transport, VirtualClock,
};
use courier_tests::logs::Logs;
use courier_tests::pg::TestDatabase;
use courier_tests::pg_transport::{database, transport};
use sqlx::PgPool;
use uuid::Uuid;

fn name(prefix: &str) -> String {
    format!("{prefix}-{}", Uuid::new_v4().simple())
}

async fn pool() -> PgPool {
    PgPool::connect_with(database().await).await.unwrap()
}

/// Inserts a row into `queue`'s entity with the given extra columns (`cols`, `values`:
/// SQL text of this test, never input) as another program would; the error's SQLSTATE and
/// constraint name when the database refuses it.
async fn insert_row(pool: &PgPool, entity: &str, cols: &str, values: &str) -> Result<(), (String, String)> {
    let sql = format!(
        "INSERT INTO courier.message (entity_id, seq, enqueued_at, message_id, message_type, body{cols}) \
         SELECT id, nextval('courier.message_seq'), now(), 'odd-row', 'test.Odd', '\\x7b7d'::bytea{values} \
         FROM courier.entity WHERE path = $1"
    );
    match sqlx::query(sqlx::AssertSqlSafe(sql)).bind(entity).execute(pool).await {
        Ok(done) => {
            assert_eq!(done.rows_affected(), 1, "entity {entity} exists");
            Ok(())
        }
        Err(sqlx::Error::Database(d)) => Err((
            d.code().unwrap_or_default().into_owned(),
            d.constraint().unwrap_or_default().to_owned(),
        )),
        Err(e) => panic!("{e}"),
    }
}

/// A database of the test's own (for what changes the table: a trigger, a constraint
/// dropped), a pool on it, and a transport on a virtual clock.
async fn own_database() -> (TestDatabase, PgPool, VirtualClock, PostgresTransport) {
    let db = TestDatabase::create().await;
    let pool = db.pool().await;
    let clock = VirtualClock::starting_now();
    let shared: std::sync::Arc<dyn Clock> = std::sync::Arc::new(clock.clone());
    let t = PostgresTransport::from_pool(db.pool().await)
        .clock(shared)
        .open()
        .await
        .unwrap();
    (db, pool, clock, t)
}

async fn send_valid(t: &PostgresTransport, queue: &str, id: &str) {
    let sender = t.sender(queue, SenderOptions::default()).await.unwrap();
    let mut m = Envelope::new("{}");
    m.message_id = id.to_owned();
    sender.send(m).await.unwrap();
}

/// Receives and completes everything receivable now; the message ids.
async fn drain(t: &PostgresTransport, path: &EntityPath) -> Vec<String> {
    let receiver = t.receiver(path).await.unwrap();
    let mut ids = Vec::new();
    loop {
        let got = receiver.receive(50, Duration::from_millis(100)).await.unwrap();
        if got.is_empty() {
            return ids;
        }
        for d in got {
            ids.push(d.message().message_id().to_owned());
            d.complete().await.unwrap();
        }
    }
}

async fn dead(t: &PostgresTransport, path: &EntityPath) -> Vec<ReceivedMessage> {
    t.peek(&path.clone().dead_letter(), 0, 100).await.unwrap()
}

/// Bugs 1-4: what no Courier sender writes is refused at INSERT, by a constraint named
/// for the rule. Before, a scheduled row with `ttl_ms = i64::MAX` stopped its queue for
/// ever ("interval out of range" at every receive), a negative count disabled retries,
/// a time-to-live of 0 or over 100 years skipped the delayed retries, and the others sat
/// in the queue for ever.
#[tokio::test]
async fn rows_no_sender_writes_are_refused_at_insert() {
    let pool = pool().await;
    let clock = VirtualClock::starting_now();
    let t = transport(&clock).await;
    let q = name("odd");
    t.create_queue(&q, &QueueOptions::default()).await.unwrap();
    let cases: [(&str, &str, &str); 8] = [
        (
            ", state, scheduled_at, ttl_ms",
            ", 1, now(), 9223372036854775807",
            "message_ttl_in_range",
        ),
        (
            ", state, scheduled_at, ttl_ms",
            ", 1, now(), 10000000000000000",
            "message_ttl_in_range",
        ),
        (
            ", state, delivery_count",
            ", 0, -2147483648",
            "message_delivery_count_not_negative",
        ),
        (", state, ttl_ms", ", 0, 0", "message_ttl_in_range"),
        (", state, ttl_ms", ", 0, 3162240000001", "message_ttl_in_range"),
        (", state", ", 2", "message_deferred_was_delivered"),
        (", state, locked_until", ", 0, 'infinity'", "message_lock_has_holder"),
        (", state", ", 1", "message_scheduled_has_time"),
    ];
    for (cols, values, constraint) in cases {
        let refused = insert_row(&pool, &q, cols, values).await;
        assert_eq!(
            refused,
            Err(("23514".to_owned(), constraint.to_owned())),
            "{cols} = {values}"
        );
    }
    send_valid(&t, &q, "valid").await;
    assert_eq!(drain(&t, &EntityPath::queue(&q)).await, ["valid"]);
    t.close().await;
    pool.close().await;
}

/// Bug 4: rows the constraints admit but no claim takes are dead-lettered with a reason
/// (or made receivable) by the sweep, within its period, and the valid message behind
/// each is received once: a row at the max delivery count without a lock, a session
/// queue's row without a session id, a row on a topic itself, and locks that end further
/// ahead than any lock Courier takes (a live holder's key, a gone holder's).
#[tokio::test]
async fn rows_no_claim_takes_are_dead_lettered_or_released() {
    let pool = pool().await;
    let clock = VirtualClock::starting_now();
    let t = transport(&clock).await;
    let q = name("odd");
    t.create_queue(&q, &QueueOptions::default()).await.unwrap();
    let path = EntityPath::queue(&q);

    insert_row(&pool, &q, ", state, delivery_count", ", 0, 10")
        .await
        .unwrap();
    send_valid(&t, &q, "behind-exhausted").await;
    assert_eq!(drain(&t, &path).await, ["behind-exhausted"]);
    let dead_letters = dead(&t, &path).await;
    assert_eq!(dead_letters.len(), 1);
    assert_eq!(
        dead_letters[0].broker.dead_letter_reason.as_deref(),
        Some(MAX_DELIVERY_COUNT_EXCEEDED)
    );

    // A lock for ever, with the key of a holder that is alive (any transport's) or gone.
    let live: i64 = sqlx::query_scalar(
        "SELECT (classid::bigint << 32) | objid::bigint FROM pg_locks WHERE locktype = 'advisory' \
         AND objsubid = 1 AND granted LIMIT 1",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    for holder in [live, 12345] {
        insert_row(
            &pool,
            &q,
            ", state, locked_until, holder, delivery_count",
            &format!(", 0, 'infinity', {holder}, 1"),
        )
        .await
        .unwrap();
        assert_eq!(drain(&t, &path).await, ["odd-row"], "holder {holder}");
    }

    let s = name("odd-sessions");
    t.create_queue(&s, &QueueOptions::default().requires_session(true))
        .await
        .unwrap();
    insert_row(&pool, &s, ", state", ", 0").await.unwrap();
    clock.advance(Duration::from_secs(11));
    let counts = t.counts(&EntityPath::queue(&s)).await.unwrap();
    assert_eq!((counts.active, counts.dead_lettered), (0, 1), "{counts:?}");
    let dead_letters = dead(&t, &EntityPath::queue(&s)).await;
    assert_eq!(
        dead_letters[0].broker.dead_letter_reason.as_deref(),
        Some("SessionIdMissing")
    );

    let topic = name("odd-topic");
    t.create_topic(&topic, &TopicOptions::default()).await.unwrap();
    t.create_subscription(&topic, "sub", &SubscriptionOptions::default())
        .await
        .unwrap();
    insert_row(&pool, &topic, ", state", ", 0").await.unwrap();
    clock.advance(Duration::from_secs(11));
    assert_eq!(
        drain(&t, &EntityPath::subscription(&topic, "sub")).await,
        ["odd-row"],
        "a row on the topic itself is published to its subscriptions"
    );
    t.close().await;
    pool.close().await;
}

/// Bug 1's class, one row: a scheduled row whose activation Postgres refuses (here a
/// trigger of the application's raises for it) is dead-lettered alone, with the
/// database's error as its description; the scheduled row beside it is activated and the
/// valid messages are received. Before, every receive of the queue failed and the log
/// said only "cannot activate scheduled or expired messages".
#[tokio::test(flavor = "current_thread")]
async fn a_row_whose_activation_fails_is_dead_lettered_alone() {
    let logs = Logs::default();
    let _guard = logs.capture();
    let (db, pool, clock, t) = own_database().await;
    sqlx::raw_sql(
        "CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN RAISE EXCEPTION 'the poison row is refused by a trigger'; END $$; \
         CREATE TRIGGER refuse_poison BEFORE INSERT ON courier.message FOR EACH ROW \
         WHEN (NEW.message_id = 'poison' AND NEW.state <> 1) EXECUTE FUNCTION refuse_poison();",
    )
    .execute(&pool)
    .await
    .unwrap();
    let q = name("poisoned");
    t.create_queue(&q, &QueueOptions::default()).await.unwrap();
    let sender = t.sender(&q, SenderOptions::default()).await.unwrap();
    for id in ["poison", "scheduled-beside"] {
        let mut m = Envelope::new("{}");
        m.message_id = id.into();
        sender
            .schedule(m, clock.now() + chrono::Duration::seconds(1))
            .await
            .unwrap();
    }
    clock.advance(Duration::from_secs(2));
    for n in 0..3 {
        send_valid(&t, &q, &format!("valid-{n}")).await;
    }
    let mut got = drain(&t, &EntityPath::queue(&q)).await;
    got.sort();
    assert_eq!(got, ["scheduled-beside", "valid-0", "valid-1", "valid-2"]);
    let dead_letters = dead(&t, &EntityPath::queue(&q)).await;
    assert_eq!(dead_letters.len(), 1);
    assert_eq!(dead_letters[0].message_id(), "poison");
    assert_eq!(
        dead_letters[0].broker.dead_letter_reason.as_deref(),
        Some(INVALID_WIRE_FORMAT)
    );
    let why = dead_letters[0]
        .broker
        .dead_letter_description
        .as_deref()
        .unwrap_or_default();
    assert!(
        why.contains("could not be activated")
            && why.contains("the poison row is refused by a trigger (SQLSTATE P0001)"),
        "{why}"
    );
    let text = logs.text();
    assert!(
        text.contains("a scheduled message could not be activated: it was dead-lettered"),
        "{text}"
    );
    t.close().await;
    pool.close().await;
    db.drop_now().await;
}

/// Bug 1's class, no one row: whatever else makes the maintenance fail (here a trigger
/// refuses every dead-lettering of an expired message) does not fail the receives of the
/// queue; the failure is logged once with the database's cause and tried again after a
/// backoff, not at every receive.
#[tokio::test(flavor = "current_thread")]
async fn a_maintenance_that_fails_does_not_stop_the_queue() {
    let logs = Logs::default();
    let _guard = logs.capture();
    let (db, pool, clock, t) = own_database().await;
    sqlx::raw_sql(
        "CREATE FUNCTION refuse_expiry() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN RAISE EXCEPTION 'expiry is refused by a trigger'; END $$; \
         CREATE TRIGGER refuse_expiry BEFORE UPDATE ON courier.message FOR EACH ROW \
         WHEN (NEW.state = 3 AND NEW.dl_reason = 'TTLExpiredException') EXECUTE FUNCTION refuse_expiry();",
    )
    .execute(&pool)
    .await
    .unwrap();
    let q = name("failing");
    t.create_queue(&q, &QueueOptions::default()).await.unwrap();
    let sender = t.sender(&q, SenderOptions::default()).await.unwrap();
    let mut expiring = Envelope::new("{}");
    expiring.message_id = "expiring".into();
    expiring.time_to_live = Some(Duration::from_secs(1));
    sender.send(expiring).await.unwrap();
    clock.advance(Duration::from_secs(2));
    for n in 0..5 {
        send_valid(&t, &q, &format!("valid-{n}")).await;
    }
    let got = drain(&t, &EntityPath::queue(&q)).await;
    assert_eq!(got, ["valid-0", "valid-1", "valid-2", "valid-3", "valid-4"]);
    let text = logs.text();
    assert!(text.contains("expiry is refused by a trigger"), "{text}");
    assert!(text.contains("P0001"), "the SQLSTATE: {text}");
    assert_eq!(
        text.matches("the maintenance of the queue failed").count(),
        1,
        "backed off, not tried at every receive: {text}"
    );
    t.close().await;
    pool.close().await;
    db.drop_now().await;
}

/// Bug 7: the maintenance's own dead-letterings are logged (one line per reason, with a
/// count and the first message id, escaped).
#[tokio::test(flavor = "current_thread")]
async fn the_maintenance_logs_what_it_dead_letters() {
    let logs = Logs::default();
    let _guard = logs.capture();
    let clock = VirtualClock::starting_now();
    let t = transport(&clock).await;
    let q = name("expiring");
    t.create_queue(&q, &QueueOptions::default()).await.unwrap();
    let sender = t.sender(&q, SenderOptions::default()).await.unwrap();
    for n in 0..3 {
        let mut m = Envelope::new("{}");
        m.message_id = format!("exp-\u{1b}[31m-{n}");
        m.time_to_live = Some(Duration::from_secs(1));
        sender.send(m).await.unwrap();
    }
    clock.advance(Duration::from_secs(2));
    assert!(drain(&t, &EntityPath::queue(&q)).await.is_empty());
    assert_eq!(dead(&t, &EntityPath::queue(&q)).await.len(), 3);
    let text = logs.text();
    let line = text
        .lines()
        .find(|l| l.contains("the maintenance dead-lettered messages of the queue"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        line.contains("TTLExpiredException") && line.contains("count=3"),
        "{line}"
    );
    assert!(line.contains("exp-\\u{1b}[31m-0"), "the first id, escaped: {line}");
    assert!(!text.contains('\u{1b}'), "{text}");
    t.close().await;
}

/// Bug 5: a database whose encoding is not UTF8 is refused at open, saying what to do
/// (before, one text that was not UTF-8 failed every receive of its queue).
#[tokio::test]
async fn a_database_that_is_not_utf8_is_refused() {
    let db = TestDatabase::create().await;
    let pool = db.pool().await;
    let ascii = format!("courier_ascii_{}", Uuid::new_v4().simple());
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE DATABASE {ascii} ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"
    )))
    .execute(&pool)
    .await
    .unwrap();
    let options = db.options.clone().database(&ascii);
    let ascii_pool = PgPool::connect_with(options).await.unwrap();
    let err = PostgresTransport::from_pool(ascii_pool.clone())
        .open()
        .await
        .unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::InvalidOptions { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("SQL_ASCII") && text.contains("ENCODING 'UTF8'"), "{text}");
    ascii_pool.close().await;
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE {ascii} WITH (FORCE)")))
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    db.drop_now().await;
}

/// A stored time-to-live out of range (a row of a table written before the constraint,
/// or the embedded broker's file) is refused at receive: dead-lettered with the reason
/// instead of skipping the delayed retries.
#[tokio::test]
async fn a_time_to_live_out_of_range_is_refused_at_receive() {
    let (db, pool, _clock, t) = own_database().await;
    sqlx::query("ALTER TABLE courier.message DROP CONSTRAINT message_ttl_in_range")
        .execute(&pool)
        .await
        .unwrap();
    let q = name("ttl");
    t.create_queue(&q, &QueueOptions::default()).await.unwrap();
    insert_row(&pool, &q, ", state, ttl_ms", ", 0, 0").await.unwrap();
    // Scheduled with a time-to-live Postgres cannot add to a time: activated (its expiry
    // bounded), then refused.
    insert_row(
        &pool,
        &q,
        ", state, scheduled_at, ttl_ms",
        ", 1, now() - interval '1 day', 9223372036854775807",
    )
    .await
    .unwrap();
    send_valid(&t, &q, "valid").await;
    assert_eq!(drain(&t, &EntityPath::queue(&q)).await, ["valid"]);
    let dead_letters = dead(&t, &EntityPath::queue(&q)).await;
    assert_eq!(dead_letters.len(), 2, "{dead_letters:?}");
    for d in &dead_letters {
        assert_eq!(d.broker.dead_letter_reason.as_deref(), Some(INVALID_WIRE_FORMAT));
        let why = d.broker.dead_letter_description.as_deref().unwrap_or_default();
        assert!(why.contains("time-to-live"), "{why}");
    }
    t.close().await;
    pool.close().await;
    db.drop_now().await;
}

/// A scheduled message that expired before it became due is dead-lettered as it
/// activates, in the same run of the maintenance (found by the row property: it was
/// activated, then sat active and expired until some later receive).
#[tokio::test]
async fn a_message_that_expired_before_it_was_due_is_dead_lettered_as_it_activates() {
    let clock = VirtualClock::starting_now();
    let t = transport(&clock).await;
    let q = name("expired-scheduled");
    t.create_queue(&q, &QueueOptions::default()).await.unwrap();
    let sender = t.sender(&q, SenderOptions::default()).await.unwrap();
    let mut m = Envelope::new("{}");
    m.message_id = "short-lived".into();
    m.time_to_live = Some(Duration::from_millis(1));
    sender
        .schedule(m, clock.now() + chrono::Duration::seconds(1))
        .await
        .unwrap();
    clock.advance(Duration::from_secs(2));
    let counts = t.counts(&EntityPath::queue(&q)).await.unwrap();
    assert_eq!(
        (counts.active, counts.scheduled, counts.dead_lettered),
        (0, 0, 1),
        "{counts:?}"
    );
    let dead_letters = dead(&t, &EntityPath::queue(&q)).await;
    assert_eq!(
        dead_letters[0].broker.dead_letter_reason.as_deref(),
        Some("TTLExpiredException")
    );
    t.close().await;
}
