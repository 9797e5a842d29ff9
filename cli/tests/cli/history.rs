//! `courier history`: a saga's timeline and a message's tree, printed and as JSON, with
//! the filters, on a SQLite store, an embedded broker's file and Postgres; rows Courier
//! would not write (odd values, details of the wrong shape) are listed with what can be
//! read; and the history an endpoint really records, read back.

use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use courier::{HistoryDetail, HistoryEvent, HistoryKind, SagaChange, SentMessage, SqliteStore, Store, TimeoutMark};
use serde_json::Value;

use super::{courier, json_of};

fn at(seconds: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 3, 10, 0, 0).unwrap() + chrono::Duration::seconds(seconds)
}

fn event(endpoint: &str, kind: HistoryKind, seconds: i64, id: &str, message_type: &str) -> HistoryEvent {
    HistoryEvent {
        endpoint: endpoint.into(),
        kind,
        at: at(seconds),
        message_id: id.into(),
        message_type: Some(message_type.into()),
        conversation_id: Some("conv-1".into()),
        causation_id: None,
        attempt: 1,
        enqueued_at: Some(at(seconds - 1)),
        received_at: Some(at(seconds)),
        detail: HistoryDetail::default(),
    }
}

fn change(correlation: &str, before: Option<&str>, after: &str) -> SagaChange {
    SagaChange {
        saga_type: "shop.Checkout".into(),
        correlation: correlation.into(),
        before: before.map(str::to_owned),
        after: Some(after.to_owned()),
        ..SagaChange::default()
    }
}

fn sent(id: &str, message_type: &str, destination: &str) -> SentMessage {
    SentMessage {
        message_id: id.into(),
        message_type: Some(message_type.into()),
        destination: destination.into(),
        topic: false,
        due: None,
    }
}

/// The timeline of checkout `cart-1` on endpoint `shop`: started (a timeout requested, a
/// message sent), a payment retried then handled (the timeout cancelled), a shipment
/// dead-lettered (never handled: found by its conversation), a duplicate of the payment;
/// and events that are not the instance's.
fn checkout_events() -> Vec<HistoryEvent> {
    let mut started = event("shop", HistoryKind::Handled, 0, "m-1", "shop.CheckoutStarted");
    let mut c = change("cart-1", None, r#"{"cart":"cart-1","items":["a"],"paid":false}"#);
    c.timeouts_requested.push(TimeoutMark {
        id: "t-1".into(),
        key: None,
        message_type: Some("shop.CheckoutExpired".into()),
        due: at(900),
    });
    started.detail.sagas.push(c);
    started.detail.sent.push(sent("m-2", "shop.Reserve", "stock"));

    let mut retried = event("shop", HistoryKind::Retried, 10, "m-3", "shop.PaymentReceived");
    retried.detail.error = Some("the bank answered 503".into());
    let mut paid = event("shop", HistoryKind::Handled, 20, "m-3", "shop.PaymentReceived");
    paid.attempt = 2;
    let mut c = change(
        "cart-1",
        Some(r#"{"cart":"cart-1","items":["a"],"paid":false}"#),
        r#"{"cart":"cart-1","items":["a"],"paid":true,"total":12}"#,
    );
    c.timeouts_cancelled.push("t-1".into());
    paid.detail.sagas.push(c);

    let mut shipped = event("shop", HistoryKind::DeadLettered, 30, "m-4", "shop.ShipOrder");
    shipped.attempt = 5;
    shipped.detail.error = Some("no address for cart-1".into());
    shipped.detail.reason = Some("courier.RetriesExhausted".into());
    let duplicate = event("shop", HistoryKind::Duplicate, 40, "m-3", "shop.PaymentReceived");

    // Not the instance's: another instance, and a failure of another conversation.
    let mut other = event("shop", HistoryKind::Handled, 5, "m-9", "shop.CheckoutStarted");
    other.conversation_id = Some("conv-2".into());
    other.detail.sagas.push(change("cart-2", None, "{}"));
    let mut stranger = event("shop", HistoryKind::DeadLettered, 35, "m-8", "shop.ShipOrder");
    stranger.conversation_id = Some("conv-2".into());
    vec![started, other, retried, paid, shipped, stranger, duplicate]
}

/// A SQLite store file holding `events`.
async fn sqlite_with(dir: &tempfile::TempDir, events: &[HistoryEvent]) -> (SqliteStore, String) {
    let file = dir.path().join("store.db");
    let store = SqliteStore::open(&file).await.unwrap();
    store.migrate().await.unwrap();
    for e in events {
        store.record_history(e).await.unwrap();
    }
    (store, file.to_str().unwrap().to_owned())
}

fn kinds(events: &Value) -> Vec<String> {
    events
        .as_array()
        .unwrap()
        .iter()
        .map(|e| format!("{} {}", e["message_id"].as_str().unwrap(), e["kind"].as_str().unwrap()))
        .collect()
}

#[tokio::test]
async fn a_saga_timeline_shows_each_event_its_state_diff_what_it_sent_and_its_failed_attempts() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, f) = sqlite_with(&dir, &checkout_events()).await;
    let run = |args: &[&str]| courier(&[&["--sqlite", f.as_str(), "history"], args].concat(), "");

    let ran = run(&["saga", "shop.Checkout", "cart-1"]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let out = &ran.stdout;
    let expected = [
        "saga shop.Checkout instance cart-1: 5 event(s)",
        "2026-12-03T10:00:00.000Z  shop.CheckoutStarted m-1  handled  [shop, attempt 1]",
        r#"    state: started {"cart":"cart-1","items":["a"],"paid":false}"#,
        "    timeouts: requested shop.CheckoutExpired t-1 due 2026-12-03T10:15:00Z",
        "    sent: shop.Reserve m-2 -> stock",
        "2026-12-03T10:00:10.000Z  shop.PaymentReceived m-3  retried: the bank answered 503  [shop, attempt 1]",
        "    (rolled back: nothing of this attempt changed the state or was sent)",
        "2026-12-03T10:00:20.000Z  shop.PaymentReceived m-3  handled  [shop, attempt 2]",
        "    state: paid: false -> true; total: (absent) -> 12",
        "    timeouts: cancelled t-1",
        "2026-12-03T10:00:30.000Z  shop.ShipOrder m-4  dead-lettered (courier.RetriesExhausted): no address for \
         cart-1  [shop, attempt 5]",
        "    (a failed attempt in a conversation of this instance's messages",
        "2026-12-03T10:00:40.000Z  shop.PaymentReceived m-3  duplicate (already handled: dropped by the inbox)  \
         [shop, attempt 1]",
    ];
    let mut from = 0;
    for want in expected {
        let found = out[from..]
            .find(want)
            .unwrap_or_else(|| panic!("{want:?} after byte {from} in\n{out}"));
        from += found + want.len();
    }
    assert!(!out.contains("m-9") && !out.contains("m-8"), "{out}");

    let json = json_of(&run(&["--json", "saga", "shop.Checkout", "cart-1"]));
    assert_eq!(
        kinds(&json["events"]),
        [
            "m-1 handled",
            "m-3 retried",
            "m-3 handled",
            "m-4 dead_lettered",
            "m-3 duplicate"
        ]
    );
    let links: Vec<&str> = json["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["link"].as_str().unwrap())
        .collect();
    assert_eq!(
        links,
        [
            "instance",
            "same_message",
            "instance",
            "same_conversation",
            "same_message"
        ]
    );
    assert_eq!(
        json["events"][0]["detail"]["sagas"][0]["timeouts_requested"][0]["id"],
        "t-1"
    );
    assert_eq!(json["more"], false);

    // Filters: outcomes (repeatable), times (inclusive), the limit.
    let json = json_of(&run(&[
        "--json",
        "saga",
        "shop.Checkout",
        "cart-1",
        "--outcome",
        "dead-lettered",
        "--outcome",
        "retried",
    ]));
    assert_eq!(kinds(&json["events"]), ["m-3 retried", "m-4 dead_lettered"]);
    let json = json_of(&run(&[
        "--json",
        "saga",
        "shop.Checkout",
        "cart-1",
        "--since",
        "2026-12-03T10:00:20Z",
        "--until",
        "2026-12-03T11:00:30+01:00",
    ]));
    assert_eq!(kinds(&json["events"]), ["m-3 handled", "m-4 dead_lettered"]);
    let ran = run(&["saga", "shop.Checkout", "cart-1", "--limit", "2"]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(
        ran.stdout
            .contains("more events: the first 2 are listed; the later ones with --since 2026-12-03T10:00:10Z"),
        "{}",
        ran.stdout
    );
    let ran = run(&[
        "saga",
        "shop.Checkout",
        "cart-1",
        "--outcome",
        "duplicate",
        "--since",
        "2026-12-04T00:00:00Z",
    ]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(ran.stdout.contains("no event passes the filters"), "{}", ran.stdout);

    // Bad usage, said as such; an instance without history: not found, and what to check.
    let ran = run(&["saga", "shop.Checkout", "cart-1", "--since", "yesterday"]);
    assert_eq!(ran.code, 2, "{}", ran.stderr);
    assert!(ran.stderr.contains("RFC 3339"), "{}", ran.stderr);
    let ran = run(&["saga", "shop.Checkout", "cart-1", "--outcome", "failed"]);
    assert_eq!(ran.code, 2, "{}", ran.stderr);
    let ran = run(&["saga", "shop.Checkout", "cart-404"]);
    assert_eq!(ran.code, 3, "{}", ran.stderr);
    assert!(ran.stderr.contains("EndpointBuilder::history"), "{}", ran.stderr);
    assert!(ran.stderr.contains("courier sagas types"), "{}", ran.stderr);
}

/// A conversation across endpoints: `m-1` handled by orders sends `m-2` to billing
/// (retried, then handled: it sends `m-4` to a mailer that keeps no history), publishes
/// `m-3` (handled by shipping and by analytics) and requests timeout `t-9` (not due yet).
fn conversation() -> Vec<HistoryEvent> {
    let mut root = event("orders", HistoryKind::Handled, 0, "m-1", "shop.PlaceOrder");
    root.causation_id = Some("m-0".into());
    root.detail.sent.push(sent("m-2", "shop.Charge", "billing"));
    root.detail.sent.push(SentMessage {
        topic: true,
        ..sent("m-3", "shop.OrderPlaced", "events")
    });
    let mut saga = change("o-1", None, "{}");
    saga.saga_type = "shop.Order".into();
    saga.timeouts_requested.push(TimeoutMark {
        id: "t-9".into(),
        key: Some("expiry".into()),
        message_type: Some("shop.OrderExpired".into()),
        due: at(3600),
    });
    root.detail.sagas.push(saga);
    let child = |endpoint: &str, kind, seconds, id: &str, message_type: &str| HistoryEvent {
        causation_id: Some("m-1".into()),
        ..event(endpoint, kind, seconds, id, message_type)
    };
    let mut retried = child("billing", HistoryKind::Retried, 2, "m-2", "shop.Charge");
    retried.detail.error = Some("card declined".into());
    let mut charged = child("billing", HistoryKind::Handled, 4, "m-2", "shop.Charge");
    charged.attempt = 2;
    charged.detail.sent.push(sent("m-4", "shop.Receipt", "mailer"));
    vec![
        root,
        retried,
        charged,
        child("shipping", HistoryKind::Handled, 3, "m-3", "shop.OrderPlaced"),
        child("analytics", HistoryKind::Handled, 5, "m-3", "shop.OrderPlaced"),
    ]
}

#[tokio::test]
async fn a_message_history_is_the_tree_of_what_it_caused_across_endpoints() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("broker.db");
    let broker = courier::Embedded::open(&file).await.unwrap();
    for e in conversation() {
        broker.store().record_history(&e).await.unwrap();
    }
    courier::Transport::close(&broker).await;
    let f = file.to_str().unwrap();
    let run = |args: &[&str]| courier(&[&["--embedded", f, "history"], args].concat(), "");

    let ran = run(&["message", "m-1"]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let expected = "\
message m-1 and the 4 message(s) it caused
caused by m-0 (courier history message m-0)
shop.PlaceOrder m-1
│  2026-12-03T10:00:00.000Z  orders: handled  [attempt 1]
├─ shop.Charge m-2  -> billing
│  │  2026-12-03T10:00:02.000Z  billing: retried: card declined  [attempt 1]
│  │  2026-12-03T10:00:04.000Z  billing: handled  [attempt 2]
│  └─ shop.Receipt m-4  -> mailer
│        no event: not handled yet, or by an endpoint that keeps no history
├─ shop.OrderPlaced m-3  -> topic events
│     2026-12-03T10:00:03.000Z  shipping: handled  [attempt 1]
│     2026-12-03T10:00:05.000Z  analytics: handled  [attempt 1]
└─ shop.OrderExpired t-9  (timeout, due 2026-12-03T11:00:00Z)
      no event: not handled yet, or by an endpoint that keeps no history
";
    assert_eq!(ran.stdout, expected);

    let json = json_of(&run(&["--json", "message", "m-1"]));
    let root = &json["root"];
    assert_eq!(root["message_id"], "m-1");
    let children: Vec<&str> = root["caused"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["message_id"].as_str().unwrap())
        .collect();
    assert_eq!(children, ["m-2", "m-3", "t-9"]);
    assert_eq!(root["caused"][0]["caused"][0]["message_id"], "m-4");
    assert_eq!(root["caused"][0]["events"][1]["endpoint"], "billing");
    assert_eq!(root["caused"][1]["sent"]["topic"], true);
    assert_eq!(root["caused"][2]["timeout"]["key"], "expiry");
    assert_eq!(json["left_out"], serde_json::json!([]));

    // A filter keeps the messages with an event that passes it, and their ancestors.
    let ran = run(&["message", "m-1", "--outcome", "retried"]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(ran.stdout.contains("billing: retried: card declined"), "{}", ran.stdout);
    for gone in [
        "m-3",
        "t-9",
        "m-4",
        "billing: handled",
        "orders: handled",
        "not handled yet",
    ] {
        assert!(!ran.stdout.contains(gone), "{gone} in {}", ran.stdout);
    }
    assert!(ran.stdout.contains("│  no event passes the filters"), "{}", ran.stdout);
    let json = json_of(&run(&["--json", "message", "m-1", "--until", "2026-12-03T10:00:03Z"]));
    assert_eq!(json["root"]["caused"].as_array().unwrap().len(), 2, "{json}");
    // A message below the root, and the size bound, said.
    let ran = run(&["message", "m-2"]);
    assert!(ran.stdout.contains("caused by m-1"), "{}", ran.stdout);
    let ran = run(&["message", "m-1", "--limit", "2"]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(
        ran.stdout.contains("left out: events past the first 2 read"),
        "{}",
        ran.stdout
    );
    let ran = run(&["message", "nope"]);
    assert_eq!(ran.code, 3, "{}", ran.stderr);
    assert!(ran.stderr.contains("EndpointBuilder::history"), "{}", ran.stderr);
}

#[tokio::test]
async fn rows_with_odd_values_are_listed_with_what_can_be_read() {
    let dir = tempfile::tempdir().unwrap();
    let (store, f) = sqlite_with(&dir, &[]).await;
    let huge = "é".repeat(150_000);
    let odd = [
        // NULL optional columns; a state after that is not JSON.
        (
            1,
            "handled",
            "m-1",
            r#"{"sagas":[{"saga_type":"S","correlation":"c","after":"{\"cut"}]}"#.to_owned(),
        ),
        // A huge, non-ASCII state.
        (
            2,
            "handled",
            "m-2",
            serde_json::json!({"sagas": [{"saga_type": "S", "correlation": "c",
                "before": "{\"état\":\"créé\"}",
                "after": serde_json::json!({"état": "payé 🚚", "note": huge}).to_string()}]})
            .to_string(),
        ),
        // Members of the wrong shape: an error that is a number, sagas that are not a list.
        (
            3,
            "retried",
            "m-1",
            r#"{"error": 42, "sent": "x", "sagas": 5}"#.to_owned(),
        ),
    ];
    for (second, kind, id, detail) in &odd {
        let row: i64 = courier::sqlx::query_scalar(
            "INSERT INTO courier_history (endpoint, kind, at, message_id, attempt, detail) \
             VALUES ('odd', ?1, ?2, ?3, 1, ?4) RETURNING id",
        )
        .bind(kind)
        .bind(at(*second).timestamp_micros())
        .bind(id)
        .bind(detail)
        .fetch_one(store.pool())
        .await
        .unwrap();
        courier::sqlx::query(
            "INSERT INTO courier_history_instance (history_id, saga_type, correlation) VALUES (?1, 'S', 'c')",
        )
        .bind(row)
        .execute(store.pool())
        .await
        .unwrap();
    }
    // A message id that is not UTF-8, caused by m-2.
    courier::sqlx::query(
        "INSERT INTO courier_history (endpoint, kind, at, message_id, causation_id, attempt, detail) \
         VALUES ('odd', 'handled', ?1, CAST(X'6dff2d33' AS TEXT), 'm-2', 1, '{}')",
    )
    .bind(at(4).timestamp_micros())
    .execute(store.pool())
    .await
    .unwrap();

    let ran = courier(&["--sqlite", &f, "history", "saga", "S", "c"], "");
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let out = &ran.stdout;
    assert!(out.contains("saga S instance c: 3 event(s)"), "{out}");
    assert!(out.contains("(no type) m-1  handled  [odd, attempt 1]"), "{out}");
    assert!(
        out.contains("state: no diff: the state after (5 bytes) is not JSON"),
        "{out}"
    );
    assert!(out.contains(r#"état: "créé" -> "payé 🚚""#), "{out}");
    assert!(out.contains("note: (absent) -> \"éééé"), "{out}");
    assert!(out.contains("retried: 42"), "{out}");
    assert!(out.contains("! unreadable: its detail's sent is not a list"), "{out}");
    assert!(out.len() < 10_000, "{} bytes printed", out.len());

    let json = json_of(&courier(&["--sqlite", &f, "--json", "history", "saga", "S", "c"], ""));
    let events = json["events"].as_array().unwrap();
    assert_eq!(events.len(), 3);
    assert_eq!(events[0]["message_type"], Value::Null);
    assert_eq!(events[0]["enqueued_at"], Value::Null);
    assert!(events[1]["detail"]["sagas"][0]["after"].as_str().unwrap().len() > 300_000);
    assert_eq!(events[2]["problems"].as_array().unwrap().len(), 3, "{}", events[2]);

    let ran = courier(&["--sqlite", &f, "history", "message", "m-2"], "");
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(ran.stdout.contains(r"(no type) m\xff-3"), "{}", ran.stdout);
    assert!(ran.stdout.contains("its message id is not UTF-8"), "{}", ran.stdout);
}

#[tokio::test]
async fn the_history_on_postgres_reads_as_on_sqlite() {
    let db = courier::test_servers::postgres_database().await.unwrap();
    let store = courier::PostgresStore::connect(&db.url()).await.unwrap();
    store.migrate().await.unwrap();
    for e in checkout_events().iter().chain(&conversation()) {
        store.record_history(e).await.unwrap();
    }
    let url = db.url();
    let run = |args: &[&str]| courier(&[&["--postgres", url.as_str(), "history"], args].concat(), "");

    let json = json_of(&run(&["--json", "saga", "shop.Checkout", "cart-1"]));
    assert_eq!(
        kinds(&json["events"]),
        [
            "m-1 handled",
            "m-3 retried",
            "m-3 handled",
            "m-4 dead_lettered",
            "m-3 duplicate"
        ]
    );
    let json = json_of(&run(&[
        "--json",
        "saga",
        "shop.Checkout",
        "cart-1",
        "--outcome",
        "handled",
    ]));
    assert_eq!(kinds(&json["events"]), ["m-1 handled", "m-3 handled"]);
    let ran = run(&["saga", "shop.Checkout", "cart-1"]);
    assert!(
        ran.stdout.contains("state: paid: false -> true; total: (absent) -> 12"),
        "{}",
        ran.stdout
    );

    let ran = run(&["message", "m-1"]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(
        ran.stdout
            .contains("│  │  2026-12-03T10:00:02.000Z  billing: retried: card declined"),
        "{}",
        ran.stdout
    );
    assert!(ran.stdout.contains("analytics: handled"), "{}", ran.stdout);
    assert_eq!(run(&["message", "nope"]).code, 3);

    // A row of odd values: NULL optional columns, a detail of the wrong shape, a state
    // that is not JSON, text that is not ASCII.
    let row: i64 = courier::sqlx::query_scalar(
        "INSERT INTO courier.history (endpoint, kind, at, message_id, attempt, detail) VALUES \
         ('odd', 'retried', now(), 'm-ü', 0, $1::jsonb) RETURNING id",
    )
    .bind(r#"{"error": 42, "sent": {}, "sagas": [{"saga_type": "S", "correlation": "ç", "after": "{\"cut"}]}"#)
    .fetch_one(store.pool())
    .await
    .unwrap();
    courier::sqlx::query(
        "INSERT INTO courier.history_instance (history_id, saga_type, correlation) VALUES ($1, 'S', 'ç')",
    )
    .bind(row)
    .execute(store.pool())
    .await
    .unwrap();
    let ran = run(&["saga", "S", "ç"]);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    for want in [
        "(no type) m-ü  retried: 42  [odd, attempt 0]",
        "state: no diff: the state after (5 bytes) is not JSON",
        "! unreadable: its detail's sent is not a list",
    ] {
        assert!(ran.stdout.contains(want), "{want} in {}", ran.stdout);
    }
    store.pool().close().await;
    db.drop_database().await.unwrap();
}

mod endpoint {
    //! An endpoint with its history on, and the command reading what it recorded.

    use super::*;
    use courier::saga::SagaContext;
    use courier::{Embedded, Endpoint, HandlerError, HistoryOptions, Routes};
    use serde::{Deserialize, Serialize};

    #[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
    #[message(name = "shop.CheckoutStarted")]
    struct CheckoutStarted {
        cart: String,
        items: Vec<String>,
    }

    #[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
    #[message(name = "shop.ItemAdded")]
    struct ItemAdded {
        cart: String,
        item: String,
    }

    #[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
    #[message(name = "shop.CheckoutExpired")]
    struct CheckoutExpired;

    #[derive(Debug, Default, Serialize, Deserialize)]
    struct Checkout {
        cart: String,
        items: Vec<String>,
    }

    #[courier::saga(name = "shop.Checkout")]
    impl Checkout {
        #[start(by = cart)]
        async fn started(&mut self, msg: CheckoutStarted, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
            self.cart = msg.cart;
            self.items = msg.items;
            ctx.request_timeout(Duration::from_secs(15 * 60), &CheckoutExpired)?;
            Ok(())
        }

        #[handle(by = cart)]
        async fn added(&mut self, msg: ItemAdded, _ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
            self.items.push(msg.item);
            Ok(())
        }

        #[timeout]
        async fn expired(&mut self, _t: CheckoutExpired, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
            ctx.complete();
            Ok(())
        }
    }

    #[tokio::test]
    async fn what_an_endpoint_records_is_what_the_command_prints() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("app.db");
        let broker = Embedded::open(&file).await.unwrap();
        let endpoint = Endpoint::builder("shop")
            .transport(broker.clone())
            .store(broker.store())
            .routes(Routes::new().send::<CheckoutStarted>("shop").send::<ItemAdded>("shop"))
            .saga::<Checkout>()
            .history(HistoryOptions::new())
            .start()
            .await
            .unwrap();
        let bus = endpoint.bus();
        bus.send(&CheckoutStarted {
            cart: "cart-7".into(),
            items: vec!["tea".into()],
        })
        .await
        .unwrap();
        let f = file.to_str().unwrap().to_owned();
        let timeline = || {
            courier(
                &["--embedded", &f, "--json", "history", "saga", "shop.Checkout", "cart-7"],
                "",
            )
        };
        // A liveness bound, not a timing assertion.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while timeline().code != 0 {
            assert!(tokio::time::Instant::now() < deadline, "no history of cart-7");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bus.send(&ItemAdded {
            cart: "cart-7".into(),
            item: "cake".into(),
        })
        .await
        .unwrap();
        loop {
            let json = json_of(&timeline());
            if json["events"].as_array().unwrap().len() == 2 {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "one event of cart-7: {json}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        endpoint.shutdown().await.unwrap();
        courier::Transport::close(&broker).await;

        let ran = courier(&["--embedded", &f, "history", "saga", "shop.Checkout", "cart-7"], "");
        assert_eq!(ran.code, 0, "{}", ran.stderr);
        let out = &ran.stdout;
        assert!(out.contains("shop.CheckoutStarted"), "{out}");
        assert!(
            out.contains(r#"state: started {"cart":"cart-7","items":["tea"]}"#),
            "{out}"
        );
        assert!(out.contains("timeouts: requested shop.CheckoutExpired"), "{out}");
        assert!(out.contains(r#"state: items[1]: (absent) -> "cake""#), "{out}");
        let started = json_of(&courier(
            &["--embedded", &f, "--json", "history", "saga", "shop.Checkout", "cart-7"],
            "",
        ));
        let first = started["events"][0]["message_id"].as_str().unwrap().to_owned();
        let ran = courier(&["--embedded", &f, "history", "message", &first], "");
        assert_eq!(ran.code, 0, "{}", ran.stderr);
        assert!(ran.stdout.contains("(timeout, due"), "{}", ran.stdout);
        assert!(ran.stdout.contains("shop: handled"), "{}", ran.stdout);
    }
}

/// A timeout requested under a key replaces any pending one of the key: the timeline says
/// so with the request, and lists a key cancelled on its own (a `cancel_timeout`) as a
/// cancellation (before, a keyed request printed "cancelled key" beside it).
#[tokio::test]
async fn a_keyed_request_says_it_replaces_and_a_cancellation_stays_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut started = event("shop", HistoryKind::Handled, 0, "m-1", "shop.CheckoutStarted");
    let mut c = change("cart-2", None, r#"{"cart":"cart-2"}"#);
    c.timeouts_requested.push(TimeoutMark {
        id: "t-2".into(),
        key: Some("expiry".into()),
        message_type: Some("shop.CheckoutExpired".into()),
        due: at(900),
    });
    c.keys_cancelled.push("expiry".into());
    started.detail.sagas.push(c);
    let mut paid = event("shop", HistoryKind::Handled, 10, "m-2", "shop.PaymentReceived");
    let mut c = change("cart-2", Some(r#"{"cart":"cart-2"}"#), r#"{"cart":"cart-2"}"#);
    c.keys_cancelled.push("expiry".into());
    paid.detail.sagas.push(c);
    let (_store, f) = sqlite_with(&dir, &[started, paid]).await;
    let ran = courier(
        &["--sqlite", f.as_str(), "history", "saga", "shop.Checkout", "cart-2"],
        "",
    );
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let lines: Vec<&str> = ran.stdout.lines().filter(|l| l.contains("timeouts:")).collect();
    assert_eq!(
        lines,
        [
            "    timeouts: requested shop.CheckoutExpired t-2 due 2026-12-03T10:15:00Z key expiry, replacing any \
             pending one",
            "    timeouts: cancelled key expiry"
        ],
        "{}",
        ran.stdout
    );
}
