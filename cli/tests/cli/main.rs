//! The `courier` binary as an operator runs it: tables, JSON, dry runs, confirmation and
//! exit codes, against broker and store files made for each test.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

mod history;
mod history_find;
mod rabbitmq;

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
    // What to do without the application: the page that says how (sqlx-cli's defaults
    // alone would fail on Postgres, and record the migrations where Courier never looks).
    assert!(ran.stderr.contains("docs/stores.md"), "{}", ran.stderr);
    assert!(!ran.stderr.contains("sqlx migrate run --source"), "{}", ran.stderr);

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

/// An empty URL (an unset shell variable: `--postgres "$DATABASE_URL"`) is bad usage,
/// said as such, not "cannot reach : ..." after a connection attempt.
#[test]
fn an_empty_url_is_bad_usage_that_names_the_option() {
    for option in ["--postgres", "--rabbitmq"] {
        let ran = courier(&[option, "", "queues"], "");
        assert_eq!(ran.code, 2, "{option}: {}", ran.stderr);
        assert!(ran.stderr.contains(option), "{option}: {}", ran.stderr);
        assert!(!ran.stderr.contains("cannot reach"), "{}", ran.stderr);
    }
}
