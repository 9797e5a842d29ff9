//! The console's pages hold any data (issue 31, point 7): 255-byte message ids (what
//! RabbitMQ delivers from a foreign producer, refused and dead-lettered), long types,
//! reasons, descriptions, header names and correlation values, in a browser 1,400 px
//! wide: every column of the dead-letter list stays in the window, its rows stay one or
//! a few lines tall, the whole text is on hover (`title`) and on the message's page, the
//! list says which sequence numbers it shows, "Resubmit all" is above the list, and the
//! timeouts page shows each timeout's id. A screenshot of each page is taken (saved with
//! `COURIER_CONSOLE_SCREENSHOTS`).
//!
//! The data: an embedded broker's dead letters and saga timeouts, seen through an admin
//! that lengthens their texts as another producer could have written them (the embedded
//! broker's own sender refuses ids over 128 bytes; RabbitMQ delivers up to 255).

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use courier::admin::{
    AdminResult, CompletedSaga, DeadLetter, DeadLetterSummary, EmbeddedAdmin, OutboxEntry, Page, PendingTimeout,
    QueueAdmin, QueueSummary, SagaFilter, SagaInstance, SagaSummary, SagaTypeSummary, StoreAdmin, TimeoutFilter,
};
use courier::{PropertyValue, SequenceNumber, Transport};
use courier_cli::console::Console;
use fantoccini::Locator;

use crate::browser::Browser;
use crate::fixture::*;

/// A 255-byte message id with no place to break a line, distinct per sequence number.
fn long_id(seq: SequenceNumber) -> String {
    let head = format!("order-{seq}-");
    format!("{head}{}", "x".repeat(255 - head.len()))
}

const LONG_TYPE: &str = "com.example.accounting.invoicing.very.deeply.nested.namespace.that.never.ends.\
     InvoiceLineItemAdjustmentRequestedByTheExternalBillingProviderV2";

fn long_reason() -> String {
    format!("Vendor.Rejected.{}", "R".repeat(120))
}

fn long_description() -> String {
    format!("upstream said: {}", "y".repeat(1500))
}

fn long_header() -> String {
    format!("x-vendor-trace-{}", "h".repeat(200))
}

/// The embedded broker's data with texts as long as a producer may write them.
struct Lengthened(EmbeddedAdmin);

#[async_trait]
impl QueueAdmin for Lengthened {
    fn describe(&self) -> String {
        QueueAdmin::describe(&self.0)
    }

    fn now(&self) -> DateTime<Utc> {
        QueueAdmin::now(&self.0)
    }

    async fn queues(&self) -> AdminResult<Vec<QueueSummary>> {
        self.0.queues().await
    }

    async fn dead_letters(
        &self,
        queue: &str,
        after: SequenceNumber,
        limit: u32,
    ) -> AdminResult<Page<DeadLetterSummary>> {
        let mut page = self.0.dead_letters(queue, after, limit).await?;
        for d in &mut page.items {
            d.message_id = long_id(d.sequence_number);
            d.message_type = Some(LONG_TYPE.to_owned());
            d.reason = Some(long_reason());
            d.error = Some(long_description());
        }
        Ok(page)
    }

    async fn dead_letter(&self, queue: &str, sequence_number: SequenceNumber) -> AdminResult<DeadLetter> {
        let mut d = self.0.dead_letter(queue, sequence_number).await?;
        d.message_id = long_id(sequence_number);
        d.message_type = Some(LONG_TYPE.to_owned());
        d.reason = Some(long_reason());
        d.description = Some(long_description());
        d.error = Some(long_description());
        d.correlation_id = Some(long_id(sequence_number + 1));
        d.headers
            .insert(long_header(), PropertyValue::String(long_description()));
        d.headers
            .insert("x-control\u{7}bell".to_owned(), PropertyValue::String("v".into()));
        Ok(d)
    }

    async fn resubmit(&self, queue: &str, sequence_number: SequenceNumber) -> AdminResult<()> {
        self.0.resubmit(queue, sequence_number).await
    }

    async fn delete_dead_letter(&self, queue: &str, sequence_number: SequenceNumber) -> AdminResult<()> {
        self.0.delete_dead_letter(queue, sequence_number).await
    }
}

#[async_trait]
impl StoreAdmin for Lengthened {
    fn describe(&self) -> String {
        StoreAdmin::describe(&self.0)
    }

    fn now(&self) -> DateTime<Utc> {
        StoreAdmin::now(&self.0)
    }

    async fn saga_types(&self) -> AdminResult<Vec<SagaTypeSummary>> {
        self.0.saga_types().await
    }

    async fn sagas(&self, saga_type: &str, filter: &SagaFilter) -> AdminResult<Vec<SagaSummary>> {
        self.0.sagas(saga_type, filter).await
    }

    async fn saga(&self, saga_type: &str, correlation: &str) -> AdminResult<SagaInstance> {
        self.0.saga(saga_type, correlation).await
    }

    async fn complete_saga(&self, saga_type: &str, correlation: &str, reason: &str) -> AdminResult<CompletedSaga> {
        self.0.complete_saga(saga_type, correlation, reason).await
    }

    async fn timeouts(&self, filter: &TimeoutFilter) -> AdminResult<Vec<PendingTimeout>> {
        let mut list = self.0.timeouts(filter).await?;
        for t in &mut list {
            t.saga_type = format!("{LONG_TYPE}.Saga");
            t.key = Some(LONG_TYPE.to_owned());
            t.endpoint = format!("endpoint-{}", "e".repeat(100));
        }
        Ok(list)
    }

    async fn outbox(&self, limit: u32) -> AdminResult<Vec<OutboxEntry>> {
        self.0.outbox(limit).await
    }

    async fn outbox_dead_letters(&self, limit: u32) -> AdminResult<Vec<OutboxEntry>> {
        self.0.outbox_dead_letters(limit).await
    }
}

/// The viewport's width and height.
async fn viewport(b: &Browser) -> (f64, f64) {
    let v = b
        .client
        .execute("return [window.innerWidth, window.innerHeight];", vec![])
        .await
        .unwrap();
    (v[0].as_f64().unwrap(), v[1].as_f64().unwrap())
}

/// `[left, top, right, bottom]` of every element `css` selects, as laid out now.
async fn rects(b: &Browser, css: &str) -> Vec<[f64; 4]> {
    let v = b
        .client
        .execute(
            "return [...document.querySelectorAll(arguments[0])].map(e => { const r = e.getBoundingClientRect(); \
             return [r.left, r.top, r.right, r.bottom]; });",
            vec![serde_json::Value::from(css)],
        )
        .await
        .unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let n = |i: usize| r[i].as_f64().unwrap();
            [n(0), n(1), n(2), n(3)]
        })
        .collect()
}

/// Every element `css` selects (at least one) lies within the viewport's width and has a
/// width of its own.
async fn all_within(b: &Browser, css: &str, width: f64) {
    let found = rects(b, css).await;
    assert!(!found.is_empty(), "nothing matches {css}");
    for [left, _, right, _] in found {
        assert!(
            left >= 0.0 && right <= width + 0.5 && right - left > 4.0,
            "{css} at {left}..{right}, out of the {width} px window"
        );
    }
}

/// Takes a screenshot (always; saved when asked) and checks it is 1,400 px wide.
async fn screenshot(b: &Browser, name: &str) {
    let png = b.client.screenshot().await.unwrap();
    assert_eq!(&png[1..4], b"PNG");
    let width = u32::from_be_bytes(png[16..20].try_into().unwrap());
    assert_eq!(width, 1400, "{name}: a screenshot 1,400 px wide");
    b.screenshot(name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_ids_types_and_headers_keep_every_column_in_the_window() {
    let (_dir, broker, endpoint, _shop) = shop(false).await;
    let admin = EmbeddedAdmin::new(broker.clone());
    // Sequence numbers that do not start at 1: three dead letters deleted first.
    for _ in 0..3 {
        dead_letter(&broker, "orders", "{}", "shop.PlaceOrder", "test.Poison").await;
    }
    let gone = admin.all_dead_letters("orders").await.unwrap();
    admin.delete_many("orders", &gone).await.unwrap();
    for i in 0..60 {
        dead_letter(
            &broker,
            "orders",
            format!("{{\"n\":{i}}}"),
            "shop.PlaceOrder",
            "test.Poison",
        )
        .await;
    }
    let all = admin.all_dead_letters("orders").await.unwrap();
    assert_eq!(all.len(), 60);
    let (first, fiftieth) = (all[0], all[49]);
    assert!(first > 1, "the list does not start at sequence number 1");
    let cart = format!("cart-{}", "c".repeat(180));
    endpoint
        .bus()
        .send(&CheckoutStarted {
            cart: cart.clone(),
            items: vec!["sku-1".into()],
        })
        .await
        .unwrap();
    eventually("a pending timeout", || async {
        !admin.timeouts(&TimeoutFilter::default()).await.unwrap().is_empty()
    })
    .await;
    let timeout_id = admin.timeouts(&TimeoutFilter::default()).await.unwrap()[0].id.clone();

    let long = Arc::new(Lengthened(admin.clone()));
    let base = serve(
        Console::new()
            .queues(long.clone() as Arc<dyn QueueAdmin>)
            .store(long as Arc<dyn StoreAdmin>),
    )
    .await;
    let b = Browser::start().await;
    b.client.set_window_size(1400, 900).await.unwrap();

    // The dashboard, with a queue whose name is as long as a name may be.
    let long_queue = format!("billing-{}", "q".repeat(112));
    broker
        .create_queue(&long_queue, &courier::QueueOptions::default())
        .await
        .unwrap();
    b.client.goto(&format!("{base}/")).await.unwrap();
    let (width, _) = viewport(&b).await;
    for column in 1..=9 {
        all_within(&b, &format!("#queues thead th:nth-child({column})"), width).await;
        all_within(&b, &format!("#queues tbody tr td:nth-child({column})"), width).await;
    }
    let name = b
        .client
        .find(Locator::Css(&format!("#queues tr[data-queue=\"{long_queue}\"] .clip")))
        .await
        .unwrap();
    assert_eq!(name.attr("title").await.unwrap(), Some(long_queue.clone()));
    screenshot(&b, "long-queues").await;

    // The list.
    b.client.goto(&format!("{base}/dlq?queue=orders")).await.unwrap();
    let (width, height) = viewport(&b).await;
    assert!((1380.0..=1400.0).contains(&width), "a window 1,400 px wide: {width}");
    assert_eq!(
        b.text("#shown").await,
        format!("60 messages in the dead-letter queue; this page shows 50, sequence numbers {first} to {fiftieth}.")
    );
    for column in 1..=9 {
        all_within(&b, &format!("#dead-letters thead th:nth-child({column})"), width).await;
        all_within(
            &b,
            &format!("#dead-letters tbody tr:first-child td:nth-child({column})"),
            width,
        )
        .await;
    }
    all_within(&b, "#dead-letters tbody td.buttons button", width).await;
    for [_, top, _, bottom] in rects(&b, "#dead-letters tbody td.buttons button").await {
        assert!(
            bottom - top < 40.0,
            "a button on one line, not {} px tall",
            bottom - top
        );
    }
    for [_, top, _, bottom] in rects(&b, "#dead-letters tbody tr").await {
        assert!(bottom - top < 100.0, "a row {} px tall", bottom - top);
    }
    let [_, _, _, all_bottom] = rects(&b, "#all button").await[0];
    assert!(
        all_bottom <= height,
        "Resubmit all at {all_bottom} px, below the {height} px window"
    );
    assert_eq!(b.text("#all button").await, "Resubmit all 60…");
    let id = b
        .client
        .find(Locator::Css("#dead-letters tbody tr:first-child td.id .clip"))
        .await
        .unwrap();
    assert_eq!(
        id.attr("title").await.unwrap(),
        Some(long_id(first)),
        "the whole id on hover"
    );
    let kind = b
        .client
        .find(Locator::Css("#dead-letters tbody tr:first-child td.type .clip"))
        .await
        .unwrap();
    assert_eq!(kind.attr("title").await.unwrap().as_deref(), Some(LONG_TYPE));
    screenshot(&b, "long-dead-letters").await;

    // One message: the whole id, type, description and header names, in the window.
    b.client
        .goto(&format!("{base}/dlq/message?queue=orders&seq={first}"))
        .await
        .unwrap();
    assert_eq!(b.text("h1").await, format!("Dead letter {}", long_id(first)));
    let fields = b.text("#fields").await;
    for whole in [long_id(first), LONG_TYPE.to_owned(), long_reason(), long_description()] {
        assert!(fields.contains(&whole), "the whole text on the message's page");
    }
    let headers = b.text("#headers").await;
    assert!(headers.contains(&long_header()), "the whole header name");
    assert!(
        headers.contains("x-control\\u{7}bell"),
        "a control character in a name is shown escaped: {headers}"
    );
    for css in ["h1", "#fields", "#headers", "#headers td", "#body", "#error"] {
        all_within(&b, css, width).await;
    }
    screenshot(&b, "long-dead-letter").await;

    // Timeouts: each one's id, every column in the window.
    b.client.goto(&format!("{base}/timeouts")).await.unwrap();
    let row = format!("#timeouts tr[data-id=\"{timeout_id}\"]");
    let shown = b
        .client
        .find(Locator::Css(&format!("{row} td.timeout-id .clip")))
        .await
        .unwrap();
    assert_eq!(shown.text().await.unwrap(), timeout_id);
    let whole = b
        .client
        .execute(
            "const e = document.querySelector(arguments[0]); return e.scrollWidth <= e.clientWidth;",
            vec![serde_json::Value::from(format!("{row} td.timeout-id .clip"))],
        )
        .await
        .unwrap();
    assert_eq!(whole, serde_json::Value::Bool(true), "the id is shown whole, not cut");
    assert_eq!(shown.attr("title").await.unwrap(), Some(timeout_id.clone()));
    for column in 1..=7 {
        all_within(&b, &format!("#timeouts thead th:nth-child({column})"), width).await;
        all_within(&b, &format!("{row} td:nth-child({column})"), width).await;
    }
    let [_, top, _, bottom] = rects(&b, &row).await[0];
    assert!(
        bottom - top < 60.0,
        "a row of two lines at most, not {} px",
        bottom - top
    );
    let correlation = b
        .client
        .find(Locator::Css(&format!("{row} td:nth-child(3) .clip")))
        .await
        .unwrap();
    assert_eq!(correlation.attr("title").await.unwrap(), Some(cart));
    screenshot(&b, "long-timeouts").await;
    b.close().await;
}
