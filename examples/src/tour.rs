//! A tour of Courier's embedded broker: queues, PeekLock settlement, the dead-letter
//! queue, scheduled messages, topics and sessions, on a durable SQLite file, no server.
//!
//! Run it with `cargo run -p courier-examples --bin tour`. It keeps its broker in a
//! temporary directory (or in the file given as the first argument) and exits 0 when every
//! step behaved as the broker contract says.

#![allow(clippy::print_stdout)]

use std::error::Error;
use std::time::Duration;

use courier::prelude::*;
use courier::{MessageState, PropertyValue, reasons};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct PlaceOrder {
    order_id: u32,
    amount_cents: u64,
}

fn check(ok: bool, what: &str) -> Result<(), Box<dyn Error>> {
    if ok {
        Ok(())
    } else {
        Err(format!("unexpected: {what}").into())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    // Ctrl-C (SIGINT) stops the tour between two broker calls; its own handler, because a
    // program started as a script's background job inherits SIGINT ignored.
    tokio::select! {
        toured = tour() => toured,
        _ = tokio::signal::ctrl_c() => {
            println!("tour: interrupted by Ctrl-C; stopped (the broker's file closes with the process)");
            std::process::exit(130);
        }
    }
}

/// The tour, step by step; an error says which step misbehaved.
async fn tour() -> Result<(), Box<dyn Error>> {
    let given = std::env::args().nth(1).map(std::path::PathBuf::from);
    let dir = tempfile_dir()?;
    let path = given.clone().unwrap_or_else(|| dir.join("courier-tour.db"));
    let broker = Embedded::open(&path).await?;
    println!("opened the embedded broker in {}", path.display());

    // 1. A queue, a typed message, a PeekLock receive and a complete.
    let orders = "tour-orders";
    broker
        .create_queue(orders, &QueueOptions::default().max_delivery_count(3))
        .await?;
    let sender = broker.sender(orders, SenderOptions::default()).await?;
    let receiver = broker.receiver(&EntityPath::queue(orders)).await?;
    let order = PlaceOrder {
        order_id: 1,
        amount_cents: 4_200,
    };
    sender
        .send(
            Envelope::json(&order)?
                .with_message_type("tour.PlaceOrder")
                .with_correlation_id("order-1"),
        )
        .await?;
    let delivery = receiver
        .receive(1, Duration::from_secs(5))
        .await?
        .pop()
        .ok_or("no message")?;
    let got: PlaceOrder = delivery.message().envelope.decode(&JsonCodec)?;
    println!(
        "received order {} for {} cents (sequence number {}, delivery {})",
        got.order_id,
        got.amount_cents,
        delivery.message().sequence_number(),
        delivery.message().delivery_count()
    );
    delivery.complete().await?;

    // 2. A poison message: abandoned until the max delivery count sends it to the
    //    dead-letter queue, with the reason on the message.
    sender
        .send(Envelope::new("not json at all").with_message_id("poison-1"))
        .await?;
    for attempt in 1..=3 {
        let d = receiver
            .receive(1, Duration::from_secs(5))
            .await?
            .pop()
            .ok_or("no message")?;
        let decoded: Result<PlaceOrder, _> = d.message().envelope.decode(&JsonCodec);
        println!(
            "attempt {attempt}: cannot decode {} ({}); abandon",
            d.message().message_id(),
            decoded.is_err()
        );
        let mut props = courier::Properties::new();
        props.insert("last-error".into(), PropertyValue::from("body is not JSON"));
        d.abandon_with(props).await?;
    }
    let dlq = broker.receiver(&EntityPath::queue(orders).dead_letter()).await?;
    let dead = dlq
        .receive(1, Duration::from_secs(5))
        .await?
        .pop()
        .ok_or("nothing dead-lettered")?;
    println!(
        "dead-lettered {}: reason {:?}, description {:?}",
        dead.message().message_id(),
        dead.message().broker.dead_letter_reason.as_deref().unwrap_or(""),
        dead.message().broker.dead_letter_description.as_deref().unwrap_or("")
    );
    check(
        dead.message().broker.dead_letter_reason.as_deref() == Some(reasons::MAX_DELIVERY_COUNT_EXCEEDED),
        "dead-letter reason",
    )?;
    dead.complete().await?;

    // 3. A scheduled message: invisible until its time, then delivered with a new
    //    sequence number; a cancelled one never appears.
    let at = chrono::Utc::now() + chrono::Duration::seconds(1);
    let reminder = sender.schedule(Envelope::new("reminder"), at).await?;
    let cancelled = sender.schedule(Envelope::new("cancelled"), at).await?;
    sender.cancel_scheduled(cancelled).await?;
    let peeked = broker.peek(&EntityPath::queue(orders), 0, 10).await?;
    check(
        peeked.iter().any(|m| m.broker.state == MessageState::Scheduled),
        "scheduled message visible to peek",
    )?;
    println!("scheduled message #{reminder} for {at}; cancelled #{cancelled}");
    let d = receiver
        .receive(1, Duration::from_secs(10))
        .await?
        .pop()
        .ok_or("the reminder never came")?;
    println!(
        "the reminder arrived {} ms after its time as #{}",
        (chrono::Utc::now() - at).num_milliseconds(),
        d.message().sequence_number()
    );
    check(d.message().body().as_ref() == b"reminder", "only the reminder arrives")?;
    d.complete().await?;

    // 4. A topic: each subscription gets its own copy.
    broker.create_topic("tour-events", &TopicOptions::default()).await?;
    for sub in ["billing", "shipping"] {
        broker
            .create_subscription("tour-events", sub, &QueueOptions::default())
            .await?;
    }
    let publisher = broker.sender("tour-events", SenderOptions::default()).await?;
    publisher
        .send(Envelope::new("order-placed").with_message_type("tour.OrderPlaced"))
        .await?;
    for sub in ["billing", "shipping"] {
        let r = broker.receiver(&EntityPath::subscription("tour-events", sub)).await?;
        let d = r.receive(1, Duration::from_secs(5)).await?.pop().ok_or("no copy")?;
        println!(
            "subscription {sub} got its copy of {:?}",
            String::from_utf8_lossy(d.message().body())
        );
        d.complete().await?;
    }

    // 5. Sessions: one receiver at a time holds a session and gets its messages in order.
    broker
        .create_queue("tour-sessions", &QueueOptions::default().requires_session(true))
        .await?;
    let s = broker.sender("tour-sessions", SenderOptions::default()).await?;
    for step in ["created", "paid", "shipped"] {
        s.send(Envelope::new(step).with_session_id("order-7")).await?;
    }
    let session = broker
        .accept_session(
            &EntityPath::queue("tour-sessions"),
            SessionSelector::Next,
            Duration::from_secs(5),
        )
        .await?;
    let steps = session.receive(10, Duration::from_secs(5)).await?;
    let names: Vec<String> = steps
        .iter()
        .map(|d| String::from_utf8_lossy(d.message().body()).into_owned())
        .collect();
    println!("session {} in order: {}", session.session_id(), names.join(" -> "));
    check(names == ["created", "paid", "shipped"], "session order")?;
    for d in steps {
        d.complete().await?;
    }
    session.set_session_state(Some("shipped".into())).await?;
    session.release().await?;

    broker.close().await;
    if given.is_none() {
        std::fs::remove_dir_all(&dir)?;
    }
    println!("tour finished: every step behaved as docs/semantics.md says");
    Ok(())
}

/// A fresh directory under the system's temporary directory.
fn tempfile_dir() -> Result<std::path::PathBuf, Box<dyn Error>> {
    let dir = std::env::temp_dir().join(format!("courier-tour-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
