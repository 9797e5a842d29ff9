//! The system under test: messages, a saga, the endpoint `shop` on an embedded broker in a
//! file, dead letters made by hand, and the console served in-process over its admin.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use courier::admin::{EmbeddedAdmin, QueueAdmin, StoreAdmin};
use courier::saga::SagaContext;
use courier::{
    Clock, Context, Embedded, Endpoint, EntityPath, Envelope, HandlerError, QueueOptions, Routes, RunningEndpoint,
    SenderOptions, Transport,
};
use courier_cli::console::Console;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "shop.PlaceOrder")]
pub(crate) struct PlaceOrder {
    pub(crate) order_id: u32,
    pub(crate) amount_cents: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "shop.CheckoutStarted")]
pub(crate) struct CheckoutStarted {
    pub(crate) cart: String,
    pub(crate) items: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "shop.CheckoutExpired")]
pub(crate) struct CheckoutExpired;

#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Checkout {
    pub(crate) cart: String,
    pub(crate) items: Vec<String>,
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

    #[timeout]
    async fn expired(&mut self, _t: CheckoutExpired, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        ctx.complete();
        Ok(())
    }
}

/// What the orders handler has seen.
#[derive(Debug, Default)]
pub(crate) struct Shop {
    /// Handler calls.
    pub(crate) calls: AtomicU32,
    /// Orders handled successfully.
    pub(crate) placed: AtomicU32,
    /// Fail every call (else only the first).
    pub(crate) always_fail: bool,
}

#[derive(Debug)]
pub(crate) struct TaxServiceDown;

impl std::fmt::Display for TaxServiceDown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the tax service answered 503")
    }
}

impl std::error::Error for TaxServiceDown {}

/// Fails its first call (or every call) for good: the message is dead-lettered at once.
#[courier::handler]
pub(crate) async fn place_order(_order: PlaceOrder, ctx: &mut Context) -> Result<(), HandlerError> {
    let shop = ctx.state::<Arc<Shop>>()?;
    let call = shop.calls.fetch_add(1, Ordering::SeqCst) + 1;
    if call == 1 || shop.always_fail {
        return Err(HandlerError::permanent(TaxServiceDown));
    }
    shop.placed.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// An embedded broker in a file of a temporary directory (a file, as an operator's: its
/// readers never wait for its writer, where an in-memory broker's readers can meet
/// "table is locked").
pub(crate) async fn broker_file(clock: Arc<dyn Clock>) -> (tempfile::TempDir, Embedded) {
    let dir = tempfile::tempdir().unwrap();
    let broker = Embedded::builder()
        .path(dir.path().join("app.db"))
        .clock(clock)
        .open()
        .await
        .unwrap();
    (dir, broker)
}

/// An embedded broker with the endpoint `shop` (orders and the checkout saga).
pub(crate) async fn shop(always_fail: bool) -> (tempfile::TempDir, Embedded, RunningEndpoint, Arc<Shop>) {
    shop_on(always_fail, Arc::new(courier::SystemClock)).await
}

/// [`shop`] on `clock`.
pub(crate) async fn shop_on(
    always_fail: bool,
    clock: Arc<dyn Clock>,
) -> (tempfile::TempDir, Embedded, RunningEndpoint, Arc<Shop>) {
    let (dir, broker) = broker_file(clock.clone()).await;
    let state = Arc::new(Shop {
        always_fail,
        ..Shop::default()
    });
    let endpoint = Endpoint::builder("shop")
        .transport(broker.clone())
        .store(broker.store())
        .routes(Routes::new().send::<PlaceOrder>("shop").send::<CheckoutStarted>("shop"))
        .handler(place_order)
        .saga::<Checkout>()
        .clock(clock)
        .state(state.clone())
        .start()
        .await
        .unwrap();
    (dir, broker, endpoint, state)
}

/// Puts `body` in the dead-letter queue of `queue` (created if missing), as a receiver
/// would, with `reason`.
pub(crate) async fn dead_letter(
    broker: &Embedded,
    queue: &str,
    body: impl Into<bytes::Bytes>,
    message_type: &str,
    reason: &str,
) {
    broker.create_queue(queue, &QueueOptions::default()).await.ok();
    let sender = broker.sender(queue, SenderOptions::default()).await.unwrap();
    let mut m = Envelope::new(body.into());
    m.message_type = Some(message_type.into());
    sender.send(m).await.unwrap();
    let receiver = broker.receiver(&EntityPath::queue(queue)).await.unwrap();
    loop {
        if let Some(d) = receiver
            .receive(1, Duration::from_secs(5))
            .await
            .unwrap()
            .into_iter()
            .next()
        {
            d.dead_letter(reason, "dead-lettered by the test").await.unwrap();
            return;
        }
    }
}

/// Waits for `check` (a liveness bound of 30 s, not a timing assertion).
pub(crate) async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The dead-letter count of `queue` (read again after a transient failure).
pub(crate) async fn dead_count(admin: &EmbeddedAdmin, queue: &str) -> u64 {
    loop {
        match admin.queues().await {
            Ok(queues) => {
                return queues
                    .into_iter()
                    .find(|q| q.name == queue)
                    .map_or(0, |q| q.dead_lettered);
            }
            Err(e) if e.is_transient() => tokio::time::sleep(Duration::from_millis(10)).await,
            Err(e) => panic!("cannot count the dead letters of {queue}: {e}"),
        }
    }
}

/// Serves `console` on a free loopback port in this process; its base URL.
pub(crate) async fn serve(console: Console) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { console.serve(listener, std::future::pending()).await.unwrap() });
    base
}

pub(crate) fn over(admin: &EmbeddedAdmin) -> Console {
    Console::new()
        .queues(Arc::new(admin.clone()) as Arc<dyn QueueAdmin>)
        .store(Arc::new(admin.clone()) as Arc<dyn StoreAdmin>)
}
