//! The history pages at their limits: a conversation of 100 messages drawn with every
//! label legible (the picture grows downwards; no two labels overlap, checked in the
//! markup and measured in the browser; screenshot conversation-100); hostile text from
//! messages and handlers shown as text on every history page, and bytes that are not
//! UTF-8 shown escaped; the pages without a history admin (what to pass), and their
//! errors (a message without events, a wrong filter).

use std::sync::Arc;

use chrono::{DateTime, TimeZone, Utc};
use courier::admin::{HistoryAdmin, SqliteAdmin};
use courier::{HistoryDetail, HistoryEvent, HistoryKind, SagaChange, SentMessage, SqliteStore, Store, TimeoutMark};
use courier_cli::console::Console;

use crate::browser::Browser;
use crate::fixture::*;
use crate::history::{CheckoutStarted, Store as Shop, shot};
use crate::http::http;

fn at(millis: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 3, 10, 0, 0).unwrap() + chrono::Duration::milliseconds(millis)
}

const ENDPOINTS: [&str; 5] = ["orders", "billing", "shipping", "stock", "mailer"];

fn id(i: usize) -> String {
    format!("m-{i:03}")
}

/// A conversation of 100 messages: message `i` was caused by `(i - 1) / 3`, handled by
/// endpoint `i % 5`; some were retried first, some dead-lettered, some are timeouts.
fn hundred() -> Vec<HistoryEvent> {
    let timeout = |i: usize| i % 10 == 9;
    let dead = |i: usize| i > 33 && i % 13 == 5;
    let endpoint = |i: usize| {
        if timeout(i) {
            ENDPOINTS[((i - 1) / 3) % 5]
        } else {
            ENDPOINTS[i % 5]
        }
    };
    let mut events = Vec::new();
    for i in 0..100 {
        let base = HistoryEvent {
            endpoint: endpoint(i).into(),
            kind: HistoryKind::Handled,
            at: at(i as i64 * 1000),
            message_id: id(i),
            message_type: Some(format!("shop.Step{}", i % 17)),
            conversation_id: Some("c-100".into()),
            causation_id: (i > 0).then(|| id((i - 1) / 3)),
            attempt: 1,
            enqueued_at: None,
            received_at: None,
            detail: HistoryDetail::default(),
        };
        if i % 7 == 3 {
            let mut retried = base.clone();
            retried.kind = HistoryKind::Retried;
            retried.at = at(i as i64 * 1000 - 400);
            retried.detail.error = Some("the service answered 503".into());
            events.push(retried);
        }
        let mut e = base;
        if dead(i) {
            e.kind = HistoryKind::DeadLettered;
            e.detail.reason = Some("courier.RetriesExhausted".into());
            e.detail.error = Some("gave up".into());
        } else if i % 7 == 3 {
            e.attempt = 2;
        }
        let mut change = SagaChange {
            saga_type: "shop.Flow".into(),
            correlation: "c-100".into(),
            before: Some("{}".into()),
            after: Some(format!("{{\"step\":{i}}}")),
            ..SagaChange::default()
        };
        if timeout(i) {
            change.timeout_fired = Some(id(i));
        }
        for c in (3 * i + 1)..=(3 * i + 3) {
            if c >= 100 {
                break;
            }
            if timeout(c) {
                change.timeouts_requested.push(TimeoutMark {
                    id: id(c),
                    key: None,
                    message_type: Some(format!("shop.Step{}", c % 17)),
                    due: at(c as i64 * 1000),
                });
            } else {
                e.detail.sent.push(SentMessage {
                    message_id: id(c),
                    message_type: Some(format!("shop.Step{}", c % 17)),
                    destination: endpoint(c).into(),
                    topic: false,
                    due: None,
                });
            }
        }
        e.detail.sagas.push(change);
        events.push(e);
    }
    events
}

/// The labels of a page's sequence diagram: (left edge, baseline y, estimated width,
/// text), as estimated by the layout.
fn labels(page: &str) -> Vec<(f64, f64, f64, String)> {
    let attr = |tag: &str, name: &str| -> f64 {
        let at = tag.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
        tag[at..].split('"').next().unwrap().parse().unwrap()
    };
    page.split("<text class=\"label\"")
        .skip(1)
        .map(|rest| {
            let (tag, after) = rest.split_once('>').unwrap();
            let text = after.split("</text>").next().unwrap().to_owned();
            (attr(tag, "data-x0"), attr(tag, "y"), attr(tag, "data-w"), text)
        })
        .collect()
}

fn svg_height(page: &str) -> f64 {
    let svg = page.split("<svg class=\"sequence\"").nth(1).unwrap();
    let at = svg.find(" height=\"").unwrap() + 9;
    svg[at..].split('"').next().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_of_a_hundred_messages_is_drawn_with_every_label_legible() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("store.db");
    let store = SqliteStore::open(&file).await.unwrap();
    store.migrate().await.unwrap();
    let events = hundred();
    for e in &events {
        store.record_history(e).await.unwrap();
    }
    let admin = SqliteAdmin::open(&file).await.unwrap();
    let base = serve(Console::new().history(Arc::new(admin) as Arc<dyn HistoryAdmin>)).await;

    let page = http("GET", &format!("{base}/history/message?id=m-000"), &[], None).await;
    assert_eq!(page.status, 200, "{}", page.body);
    let labels = labels(&page.body);
    assert_eq!(
        labels.len(),
        events.len() + 10,
        "an arrow per event, and per timeout requested"
    );
    // Each label on a line of its own, at least a line's height from the next, and no two
    // boxes overlapping (with the estimated widths).
    let height = svg_height(&page.body);
    assert!(
        height > 30.0 * labels.len() as f64,
        "the picture grows downwards: {height}"
    );
    for (i, a) in labels.iter().enumerate() {
        assert!(a.1 > 14.0 && a.1 < height, "{a:?} within the picture");
        for b in &labels[i + 1..] {
            let apart_y = (a.1 - b.1).abs() >= 14.0;
            let apart_x = a.0 + a.2 <= b.0 || b.0 + b.2 <= a.0;
            assert!(apart_y || apart_x, "{a:?} overlaps {b:?}");
        }
    }
    assert!(page.body.contains("shop.Step3: retried"), "the error's arrow");
    assert!(
        page.body.contains("class=\"arrow k-dead\""),
        "dead letters in their colour"
    );
    for name in ENDPOINTS {
        assert!(
            page.body.contains(&format!("data-name=\"{name}\"")),
            "a lifeline for {name}"
        );
    }

    // Read with a smaller bound: the page says what the tree left out.
    let cut = http("GET", &format!("{base}/history/message?id=m-000&limit=50"), &[], None).await;
    assert_eq!(cut.status, 200, "{}", cut.body);
    let left_out = cut.body.split("id=\"left-out\"").nth(1).expect("a left-out note");
    assert!(left_out.contains("events past the first 50 read"), "{left_out}");

    // In the browser: every text of the picture at 11 px or more (the times) and 12 px
    // (the labels), and no two boxes overlapping, as Chromium lays them out.
    let b = Browser::start().await;
    b.client
        .goto(&format!("{base}/history/message?id=m-000"))
        .await
        .unwrap();
    let found = b
        .client
        .execute(
            r#"const boxes = [...document.querySelectorAll('#sequence text')].map(t => {
                 const r = t.getBoundingClientRect();
                 return {x: r.left, y: r.top, w: r.width, h: r.height, size: parseFloat(getComputedStyle(t).fontSize), text: t.textContent};
               });
               const overlaps = [];
               for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
                 const a = boxes[i], b = boxes[j];
                 if (a.x < b.x + b.w - 0.5 && b.x < a.x + a.w - 0.5 && a.y < b.y + b.h - 0.5 && b.y < a.y + a.h - 0.5) overlaps.push(a.text + ' / ' + b.text);
               }
               return {count: boxes.length, smallest: Math.min(...boxes.map(b => b.size)), overlaps: overlaps.slice(0, 10),
                       beyond: boxes.filter(b => b.w < 1).length};"#,
            vec![],
        )
        .await
        .unwrap();
    assert!(found["count"].as_u64().unwrap() > 200, "{found}");
    assert!(found["smallest"].as_f64().unwrap() >= 11.0, "{found}");
    assert_eq!(found["overlaps"], serde_json::json!([]), "{found}");
    assert_eq!(found["beyond"], 0, "{found}");
    shot(&b, "conversation-100", Some("#sequence g.arrow[data-row=\"60\"]"), 1300).await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_history_page_shows_hostile_text_as_text() {
    let shop = Shop::start().await;
    let cart = "<script>alert('cart')</script>";
    shop.shop()
        .bus()
        .send(&CheckoutStarted {
            cart: cart.into(),
            items: vec!["<img src=x onerror=alert(1)>".into()],
        })
        .await
        .unwrap();
    eventually("the alert dead-lettered", || async {
        shop.timeline(cart)
            .await
            .iter()
            .any(|(t, k)| t == "store.StockLow" && *k == HistoryKind::DeadLettered)
    })
    .await;
    let started = shop
        .admin
        .saga_history("store.Checkout", cart, &Default::default())
        .await
        .unwrap()
        .events[0]
        .event
        .message_id
        .clone();
    let base = serve(over(&shop.admin).history(Arc::new(shop.admin.clone()) as Arc<dyn HistoryAdmin>)).await;
    let encoded = |v: &str| serde_urlencoded::to_string([("v", v)]).unwrap()[2..].to_owned();
    for path in [
        format!("/history/saga?saga=store.Checkout&correlation={}", encoded(cart)),
        format!("/history/message?id={started}"),
        format!("/history/message?id={started}&since=2000-01-01&outcome=dead_lettered"),
    ] {
        let page = http("GET", &format!("{base}{path}"), &[], None).await;
        assert_eq!(page.status, 200, "{path}: {}", page.body);
        assert!(!page.body.contains("<script>alert"), "{path}: {}", page.body);
        assert!(!page.body.contains("<img src=x"), "{path}: {}", page.body);
        assert!(
            page.body.contains("&lt;img src=x onerror=alert(1)&gt;"),
            "{path}: {}",
            page.body
        );
    }
    shop.stop().await;

    // A row another program wrote: a type with markup, an id and an error not UTF-8.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("store.db");
    let store = SqliteStore::open(&file).await.unwrap();
    store.migrate().await.unwrap();
    let mut root = HistoryEvent {
        endpoint: "<b>orders</b>".into(),
        kind: HistoryKind::Handled,
        at: at(0),
        message_id: "m-1".into(),
        message_type: Some("<script>alert(\"type\")</script>".into()),
        conversation_id: None,
        causation_id: None,
        attempt: 1,
        enqueued_at: None,
        received_at: None,
        detail: HistoryDetail::default(),
    };
    root.detail.sagas.push(SagaChange {
        saga_type: "<i>S</i>".into(),
        correlation: "c".into(),
        before: Some(r#"{"note":"<script>x</script>"}"#.into()),
        after: Some(r#"{"note":"</td></table><script>y</script>"}"#.into()),
        ..SagaChange::default()
    });
    store.record_history(&root).await.unwrap();
    courier::sqlx::query(
        "INSERT INTO courier_history (endpoint, kind, at, message_id, message_type, causation_id, attempt, detail) \
         VALUES ('odd', 'dead_lettered', ?1, CAST(X'6dff2d33' AS TEXT), CAST(X'3c7363726970743efe' AS TEXT), 'm-1', 1, \
         '{\"error\": \"<script>alert(2)</script>\"}')",
    )
    .bind(at(1000).timestamp_micros())
    .execute(store.pool())
    .await
    .unwrap();
    let admin = SqliteAdmin::open(&file).await.unwrap();
    let base = serve(Console::new().history(Arc::new(admin) as Arc<dyn HistoryAdmin>)).await;
    for path in [
        "/history/message?id=m-1",
        "/history/saga?saga=%3Ci%3ES%3C%2Fi%3E&correlation=c",
    ] {
        let page = http("GET", &format!("{base}{path}"), &[], None).await;
        assert_eq!(page.status, 200, "{path}: {}", page.body);
        for raw in ["<script>", "<b>orders", "<i>S", "</td></table><script>"] {
            assert!(!page.body.contains(raw), "{raw} in {path}: {}", page.body);
        }
        assert!(page.body.contains("&lt;b&gt;orders&lt;/b&gt;"), "{path}: {}", page.body);
    }
    let page = http("GET", &format!("{base}/history/message?id=m-1"), &[], None).await;
    assert!(page.body.contains(r"m\xff-3"), "the id's bytes escaped: {}", page.body);
    assert!(
        page.body.contains(r"&lt;script&gt;\xfe"),
        "the type's bytes escaped: {}",
        page.body
    );
    assert!(
        page.body.contains("&lt;script&gt;alert(2)&lt;/script&gt;"),
        "{}",
        page.body
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_history_the_pages_say_what_to_pass_and_errors_say_what_to_do() {
    let (_dir, broker, endpoint, _shop) = shop(true).await;
    endpoint
        .bus()
        .send(&PlaceOrder {
            order_id: 1,
            amount_cents: 100,
        })
        .await
        .unwrap();
    let admin = courier::admin::EmbeddedAdmin::new(broker.clone());
    eventually("a dead letter", || async { dead_count(&admin, "shop").await == 1 }).await;
    let seq = courier::admin::QueueAdmin::all_dead_letters(&admin, "shop")
        .await
        .unwrap()[0];

    let without = serve(over(&admin)).await;
    for path in ["/history/message?id=m-1", "/history/saga?saga=s&correlation=c"] {
        let page = http("GET", &format!("{without}{path}"), &[], None).await;
        assert_eq!(page.status, 404, "{}", page.body);
        assert!(page.body.contains("Console::history"), "{}", page.body);
        assert!(
            page.body.contains("--embedded FILE, --postgres URL or --sqlite FILE"),
            "{}",
            page.body
        );
    }
    let dead = http("GET", &format!("{without}/dlq/message?queue=shop&seq={seq}"), &[], None).await;
    assert_eq!(dead.status, 200);
    assert!(
        !dead.body.contains("history-link"),
        "no link to a history it cannot show"
    );

    let with = serve(over(&admin).history(Arc::new(admin.clone()) as Arc<dyn HistoryAdmin>)).await;
    let dead = http("GET", &format!("{with}/dlq/message?queue=shop&seq={seq}"), &[], None).await;
    assert!(dead.body.contains("id=\"history-link\""), "{}", dead.body);
    // The endpoint keeps no history: its message has no event, and the page says what to check.
    let link = dead
        .body
        .split("/history/message?id=")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap();
    let none = http("GET", &format!("{with}/history/message?id={link}"), &[], None).await;
    assert_eq!(none.status, 404, "{}", none.body);
    assert!(none.body.contains("EndpointBuilder::history"), "{}", none.body);
    for (path, says) in [
        ("/history/message", "needs its id"),
        ("/history/message?id=x&since=yesterday", "RFC 3339"),
        ("/history/message?id=x&outcome=failed", "not an outcome"),
        ("/history/saga?saga=s", "needs its name and correlation"),
    ] {
        let page = http("GET", &format!("{with}{path}"), &[], None).await;
        assert_eq!(page.status, 400, "{path}: {}", page.body);
        assert!(page.body.contains(says), "{path}: {}", page.body);
    }
    endpoint.shutdown().await.unwrap();
}
