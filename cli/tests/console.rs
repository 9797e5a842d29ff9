//! The web console in a real browser: headless Chromium driven over WebDriver
//! (chromedriver, started by each test on a free port), against a console served in
//! this process over the operations API of an embedded broker that runs endpoints here.
//!
//! Needs the Debian packages `chromium` and `chromium-driver` (.ci/run and scripts/test.sh
//! install them when run as root); a missing chromedriver fails the test with what to
//! install. `CHROMEDRIVER` names another chromedriver, `CHROMIUM` another browser.
//!
//! With `COURIER_CONSOLE_SCREENSHOTS=DIR` the tour of the pages saves a PNG of each in DIR
//! (docs/console/ holds the ones the docs show):
//! `COURIER_CONSOLE_SCREENSHOTS=docs/console cargo test -p courier-cli --test console`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use courier::admin::{EmbeddedAdmin, QueueAdmin, StoreAdmin};
use courier::saga::SagaContext;
use courier::{
    Clock, Context, Embedded, Endpoint, EntityPath, Envelope, HandlerError, QueueOptions, Routes, RunningEndpoint,
    SenderOptions, Transport, VirtualClock,
};
use courier_cli::console::Console;
use fantoccini::{Client, ClientBuilder, Locator};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use serde::{Deserialize, Serialize};

// ---------------------------------------------------------------- the system under test

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "shop.PlaceOrder")]
struct PlaceOrder {
    order_id: u32,
    amount_cents: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "shop.CheckoutStarted")]
struct CheckoutStarted {
    cart: String,
    items: Vec<String>,
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

    #[timeout]
    async fn expired(&mut self, _t: CheckoutExpired, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        ctx.complete();
        Ok(())
    }
}

/// What the orders handler has seen.
#[derive(Debug, Default)]
struct Shop {
    /// Handler calls.
    calls: AtomicU32,
    /// Orders handled successfully.
    placed: AtomicU32,
    /// Fail every call (else only the first).
    always_fail: bool,
}

#[derive(Debug)]
struct TaxServiceDown;

impl std::fmt::Display for TaxServiceDown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the tax service answered 503")
    }
}

impl std::error::Error for TaxServiceDown {}

/// Fails its first call (or every call) for good: the message is dead-lettered at once.
#[courier::handler]
async fn place_order(_order: PlaceOrder, ctx: &mut Context) -> Result<(), HandlerError> {
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
async fn broker_file(clock: Arc<dyn Clock>) -> (tempfile::TempDir, Embedded) {
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
async fn shop(always_fail: bool) -> (tempfile::TempDir, Embedded, RunningEndpoint, Arc<Shop>) {
    shop_on(always_fail, Arc::new(courier::SystemClock)).await
}

/// [`shop`] on `clock`.
async fn shop_on(
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
async fn dead_letter(broker: &Embedded, queue: &str, body: impl Into<bytes::Bytes>, message_type: &str, reason: &str) {
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
async fn eventually<F, Fut>(what: &str, mut check: F)
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
async fn dead_count(admin: &EmbeddedAdmin, queue: &str) -> u64 {
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
async fn serve(console: Console) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { console.serve(listener, std::future::pending()).await.unwrap() });
    base
}

fn over(admin: &EmbeddedAdmin) -> Console {
    Console::new()
        .queues(Arc::new(admin.clone()) as Arc<dyn QueueAdmin>)
        .store(Arc::new(admin.clone()) as Arc<dyn StoreAdmin>)
}

// ---------------------------------------------------------------- the browser

/// Headless Chromium behind a chromedriver this test started.
struct Browser {
    client: Client,
    driver: Child,
    /// The chromedriver's port and the session, to end it from `drop` when a test failed
    /// (killing chromedriver alone would leave its Chromium running).
    port: u16,
    session: Option<String>,
    _profile: tempfile::TempDir,
}

const INSTALL: &str = "the console's browser tests need Chromium and its WebDriver: install them with \
     `apt-get install chromium chromium-driver` (Debian; .ci/run and scripts/test.sh do it when run as root), \
     or set CHROMEDRIVER to a chromedriver (and CHROMIUM to its browser)";

impl Browser {
    async fn start() -> Self {
        let driver_bin = std::env::var("CHROMEDRIVER").unwrap_or_else(|_| "chromedriver".into());
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let driver = Command::new(&driver_bin)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start `{driver_bin}` ({e}): {INSTALL}"));
        let profile = tempfile::tempdir().unwrap();
        let mut options = serde_json::json!({
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1280,900", "--hide-scrollbars",
                format!("--user-data-dir={}", profile.path().display()),
            ],
        });
        let chromium = std::env::var("CHROMIUM").ok().or_else(|| {
            ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
                .into_iter()
                .find(|p| std::path::Path::new(p).exists())
                .map(str::to_owned)
        });
        if let Some(binary) = chromium {
            options["binary"] = binary.into();
        }
        let mut caps = serde_json::Map::new();
        caps.insert("goog:chromeOptions".into(), options);
        let url = format!("http://127.0.0.1:{port}");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let mut driver = driver;
        let client = loop {
            match ClientBuilder::new(HttpConnector::new())
                .capabilities(caps.clone())
                .connect(&url)
                .await
            {
                Ok(c) => break c,
                Err(e) => {
                    if let Ok(Some(status)) = driver.try_wait() {
                        panic!("`{driver_bin}` exited ({status}) before a session started: {INSTALL}");
                    }
                    if tokio::time::Instant::now() >= deadline {
                        let _ = driver.kill();
                        panic!("no browser session from `{driver_bin}` within 60 s ({e}): {INSTALL}");
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        let session = client.session_id().await.unwrap();
        let browser = Self {
            client,
            driver,
            port,
            session,
            _profile: profile,
        };
        browser.client.set_window_size(1280, 900).await.unwrap();
        browser
    }

    /// The text of the first element `css` selects (waiting for it to appear).
    async fn text(&self, css: &str) -> String {
        let found = self
            .client
            .wait()
            .at_most(Duration::from_secs(20))
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no {css} on the page ({e})"));
        found.text().await.unwrap()
    }

    async fn has(&self, css: &str) -> bool {
        !self.client.find_all(Locator::Css(css)).await.unwrap().is_empty()
    }

    /// Saves a PNG of the page as DIR/`name`.png when COURIER_CONSOLE_SCREENSHOTS=DIR.
    async fn screenshot(&self, name: &str) {
        if let Ok(dir) = std::env::var("COURIER_CONSOLE_SCREENSHOTS") {
            // Relative to the workspace, where the command is run from.
            let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(dir);
            std::fs::create_dir_all(&dir).unwrap();
            let png = self.client.screenshot().await.unwrap();
            std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
        }
    }

    async fn close(mut self) {
        self.client.clone().close().await.unwrap();
        self.session = None;
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // A test that failed did not close its session: end it (and so its Chromium) with
        // a blocking request, then stop chromedriver.
        if let Some(session) = self.session.take() {
            use std::io::{Read, Write};
            if let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", self.port)) {
                let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                let _ = write!(
                    stream,
                    "DELETE /session/{session} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n\r\n",
                    self.port
                );
                let _ = stream.read_to_end(&mut Vec::new());
            }
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

// ---------------------------------------------------------------- a plain HTTP client

struct Answer {
    status: u16,
    headers: hyper::HeaderMap,
    body: String,
}

async fn http(method: &str, url: &str, headers: &[(&str, &str)], form: Option<&str>) -> Answer {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build::<_, Full<bytes::Bytes>>(HttpConnector::new());
    let mut request = hyper::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    if form.is_some() {
        request = request.header("content-type", "application/x-www-form-urlencoded");
    }
    let body = Full::new(bytes::Bytes::from(form.unwrap_or_default().to_owned()));
    let response = client.request(request.body(body).unwrap()).await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// How many points the sparkline of `queue` has on a dashboard page.
fn sparkline_points(page: &str, queue: &str) -> usize {
    let Some(row) = page.split(&format!("data-queue=\"{queue}\"")).nth(1) else {
        return 0;
    };
    let row = row.split("</tr>").next().unwrap_or_default();
    row.split("<polyline points=\"")
        .nth(1)
        .and_then(|p| p.split('"').next())
        .map_or(0, |p| p.split(' ').count())
}

/// The CSRF token of a page's forms.
fn csrf_of(page: &str) -> String {
    let at = page.find("name=\"csrf\" value=\"").expect("a form with the CSRF token") + 19;
    page[at..].split('"').next().unwrap().to_owned()
}

// ---------------------------------------------------------------- the tests

/// (a) The dashboard shows each queue with its counts; and a tour of every page, each
/// checked, with a screenshot of each when asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_shows_what_the_broker_and_the_store_hold() {
    let clock = VirtualClock::starting_now();
    let (_dir, broker, endpoint, _shop) = shop_on(true, Arc::new(clock.clone())).await;
    let admin = EmbeddedAdmin::new(broker.clone());
    let base = serve(over(&admin).sample_every(Duration::from_millis(100))).await;

    // An hour of dead-letter history, on the virtual clock: a poison order now and then,
    // the console's sampler recording each step (seen in the sparkline's points).
    let mut order_id = 0;
    for (step, dead) in [0, 1, 1, 2, 2, 3].into_iter().enumerate() {
        while dead_count(&admin, "shop").await < dead {
            order_id += 1;
            let want = dead_count(&admin, "shop").await + 1;
            endpoint
                .bus()
                .send(&PlaceOrder {
                    order_id,
                    amount_cents: 1250,
                })
                .await
                .unwrap();
            eventually("a dead letter", || async { dead_count(&admin, "shop").await >= want }).await;
        }
        eventually("the sampler to record the step", || async {
            sparkline_points(&http("GET", &format!("{base}/"), &[], None).await.body, "shop") > step + 1
        })
        .await;
        clock.advance(Duration::from_secs(10 * 60));
    }
    for (i, cart) in ["cart-1042", "cart-1043", "cart-1044"].into_iter().enumerate() {
        let items = (0..=i).map(|n| format!("sku-{}", 100 + n)).collect();
        endpoint
            .bus()
            .send(&CheckoutStarted {
                cart: cart.into(),
                items,
            })
            .await
            .unwrap();
    }
    eventually("three sagas", || async {
        admin.sagas("shop.Checkout", &Default::default()).await.unwrap().len() == 3
    })
    .await;
    // A queue nobody receives from: active messages, and a binary dead letter.
    broker.create_queue("billing", &QueueOptions::default()).await.unwrap();
    let sender = broker.sender("billing", SenderOptions::default()).await.unwrap();
    for n in 0..4 {
        sender
            .send(Envelope::new(format!("{{\"invoice\":{n}}}")))
            .await
            .unwrap();
    }
    dead_letter(
        &broker,
        "images",
        vec![0x89, b'P', b'N', b'G', 0, 1, 2, 255],
        "media.Thumbnail",
        "MaxDeliveryCountExceeded",
    )
    .await;

    let b = Browser::start().await;

    b.client.goto(&format!("{base}/")).await.unwrap();
    let row = "#queues tr[data-queue=\"billing\"]";
    assert_eq!(b.text(&format!("{row} td.active")).await, "4");
    assert_eq!(b.text(&format!("{row} td.dead")).await, "0");
    assert_eq!(b.text("#queues tr[data-queue=\"shop\"] td.dead").await, "3");
    assert_eq!(b.text("#queues tr[data-queue=\"images\"] td.dead").await, "1");
    assert!(
        b.has("#queues tr[data-queue=\"shop\"] svg.spark").await,
        "a sparkline per queue"
    );
    let points = b
        .client
        .find(Locator::Css("#queues tr[data-queue=\"shop\"] svg.spark polyline"))
        .await
        .unwrap()
        .attr("points")
        .await
        .unwrap()
        .unwrap();
    assert!(
        points.split(' ').count() >= 7,
        "the samples of the hour and now: {points}"
    );
    assert!(
        b.text("#store").await.contains("3 saga instances"),
        "{}",
        b.text("#store").await
    );
    b.screenshot("dashboard").await;

    b.client
        .find(Locator::Css("#queues tr[data-queue=\"shop\"] td.dead a"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert_eq!(b.text("h1").await, "Dead letters of shop");
    assert_eq!(
        b.client
            .find_all(Locator::Css("#dead-letters tbody tr"))
            .await
            .unwrap()
            .len(),
        3
    );
    assert!(b.text("#dead-letters").await.contains("the tax service answered 503"));
    b.screenshot("dead-letters").await;

    b.client
        .find(Locator::Css("#dead-letters a.message-id"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert!(b.text("h1").await.starts_with("Dead letter "));
    assert!(b.text("#error").await.contains("the tax service answered 503"));
    assert!(b.text("#body").await.contains("\"order_id\": 1"), "JSON shown pretty");
    assert!(b.text("#headers").await.contains("courier.failure.error"));
    b.screenshot("dead-letter").await;

    b.client.goto(&format!("{base}/dlq?queue=images")).await.unwrap();
    b.client
        .find(Locator::Css("#dead-letters a.message-id"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert!(
        b.text("#body").await.contains("89 50 4e 47 00 01 02 ff"),
        "bytes in hex"
    );

    b.client.goto(&format!("{base}/sagas")).await.unwrap();
    assert!(b.text("#saga-types").await.contains("shop.Checkout"));
    b.client
        .find(Locator::LinkText("shop.Checkout"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert_eq!(
        b.client.find_all(Locator::Css("#sagas tbody tr")).await.unwrap().len(),
        3
    );
    b.screenshot("sagas").await;
    let filter = b.client.form(Locator::Css("form.filters")).await.unwrap();
    filter.set_by_name("correlation", "1043").await.unwrap();
    filter.submit().await.unwrap();
    assert_eq!(
        b.client.find_all(Locator::Css("#sagas tbody tr")).await.unwrap().len(),
        1
    );
    b.client
        .find(Locator::LinkText("cart-1043"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert_eq!(b.text("#version").await, "1");
    assert!(b.text("#state").await.contains("sku-101"));
    assert!(b.text("#timeouts").await.contains("shop.CheckoutExpired"));
    b.screenshot("saga").await;

    b.client.goto(&format!("{base}/timeouts")).await.unwrap();
    assert_eq!(
        b.client
            .find_all(Locator::Css("#timeouts tbody tr"))
            .await
            .unwrap()
            .len(),
        3
    );
    b.screenshot("timeouts").await;
    b.client.goto(&format!("{base}/timeouts?overdue=on")).await.unwrap();
    assert!(b.has("#no-timeouts").await, "none is overdue");

    b.client.goto(&format!("{base}/outbox")).await.unwrap();
    assert_eq!(b.text("h1").await, "Outbox");

    // Completing a saga by hand: the reason is required (the form says so, and the
    // server refuses an empty one).
    b.client
        .goto(&format!(
            "{base}/sagas/instance?saga=shop.Checkout&correlation=cart-1042"
        ))
        .await
        .unwrap();
    let csrf = b
        .client
        .find(Locator::Css("input[name=csrf]"))
        .await
        .unwrap()
        .attr("value")
        .await
        .unwrap()
        .unwrap();
    let form = format!("csrf={csrf}&saga=shop.Checkout&correlation=cart-1042&reason=+");
    let refused = http("POST", &format!("{base}/sagas/complete"), &[], Some(&form)).await;
    assert_eq!(refused.status, 400, "{}", refused.body);
    assert!(
        admin.saga("shop.Checkout", "cart-1042").await.is_ok(),
        "not completed without a reason"
    );
    let complete = b
        .client
        .form(Locator::Css("form[action=\"/sagas/complete\"]"))
        .await
        .unwrap();
    complete
        .set_by_name("reason", "the customer paid by phone")
        .await
        .unwrap();
    complete.submit().await.unwrap();
    assert!(b.text("#flash").await.contains("cart-1042"));
    assert!(admin.saga("shop.Checkout", "cart-1042").await.is_err(), "completed");

    b.close().await;
    endpoint.shutdown().await.unwrap();
}

/// (b) A poison message: its DLQ page, the resubmit button, and the running endpoint
/// handles it; the page then shows no dead letter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resubmitted_dead_letter_is_handled_by_the_running_endpoint() {
    let (_dir, broker, endpoint, shop) = shop(false).await;
    let admin = EmbeddedAdmin::new(broker.clone());
    endpoint
        .bus()
        .send(&PlaceOrder {
            order_id: 1,
            amount_cents: 990,
        })
        .await
        .unwrap();
    eventually("the poison message in the DLQ", || async {
        dead_count(&admin, "shop").await == 1
    })
    .await;
    assert_eq!(shop.placed.load(Ordering::SeqCst), 0);

    let base = serve(over(&admin)).await;
    let b = Browser::start().await;
    b.client.goto(&format!("{base}/")).await.unwrap();
    b.client
        .find(Locator::Css("#queues tr[data-queue=\"shop\"] td.dead a"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert_eq!(
        b.client
            .find_all(Locator::Css("#dead-letters tbody tr"))
            .await
            .unwrap()
            .len(),
        1
    );
    b.client
        .find(Locator::XPath("//table[@id='dead-letters']//button[text()='Resubmit']"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert_eq!(b.text("#flash").await, "1 message resubmitted.");

    eventually("the endpoint to handle the resubmitted order", || async {
        shop.placed.load(Ordering::SeqCst) == 1
    })
    .await;
    assert_eq!(shop.calls.load(Ordering::SeqCst), 2, "one failure, one success");
    b.client.refresh().await.unwrap();
    assert!(b.has("#empty").await, "no dead letter left: {}", b.text("main").await);
    assert!(!b.has("#dead-letters").await);
    b.close().await;
    endpoint.shutdown().await.unwrap();
}

/// (c) A dead letter's body, type and reason with markup show as text; nothing runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn markup_in_a_dead_letter_shows_as_text_and_never_runs() {
    let (_dir, broker) = broker_file(Arc::new(courier::SystemClock)).await;
    let admin = EmbeddedAdmin::new(broker.clone());
    let body = "<script>alert(1)</script>";
    let marker = "<img src=x onerror=\"document.title='pwned'\">";
    dead_letter(
        &broker,
        "xss",
        body,
        marker,
        "<b>bold</b><script>document.title='pwned'</script>",
    )
    .await;
    let base = serve(over(&admin)).await;
    let b = Browser::start().await;

    b.client.goto(&format!("{base}/dlq?queue=xss")).await.unwrap();
    assert!(b.text("#dead-letters").await.contains(marker), "the type as text");
    b.client
        .find(Locator::Css("#dead-letters a.message-id"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert_eq!(b.text("#body").await, body);
    assert!(b.text("#reason").await.contains("<b>bold</b>"));
    assert!(b.text("#fields").await.contains(marker));
    let untouched = b
        .client
        .execute(
            "return [document.title, document.querySelectorAll('main script, main img, main b').length]",
            vec![],
        )
        .await
        .unwrap();
    assert!(
        untouched[0].as_str().unwrap().starts_with("Dead letter"),
        "no script changed the title: {untouched}"
    );
    assert_eq!(untouched[1], 0, "no element made of the message's data: {untouched}");
    assert!(b.client.get_alert_text().await.is_err(), "no alert open");
    b.close().await;
}

/// (d) Without the CSRF token (or from another origin) a change is refused with 403; with
/// a token configured, a request without it is refused with 401; a login sets a cookie
/// that lets the browser in; a console without a token refuses a non-loopback Host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_need_the_csrf_token_and_requests_the_access_token() {
    let (_dir, broker) = broker_file(Arc::new(courier::SystemClock)).await;
    let admin = EmbeddedAdmin::new(broker.clone());
    dead_letter(&broker, "orders", "{}", "shop.PlaceOrder", "test.Poison").await;
    let seq = admin.all_dead_letters("orders").await.unwrap()[0];
    let token = "console-test-token-0123456789";
    let base = serve(over(&admin).token(token)).await;
    let bearer = format!("Bearer {token}");
    let auth = [("authorization", bearer.as_str())];

    let anonymous = http("GET", &format!("{base}/"), &[], None).await;
    assert_eq!(anonymous.status, 401);
    assert!(anonymous.body.contains("name=\"token\""), "the login form");
    let change = format!("queue=orders&one={seq}");
    let no_token = http("POST", &format!("{base}/dlq/delete"), &[], Some(&change)).await;
    assert_eq!(no_token.status, 401);

    let page = http("GET", &format!("{base}/dlq?queue=orders"), &auth, None).await;
    assert_eq!(page.status, 200);
    let csrf = csrf_of(&page.body);
    let no_csrf = http(
        "POST",
        &format!("{base}/dlq/delete"),
        &auth,
        Some(&format!("{change}&confirmed=1")),
    )
    .await;
    assert_eq!(no_csrf.status, 403, "{}", no_csrf.body);
    let wrong = http(
        "POST",
        &format!("{base}/dlq/delete"),
        &auth,
        Some(&format!("{change}&confirmed=1&csrf=x{csrf}")),
    )
    .await;
    assert_eq!(wrong.status, 403);
    let origin = [("authorization", bearer.as_str()), ("origin", "https://evil.example")];
    let foreign = http(
        "POST",
        &format!("{base}/dlq/delete"),
        &origin,
        Some(&format!("{change}&confirmed=1&csrf={csrf}")),
    )
    .await;
    assert_eq!(foreign.status, 403);
    let get_changes_nothing = http(
        "GET",
        &format!("{base}/dlq/delete?{change}&confirmed=1&csrf={csrf}"),
        &auth,
        None,
    )
    .await;
    assert_eq!(get_changes_nothing.status, 405);
    assert_eq!(dead_count(&admin, "orders").await, 1, "nothing was deleted");

    let ok = http(
        "POST",
        &format!("{base}/dlq/delete"),
        &auth,
        Some(&format!("{change}&confirmed=1&csrf={csrf}")),
    )
    .await;
    assert_eq!(ok.status, 303, "{}", ok.body);
    assert_eq!(dead_count(&admin, "orders").await, 0);

    // The login form in the browser: a wrong token, then the right one.
    let b = Browser::start().await;
    b.client.goto(&format!("{base}/")).await.unwrap();
    assert_eq!(b.text("h1").await, "Log in");
    let login = b.client.form(Locator::Css("form.login")).await.unwrap();
    login.set_by_name("token", "not-the-token").await.unwrap();
    login.submit().await.unwrap();
    assert!(b.text("main").await.contains("not the access token"));
    let login = b.client.form(Locator::Css("form.login")).await.unwrap();
    login.set_by_name("token", token).await.unwrap();
    login.submit().await.unwrap();
    assert_eq!(b.text("h1").await, "Queues");
    b.client.goto(&format!("{base}/")).await.unwrap();
    assert_eq!(b.text("h1").await, "Queues", "the cookie keeps the browser in");
    b.close().await;

    // The login's cookie is HttpOnly and SameSite=Strict.
    let form = format!("csrf={csrf}&token={token}");
    let logged = http("POST", &format!("{base}/login"), &[], Some(&form)).await;
    assert_eq!(logged.status, 303);
    let cookie = logged.headers["set-cookie"].to_str().unwrap().to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let session = cookie.split(';').next().unwrap();
    assert_eq!(
        http("GET", &format!("{base}/"), &[("cookie", session)], None)
            .await
            .status,
        200
    );

    // Without a token: loopback names only.
    let open = serve(over(&admin)).await;
    assert_eq!(http("GET", &format!("{open}/"), &[], None).await.status, 200);
    assert_eq!(
        http("GET", &format!("{open}/"), &[("host", "console.example:80")], None)
            .await
            .status,
        403
    );
}

/// `courier serve` refuses a non-loopback address without a token, saying what to do.
#[tokio::test]
async fn serve_refuses_a_public_address_without_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("app.db");
    Embedded::open(&file).await.unwrap().close().await;
    let out = Command::new(env!("CARGO_BIN_EXE_courier"))
        .args(["serve", "--listen", "0.0.0.0:0", "--embedded"])
        .arg(&file)
        .env_remove("COURIER_CONSOLE_TOKEN")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--token") && stderr.contains("COURIER_CONSOLE_TOKEN"),
        "{stderr}"
    );
}

/// (e) `courier serve` with a store URL that carries a password never shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_never_shows_a_connection_password() {
    let db = courier::test_servers::postgres_database().await.unwrap();
    // The test server's URL, with a password in it (the server trusts, or this is its own).
    let url = db.url();
    let (url, password) = match url.split_once("://").and_then(|(_, rest)| rest.split_once('@')) {
        Some((user_info, _)) if user_info.contains(':') => {
            let password = user_info.split_once(':').unwrap().1.to_owned();
            (url.clone(), password)
        }
        _ => (
            url.replacen("://postgres@", "://postgres:console-s3cret-pw@", 1),
            "console-s3cret-pw".to_owned(),
        ),
    };
    assert!(url.contains(&format!(":{password}@")), "a password in {url}");
    courier::PostgresStore::connect(&url).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("app.db");
    Embedded::open(&file).await.unwrap().close().await;
    let mut child = Command::new(env!("CARGO_BIN_EXE_courier"))
        .args(["serve", "--listen", "127.0.0.1:0", "--embedded"])
        .arg(&file)
        .env("COURIER_POSTGRES", &url)
        .env_remove("COURIER_CONSOLE_TOKEN")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let first = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        let mut line = String::new();
        std::io::BufReader::new(stderr).read_line(&mut line).unwrap();
        line
    })
    .await
    .unwrap();
    let base = first
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no address in {first:?}"))
        .trim_end_matches('/')
        .to_owned();
    assert!(!first.contains(&password), "{first}");
    let pages = [
        "/",
        "/sagas",
        "/sagas/list?saga=none",
        "/sagas/instance?saga=none&correlation=x",
        "/timeouts",
        "/outbox",
    ];
    let mut shown = String::new();
    for p in pages {
        let a = http("GET", &format!("{base}{p}"), &[], None).await;
        assert!(
            !a.body.contains(&format!(":{password}@")),
            "{p} shows the password: {}",
            a.body
        );
        shown.push_str(&a.body);
    }
    assert!(shown.contains(":***@"), "the store is named, its password hidden");
    child.kill().unwrap();
    child.wait().unwrap();
    db.drop_database().await.unwrap();
}

/// Errors are pages with the status that fits and what to do: 400 for a wrong address,
/// 404 for what is not there, 409 for a change refused (a broker file another broker
/// holds), 404 for a part the console was not given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_pages_with_the_status_that_fits() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("app.db");
    let running = Embedded::open(&file).await.unwrap();
    dead_letter(&running, "orders", "{}", "shop.PlaceOrder", "test.Poison").await;
    // The file is held by the broker above: this admin can only read it.
    let read_only = EmbeddedAdmin::open(&file).await.unwrap();
    assert!(read_only.is_read_only());
    let seq = read_only.all_dead_letters("orders").await.unwrap()[0];
    let base = serve(Console::new().queues(Arc::new(read_only.clone()))).await;

    let get = |path: &str| {
        let url = format!("{base}{path}");
        async move { http("GET", &url, &[], None).await }
    };
    let no_queue = get("/dlq").await;
    assert_eq!(no_queue.status, 400);
    assert!(no_queue.body.contains("open it from the console"), "{}", no_queue.body);
    let missing = get("/dlq?queue=nope").await;
    assert_eq!(missing.status, 404);
    assert!(missing.body.contains("go back to the list"), "{}", missing.body);
    assert_eq!(
        get(&format!("/dlq/message?queue=orders&seq={}", seq + 1000))
            .await
            .status,
        404
    );
    assert_eq!(get("/no/such/page").await.status, 404);
    let no_store = get("/sagas").await;
    assert_eq!(no_store.status, 404);
    assert!(
        no_store.body.contains("--embedded FILE, --postgres URL"),
        "{}",
        no_store.body
    );

    let page = get(&format!("/dlq/message?queue=orders&seq={seq}")).await;
    assert_eq!(page.status, 200, "reading works");
    let csrf = csrf_of(&page.body);
    let refused = http(
        "POST",
        &format!("{base}/dlq/resubmit"),
        &[],
        Some(&format!("csrf={csrf}&queue=orders&one={seq}")),
    )
    .await;
    assert_eq!(refused.status, 409, "{}", refused.body);
    assert!(refused.body.contains("stop that process first"), "{}", refused.body);
    assert_eq!(dead_count(&read_only, "orders").await, 1);
    read_only.close().await;
    running.close().await;
}

/// Without a token the router answers only a peer on loopback: one it cannot identify
/// (served without `ConnectInfo`) or another address gets 403, even with `Host:
/// localhost` (which any client can send).
#[tokio::test]
async fn without_a_token_only_a_loopback_peer_is_answered() {
    use axum::extract::ConnectInfo;
    use tower::ServiceExt;

    let (_dir, broker) = broker_file(Arc::new(courier::SystemClock)).await;
    let admin = EmbeddedAdmin::new(broker.clone());
    let router = over(&admin).router().unwrap();
    let ask = |peer: Option<[u8; 4]>| {
        let router = router.clone();
        async move {
            let mut request = axum::http::Request::builder()
                .uri("/")
                .header("host", "localhost:8080")
                .body(axum::body::Body::empty())
                .unwrap();
            if let Some(ip) = peer {
                request
                    .extensions_mut()
                    .insert(ConnectInfo(std::net::SocketAddr::from((ip, 40000))));
            }
            router.oneshot(request).await.unwrap().status().as_u16()
        }
    };
    assert_eq!(ask(Some([127, 0, 0, 1])).await, 200);
    assert_eq!(ask(Some([10, 0, 0, 5])).await, 403);
    assert_eq!(ask(None).await, 403, "a peer it cannot identify");
    broker.close().await;
}
