//! `courier.send`, `courier.publish` and `courier.schedule`, the SQL functions other
//! producers send with (docs/postgres.md, "Messages from other producers"): the
//! documented blocks run as written (the Python one where psycopg is installed, as in CI;
//! else it is only parsed), every argument out of range is refused with SQLSTATE CL100 or
//! CL101 and a message that names it, and, over the whole space of arguments, the
//! function accepts exactly what Courier's own sender accepts and the receiver gets what
//! was sent; and a `send_batch` stores each message as a single send does.
//!
//! Long run: `COURIER_FUZZ_CASES=5000 cargo test -p courier-tests --test transport
//! pg_send_function`.

use std::process::Command;
use std::time::Duration;

use courier::{
    EntityPath, Envelope, ErrorKind, Properties, PropertyValue, QueueOptions, SenderOptions, SubscriptionOptions,
    TopicOptions, Transport, VirtualClock,
};
use courier_tests::pg::TestDatabase;
use courier_tests::pg_transport::{database, transport};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use sqlx::PgPool;
use uuid::Uuid;

/// The ```sql block of docs/postgres.md whose first line is `-- courier-doc: <tag>`, or
/// the ```python block when `tag` is "python".
fn doc_block(tag: &str) -> String {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/postgres.md")).unwrap();
    let (fence, first) = if tag == "python" {
        ("```python\n", None)
    } else {
        ("```sql\n", Some(format!("-- courier-doc: {tag}\n")))
    };
    for (i, _) in doc.match_indices(fence) {
        let body = &doc[i + fence.len()..];
        let body = &body[..body.find("```").unwrap()];
        if first.as_ref().is_none_or(|f| body.starts_with(f.as_str())) {
            return body.to_owned();
        }
    }
    panic!("docs/postgres.md has no {tag} block");
}

async fn received(t: &courier::PostgresTransport, path: &EntityPath) -> Vec<courier::ReceivedMessage> {
    received_waiting(t, path, Duration::from_millis(300)).await
}

/// Receives and completes everything receivable, waiting `wait` for more each time.
async fn received_waiting(
    t: &courier::PostgresTransport,
    path: &EntityPath,
    wait: Duration,
) -> Vec<courier::ReceivedMessage> {
    let receiver = t.receiver(path).await.unwrap();
    let mut all = Vec::new();
    loop {
        let got = receiver.receive(50, wait).await.unwrap();
        if got.is_empty() {
            all.sort_by_key(|m: &courier::ReceivedMessage| m.broker.sequence_number);
            return all;
        }
        for d in got {
            all.push(d.message().clone());
            d.complete().await.unwrap();
        }
    }
}

/// A database of the test's own (the documented blocks name fixed queues), with the queue
/// `billing`: its pool and a transport on it.
async fn database_of_its_own() -> (TestDatabase, PgPool, courier::PostgresTransport) {
    let db = TestDatabase::create().await;
    let pool = db.pool().await;
    let t = courier::PostgresTransport::from_pool(db.pool().await)
        .open()
        .await
        .unwrap();
    t.create_queue("billing", &QueueOptions::default()).await.unwrap();
    (db, pool, t)
}

#[tokio::test]
async fn the_documented_statements_send_what_they_say() {
    let (db, pool, t) = database_of_its_own().await;
    t.create_topic("orders.events", &TopicOptions::default()).await.unwrap();
    t.create_subscription("orders.events", "shop", &SubscriptionOptions::default())
        .await
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(doc_block("psql")))
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("CREATE TABLE shop_order (id bigint PRIMARY KEY, cents bigint NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(doc_block("trigger")))
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO shop_order VALUES (7, 300)")
        .execute(&pool)
        .await
        .unwrap();

    let python = doc_block("python");
    let has_psycopg = Command::new("python3")
        .args(["-c", "import psycopg"])
        .status()
        .is_ok_and(|s| s.success());
    let mut billing_ids = vec!["order-1043-charge", "order-1044-charge"];
    if has_psycopg {
        let out = Command::new("python3")
            .args(["-c", &python])
            // sqlx's own query parameters are not libpq's.
            .env("DATABASE_URL", db.url().split('?').next().unwrap())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stdout).starts_with("sent as "));
        billing_ids.push("order-1045-charge");
    } else {
        eprintln!("psycopg is not installed (pip install \"psycopg[binary]\"): the Python block is only parsed");
        let out = Command::new("python3")
            .args(["-c", "import ast, sys; ast.parse(sys.stdin.read())"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                use std::io::Write;
                child.stdin.take().unwrap().write_all(python.as_bytes())?;
                child.wait_with_output()
            })
            .unwrap();
        assert!(out.status.success(), "the Python block parses");
    }

    let billing = received(&t, &EntityPath::queue("billing")).await;
    let ids: Vec<&str> = billing.iter().map(|m| m.message_id()).collect();
    assert_eq!(ids, billing_ids);
    let second = &billing[1];
    assert_eq!(second.envelope.correlation_id.as_deref(), Some("order-1044"));
    assert_eq!(second.envelope.message_type.as_deref(), Some("billing.Charge"));
    assert_eq!(second.envelope.content_type.as_deref(), Some("application/json"));
    assert_eq!(second.envelope.time_to_live, Some(Duration::from_secs(3600)));
    assert_eq!(
        second.envelope.properties.get("tenant"),
        Some(&PropertyValue::String("acme".into()))
    );
    assert_eq!(second.envelope.properties.get("priority"), Some(&PropertyValue::Int(2)));
    assert_eq!(&second.envelope.body[..], br#"{"order": 1044, "cents": 500}"#);
    let counts = t.counts(&EntityPath::queue("billing")).await.unwrap();
    assert_eq!(counts.scheduled, 1, "the reminder waits a day");

    let shop = received(&t, &EntityPath::subscription("orders.events", "shop")).await;
    let ids: Vec<&str> = shop.iter().map(|m| m.message_id()).collect();
    assert_eq!(ids, ["order-1043-placed", "order-placed-7"]);
    assert_eq!(&shop[1].envelope.body[..], br#"{"order" : 7, "cents" : 300}"#);
    t.close().await;
    pool.close().await;
    db.drop_now().await;
}

/// The SQLSTATE and message of a failed call.
async fn call_error(pool: &PgPool, sql: &str) -> (String, String) {
    match sqlx::query(sqlx::AssertSqlSafe(sql.to_owned())).execute(pool).await {
        Err(sqlx::Error::Database(d)) => (d.code().unwrap_or_default().into_owned(), d.message().to_owned()),
        other => panic!("{sql}: {other:?}"),
    }
}

#[tokio::test]
async fn each_argument_out_of_range_is_refused_naming_it() {
    let pool = PgPool::connect_with(database().await).await.unwrap();
    let clock = VirtualClock::starting_now();
    let t = transport(&clock).await;
    let q = format!("sendfn-{}", Uuid::new_v4().simple());
    let s = format!("sendfn-s-{}", Uuid::new_v4().simple());
    let topic = format!("sendfn-t-{}", Uuid::new_v4().simple());
    t.create_queue(&q, &QueueOptions::default()).await.unwrap();
    t.create_queue(&s, &QueueOptions::default().requires_session(true))
        .await
        .unwrap();
    t.create_topic(&topic, &TopicOptions::default()).await.unwrap();
    let cases = [
        (
            format!("SELECT courier.send('{q}x', 'a', 't', '')"),
            "CL101",
            "does not exist",
        ),
        (
            format!("SELECT courier.send('{topic}', 'a', 't', '')"),
            "CL101",
            "does not exist",
        ),
        (
            format!("SELECT courier.publish('{q}', 'a', 't', '')"),
            "CL101",
            "does not exist",
        ),
        (
            "SELECT courier.send(NULL, 'a', 't', '')".into(),
            "CL100",
            "queue must be given",
        ),
        (
            format!("SELECT courier.send('{q}', '', 't', '')"),
            "CL100",
            "message_id must have 1 to 128 bytes",
        ),
        (
            format!("SELECT courier.send('{q}', NULL, 't', '')"),
            "CL100",
            "message_id must have",
        ),
        (
            format!("SELECT courier.send('{q}', repeat('é', 65), 't', '')"),
            "CL100",
            "it has 130",
        ),
        (
            format!("SELECT courier.send('{q}', 'a', 't', NULL)"),
            "CL100",
            "body must not be NULL",
        ),
        (
            format!("SELECT courier.send('{s}', 'a', 't', '')"),
            "CL100",
            "requires sessions",
        ),
        (
            format!("SELECT courier.send('{s}', 'a', 't', '', session_id => '')"),
            "CL100",
            "session_id must have",
        ),
        (
            format!("SELECT courier.send('{q}', 'a', 't', '', time_to_live => interval '0')"),
            "CL100",
            "time_to_live",
        ),
        (
            format!("SELECT courier.send('{q}', 'a', 't', '', time_to_live => interval '-1 second')"),
            "CL100",
            "between 1 millisecond and 100 years",
        ),
        (
            format!("SELECT courier.send('{q}', 'a', 't', '', time_to_live => interval '101 years')"),
            "CL100",
            "time_to_live",
        ),
        (
            format!("SELECT courier.schedule('{q}', NULL, 'a', 't', '')"),
            "CL100",
            "scheduled_at must be given",
        ),
        (
            format!("SELECT courier.schedule('{q}', 'infinity', 'a', 't', '')"),
            "CL100",
            "at most 100 years ahead",
        ),
        (
            format!("SELECT courier.schedule('{q}', '1969-12-31', 'a', 't', '')"),
            "CL100",
            "from 1970 on",
        ),
        (
            format!("SELECT courier.send('{q}', 'a', 't', '', properties => '[1]')"),
            "CL100",
            "must be a JSON object",
        ),
        (
            format!("SELECT courier.send('{q}', 'a', 't', '', properties => '{{\"k\": null}}')"),
            "CL100",
            "property 'k'",
        ),
        (
            format!("SELECT courier.send('{q}', 'a', 't', '', properties => '{{\"k\": 1e400}}')"),
            "CL100",
            "64-bit float",
        ),
        (
            format!("SELECT courier.send('{q}', 'a', 't', 'abcd', max_message_size => 4)"),
            "CL100",
            "the limit is 4",
        ),
    ];
    for (sql, code, words) in cases {
        let (got_code, message) = call_error(&pool, &sql).await;
        assert_eq!(got_code, code, "{sql}: {message}");
        assert!(
            message.starts_with("courier: ") && message.contains(words),
            "{sql}: {message}"
        );
    }
    assert_eq!(
        t.counts(&EntityPath::queue(&q)).await.unwrap().active,
        0,
        "nothing sent"
    );
    t.close().await;
    pool.close().await;
}

/// Arguments of a call, over the whole space a producer may pass (no NUL characters:
/// Postgres text cannot hold them, and the driver refuses to bind them).
#[derive(Debug, Clone)]
struct Args {
    message_id: String,
    correlation_id: Option<String>,
    session_id: Option<String>,
    ttl_ms: Option<i64>,
    properties: Option<serde_json::Value>,
    body: Vec<u8>,
}

/// A property runner of `COURIER_FUZZ_CASES` cases (`default` when unset).
fn runner(default: u32) -> TestRunner {
    let cases = std::env::var("COURIER_FUZZ_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default);
    TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    })
}

fn text(max: usize) -> impl Strategy<Value = String> {
    prop_oneof![
        proptest::string::string_regex(&format!("[a-z0-9-]{{0,{max}}}")).unwrap(),
        proptest::collection::vec(any::<char>().prop_filter("no NUL", |c| *c != '\0'), 0..max)
            .prop_map(|c| c.into_iter().collect()),
    ]
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(serde_json::Value::from),
        text(20).prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(2, 8, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..3).prop_map(serde_json::Value::from),
            proptest::collection::btree_map(text(8), inner, 0..3)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

fn args() -> impl Strategy<Value = Args> {
    (
        text(140),
        proptest::option::of(text(40)),
        proptest::option::of(text(140)),
        proptest::option::of(prop_oneof![
            Just(0_i64),
            Just(1),
            Just(-1),
            Just(3_162_240_000_000),
            Just(3_162_240_000_001),
            -10_000_000_000_000_i64..10_000_000_000_000,
        ]),
        proptest::option::of(prop_oneof![
            proptest::collection::btree_map(text(12), json_value(), 0..4)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            json_value(),
        ]),
        proptest::collection::vec(any::<u8>(), 0..300),
    )
        .prop_map(
            |(message_id, correlation_id, session_id, ttl_ms, properties, body)| Args {
                message_id,
                correlation_id,
                session_id,
                ttl_ms,
                properties,
                body,
            },
        )
}

/// The envelope Courier's own sender would be given for `a`, or `None` when the
/// properties are not what an envelope can hold (then only the function decides).
fn envelope(a: &Args) -> Option<Envelope> {
    let mut m = Envelope::new(a.body.clone());
    m.message_id = a.message_id.clone();
    m.message_type = Some("sendfn.Any".into());
    m.content_type = Some("application/json".into());
    m.correlation_id = a.correlation_id.clone();
    m.session_id = a.session_id.clone();
    m.time_to_live = match a.ttl_ms {
        None => None,
        Some(ms) if ms < 0 => return Some(m.with_time_to_live(Duration::ZERO)),
        Some(ms) => Some(Duration::from_millis(ms.unsigned_abs())),
    };
    if let Some(p) = &a.properties {
        m.properties = serde_json::from_value::<Properties>(p.clone()).ok()?;
    }
    Some(m)
}

#[test]
fn the_function_accepts_what_courier_s_sender_accepts_and_delivers_it_as_sent() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (pool, t, q, mirror) = rt.block_on(async {
        let pool = PgPool::connect_with(database().await).await.unwrap();
        let clock = VirtualClock::starting_now();
        let t = transport(&clock).await;
        let q = format!("sendfn-p-{}", Uuid::new_v4().simple());
        let mirror = format!("sendfn-m-{}", Uuid::new_v4().simple());
        for name in [&q, &mirror] {
            t.create_queue(name, &QueueOptions::default()).await.unwrap();
        }
        (pool, t, q, mirror)
    });
    let mut runner = runner(64);
    runner
        .run(&args(), |a| {
            rt.block_on(one_case(&pool, &t, &q, &mirror, &a));
            Ok(())
        })
        .unwrap();
    rt.block_on(async {
        t.close().await;
        pool.close().await;
    });
}

async fn one_case(pool: &PgPool, t: &courier::PostgresTransport, q: &str, mirror: &str, a: &Args) {
    let by_sql = sqlx::query_scalar::<_, i64>(
        "SELECT courier.send($1, $2, 'sendfn.Any', $3, correlation_id => $4, session_id => $5, \
         properties => $6::jsonb, time_to_live => $7 * interval '1 millisecond')",
    )
    .bind(q)
    .bind(&a.message_id)
    .bind(&a.body)
    .bind(&a.correlation_id)
    .bind(&a.session_id)
    .bind(a.properties.as_ref().map(serde_json::Value::to_string))
    .bind(a.ttl_ms)
    .fetch_one(pool)
    .await;
    let by_courier = match envelope(a) {
        Some(m) => {
            let sender = t.sender(mirror, SenderOptions::default()).await.unwrap();
            match sender.send(m).await {
                Ok(()) => Some(Ok(())),
                Err(e) => {
                    let e = courier::Error::from(e);
                    assert!(
                        matches!(
                            e.kind(),
                            ErrorKind::InvalidMessage { .. } | ErrorKind::MessageTooLarge { .. }
                        ),
                        "Courier's sender: {e}"
                    );
                    Some(Err(()))
                }
            }
        }
        None => None,
    };
    if by_courier.is_none() {
        assert!(by_sql.is_err(), "properties no envelope can hold were taken: {a:?}");
    }
    match &by_sql {
        Ok(_) => assert_ne!(
            by_courier,
            Some(Err(())),
            "the function took what Courier's sender refuses: {a:?}"
        ),
        Err(sqlx::Error::Database(d)) => {
            assert_eq!(d.code().as_deref(), Some("CL100"), "{a:?}: {}", d.message());
            assert!(d.message().starts_with("courier: "), "{}", d.message());
            assert_ne!(
                by_courier,
                Some(Ok(())),
                "the function refused what Courier's sender takes: {a:?}: {}",
                d.message()
            );
        }
        Err(e) => panic!("{a:?}: {e}"),
    }
    // Sent and committed before: no receive needs to wait for them.
    let got = received_waiting(t, &EntityPath::queue(q), Duration::from_millis(10)).await;
    received_waiting(t, &EntityPath::queue(mirror), Duration::from_millis(10)).await;
    if by_sql.is_err() {
        assert!(got.is_empty());
        return;
    }
    assert_eq!(got.len(), 1, "{a:?}");
    let m = &got[0].envelope;
    assert_eq!(m.message_id, a.message_id);
    assert_eq!(m.correlation_id, a.correlation_id);
    assert_eq!(m.session_id, a.session_id);
    assert_eq!(&m.body[..], &a.body[..]);
    assert_eq!(
        m.time_to_live,
        a.ttl_ms.map(|ms| Duration::from_millis(ms.unsigned_abs()))
    );
    let want: Properties = a
        .properties
        .clone()
        .map(|p| serde_json::from_value(p).unwrap())
        .unwrap_or_default();
    assert_eq!(m.properties, want);
}

/// A `send_batch` to a queue (one statement, which notifies itself) stores each message
/// as `Sender::send` stores it, over the whole space of arguments: the envelopes Courier's
/// sender takes alone are taken as one batch, and its receiver gets, in order, what the
/// receiver of the single sends got.
#[test]
fn a_batch_stores_each_message_as_a_single_send_does() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (t, alone, batched) = rt.block_on(async {
        let t = transport(&VirtualClock::starting_now()).await;
        let alone = format!("sendfn-alone-{}", Uuid::new_v4().simple());
        let batched = format!("sendfn-batch-{}", Uuid::new_v4().simple());
        for name in [&alone, &batched] {
            t.create_queue(name, &QueueOptions::default()).await.unwrap();
        }
        (t, alone, batched)
    });
    let mut runner = runner(32);
    runner
        .run(&proptest::collection::vec(args(), 2..6), |batch| {
            rt.block_on(batch_case(&t, &alone, &batched, &batch));
            Ok(())
        })
        .unwrap();
    rt.block_on(t.close());
}

async fn batch_case(t: &courier::PostgresTransport, alone: &str, batched: &str, batch: &[Args]) {
    let one = t.sender(alone, SenderOptions::default()).await.unwrap();
    let mut taken = Vec::new();
    for a in batch {
        if let Some(m) = envelope(a)
            && one.send(m.clone()).await.is_ok()
        {
            taken.push(m);
        }
    }
    let singles = received_waiting(t, &EntityPath::queue(alone), Duration::from_millis(10)).await;
    if !taken.is_empty() {
        let many = t.sender(batched, SenderOptions::default()).await.unwrap();
        many.send_batch(taken.clone())
            .await
            .unwrap_or_else(|e| panic!("a batch of what was taken alone was refused: {e}: {batch:?}"));
    }
    let got = received_waiting(t, &EntityPath::queue(batched), Duration::from_millis(10)).await;
    let envelopes = |r: &[courier::ReceivedMessage]| r.iter().map(|m| m.envelope.clone()).collect::<Vec<_>>();
    assert_eq!(envelopes(&got), envelopes(&singles), "{batch:?}");
}

/// A float property comes back as the float that was sent, through Courier's sender as
/// through `courier.send`: jsonb prints every digit of the number, which serde_json read
/// one unit in the last place away before its `float_roundtrip` feature (found by the
/// property above).
#[tokio::test]
async fn a_float_property_reads_back_bit_for_bit() {
    let clock = VirtualClock::starting_now();
    let t = transport(&clock).await;
    let q = format!("sendfn-f-{}", Uuid::new_v4().simple());
    t.create_queue(&q, &QueueOptions::default()).await.unwrap();
    let floats = [
        -7.073298054712449e264,
        0.1,
        1e-300,
        f64::MAX,
        f64::MIN_POSITIVE,
        123_456.789,
    ];
    let mut m = Envelope::new("{}");
    for (i, f) in floats.iter().enumerate() {
        m.properties.insert(format!("f{i}"), PropertyValue::Float(*f));
    }
    t.sender(&q, SenderOptions::default())
        .await
        .unwrap()
        .send(m)
        .await
        .unwrap();
    let got = received(&t, &EntityPath::queue(&q)).await;
    for (i, f) in floats.iter().enumerate() {
        match got[0].envelope.properties.get(&format!("f{i}")) {
            Some(PropertyValue::Float(back)) => assert_eq!(back.to_bits(), f.to_bits(), "{f}"),
            other => panic!("{f}: {other:?}"),
        }
    }
    t.close().await;
}

/// A producer given USAGE on the schema and nothing else sends through the functions (they
/// run with their owner's rights) but cannot write a row itself: no dead letter whose
/// record (`dl_reason`, `dl_description`) the operations command would show as the
/// transport's (issue 31).
#[tokio::test]
async fn a_producer_with_only_the_functions_sends_but_cannot_write_a_dead_letter() {
    let (db, pool, t) = database_of_its_own().await;
    let role = format!("courier_producer_{}", &Uuid::new_v4().simple().to_string()[..12]);
    // The documented grants, for a role of this test's own.
    let grants = doc_block("roles").replace("billing_producer", &role);
    sqlx::raw_sql(sqlx::AssertSqlSafe(grants)).execute(&pool).await.unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let as_producer = |sql: &'static str| format!("SET ROLE {role}; {sql}");
    sqlx::raw_sql(sqlx::AssertSqlSafe(as_producer(
        "SELECT courier.send('billing', 'from-the-producer', 'billing.Charge', convert_to('{}', 'UTF8'))",
    )))
    .execute(&mut *conn)
    .await
    .unwrap();
    let forged = sqlx::raw_sql(sqlx::AssertSqlSafe(as_producer(
        "INSERT INTO courier.message (entity_id, seq, state, enqueued_at, message_id, body, dl_reason, dl_description) \
         SELECT id, nextval('courier.message_seq'), 3, now(), 'forged', '\\x7b7d', 'courier.RetriesExhausted', \
         'FORGED' FROM courier.entity WHERE name = 'billing'",
    )))
    .execute(&mut *conn)
    .await
    .unwrap_err();
    let code = forged
        .as_database_error()
        .and_then(|e| e.code())
        .map(|c| c.into_owned());
    assert_eq!(code.as_deref(), Some("42501"), "permission denied: {forged}");
    sqlx::raw_sql("RESET ROLE").execute(&mut *conn).await.unwrap();
    drop(conn);

    let billing = received(&t, &EntityPath::queue("billing")).await;
    let ids: Vec<&str> = billing.iter().map(|m| m.message_id()).collect();
    assert_eq!(ids, ["from-the-producer"]);
    assert_eq!(t.counts(&EntityPath::queue("billing")).await.unwrap().dead_lettered, 0);
    t.close().await;
    for sql in [format!("DROP OWNED BY {role}"), format!("DROP ROLE {role}")] {
        sqlx::query(sqlx::AssertSqlSafe(sql)).execute(&pool).await.unwrap();
    }
    pool.close().await;
    db.drop_now().await;
}
