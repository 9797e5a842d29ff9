//! The `courier` binary as an operator runs it: tables, JSON, dry runs, confirmation and
//! exit codes, against broker and store files made for each test.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use courier::admin::{EmbeddedAdmin, QueueAdmin};
use courier::{Embedded, EntityPath, Envelope, QueueOptions, SenderOptions, SqliteStore, Store, Transport};

struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs `courier` with `args`, writing `stdin` to it.
fn courier(args: &[&str], stdin: &str) -> Ran {
    let mut child = Command::new(env!("CARGO_BIN_EXE_courier"))
        .args(args)
        .env_remove("COURIER_EMBEDDED")
        .env_remove("COURIER_POSTGRES")
        .env_remove("COURIER_SQLITE")
        .env_remove("COURIER_RABBITMQ")
        .env_remove("COURIER_RABBITMQ_MANAGEMENT")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    Ran {
        code: out.status.code().unwrap(),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

/// A broker file whose queue `orders` holds `bodies.len()` dead letters (the broker is
/// closed again); returns their sequence numbers.
async fn broker_with_dead_letters(path: &Path, bodies: &[&str]) -> Vec<i64> {
    let broker = Embedded::open(path).await.unwrap();
    broker.create_queue("orders", &QueueOptions::default()).await.unwrap();
    let sender = broker.sender("orders", SenderOptions::default()).await.unwrap();
    for (i, body) in bodies.iter().enumerate() {
        let mut m = Envelope::new(body.to_string());
        m.message_id = format!("order-{i}");
        m.message_type = Some("shop.PlaceOrder".into());
        m.properties
            .insert("courier.failure.error".into(), "the tax service said no".into());
        sender.send(m).await.unwrap();
    }
    let receiver = broker.receiver(&EntityPath::queue("orders")).await.unwrap();
    let mut left = bodies.len();
    while left > 0 {
        for d in receiver.receive(left, Duration::from_secs(5)).await.unwrap() {
            d.dead_letter("test.Poison", "broken on purpose").await.unwrap();
            left -= 1;
        }
    }
    let seqs = EmbeddedAdmin::new(broker.clone())
        .all_dead_letters("orders")
        .await
        .unwrap();
    broker.close().await;
    seqs
}

async fn counts(path: &Path) -> (u64, u64) {
    let admin = EmbeddedAdmin::open(path).await.unwrap();
    let q = admin.queues().await.unwrap().remove(0);
    admin.close().await;
    (q.active, q.dead_lettered)
}

#[tokio::test]
async fn queues_and_dead_letters_are_listed_as_tables_and_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("broker.db");
    let seqs = broker_with_dead_letters(&file, &["{\"id\":1}", "{\"id\":2}"]).await;
    let f = file.to_str().unwrap();

    let ran = courier(&["--embedded", f, "queues"], "");
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let mut lines = ran.stdout.lines();
    assert!(lines.next().unwrap().starts_with("NAME"));
    let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(row[..7], ["orders", "queue", "0", "0", "0", "0", "2"]);

    let ran = courier(&["--embedded", f, "--json", "queues"], "");
    let json: serde_json::Value = serde_json::from_str(&ran.stdout).unwrap();
    assert_eq!(json[0]["name"], "orders");
    assert_eq!(json[0]["dead_lettered"], 2);

    let ran = courier(&["--embedded", f, "dlq", "list", "orders"], "");
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(ran.stdout.contains("test.Poison"), "{}", ran.stdout);
    // The failure header was written by the sender, not by Courier's dead-lettering: the
    // list shows the dead-letter description, not that text (issue 31 point 6).
    assert!(ran.stdout.contains("broken on purpose"), "{}", ran.stdout);
    assert!(!ran.stdout.contains("the tax service said no"), "{}", ran.stdout);
    assert!(ran.stdout.contains("2 of 2 dead letters of orders"), "{}", ran.stdout);

    let ran = courier(
        &["--embedded", f, "dlq", "list", "orders", "--limit", "1", "--json"],
        "",
    );
    let page: serde_json::Value = serde_json::from_str(&ran.stdout).unwrap();
    assert_eq!(page["items"][0]["sequence_number"], seqs[0]);
    assert_eq!(page["next_after"], seqs[0]);
    assert_eq!(page["total"], 2);
}

#[tokio::test]
async fn show_prints_the_failure_and_the_body_and_escapes_control_characters() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("broker.db");
    let seqs = broker_with_dead_letters(&file, &["{\"id\":7}", "evil\u{1b}[2J<script>"]).await;
    let f = file.to_str().unwrap();

    let ran = courier(&["--embedded", f, "dlq", "show", "orders", &seqs[0].to_string()], "");
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    for want in [
        "message id:     order-0",
        "reason:         test.Poison",
        "broken on purpose",
        "\"id\": 7",
    ] {
        assert!(ran.stdout.contains(want), "{want} in {}", ran.stdout);
    }
    assert!(ran.stdout.contains("the tax service said no"));

    let ran = courier(&["--embedded", f, "dlq", "show", "orders", &seqs[1].to_string()], "");
    assert!(!ran.stdout.contains('\u{1b}'), "{}", ran.stdout);
    assert!(ran.stdout.contains("evil\\u{1b}[2J<script>"), "{}", ran.stdout);

    let ran = courier(
        &["--embedded", f, "--json", "dlq", "show", "orders", &seqs[0].to_string()],
        "",
    );
    let json: serde_json::Value = serde_json::from_str(&ran.stdout).unwrap();
    assert_eq!(json["body"], serde_json::json!({"kind": "json", "value": {"id": 7}}));
    assert_eq!(json["delivery_count"], 1);
}

#[tokio::test]
async fn a_dry_run_and_a_refused_confirmation_change_nothing_and_a_resubmit_moves_the_message() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("broker.db");
    let seqs = broker_with_dead_letters(&file, &["{}", "{}", "{}"]).await;
    let f = file.to_str().unwrap();
    let first = seqs[0].to_string();

    let ran = courier(&["--embedded", f, "dlq", "resubmit", "orders", &first, "--dry-run"], "");
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(
        ran.stdout.contains(&format!("would resubmit {first}")),
        "{}",
        ran.stdout
    );
    assert_eq!(counts(&file).await, (0, 3));

    let ran = courier(&["--embedded", f, "dlq", "resubmit", "orders", &first], "n\n");
    assert_eq!(ran.code, 6, "{}", ran.stderr);
    assert!(ran.stderr.contains("[y/N]"), "{}", ran.stderr);
    assert_eq!(counts(&file).await, (0, 3));

    let ran = courier(&["--embedded", f, "dlq", "resubmit", "orders", &first], "y\n");
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert_eq!(counts(&file).await, (1, 2));

    let ran = courier(
        &["--embedded", f, "--json", "--yes", "dlq", "resubmit", "orders", "--all"],
        "",
    );
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let outcome: serde_json::Value = serde_json::from_str(&ran.stdout).unwrap();
    assert_eq!(outcome["done"], serde_json::json!([seqs[1], seqs[2]]));
    assert_eq!(counts(&file).await, (3, 0));
}

#[tokio::test]
async fn the_prompt_counts_only_dead_letters_that_exist_and_show_cuts_a_large_body() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("broker.db");
    // Under the embedded broker's 1-MiB limit, on one line.
    let big = format!("{{\"text\":\"{}\"}}", "x".repeat(900_000));
    let seqs = broker_with_dead_letters(&file, &["{}", big.as_str()]).await;
    let f = file.to_str().unwrap();
    let (first, missing) = (seqs[0].to_string(), (seqs[1] + 1000).to_string());
    // `resubmit 6 99` with 99 not a dead letter: the prompt says 1, and names 99.
    let ran = courier(&["--embedded", f, "dlq", "resubmit", "orders", &first, &missing], "n\n");
    assert_eq!(ran.code, 6, "{}", ran.stderr);
    assert!(ran.stderr.contains("Resubmit 1 dead letter(s)"), "{}", ran.stderr);
    assert!(ran.stderr.contains(&format!("left out: [{missing}]")), "{}", ran.stderr);
    // Only numbers that are not there: nothing asked, exit code 3.
    let ran = courier(&["--embedded", f, "dlq", "resubmit", "orders", &missing], "");
    assert_eq!(ran.code, 3, "{}", ran.stderr);
    assert!(!ran.stderr.contains("[y/N]"), "{}", ran.stderr);
    assert_eq!(counts(&file).await, (0, 2));
    // A 1-MiB body is cut, and --full prints it whole.
    let large = seqs[1].to_string();
    let ran = courier(&["--embedded", f, "dlq", "show", "orders", &large], "");
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(ran.stdout.len() < 20_000, "{} bytes printed", ran.stdout.len());
    assert!(ran.stdout.contains("cut after 4096 of"), "{}", &ran.stdout[..2000]);
    let ran = courier(&["--embedded", f, "dlq", "show", "orders", &large, "--full"], "");
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(ran.stdout.len() > 900_000, "{} bytes printed", ran.stdout.len());
}

#[tokio::test]
async fn delete_asks_and_then_deletes_for_good() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("broker.db");
    let seqs = broker_with_dead_letters(&file, &["{}", "{}"]).await;
    let f = file.to_str().unwrap();
    let ran = courier(
        &[
            "--embedded",
            f,
            "dlq",
            "delete",
            "orders",
            "--all",
            "--dry-run",
            "--json",
        ],
        "",
    );
    let json: serde_json::Value = serde_json::from_str(&ran.stdout).unwrap();
    assert_eq!(json["dry_run"], true);
    assert_eq!(json["sequence_numbers"], serde_json::json!(seqs));
    let ran = courier(
        &["--embedded", f, "-y", "dlq", "delete", "orders", &seqs[0].to_string()],
        "",
    );
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert_eq!(counts(&file).await, (0, 1));
}

#[tokio::test]
async fn exit_codes_say_what_went_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("broker.db");
    let seqs = broker_with_dead_letters(&file, &["{}"]).await;
    let f = file.to_str().unwrap();

    // Not found: the file (not created), the queue, the message, some of those given.
    let missing = dir.path().join("missing.db");
    let ran = courier(&["--embedded", missing.to_str().unwrap(), "queues"], "");
    assert_eq!(ran.code, 3, "{}", ran.stderr);
    assert!(!missing.exists());
    assert_eq!(courier(&["--embedded", f, "dlq", "list", "nope"], "").code, 3);
    assert_eq!(courier(&["--embedded", f, "dlq", "show", "orders", "999"], "").code, 3);
    let ran = courier(&["--embedded", f, "-y", "dlq", "resubmit", "orders", "999"], "");
    assert_eq!(ran.code, 3, "{}", ran.stdout);
    assert_eq!(counts(&file).await, (0, 1));

    // Usage: nothing to connect to, a bad command line, a store command without a store.
    assert_eq!(courier(&["queues"], "").code, 2);
    assert_eq!(courier(&["--embedded", f, "dlq", "resubmit", "orders"], "").code, 2);

    // Refused: a broker file that a running process holds is read-only.
    let running = Embedded::open(&file).await.unwrap();
    let ran = courier(&["--embedded", f, "dlq", "list", "orders"], "");
    assert_eq!(ran.code, 0, "reads work on a file in use: {}", ran.stderr);
    let ran = courier(
        &["--embedded", f, "-y", "dlq", "resubmit", "orders", &seqs[0].to_string()],
        "",
    );
    assert_eq!(ran.code, 4, "{}", ran.stderr);
    assert!(ran.stderr.contains("in use"), "{}", ran.stderr);
    running.close().await;
    assert_eq!(counts(&file).await, (0, 1));

    // Refused: a database without Courier's tables (not the application's, or never
    // migrated) says so and what to do, instead of SQL's "no such table".
    let empty = dir.path().join("empty.db");
    std::fs::File::create(&empty).unwrap();
    let ran = courier(&["--sqlite", empty.to_str().unwrap(), "sagas", "types"], "");
    assert_eq!(ran.code, 4, "{}", ran.stderr);
    assert!(ran.stderr.contains("has no table courier_saga"), "{}", ran.stderr);
    assert!(ran.stderr.contains("migrations"), "{}", ran.stderr);

    // Cannot connect, and the password is never shown.
    let ran = courier(
        &[
            "--postgres",
            "postgres://app:hunter2@127.0.0.1:1/shop",
            "sagas",
            "types",
        ],
        "",
    );
    assert_eq!(ran.code, 5, "{}", ran.stderr);
    assert!(!ran.stderr.contains("hunter2"), "{}", ran.stderr);
    assert!(ran.stderr.contains("app:***@127.0.0.1:1/shop"), "{}", ran.stderr);
}

#[tokio::test]
async fn sagas_are_listed_shown_and_completed_with_a_logged_reason() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("store.db");
    let store = SqliteStore::open(&file).await.unwrap();
    store.migrate().await.unwrap();
    courier::sqlx::query(
        "INSERT INTO courier_saga (saga_type, correlation, state, version, created_at, updated_at) VALUES \
         ('OrderSaga', 'order-1', '{\"step\":\"paid\"}', 2, 0, 0), ('OrderSaga', 'order-2', '{}', 1, 0, 0)",
    )
    .execute(store.pool())
    .await
    .unwrap();
    courier::sqlx::query(
        "INSERT INTO courier_saga_timeout (id, endpoint, saga_type, correlation, due_at, envelope, body, created_at) \
         VALUES ('t-1', 'orders', 'OrderSaga', 'order-1', 0, '{\"message_id\":\"t-1\"}', X'00', 0)",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let f = file.to_str().unwrap();

    let ran = courier(&["--sqlite", f, "sagas", "list", "OrderSaga", "--with-timeout"], "");
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(
        ran.stdout.contains("order-1") && !ran.stdout.contains("order-2"),
        "{}",
        ran.stdout
    );

    let ran = courier(&["--sqlite", f, "sagas", "show", "OrderSaga", "order-1"], "");
    assert!(ran.stdout.contains("\"step\": \"paid\""), "{}", ran.stdout);
    assert!(ran.stdout.contains("t-1"), "{}", ran.stdout);

    let ran = courier(&["--sqlite", f, "--json", "timeouts", "--overdue"], "");
    let list: serde_json::Value = serde_json::from_str(&ran.stdout).unwrap();
    assert_eq!(list[0]["id"], "t-1");

    let ran = courier(
        &[
            "--sqlite",
            f,
            "-y",
            "sagas",
            "complete",
            "OrderSaga",
            "order-1",
            "--reason",
            " ",
        ],
        "",
    );
    assert_eq!(ran.code, 4, "{}", ran.stderr);
    let ran = courier(
        &[
            "--sqlite",
            f,
            "sagas",
            "complete",
            "OrderSaga",
            "order-1",
            "--reason",
            "refunded by hand",
            "--dry-run",
        ],
        "",
    );
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(ran.stdout.contains("dry run"), "{}", ran.stdout);
    let ran = courier(
        &[
            "--sqlite",
            f,
            "-y",
            "sagas",
            "complete",
            "OrderSaga",
            "order-1",
            "--reason",
            "refunded by hand",
        ],
        "",
    );
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(ran.stdout.contains("removed 1 timeout(s)"), "{}", ran.stdout);
    assert!(
        ran.stderr.contains("refunded by hand"),
        "the reason is logged: {}",
        ran.stderr
    );
    let ran = courier(&["--sqlite", f, "sagas", "show", "OrderSaga", "order-1"], "");
    assert_eq!(ran.code, 3, "{}", ran.stderr);
}

/// A name no earlier run used (tests share the servers).
fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{prefix}-{}-{nanos}", std::process::id())
}

/// Sends `n` messages to `queue` of `transport` and dead-letters them.
async fn dead_letter_on(transport: &dyn Transport, queue: &str, n: usize) {
    transport.create_queue(queue, &QueueOptions::default()).await.unwrap();
    let sender = transport.sender(queue, SenderOptions::default()).await.unwrap();
    for i in 0..n {
        let mut m = Envelope::new(format!("{{\"id\":{i}}}"));
        m.message_id = format!("order-{i}");
        m.message_type = Some("shop.PlaceOrder".into());
        m.properties
            .insert("courier.failure.error".into(), "the tax service said no".into());
        sender.send(m).await.unwrap();
    }
    let receiver = transport.receiver(&EntityPath::queue(queue)).await.unwrap();
    let mut left = n;
    while left > 0 {
        for d in receiver.receive(left, Duration::from_secs(5)).await.unwrap() {
            d.dead_letter("test.Poison", "broken on purpose").await.unwrap();
            left -= 1;
        }
    }
}

fn json_of(ran: &Ran) -> serde_json::Value {
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    serde_json::from_str(&ran.stdout).unwrap()
}

#[tokio::test]
async fn the_postgres_transport_dead_letters_are_listed_shown_resubmitted_and_deleted() {
    let db = courier::test_servers::postgres_database().await.unwrap();
    let transport = courier::PostgresTransport::connect(&db.url()).await.unwrap();
    dead_letter_on(&transport, "orders", 3).await;
    // A password in the URL is never printed: the container's own, or one put in the URL
    // of a server that trusts any (DATABASE_URL on this machine).
    let own = db
        .url()
        .split_once("://")
        .and_then(|(_, rest)| rest.split_once('@'))
        .and_then(|(user_info, _)| user_info.split_once(':'))
        .map(|(_, password)| password.to_owned());
    let (url, password) = match own {
        Some(password) => (db.url(), password),
        None => (
            db.url().replacen("://postgres@", "://postgres:hunter2@", 1),
            "hunter2".to_owned(),
        ),
    };
    let secret = format!(":{password}@");
    assert!(url.contains(&secret), "{url}");
    let pg = ["--postgres", url.as_str()];
    let run = |args: &[&str], stdin: &str| courier(&[&pg[..], args].concat(), stdin);

    let ran = run(&["queues"], "");
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let row: Vec<&str> = ran.stdout.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(row[..7], ["orders", "queue", "0", "0", "0", "0", "3"]);

    let page = json_of(&run(&["--json", "dlq", "list", "orders", "--limit", "2"], ""));
    assert_eq!(page["total"], 3);
    assert_eq!(page["items"][0]["message_id"], "order-0");
    assert_eq!(page["items"][0]["reason"], "test.Poison");
    let seqs: Vec<i64> = (0..2)
        .map(|i| page["items"][i]["sequence_number"].as_i64().unwrap())
        .collect();
    let rest = json_of(&run(
        &["--json", "dlq", "list", "orders", "--after", &seqs[1].to_string()],
        "",
    ));
    let third = rest["items"][0]["sequence_number"].as_i64().unwrap();

    let ran = run(&["dlq", "show", "orders", &seqs[0].to_string()], "");
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(ran.stdout.contains("\"id\": 0"), "{}", ran.stdout);
    assert!(ran.stdout.contains("the tax service said no"), "{}", ran.stdout);

    let ran = run(&["--yes", "dlq", "resubmit", "orders", &seqs[0].to_string()], "");
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let ran = run(&["--yes", "dlq", "delete", "orders", &seqs[1].to_string()], "");
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let ran = run(&["--yes", "dlq", "delete", "orders", &seqs[1].to_string()], "");
    assert_eq!(ran.code, 3, "not found: {}", ran.stderr);
    let ran = run(&["dlq", "resubmit", "orders", "--all", "--dry-run"], "");
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(ran.stdout.contains(&third.to_string()), "{}", ran.stdout);

    let queues = json_of(&run(&["--json", "queues"], ""));
    assert_eq!(
        (queues[0]["active"].as_u64(), queues[0]["dead_lettered"].as_u64()),
        (Some(1), Some(1))
    );
    let received = transport
        .receiver(&EntityPath::queue("orders"))
        .await
        .unwrap()
        .receive(1, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(received[0].message().envelope.message_id, "order-0");
    assert_eq!(received[0].message().broker.delivery_count, 1);
    for ran in [run(&["queues"], ""), run(&["dlq", "list", "nope"], "")] {
        assert!(!ran.stdout.contains(&secret) && !ran.stderr.contains(&secret));
        assert!(!ran.stdout.contains(&url) && !ran.stderr.contains(&url));
    }
    transport.close().await;
    db.drop_database().await.unwrap();
}

#[tokio::test]
async fn rabbitmq_queues_are_listed_from_the_schedule_store_and_dead_letters_resubmitted() {
    // A virtual host of its own on the test broker (AMQP_URL, or a container).
    let vhost = courier::test_servers::rabbitmq_vhost().await.unwrap();
    let amqp = vhost.url().to_owned();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("store.db");
    let store = SqliteStore::open(&file).await.unwrap();
    store.migrate().await.unwrap();
    let transport = courier::AmqpTransport::builder(amqp.as_str())
        .schedules(&store)
        .open()
        .await
        .unwrap();
    let queue = unique("cli-orders");
    dead_letter_on(&transport, &queue, 2).await;
    // Its receiver's consumer would take the resubmitted messages (RabbitMQ counts only
    // the ready ones): closed, and a transport without a consumer counts afterwards.
    transport.close().await;
    let transport = courier::AmqpTransport::builder(amqp.as_str())
        .schedules(&store)
        .open()
        .await
        .unwrap();
    let f = file.to_str().unwrap();
    let rabbit = ["--rabbitmq", amqp.as_str(), "--sqlite", f];
    let run = |args: &[&str]| courier(&[&rabbit[..], args].concat(), "");

    let queues = json_of(&run(&["--json", "queues"]));
    assert_eq!(queues[0]["name"], queue.as_str());
    assert_eq!(queues[0]["dead_lettered"], 2);
    let ran = run(&["queues"]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(ran.stdout.contains(&queue), "{}", ran.stdout);

    let page = json_of(&run(&["--json", "dlq", "list", &queue]));
    assert_eq!(page["total"], 2);
    let mut ids: Vec<&str> = (0..2)
        .map(|i| page["items"][i]["message_id"].as_str().unwrap())
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, ["order-0", "order-1"]);
    let seq = page["items"][0]["sequence_number"].as_i64().unwrap();
    let shown = json_of(&run(&["--json", "dlq", "show", &queue, &seq.to_string()]));
    assert_eq!(shown["reason"], "test.Poison");

    // Reading moves nothing (issue 31): a dry run of --all, a page past the end.
    let ran = run(&["dlq", "delete", &queue, "--all", "--dry-run"]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(ran.stdout.contains("dry run: 2 dead letters"), "{}", ran.stdout);
    let past = json_of(&run(&["--json", "dlq", "list", &queue, "--after", "10000"]));
    assert_eq!(
        (past["total"].as_u64(), past["items"].as_array().map(Vec::len)),
        (Some(2), Some(0))
    );
    let c = transport.counts(&EntityPath::queue(&queue)).await.unwrap();
    assert_eq!(c.dead_lettered, 2, "still in RabbitMQ's dead-letter queue");

    let ran = run(&["--yes", "dlq", "resubmit", &queue, "--all"]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    // RabbitMQ's counts follow the acknowledgements a moment later.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let c = transport.counts(&EntityPath::queue(&queue)).await.unwrap();
        if (c.active, c.dead_lettered) == (2, 0) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "counts stay {c:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The password is never printed (the user name is).
    let ran = run(&["dlq", "list", "no-such-queue"]);
    assert_eq!(ran.code, 3, "{}", ran.stderr);
    let password = amqp
        .split_once("://")
        .and_then(|(_, r)| r.split_once('@'))
        .and_then(|(u, _)| u.split_once(':'));
    if let Some((_, password)) = password {
        assert!(!ran.stderr.contains(&format!(":{password}@")), "{}", ran.stderr);
    }
    // Without a store, the operator names the queue.
    let queues = json_of(&courier(
        &[
            "--rabbitmq",
            amqp.as_str(),
            "--rabbitmq-queue",
            &queue,
            "--json",
            "queues",
        ],
        "",
    ));
    assert_eq!(queues[0]["active"], 2);
    // Without a store, dead letters cannot be read: the error says what to add.
    let ran = courier(&["--rabbitmq", amqp.as_str(), "dlq", "list", &queue], "");
    assert_eq!(ran.code, 4, "{}", ran.stderr);
    assert!(ran.stderr.contains("--postgres URL or --sqlite FILE"), "{}", ran.stderr);
    transport.delete(&EntityPath::queue(&queue)).await.unwrap();
    transport.close().await;
    vhost.delete().await.unwrap();
}

#[tokio::test]
async fn rabbitmq_a_refused_login_fails_at_once_in_one_line() {
    let vhost = courier::test_servers::rabbitmq_vhost().await.unwrap();
    let url = vhost.url().to_owned();
    // The same URL with a wrong password.
    let (scheme, rest) = url.split_once("://").unwrap();
    let (user, host) = rest.split_once('@').unwrap();
    let user = user.split_once(':').map_or(user, |(u, _)| u);
    let bad = format!("{scheme}://{user}:not-the-password@{host}");
    let ran = courier(&["--rabbitmq", &bad, "queues"], "");
    assert_eq!(ran.code, 5, "{}", ran.stderr);
    let lines: Vec<&str> = ran.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line, no retries: {}", ran.stderr);
    assert!(lines[0].contains("refused the connection"), "{}", ran.stderr);
    assert!(!ran.stderr.contains("not-the-password"), "{}", ran.stderr);
    vhost.delete().await.unwrap();
}

#[tokio::test]
async fn rabbitmq_locked_comes_from_the_management_api_and_no_password_is_printed() {
    // A virtual host of its own on the test broker, and that broker's management API
    // (the container's image has the plugin on; with AMQP_URL, RABBITMQ_MANAGEMENT_URL
    // or port 15672 of its host).
    let vhost = courier::test_servers::rabbitmq_vhost().await.unwrap();
    let amqp = vhost.url().to_owned();
    let management = vhost.management_url().to_owned();
    let db = courier::test_servers::postgres_database().await.unwrap();
    let store = courier::PostgresStore::connect(&db.url()).await.unwrap();
    store.migrate().await.unwrap();
    let transport = courier::AmqpTransport::builder(amqp.as_str())
        .schedules(&store)
        .open()
        .await
        .unwrap();
    let queue = unique("cli-held");
    transport.create_queue(&queue, &QueueOptions::default()).await.unwrap();
    let sender = transport.sender(&queue, SenderOptions::default()).await.unwrap();
    for i in 0..5 {
        sender.send(Envelope::new(format!("{{\"id\":{i}}}"))).await.unwrap();
    }
    // Two received and not settled: RabbitMQ counts them unacknowledged.
    let receiver = transport.receiver(&EntityPath::queue(&queue)).await.unwrap();
    let mut held = Vec::new();
    while held.len() < 2 {
        held.extend(receiver.receive(2 - held.len(), Duration::from_secs(5)).await.unwrap());
    }
    let pg = db.url();
    let with = |args: &[&str]| {
        let base = [
            "--rabbitmq",
            amqp.as_str(),
            "--rabbitmq-management",
            management.as_str(),
            "--postgres",
            pg.as_str(),
        ];
        courier(&[&base[..], args].concat(), "")
    };
    // The API's statistics are refreshed every few seconds.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let queues = json_of(&with(&["--json", "queues"]));
        let q = queues
            .as_array()
            .unwrap()
            .iter()
            .find(|q| q["name"] == queue.as_str())
            .unwrap()
            .clone();
        if (q["locked"].as_u64(), q["active"].as_u64()) == (Some(2), Some(3)) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{q}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let ran = with(&["queues"]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let row: Vec<&str> = ran
        .stdout
        .lines()
        .find(|l| l.starts_with(&queue))
        .unwrap()
        .split_whitespace()
        .collect();
    // NAME KIND ACTIVE LOCKED SCHEDULED DEFERRED DEAD OLDEST: a quorum queue has no oldest age.
    assert_eq!(
        row,
        [queue.as_str(), "queue", "3", "2", "0", "0", "0", "-"],
        "{}",
        ran.stdout
    );

    // The same from the environment, with a management URL that has no user and password:
    // the AMQP URL's are used.
    let bare = management
        .split_once("://")
        .map(|(scheme, rest)| format!("{scheme}://{}", rest.rsplit_once('@').map_or(rest, |(_, h)| h)))
        .unwrap();
    let amqp_credentials = amqp
        .split_once("://")
        .and_then(|(_, r)| r.split_once('@'))
        .map(|(u, _)| u);
    let management_credentials = management
        .split_once("://")
        .and_then(|(_, r)| r.split_once('@'))
        .map(|(u, _)| u);
    if amqp_credentials == management_credentials {
        let child = Command::new(env!("CARGO_BIN_EXE_courier"))
            .args([
                "--rabbitmq",
                amqp.as_str(),
                "--postgres",
                pg.as_str(),
                "--json",
                "queues",
            ])
            .env_remove("COURIER_EMBEDDED")
            .env_remove("COURIER_POSTGRES")
            .env_remove("COURIER_SQLITE")
            .env_remove("COURIER_RABBITMQ")
            .env("COURIER_RABBITMQ_MANAGEMENT", &bare)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let queues: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let q = queues
            .as_array()
            .unwrap()
            .iter()
            .find(|q| q["name"] == queue.as_str())
            .unwrap();
        assert_eq!(q["locked"], 2, "{q}");
    }

    // An unreachable management API: the AMQP counts, exit 0, a warning that says what to
    // do and never the password; a bad URL: a usage error, without the password either.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let secret = "hunter2-mgmt";
    let down = format!("http://ops:{secret}@127.0.0.1:{closed}");
    let base = [
        "--rabbitmq",
        amqp.as_str(),
        "--postgres",
        pg.as_str(),
        "--rabbitmq-management",
    ];
    let ran = courier(&[&base[..], &[down.as_str(), "queues"]].concat(), "");
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let row: Vec<&str> = ran
        .stdout
        .lines()
        .find(|l| l.starts_with(&queue))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(row[2..4], ["3", "0"], "{}", ran.stdout);
    assert!(
        ran.stderr.contains("rabbitmq-plugins enable rabbitmq_management"),
        "{}",
        ran.stderr
    );
    assert!(ran.stderr.contains("http://ops:***@127.0.0.1:"), "{}", ran.stderr);
    let bad = format!("https://ops:{secret}@127.0.0.1:15671");
    let refused = courier(&[&base[..], &[bad.as_str(), "queues"]].concat(), "");
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("HTTPS management endpoints are not supported"),
        "{}",
        refused.stderr
    );
    // Given after the command (a global option), it works as well; without --rabbitmq,
    // it is a usage error.
    let after = courier(
        &[
            "--rabbitmq",
            amqp.as_str(),
            "--postgres",
            pg.as_str(),
            "queues",
            "--rabbitmq-management",
            management.as_str(),
        ],
        "",
    );
    assert_eq!(after.code, 0, "{}", after.stderr);
    let alone = courier(
        &[
            "--postgres",
            pg.as_str(),
            "--rabbitmq-management",
            down.as_str(),
            "queues",
        ],
        "",
    );
    assert_eq!(alone.code, 2, "{}", alone.stderr);
    assert!(alone.stderr.contains("needs --rabbitmq URL"), "{}", alone.stderr);
    let amqp_password = amqp_credentials
        .and_then(|c| c.split_once(':'))
        .map(|(_, p)| p.to_owned());
    let management_password = management_credentials
        .and_then(|c| c.split_once(':'))
        .map(|(_, p)| p.to_owned());
    for ran in [&ran, &refused, &alone, &after, &with(&["queues"])] {
        for text in [&ran.stdout, &ran.stderr] {
            assert!(!text.contains(secret), "{text}");
            for password in [&amqp_password, &management_password].into_iter().flatten() {
                assert!(!text.contains(&format!(":{password}@")), "{text}");
            }
        }
    }
    drop(held);
    drop(receiver);
    transport.delete(&EntityPath::queue(&queue)).await.unwrap();
    transport.close().await;
    store.pool().close().await;
    db.drop_database().await.unwrap();
    vhost.delete().await.unwrap();
}
