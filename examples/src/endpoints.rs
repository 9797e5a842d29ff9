//! Two endpoints on the embedded broker exchanging a command and an event, with a flaky
//! handler that succeeds on its third attempt and a poison message that ends in the
//! dead-letter queue.
//!
//! - `sales` handles the command `PlaceOrder` and publishes the event `OrderPlaced`;
//! - `billing` subscribes to `OrderPlaced`; its payment gateway times out twice, so the
//!   handler fails on attempts 1 and 2 (transient errors, retried at once by the default
//!   retry policy) and charges the order on attempt 3;
//! - a `PlaceOrder` whose body is not JSON cannot be decoded: it goes straight to the
//!   dead-letter queue of `sales`, with the reason and the failure written on it.
//!
//! Run it with `cargo run -p courier-examples --bin endpoints`. It needs no server (the
//! broker lives in memory), takes about a second, prints one line per step and exits
//! 0 only when everything ended as described above. The framework's own log is off by
//! default; `RUST_LOG=courier=info` shows it (retries are WARN, dead letters ERROR).

#![allow(clippy::print_stdout)]

use std::error::Error;
use std::fmt;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use courier::prelude::*;
use courier::recoverability::{headers, reasons as failure_reasons};
use courier::{ReceivedMessage, ShutdownReport};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

/// How long the program waits for any one thing before it gives up.
const WAIT: Duration = Duration::from_secs(10);

/// On which attempt the payment gateway stops timing out.
const GATEWAY_ANSWERS_ON_ATTEMPT: u32 = 3;

/// A command: sent to one queue, the input queue of `sales`.
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "sales.PlaceOrder")]
struct PlaceOrder {
    /// The order.
    order_id: u32,
    /// What it costs.
    amount_cents: u64,
}

/// An event: published to a topic; every endpoint with a handler for it gets a copy.
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "sales.OrderPlaced")]
struct OrderPlaced {
    /// The order.
    order_id: u32,
    /// What to charge.
    amount_cents: u64,
}

/// The routing table both endpoints share: where commands go, which types are events.
fn routes() -> Routes {
    Routes::new().send::<PlaceOrder>("sales").event::<OrderPlaced>()
}

/// What the handlers tell `main`, so that it knows when the story is over and can check
/// how it went.
#[derive(Debug, Clone, PartialEq, Eq)]
enum News {
    /// `sales` accepted an order.
    Placed {
        /// The order.
        order_id: u32,
    },
    /// `billing` tried to charge an order.
    ChargeAttempt {
        /// The order.
        order_id: u32,
        /// Which attempt (1 on the first).
        attempt: u32,
        /// Whether the charge went through.
        charged: bool,
    },
}

/// The handlers' line back to `main`, given to both endpoints as state.
#[derive(Debug, Clone)]
struct Newsroom(mpsc::UnboundedSender<News>);

impl Newsroom {
    /// The newsroom of the endpoint handling the message.
    fn of(ctx: &Context) -> Result<&Self, HandlerError> {
        ctx.state::<Self>()
    }

    /// Tells `main`.
    fn tell(&self, news: News) -> Result<(), HandlerError> {
        self.0
            .send(news)
            .map_err(|_| HandlerError::msg("main stopped listening"))
    }
}

/// The error of the payment gateway stand-in.
#[derive(Debug)]
struct GatewayTimeout;

impl fmt::Display for GatewayTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("payment gateway timeout")
    }
}

impl Error for GatewayTimeout {}

/// A payment gateway stand-in that times out until the attempt
/// [`GATEWAY_ANSWERS_ON_ATTEMPT`].
fn charge_card(attempt: u32) -> Result<(), GatewayTimeout> {
    if attempt < GATEWAY_ANSWERS_ON_ATTEMPT {
        Err(GatewayTimeout)
    } else {
        Ok(())
    }
}

/// `sales`: accepts the order and publishes `OrderPlaced`. The event leaves only once the
/// handler returned `Ok`.
#[courier::handler]
async fn place_order(order: PlaceOrder, ctx: &mut Context) -> Result<(), HandlerError> {
    println!("sales: order {} placed, publishing OrderPlaced", order.order_id);
    ctx.publish(&OrderPlaced {
        order_id: order.order_id,
        amount_cents: order.amount_cents,
    })?;
    Newsroom::of(ctx)?.tell(News::Placed {
        order_id: order.order_id,
    })
}

/// `billing`: charges the order. A gateway timeout is a transient error: returning it
/// makes the endpoint hand the message back to the broker, which delivers it again.
#[courier::handler]
async fn charge_order(event: OrderPlaced, ctx: &mut Context) -> Result<(), HandlerError> {
    let attempt = ctx.attempt();
    let newsroom = Newsroom::of(ctx)?;
    let result = charge_card(attempt);
    newsroom.tell(News::ChargeAttempt {
        order_id: event.order_id,
        attempt,
        charged: result.is_ok(),
    })?;
    match result {
        Ok(()) => {
            println!(
                "billing: order {} charged {} cents on attempt {attempt}",
                event.order_id, event.amount_cents
            );
            Ok(())
        }
        Err(e) => {
            println!(
                "billing: attempt {attempt} for order {} failed: {e} (will retry)",
                event.order_id
            );
            Err(e.into())
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("off"));
    tracing_subscriber::fmt().with_env_filter(filter).init();
    // Ctrl-C (SIGINT) stops the story (`run` listens for it: its own handler, because a
    // program started as a script's background job inherits SIGINT ignored) and the
    // endpoints shut down gracefully.
    match run().await {
        Err(e) if e.is::<Interrupted>() => {
            println!("endpoints: {e}");
            ExitCode::from(130)
        }
        Ok(()) => {
            println!("ok: the order was charged once, after 3 attempts; the poison message was dead-lettered");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("endpoints: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Ctrl-C (SIGINT) was pressed: the endpoints were shut down gracefully.
#[derive(Debug)]
struct Interrupted;

impl fmt::Display for Interrupted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("interrupted by Ctrl-C; the endpoints stopped gracefully (the broker lived in memory)")
    }
}

impl Error for Interrupted {}

/// The whole story; an error says what went wrong. Ctrl-C ends it early with
/// [`Interrupted`], after the endpoints' graceful shutdown.
async fn run() -> Result<(), Box<dyn Error>> {
    // Listen from the start, so a Ctrl-C while the endpoints start counts too.
    let mut ctrl_c = tokio::spawn(tokio::signal::ctrl_c());
    let broker = Embedded::in_memory().await?;
    let transport: Arc<dyn Transport> = Arc::new(broker);
    let (news_tx, mut news) = mpsc::unbounded_channel();
    let newsroom = Newsroom(news_tx);

    // 1. Two endpoints. Each creates its input queue; `billing` also creates its
    //    subscription to the OrderPlaced topic, because it handles that event.
    let sales = Endpoint::builder("sales")
        .transport(transport.clone())
        .routes(routes())
        .state(newsroom.clone())
        .handler(place_order)
        .start()
        .await?;
    let billing = Endpoint::builder("billing")
        .transport(transport.clone())
        .routes(routes())
        .state(newsroom)
        .handler(charge_order)
        .start()
        .await?;
    let topic = routes()
        .topic_of(OrderPlaced::NAME)
        .ok_or("OrderPlaced has no topic")?
        .to_owned();
    println!("main: endpoints sales and billing started (billing subscribes to topic {topic})");

    // Steps 2 and 3 run until they end or Ctrl-C; either way the endpoints then stop
    // gracefully (step 4).
    let story = async {
        // 2. A command, sent from outside any handler with the endpoint's bus; wait until
        //    billing has charged the order.
        let order = PlaceOrder {
            order_id: 1,
            amount_cents: 4_200,
        };
        println!("main: sending PlaceOrder for order {}", order.order_id);
        sales.bus().send(&order).await?;
        let mut heard = Vec::new();
        let deadline = tokio::time::Instant::now() + WAIT;
        while !heard
            .iter()
            .any(|n| matches!(n, News::ChargeAttempt { charged: true, .. }))
        {
            match tokio::time::timeout_at(deadline, news.recv()).await {
                Ok(Some(n)) => heard.push(n),
                Ok(None) => return Err("the handlers' channel closed before the order was charged".into()),
                Err(_) => {
                    return Err(format!(
                        "the order was not charged within {WAIT:?} (heard so far: {heard:?}); \
                     run with RUST_LOG=courier=info to see why"
                    )
                    .into());
                }
            }
        }

        // 3. A poison message: typed as PlaceOrder, but its body is not JSON. No retry can
        //    decode it, so the endpoint dead-letters it at once.
        let poison = Envelope::new("{oops")
            .with_message_type(PlaceOrder::NAME)
            .with_content_type("application/json");
        let poison_id = poison.message_id.clone();
        println!("main: sending a poison PlaceOrder whose body is `{{oops` (message id {poison_id})");
        sales.bus().send_envelope("sales", poison).await?;

        // Nothing in the endpoint announces a dead letter, so wait for it the way an
        // operator's tool would: a receiver on the dead-letter sub-queue waits inside the
        // broker until a message arrives. Only looking: hand it back untouched.
        let dead_letter_queue = EntityPath::queue("sales").dead_letter();
        let watcher = transport.receiver(&dead_letter_queue).await?;
        let arrived = watcher.receive(1, WAIT).await?;
        if arrived.is_empty() {
            return Err(format!("nothing reached {dead_letter_queue} within {WAIT:?}").into());
        }
        for delivery in arrived {
            delivery.abandon().await?;
        }
        let dead = transport.peek(&dead_letter_queue, 0, 10).await?;
        println!("main: {dead_letter_queue} holds {} message(s):", dead.len());
        for message in &dead {
            print_dead_letter(message);
        }
        Ok::<_, Box<dyn Error>>((heard, dead, poison_id))
    };
    let told = tokio::select! {
        told = story => Some(told),
        Ok(Ok(())) = &mut ctrl_c => None,
    };

    // 4. Graceful shutdown: stop receiving, let running handlers finish.
    let billing_report = billing.shutdown().await?;
    let sales_report = sales.shutdown().await?;
    print_report("sales", &sales_report);
    print_report("billing", &billing_report);
    let Some(told) = told else {
        return Err(Interrupted.into());
    };
    let (mut heard, dead, poison_id) = told?;
    // The endpoints are stopped: whatever the handlers still said is in the channel.
    while let Ok(n) = news.try_recv() {
        heard.push(n);
    }
    let left_in_sales = transport.counts(&EntityPath::queue("sales")).await?;
    let left_in_billing = transport.counts(&EntityPath::subscription(&topic, "billing")).await?;

    // 5. Did everything end as it should?
    let mut problems = Vec::new();
    let mut expect = |ok: bool, what: String| {
        if !ok {
            problems.push(what);
        }
    };
    let placed: Vec<_> = heard.iter().filter(|n| matches!(n, News::Placed { .. })).collect();
    expect(
        placed.len() == 1,
        format!("sales should place the order once, not {}", placed.len()),
    );
    let attempts: Vec<(u32, bool)> = heard
        .iter()
        .filter_map(|n| match n {
            News::ChargeAttempt { attempt, charged, .. } => Some((*attempt, *charged)),
            News::Placed { .. } => None,
        })
        .collect();
    expect(
        attempts == [(1, false), (2, false), (3, true)],
        format!("billing should fail on attempts 1 and 2 and charge on 3; it went (attempt, charged) {attempts:?}"),
    );
    expect(
        dead.len() == 1,
        format!("exactly one message should be dead-lettered, not {}", dead.len()),
    );
    for message in &dead {
        expect(
            message.message_id() == poison_id,
            format!(
                "the dead letter {} is not the poison message {poison_id}",
                message.message_id()
            ),
        );
        let reason = message.broker.dead_letter_reason.as_deref();
        expect(
            reason == Some(failure_reasons::DESERIALIZATION_FAILED),
            format!(
                "the dead-letter reason is {reason:?}, not {}",
                failure_reasons::DESERIALIZATION_FAILED
            ),
        );
    }
    let counts = |r: &ShutdownReport| (r.completed, r.retried, r.dead_lettered, r.interrupted);
    expect(
        counts(&sales_report) == (1, 0, 1, 0),
        format!("sales report: {sales_report:?}, expected 1 completed, 1 dead-lettered"),
    );
    expect(
        counts(&billing_report) == (1, 2, 0, 0),
        format!("billing report: {billing_report:?}, expected 1 completed, 2 retried"),
    );
    expect(
        left_in_sales.active == 0 && left_in_billing.active == 0,
        format!("messages left behind: sales {left_in_sales:?}, billing {left_in_billing:?}"),
    );
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("\n  - {}", problems.join("\n  - ")).into())
    }
}

/// Prints a dead-lettered message: its id, why the endpoint gave up, and the failure it
/// recorded in the `courier.failure.*` headers.
fn print_dead_letter(message: &ReceivedMessage) {
    let broker = &message.broker;
    println!("  message id   {}", message.message_id());
    println!(
        "  type         {}",
        message.envelope.message_type.as_deref().unwrap_or("-")
    );
    println!("  body         {}", String::from_utf8_lossy(message.body()));
    println!("  reason       {}", broker.dead_letter_reason.as_deref().unwrap_or("-"));
    println!(
        "  description  {}",
        broker.dead_letter_description.as_deref().unwrap_or("-")
    );
    for key in [
        headers::FAILURE_ENDPOINT,
        headers::FAILURE_HANDLER,
        headers::FAILURE_ATTEMPTS,
        headers::FAILURE_PERMANENT,
        headers::FAILURE_TIME,
        headers::FAILURE_ERROR,
        headers::FAILURE_CHAIN,
    ] {
        let value = match message.envelope.properties.get(key) {
            None => "(not set)".to_owned(),
            Some(v) => v.to_string().replace('\n', "\n                             "),
        };
        println!("  {key:<26} {value}");
    }
}

/// Prints what an endpoint did over its life and during its shutdown.
fn print_report(endpoint: &str, report: &ShutdownReport) {
    println!(
        "main: {endpoint} stopped: {} completed, {} retried, {} dead-lettered over its life; \
         {} handed back and {} interrupted at shutdown",
        report.completed, report.retried, report.dead_lettered, report.abandoned_prefetched, report.interrupted
    );
}
