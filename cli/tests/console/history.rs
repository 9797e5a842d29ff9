//! The history pages in the browser (issue 33, "the console"), over what real endpoints
//! recorded on an embedded broker with a virtual clock: a checkout saga that reserves
//! stock (the reservation retried once, its answer retried once, a stock alert
//! dead-lettered in the same conversation) and times out; an order dead-lettered, then
//! resubmitted from the console and handled (it charges a card on another endpoint).
//! Checked: the saga page's link to its timeline; the timeline's rows, state diffs, the
//! guess mark, the failed attempts with their errors, the timeouts on the time axis; the
//! message page's events and sequence diagram (lifelines, arrows, colours, the timeout
//! as an arrow from an endpoint to itself); the dead letter's link to its history.
//! Screenshots: saga-timeline, conversation, conversation-resubmitted, dead-letter-history.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use courier::admin::{EmbeddedAdmin, HistoryAdmin, HistoryFilter, QueueAdmin};
use courier::saga::SagaContext;
use courier::{
    Context, Embedded, Endpoint, HandlerError, HistoryKind, HistoryOptions, RetryPolicy, Routes, RunningEndpoint,
    VirtualClock,
};
use fantoccini::Locator;
use serde::{Deserialize, Serialize};

use crate::browser::Browser;
use crate::fixture::*;

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "store.CheckoutStarted")]
pub(crate) struct CheckoutStarted {
    pub(crate) cart: String,
    pub(crate) items: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "store.ReserveStock")]
pub(crate) struct ReserveStock {
    cart: String,
    items: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "store.StockReserved")]
pub(crate) struct StockReserved {
    cart: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "store.StockLow")]
pub(crate) struct StockLow {
    sku: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "store.CheckoutExpired")]
pub(crate) struct CheckoutExpired;

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "store.PlaceOrder")]
pub(crate) struct PlaceOrder {
    pub(crate) order: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "store.ChargeCard")]
pub(crate) struct ChargeCard {
    order: u32,
    cents: u64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Checkout {
    cart: String,
    items: Vec<String>,
    reserved: bool,
    status: String,
}

#[courier::saga(name = "store.Checkout")]
impl Checkout {
    #[start(by = cart)]
    async fn started(&mut self, msg: CheckoutStarted, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        self.cart = msg.cart.clone();
        self.items = msg.items.clone();
        self.status = "open".into();
        ctx.request_timeout(Duration::from_secs(15 * 60), &CheckoutExpired)?;
        ctx.send(&ReserveStock {
            cart: msg.cart,
            items: msg.items,
        })?;
        Ok(())
    }

    /// Fails its first attempt (the warehouse's answer comes before the cart is saved).
    #[handle(by = cart)]
    async fn reserved(&mut self, _msg: StockReserved, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        if ctx.attempt() == 1 {
            return Err(HandlerError::transient(Failure(
                "the cart is locked by another request".into(),
            )));
        }
        self.reserved = true;
        self.status = "reserved".into();
        Ok(())
    }

    #[timeout]
    async fn expired(&mut self, _t: CheckoutExpired, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        self.status = "expired".into();
        ctx.complete();
        Ok(())
    }
}

#[derive(Debug)]
pub(crate) struct Failure(pub(crate) String);

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Failure {}

/// The warehouse: fails its first attempt, then reserves and warns of a low stock.
#[courier::handler]
async fn reserve(msg: ReserveStock, ctx: &mut Context) -> Result<(), HandlerError> {
    if ctx.attempt() == 1 {
        return Err(HandlerError::transient(Failure(
            "the warehouse database timed out".into(),
        )));
    }
    ctx.send(&StockReserved { cart: msg.cart })?;
    ctx.send(&StockLow {
        sku: msg.items.first().cloned().unwrap_or_default(),
    })?;
    Ok(())
}

/// Nobody buys more: every stock alert is dead-lettered.
#[courier::handler]
async fn stock_low(msg: StockLow, _ctx: &mut Context) -> Result<(), HandlerError> {
    Err(HandlerError::permanent(Failure(format!("no supplier for {}", msg.sku))))
}

/// Orders: the first call fails for good (dead-lettered); later ones charge the card.
#[courier::handler]
async fn place_order(msg: PlaceOrder, ctx: &mut Context) -> Result<(), HandlerError> {
    let calls = ctx.state::<Arc<AtomicU32>>()?;
    if calls.fetch_add(1, Ordering::SeqCst) == 0 {
        return Err(HandlerError::permanent(Failure("the tax service answered 503".into())));
    }
    ctx.send(&ChargeCard {
        order: msg.order,
        cents: 4200,
    })?;
    Ok(())
}

#[courier::handler]
async fn charge(_msg: ChargeCard, _ctx: &mut Context) -> Result<(), HandlerError> {
    Ok(())
}

/// The three endpoints of the store, each keeping a history.
pub(crate) struct Store {
    pub(crate) _dir: tempfile::TempDir,
    pub(crate) broker: Embedded,
    pub(crate) admin: EmbeddedAdmin,
    pub(crate) clock: VirtualClock,
    pub(crate) endpoints: Vec<RunningEndpoint>,
}

impl Store {
    pub(crate) async fn start() -> Self {
        let clock = VirtualClock::starting_now();
        let (dir, broker) = broker_file(Arc::new(clock.clone())).await;
        let policy = || RetryPolicy::default().immediate(1).delayed([]);
        let shop = Endpoint::builder("shop")
            .transport(broker.clone())
            .store(broker.store())
            .routes(
                Routes::new()
                    .send::<CheckoutStarted>("shop")
                    .send::<PlaceOrder>("shop")
                    .send::<ReserveStock>("stock")
                    .send::<ChargeCard>("billing"),
            )
            .saga::<Checkout>()
            .handler(stock_low)
            .handler(place_order)
            .state(Arc::new(AtomicU32::new(0)))
            .recoverability(policy())
            .history(HistoryOptions::new())
            .clock(Arc::new(clock.clone()))
            .start()
            .await
            .unwrap();
        let stock = Endpoint::builder("stock")
            .transport(broker.clone())
            .store(broker.store())
            .routes(Routes::new().send::<StockReserved>("shop").send::<StockLow>("shop"))
            .handler(reserve)
            .recoverability(policy())
            .history(HistoryOptions::new())
            .clock(Arc::new(clock.clone()))
            .start()
            .await
            .unwrap();
        let billing = Endpoint::builder("billing")
            .transport(broker.clone())
            .store(broker.store())
            .handler(charge)
            .history(HistoryOptions::new())
            .clock(Arc::new(clock.clone()))
            .start()
            .await
            .unwrap();
        let admin = EmbeddedAdmin::new(broker.clone());
        Self {
            _dir: dir,
            broker,
            admin,
            clock,
            endpoints: vec![shop, stock, billing],
        }
    }

    pub(crate) fn shop(&self) -> &RunningEndpoint {
        &self.endpoints[0]
    }

    /// The kinds of the events of `saga` instance `cart`, oldest first.
    pub(crate) async fn timeline(&self, cart: &str) -> Vec<(String, HistoryKind)> {
        match self
            .admin
            .saga_history("store.Checkout", cart, &HistoryFilter::default())
            .await
        {
            Ok(h) => h
                .events
                .iter()
                .map(|e| (e.event.message_type.clone().unwrap_or_default(), e.event.kind))
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    /// Whether message `id`'s conversation holds an event of `kind` of type `ty`.
    pub(crate) async fn conversation_has(&self, id: &str, ty: &str, kind: HistoryKind) -> bool {
        fn walk(n: &courier::admin::MessageNode, ty: &str, kind: HistoryKind) -> bool {
            n.events
                .iter()
                .any(|e| e.event.message_type.as_deref() == Some(ty) && e.event.kind == kind)
                || n.caused.iter().any(|c| walk(c, ty, kind))
        }
        self.admin
            .message_history(id, &HistoryFilter::default())
            .await
            .is_ok_and(|h| walk(&h.root, ty, kind))
    }

    pub(crate) async fn stop(self) {
        for e in self.endpoints {
            e.shutdown().await.unwrap();
        }
        courier::Transport::close(&self.broker).await;
    }
}

/// The checkout `cart` started, its stock reserved (after the retries) and its stock alert
/// dead-lettered.
async fn checkout(store: &Store, cart: &str) {
    store
        .shop()
        .bus()
        .send(&CheckoutStarted {
            cart: cart.into(),
            items: vec!["sku-101".into(), "sku-207".into()],
        })
        .await
        .unwrap();
    eventually("the stock reserved and the alert dead-lettered", || async {
        let t = store.timeline(cart).await;
        t.contains(&("store.StockReserved".to_owned(), HistoryKind::Handled))
            && t.contains(&("store.StockLow".to_owned(), HistoryKind::DeadLettered))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saga_that_timed_out_has_its_timeline_and_its_conversation() {
    let store = Store::start().await;
    checkout(&store, "cart-1043").await;
    store.clock.advance(Duration::from_secs(16 * 60));
    eventually("the checkout expired", || async {
        store
            .timeline("cart-1043")
            .await
            .contains(&("store.CheckoutExpired".to_owned(), HistoryKind::Handled))
    })
    .await;
    // Another checkout, still open (its timeout pending): the saga's page links to its
    // timeline.
    checkout(&store, "cart-1044").await;
    let console = over(&store.admin).history(Arc::new(store.admin.clone()) as Arc<dyn HistoryAdmin>);
    let base = serve(console).await;
    let b = Browser::start().await;

    b.client
        .goto(&format!(
            "{base}/sagas/instance?saga=store.Checkout&correlation=cart-1044"
        ))
        .await
        .unwrap();
    b.client
        .find(Locator::Css("#history-link a"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    b.wait_for_url("/history/saga").await;
    assert_eq!(b.text("h1").await, "History of store.Checkout cart-1044");

    // The instance that timed out: completed, its page says so and links to its history.
    b.client
        .goto(&format!(
            "{base}/sagas/instance?saga=store.Checkout&correlation=cart-1043"
        ))
        .await
        .unwrap();
    assert!(b.text("#no-instance").await.contains("completed"));
    b.client
        .find(Locator::Css("#history-link a"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    b.wait_for_url("correlation=cart-1043").await;
    let mut kinds: Vec<String> = attrs(&b, "#timeline tbody.event", "data-kind").await;
    // The dispatcher's steps of the timeout, when the endpoints record them, are left
    // aside here (shown by their names, on the axis's timeout lane).
    let steps = kinds.iter().filter(|k| k.starts_with("timeout_")).count();
    assert_eq!(count(&b, "#time-axis g.mark.timeout-event").await, steps);
    kinds.retain(|k| !k.starts_with("timeout_"));
    assert_eq!(kinds.len(), 5, "{kinds:?}");
    assert_eq!(
        (kinds[0].as_str(), kinds[4].as_str()),
        ("handled", "handled"),
        "{kinds:?}"
    );
    // The answer and the alert were handled at the same time, in either order.
    kinds[1..4].sort();
    assert_eq!(
        kinds[1..4],
        ["dead_lettered", "handled", "retried"],
        "the answer retried then handled, the alert dead-lettered"
    );
    let rows = b.text("#timeline").await;
    for want in [
        "store.CheckoutStarted",
        "the cart is locked by another request",
        "no supplier for sku-101",
        "≈ same conversation (a guess)",
        "same message",
        "requested timeout store.CheckoutExpired",
        "replacing any pending one",
        "sent store.ReserveStock",
        "this message was timeout",
        "completed",
    ] {
        assert!(rows.contains(want), "{want} in {rows}");
    }
    assert!(
        !rows.contains("cancelled the timeout of key"),
        "said with the request: {rows}"
    );
    // The diff of the answer: removed and added values, each in its element.
    let dels = texts(&b, "#timeline del").await;
    let inss = texts(&b, "#timeline ins").await;
    assert!(
        dels.contains(&"false".to_owned()) && inss.contains(&"true".to_owned()),
        "{dels:?} {inss:?}"
    );
    assert!(dels.contains(&"\"open\"".to_owned()) && inss.contains(&"\"reserved\"".to_owned()));
    assert!(inss.contains(&"\"expired\"".to_owned()), "{inss:?}");
    assert!(
        colour_of(&b, "#timeline del").await.contains("130, 7, 30"),
        "removed in red"
    );
    assert!(
        colour_of(&b, "#timeline ins").await.contains("17, 99, 41"),
        "added in green"
    );
    // The time axis: five events, the timeout requested (with its due time), then fired.
    assert_eq!(count(&b, "#time-axis g.mark.event").await, 5);
    assert_eq!(count(&b, "#time-axis g.mark.requested").await, 1);
    assert_eq!(count(&b, "#time-axis g.mark.due").await, 1);
    assert_eq!(count(&b, "#time-axis g.mark.fired").await, 1);
    assert_eq!(count(&b, "#time-axis g.mark.event.k-dead").await, 1);
    shot(&b, "saga-timeline", None, 1500).await;

    // Filters: failures only.
    let filter = b.client.form(Locator::Css("#history-filters")).await.unwrap();
    for k in ["retried", "dead_lettered"] {
        b.client
            .find(Locator::Css(&format!("#history-filters input[value=\"{k}\"]")))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
    }
    filter.submit().await.unwrap();
    b.wait_for_url("outcome=retried").await;
    assert_eq!(
        attrs(&b, "#timeline tbody.event", "data-kind").await,
        ["retried", "dead_lettered"]
    );

    // The conversation of the first message, from its link.
    b.client
        .goto(&format!(
            "{base}/history/saga?saga=store.Checkout&correlation=cart-1043"
        ))
        .await
        .unwrap();
    b.client
        .find(Locator::Css("#timeline tbody.event a.msg"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    b.wait_for_url("/history/message").await;
    assert!(b.text("h1").await.starts_with("Message store.CheckoutStarted"));
    assert_eq!(
        attrs(&b, "#sequence g.lifeline", "data-name").await,
        ["sender", "shop", "stock"]
    );
    let mut arrows = svg_texts(&b, "#sequence text.label").await;
    // The dispatcher's steps of the timeout, when recorded: arrows from shop to itself.
    arrows.retain(|a| !a.contains(": timeout-"));
    let want = [
        "store.CheckoutStarted: handled",
        "timeout store.CheckoutExpired requested",
        "store.ReserveStock: retried",
        "store.ReserveStock: handled #2",
        "store.StockReserved: retried",
        "store.StockReserved: handled #2",
        "store.StockLow: dead-lettered",
        "timeout store.CheckoutExpired: handled",
    ];
    for w in want {
        assert!(arrows.iter().any(|a| a.starts_with(w)), "{w} in {arrows:?}");
    }
    assert_eq!(arrows.len(), want.len(), "{arrows:?}");
    // The timeout's arrows go from shop to shop; the failed ones have their colours.
    let timeout_rows = b
        .client
        .find_all(Locator::Css("#sequence g.arrow.k-timeout path"))
        .await
        .unwrap();
    assert_eq!(timeout_rows.len(), 1, "the request: an arrow from shop to itself");
    assert_eq!(count(&b, "#sequence g.arrow.k-dead").await, 1);
    assert_eq!(count(&b, "#sequence g.arrow.k-retried").await, 2);
    shot(&b, "conversation", Some("#conversation"), 1250).await;
    b.close().await;
    store.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_links_to_its_history_and_its_resubmission_shows_there() {
    let store = Store::start().await;
    store.shop().bus().send(&PlaceOrder { order: 1043 }).await.unwrap();
    eventually("the order dead-lettered", || async {
        dead_count(&store.admin, "shop").await == 1
    })
    .await;
    let seq = store.admin.all_dead_letters("shop").await.unwrap()[0];
    let dead = store.admin.dead_letter("shop", seq).await.unwrap();
    let console = over(&store.admin).history(Arc::new(store.admin.clone()) as Arc<dyn HistoryAdmin>);
    let base = serve(console).await;
    let b = Browser::start().await;

    b.client
        .goto(&format!("{base}/dlq/message?queue=shop&seq={seq}"))
        .await
        .unwrap();
    b.client
        .find(Locator::Css("#history-link a"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    b.wait_for_url("/history/message").await;
    assert!(b.text("h1").await.contains(&dead.message_id));
    assert_eq!(attrs(&b, "#events tbody tr", "data-kind").await, ["dead_lettered"]);
    assert!(b.text("#events").await.contains("the tax service answered 503"));
    b.screenshot("dead-letter-history").await;

    // Resubmitted from the console: handled, and the card charged on billing.
    b.client
        .goto(&format!("{base}/dlq/message?queue=shop&seq={seq}"))
        .await
        .unwrap();
    b.client
        .find(Locator::Css("button.primary"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    b.wait_for_url("done=resubmitted").await;
    eventually("the card charged", || async {
        store
            .conversation_has(&dead.message_id, "store.ChargeCard", HistoryKind::Handled)
            .await
    })
    .await;
    b.client
        .goto(&format!("{base}/history/message?id={}", dead.message_id))
        .await
        .unwrap();
    assert_eq!(
        attrs(&b, "#events tbody tr", "data-kind").await,
        ["dead_lettered", "handled"]
    );
    assert_eq!(
        attrs(&b, "#sequence g.lifeline", "data-name").await,
        ["sender", "shop", "billing"]
    );
    let arrows = svg_texts(&b, "#sequence text.label").await;
    assert_eq!(
        arrows,
        [
            "store.PlaceOrder: dead-lettered",
            "store.PlaceOrder: handled",
            "store.ChargeCard: handled"
        ]
    );
    assert_eq!(count(&b, "#sequence g.arrow.k-dead").await, 1);
    assert!(b.text("#messages").await.contains("billing: handled"));
    shot(&b, "conversation-resubmitted", Some("#events"), 1000).await;
    // The charge's page: caused by the order.
    b.client
        .find(Locator::Css("#messages tr:nth-child(2) a.msg"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    b.wait_for_text("#caused-by", &dead.message_id).await;
    b.close().await;
    store.stop().await;
}

/// A screenshot of the page (when asked) in a window `height` pixels tall, scrolled to
/// the element `css` selects.
pub(crate) async fn shot(b: &Browser, name: &str, css: Option<&str>, height: u32) {
    if std::env::var_os("COURIER_CONSOLE_SCREENSHOTS").is_none() {
        return;
    }
    b.client.set_window_size(1280, height).await.unwrap();
    if let Some(css) = css {
        b.client
            .execute(
                "document.querySelector(arguments[0]).scrollIntoView()",
                vec![serde_json::json!(css)],
            )
            .await
            .unwrap();
    }
    b.screenshot(name).await;
    b.client.set_window_size(1280, 900).await.unwrap();
}

/// The values of attribute `name` of every element `css` selects.
pub(crate) async fn attrs(b: &Browser, css: &str, name: &str) -> Vec<String> {
    let mut out = Vec::new();
    for e in b.client.find_all(Locator::Css(css)).await.unwrap() {
        out.push(e.attr(name).await.unwrap().unwrap_or_default());
    }
    out
}

/// The texts of every element `css` selects.
pub(crate) async fn texts(b: &Browser, css: &str) -> Vec<String> {
    let mut out = Vec::new();
    for e in b.client.find_all(Locator::Css(css)).await.unwrap() {
        out.push(e.text().await.unwrap());
    }
    out
}

/// The text content of every SVG element `css` selects.
pub(crate) async fn svg_texts(b: &Browser, css: &str) -> Vec<String> {
    let mut out = Vec::new();
    for e in b.client.find_all(Locator::Css(css)).await.unwrap() {
        out.push(e.prop("textContent").await.unwrap().unwrap_or_default());
    }
    out
}

pub(crate) async fn count(b: &Browser, css: &str) -> usize {
    b.client.find_all(Locator::Css(css)).await.unwrap().len()
}

async fn colour_of(b: &Browser, css: &str) -> String {
    b.client
        .find(Locator::Css(css))
        .await
        .unwrap()
        .css_value("color")
        .await
        .unwrap()
}
