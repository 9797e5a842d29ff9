//! The endpoint: handlers, routing, the context, settlement, recoverability and
//! observability here; shutdown and locks in `lifecycle.rs`, the bad-input corpus in
//! `corpus.rs`. Every test runs on its own embedded broker and a virtual clock.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs,
    unreachable_pub
)]

mod batch;
mod batch_store;
mod content_types;
mod corpus;
mod crash;
mod dead_letter_flood;
mod forged_failure;
mod forged_retry_count;
mod lifecycle;
mod missing_queue;
mod refused;
mod sessions;
mod support;
mod tracing_capture;
mod unrouted;
mod versions;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use courier::{
    Context, Envelope, HandlerError, Message, ResultExt, RetryPolicy, Routes, SendOptions,
    recoverability::{headers, reasons},
};
use support::*;

#[tokio::test]
async fn a_sent_command_reaches_its_handler_and_is_completed() {
    let fx = fixture().await;
    let calls = Calls::default();
    let sales = start(&fx, "sales", recording::<PlaceOrder>("place", &calls)).await;
    let id = sales.bus().send(&PlaceOrder { id: 7 }).await.unwrap();
    eventually("the handler", || async { calls.len() == 1 }).await;
    wait_counts(&fx.transport, "sales", |c| c.active == 0).await;
    let call = &calls.all()[0];
    assert_eq!(call.message_id, id);
    assert_eq!(call.payload, "PlaceOrder { id: 7 }");
    assert_eq!(call.message_type.as_deref(), Some("test.PlaceOrder"));
    assert_eq!((call.delivery_count, call.attempt), (1, 1));
    assert!(call.sequence_number > 0);
    let report = sales.shutdown().await.unwrap();
    assert_eq!(report.completed, 1);
    assert_eq!(report.dead_lettered, 0);
}

#[tokio::test]
async fn outgoing_messages_inherit_correlation_take_causation_and_leave_only_on_success() {
    let fx = fixture().await;
    let calls = Calls::default();
    let attempts = Arc::new(AtomicU32::new(0));
    let a = attempts.clone();
    let sales = endpoint(&fx, "sales")
        .handler(handler_fn("place", move |m: PlaceOrder, ctx: &mut Context| {
            ctx.send(&Ping { n: m.id }).unwrap();
            ctx.publish(&OrderPlaced { id: m.id }).unwrap();
            ctx.send_after(&Ping { n: 1000 + m.id }, Duration::from_secs(60))
                .unwrap();
            // The first attempt fails after sending: nothing of it may leave.
            if a.fetch_add(1, Ordering::SeqCst) == 0 {
                return fail(HandlerError::msg("first attempt fails"));
            }
            ok()
        }))
        .start()
        .await
        .unwrap();
    let pings = start(&fx, "pings", recording::<Ping>("ping", &calls)).await;
    let billing = start(&fx, "billing", recording::<OrderPlaced>("placed", &calls)).await;
    let id = sales
        .bus()
        .send_with(&PlaceOrder { id: 1 }, SendOptions::new().header("tenant", "acme"))
        .await
        .unwrap();
    eventually("ping and event", || async { calls.len() == 2 }).await;
    assert_eq!(attempts.load(Ordering::SeqCst), 2);
    for c in calls.all() {
        // The command had no correlation id: its message id starts the conversation.
        assert_eq!(c.correlation_id.as_deref(), Some(id.as_str()), "{c:?}");
        assert_eq!(c.causation_id.as_deref(), Some(id.as_str()), "{c:?}");
    }
    // Exactly one ping and one event: the failed attempt's messages were discarded.
    assert_eq!(calls.of("ping").len(), 1);
    assert_eq!(calls.of("placed").len(), 1);
    // The delayed ping is scheduled, one minute out.
    wait_counts(&fx.transport, "pings", |c| c.scheduled == 1).await;
    fx.clock.advance(Duration::from_secs(61));
    eventually("the scheduled ping", || async { calls.of("ping").len() == 2 }).await;
    assert_eq!(calls.of("ping")[1].payload, "Ping { n: 1001 }");
    for e in [sales, pings, billing] {
        e.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn a_correlation_id_set_by_the_sender_flows_through_every_hop() {
    let fx = fixture().await;
    let calls = Calls::default();
    let sales = endpoint(&fx, "sales")
        .handler(handler_fn("place", |m: PlaceOrder, ctx: &mut Context| {
            ctx.send(&Ping { n: m.id }).unwrap();
            ok()
        }))
        .start()
        .await
        .unwrap();
    let pings = start(&fx, "pings", recording::<Ping>("ping", &calls)).await;
    let mut env = PlaceOrder { id: 3 }
        .to_envelope()
        .unwrap()
        .with_correlation_id("order-3");
    env.message_id = "cmd-3".into();
    sales.bus().send_envelope("sales", env).await.unwrap();
    eventually("ping", || async { calls.len() == 1 }).await;
    let c = &calls.all()[0];
    assert_eq!(c.correlation_id.as_deref(), Some("order-3"));
    assert_eq!(c.causation_id.as_deref(), Some("cmd-3"));
    sales.shutdown().await.unwrap();
    pings.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_published_event_reaches_every_subscribing_endpoint_once() {
    let fx = fixture().await;
    let calls = Calls::default();
    let mut running = Vec::new();
    for (name, h) in [("billing", "billing"), ("shipping", "shipping")] {
        running.push(
            endpoint(&fx, name)
                .handler(recording::<OrderPlaced>(h, &calls))
                .start()
                .await
                .unwrap(),
        );
    }
    running[0].bus().publish(&OrderPlaced { id: 5 }).await.unwrap();
    eventually("both subscribers", || async { calls.len() == 2 }).await;
    assert_eq!(calls.of("billing").len(), 1);
    assert_eq!(calls.of("shipping").len(), 1);
    // Publishing a type that is not declared as an event is refused with a clear error.
    let err = running[0].bus().publish(&Ping { n: 1 }).await.unwrap_err();
    assert!(matches!(err.kind(), courier::ErrorKind::NoRoute { .. }), "{err}");
    assert!(!err.is_transient());
    for e in running {
        e.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn several_handlers_of_one_type_all_run_and_one_failing_fails_the_message() {
    let fx = fixture().await;
    let calls = Calls::default();
    let failures = Arc::new(AtomicU32::new(0));
    let (c, f) = (calls.clone(), failures.clone());
    let sales = endpoint(&fx, "sales")
        .handler(recording::<PlaceOrder>("first", &calls))
        .handler(handler_fn("second", move |_m: PlaceOrder, ctx: &mut Context| {
            c.record("second", ctx, String::new());
            if f.fetch_add(1, Ordering::SeqCst) == 0 {
                return fail(HandlerError::msg("second fails once"));
            }
            ok()
        }))
        .start()
        .await
        .unwrap();
    sales.bus().send(&PlaceOrder { id: 1 }).await.unwrap();
    eventually("two rounds", || async { calls.len() == 4 }).await;
    wait_counts(&fx.transport, "sales", |c| c.active == 0).await;
    let order: Vec<_> = calls.all().iter().map(|c| (c.handler, c.attempt)).collect();
    assert_eq!(order, vec![("first", 1), ("second", 1), ("first", 2), ("second", 2)]);
    let report = sales.shutdown().await.unwrap();
    assert_eq!((report.completed, report.retried), (1, 1));
}

#[tokio::test]
async fn a_handler_failing_n_times_then_succeeding_is_called_n_plus_one_times_and_completed_once() {
    let fx = fixture().await;
    let calls = Calls::default();
    let c = calls.clone();
    let n = 2;
    let sales = endpoint(&fx, "sales")
        .handler(handler_fn("flaky", move |_m: PlaceOrder, ctx: &mut Context| {
            c.record("flaky", ctx, String::new());
            if ctx.attempt() <= n {
                return fail(HandlerError::msg(format!("attempt {} fails", ctx.attempt())));
            }
            ok()
        }))
        .start()
        .await
        .unwrap();
    sales.bus().send(&PlaceOrder { id: 1 }).await.unwrap();
    eventually("three calls", || async { calls.len() == 3 }).await;
    wait_counts(&fx.transport, "sales", |c| c.active == 0 && c.scheduled == 0).await;
    let report = sales.shutdown().await.unwrap();
    assert_eq!(calls.len(), 3, "called N+1 times");
    assert_eq!(report.completed, 1, "completed once");
    assert_eq!(report.retried, 2);
    let counts: Vec<_> = calls.all().iter().map(|c| c.delivery_count).collect();
    assert_eq!(
        counts,
        vec![1, 2, 3],
        "immediate retries are redeliveries by the broker"
    );
    assert!(dead_letters(&fx.transport, "sales").await.is_empty());
}

#[derive(Debug, thiserror::Error)]
#[error("card declined")]
struct Declined(#[source] std::io::Error);

#[tokio::test]
async fn retries_exhausted_end_in_the_dead_letter_queue_with_the_failure_readable() {
    let fx = fixture().await;
    let calls = Calls::default();
    let c = calls.clone();
    let policy = RetryPolicy::default()
        .immediate(1)
        .delayed([Duration::from_secs(10), Duration::from_secs(20)]);
    let sales = endpoint(&fx, "sales")
        .recoverability(policy.clone())
        .handler(handler_fn("charge", move |_m: PlaceOrder, ctx: &mut Context| {
            c.record("charge", ctx, String::new());
            fail(Declined(std::io::Error::other("gateway said no")).into())
        }))
        .start()
        .await
        .unwrap();
    let id = sales.bus().send(&PlaceOrder { id: 9 }).await.unwrap();
    advance_when_scheduled(&fx, "sales", 1, Duration::from_secs(10)).await;
    eventually("round 2", || async { calls.len() == 4 }).await;
    advance_when_scheduled(&fx, "sales", 1, Duration::from_secs(20)).await;
    wait_counts(&fx.transport, "sales", |c| c.dead_lettered == 1).await;
    assert_eq!(calls.len() as u32, policy.max_attempts());
    let attempts: Vec<_> = calls
        .all()
        .iter()
        .map(|c| (c.attempt, c.delayed_retries, c.delivery_count))
        .collect();
    assert_eq!(
        attempts,
        vec![(1, 0, 1), (2, 0, 2), (3, 1, 1), (4, 1, 2), (5, 2, 1), (6, 2, 2)]
    );
    assert!(
        calls.all().iter().all(|c| c.message_id == id),
        "retries keep the message id"
    );

    let dead = dead_letters(&fx.transport, "sales").await;
    assert_eq!(dead.len(), 1);
    let d = &dead[0];
    assert_eq!(d.message_id(), id);
    assert_eq!(d.broker.dead_letter_reason.as_deref(), Some(reasons::RETRIES_EXHAUSTED));
    assert_eq!(
        d.broker.dead_letter_description.as_deref(),
        Some("card declined: gateway said no")
    );
    assert_eq!(string_prop(d, headers::FAILURE_ERROR), "card declined");
    assert_eq!(string_prop(d, headers::FAILURE_CHAIN), "card declined\ngateway said no");
    assert_eq!(string_prop(d, headers::FAILURE_HANDLER), "charge");
    assert_eq!(string_prop(d, headers::FAILURE_ENDPOINT), "sales");
    assert_eq!(int_prop(d, headers::FAILURE_ATTEMPTS), 6);
    assert_eq!(int_prop(d, headers::DELAYED_RETRIES), 2);
    let at = chrono::DateTime::parse_from_rfc3339(&string_prop(d, headers::FAILURE_TIME)).unwrap();
    assert!(
        (at.with_timezone(&chrono::Utc) - courier::Clock::now(&fx.clock))
            .num_seconds()
            .abs()
            < 1
    );
    let report = sales.shutdown().await.unwrap();
    assert_eq!((report.completed, report.retried, report.dead_lettered), (0, 5, 1));
}

#[tokio::test]
async fn undecodable_bodies_unknown_types_and_permanent_errors_are_dead_lettered_at_once() {
    let fx = fixture().await;
    let calls = Calls::default();
    let c = calls.clone();
    let sales = endpoint(&fx, "sales")
        .handler(handler_fn("place", move |m: PlaceOrder, ctx: &mut Context| {
            c.record("place", ctx, String::new());
            if m.id == 13 {
                return Box::pin(async {
                    Err::<(), _>(std::io::Error::other("order 13 cannot exist")).permanent()?;
                    Ok(())
                });
            }
            ok()
        }))
        .start()
        .await
        .unwrap();
    let bus = sales.bus().clone();
    let bad_body = Envelope::new("{not json")
        .with_message_type(PlaceOrder::NAME)
        .with_content_type("application/json")
        .with_message_id("bad-body");
    let unknown = Envelope::json(&serde_json::json!({"x": 1}))
        .unwrap()
        .with_message_type("test.Nobody")
        .with_message_id("unknown-type");
    let untyped = Envelope::new("raw").with_message_id("no-type");
    let wrong_content = Envelope::new("<xml/>")
        .with_message_type(PlaceOrder::NAME)
        .with_content_type("application/xml")
        .with_message_id("wrong-content-type");
    for e in [bad_body, unknown, untyped, wrong_content] {
        bus.send_envelope("sales", e).await.unwrap();
    }
    bus.send_with(&PlaceOrder { id: 13 }, SendOptions::new().message_id("permanent"))
        .await
        .unwrap();
    bus.send_with(&PlaceOrder { id: 1 }, SendOptions::new().message_id("good"))
        .await
        .unwrap();
    wait_counts(&fx.transport, "sales", |c| c.dead_lettered == 5 && c.active == 0).await;
    let dead = dead_letters(&fx.transport, "sales").await;
    let reason = |id: &str| {
        let d = dead.iter().find(|d| d.message_id() == id).unwrap();
        assert_eq!(d.delivery_count(), 1, "{id} was dead-lettered on its first delivery");
        (
            d.broker.dead_letter_reason.clone().unwrap(),
            d.broker.dead_letter_description.clone().unwrap(),
        )
    };
    assert_eq!(reason("bad-body").0, reasons::DESERIALIZATION_FAILED);
    assert_eq!(reason("wrong-content-type").0, reasons::DESERIALIZATION_FAILED);
    assert!(reason("wrong-content-type").1.contains("application/xml"));
    let (r, d) = reason("unknown-type");
    assert_eq!(r, reasons::UNKNOWN_MESSAGE_TYPE);
    assert!(d.contains("test.Nobody") && d.contains("test.PlaceOrder"), "{d}");
    assert_eq!(reason("no-type").0, reasons::UNKNOWN_MESSAGE_TYPE);
    let (r, d) = reason("permanent");
    assert_eq!(r, reasons::PERMANENT_FAILURE);
    assert_eq!(d, "order 13 cannot exist");
    let handled: Vec<_> = calls.all().iter().map(|c| c.message_id.clone()).collect();
    assert_eq!(handled.len(), 2, "{handled:?}");
    assert!(handled.contains(&"good".to_owned()) && handled.contains(&"permanent".to_owned()));
    sales.shutdown().await.unwrap();
}

/// A producer's terminal escapes, line breaks and bidi overrides in a message id (issue
/// 30): the log lines of its handling show them escaped, in the `message` span and in a
/// handler's error that quotes the id, and never pass them to the operator's terminal.
#[tokio::test]
async fn a_message_id_with_terminal_escapes_is_logged_escaped() {
    let log = courier_tests::logs::Logs::default();
    let _guard = log.capture_at(tracing::Level::INFO);
    let fx = fixture().await;
    let sales = endpoint(&fx, "sales")
        .handler(handler_fn("place", move |_: PlaceOrder, ctx: &mut Context| {
            let error = std::io::Error::other(format!("cannot place {}", ctx.message_id()));
            Box::pin(async move {
                Err::<(), _>(error).permanent()?;
                Ok(())
            })
        }))
        .start()
        .await
        .unwrap();
    let evil = "evil-\u{1b}[31m-\r\n-\u{202e}";
    let escaped = r"evil-\u{1b}[31m-\r\n-\u{202e}";
    let unknown = Envelope::json(&serde_json::json!({"x": 1}))
        .unwrap()
        .with_message_type("test.Nobody")
        .with_message_id(evil);
    sales.bus().send_envelope("sales", unknown).await.unwrap();
    sales
        .bus()
        .send_with(&PlaceOrder { id: 1 }, SendOptions::new().message_id(format!("{evil}2")))
        .await
        .unwrap();
    wait_counts(&fx.transport, "sales", |c| c.dead_lettered == 2 && c.active == 0).await;
    sales.shutdown().await.unwrap();
    let text = log.text();
    for c in ['\u{1b}', '\r', '\u{202e}'] {
        assert!(!text.contains(c), "{c:?} reached the log: {text:?}");
    }
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("evil") || l.contains("[31m"))
        .collect();
    for line in &lines {
        assert!(line.contains(&format!("message_id={escaped}")), "{line:?}");
    }
    let dead: Vec<&&str> = lines.iter().filter(|l| l.contains("message dead-lettered")).collect();
    assert_eq!(dead.len(), 2, "{text:?}");
    assert!(
        dead.iter()
            .any(|l| l.contains(&format!("description=cannot place {escaped}2"))),
        "{text:?}"
    );
}

#[tokio::test]
async fn a_message_sent_under_an_earlier_name_is_handled_through_its_alias() {
    let fx = fixture().await;
    let calls = Calls::default();
    let pings = start(&fx, "pings", recording::<Ping>("ping", &calls)).await;
    let old = Envelope::json(&Ping { n: 4 })
        .unwrap()
        .with_message_type("test.OldPing");
    pings.bus().send_envelope("pings", old).await.unwrap();
    eventually("ping", || async { calls.len() == 1 }).await;
    assert_eq!(calls.all()[0].payload, "Ping { n: 4 }");
    pings.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_panicking_handler_counts_as_a_failure_and_the_endpoint_goes_on() {
    let fx = fixture().await;
    let calls = Calls::default();
    let c = calls.clone();
    let sales = endpoint(&fx, "sales")
        .recoverability(RetryPolicy::default().immediate(1).delayed([]))
        .handler(handler_fn("boom", move |m: PlaceOrder, ctx: &mut Context| {
            c.record("boom", ctx, m.id.to_string());
            assert!(m.id != 1, "order 1 explodes");
            ok()
        }))
        .start()
        .await
        .unwrap();
    sales.bus().send(&PlaceOrder { id: 1 }).await.unwrap();
    wait_counts(&fx.transport, "sales", |c| c.dead_lettered == 1).await;
    sales.bus().send(&PlaceOrder { id: 2 }).await.unwrap();
    eventually("the next message", || async { calls.len() == 3 }).await;
    wait_counts(&fx.transport, "sales", |c| c.active == 0).await;
    let dead = dead_letters(&fx.transport, "sales").await;
    assert_eq!(
        string_prop(&dead[0], headers::FAILURE_ERROR),
        "handler panicked: order 1 explodes"
    );
    assert_eq!(string_prop(&dead[0], headers::FAILURE_HANDLER), "boom");
    let report = sales.shutdown().await.unwrap();
    assert_eq!((report.completed, report.dead_lettered), (1, 1));
}

#[tokio::test]
async fn a_poison_message_never_blocks_the_messages_behind_it() {
    let fx = fixture().await;
    let calls = Calls::default();
    let c = calls.clone();
    let sales = endpoint(&fx, "sales")
        .concurrency(1)
        .prefetch(1)
        .handler(handler_fn("h", move |m: PlaceOrder, ctx: &mut Context| {
            c.record("h", ctx, m.id.to_string());
            if m.id == 0 {
                return fail(HandlerError::msg("poison"));
            }
            ok()
        }))
        .start()
        .await
        .unwrap();
    for id in 0..6 {
        sales.bus().send(&PlaceOrder { id }).await.unwrap();
    }
    // Without moving the clock: the poison message waits in a delayed retry while the
    // five behind it are handled.
    eventually("the five good messages", || async {
        calls.all().iter().filter(|c| c.payload != "0").count() == 5
    })
    .await;
    wait_counts(&fx.transport, "sales", |c| c.active == 0 && c.scheduled == 1).await;
    assert_eq!(calls.all().iter().filter(|c| c.payload == "0").count(), 4);
    sales.shutdown().await.unwrap();
}

#[tokio::test]
async fn reply_goes_to_the_reply_to_queue_and_fails_clearly_without_one() {
    let fx = fixture().await;
    let calls = Calls::default();
    let pings = endpoint(&fx, "pings")
        .recoverability(RetryPolicy::none())
        .handler(handler_fn("pong", |m: Ping, ctx: &mut Context| {
            let r = ctx.reply(&OrderPlaced { id: m.n });
            Box::pin(async move { r.map_err(HandlerError::permanent) })
        }))
        .start()
        .await
        .unwrap();
    let replies = start(&fx, "replies", recording::<OrderPlaced>("reply", &calls)).await;
    let with_reply = Ping { n: 8 }.to_envelope().unwrap().with_reply_to("replies");
    pings.bus().send_envelope("pings", with_reply).await.unwrap();
    eventually("the reply", || async { calls.len() == 1 }).await;
    pings.bus().send(&Ping { n: 9 }).await.unwrap();
    wait_counts(&fx.transport, "pings", |c| c.dead_lettered == 1).await;
    let d = &dead_letters(&fx.transport, "pings").await[0];
    assert!(
        d.broker
            .dead_letter_description
            .as_deref()
            .unwrap()
            .contains("no reply-to address")
    );
    pings.shutdown().await.unwrap();
    replies.shutdown().await.unwrap();
}

#[derive(Debug)]
struct Greeting(&'static str);

#[courier::handler]
async fn greet(msg: Ping, ctx: &mut Context) -> Result<(), HandlerError> {
    let greeting = ctx.state::<Greeting>()?;
    let calls = ctx.state::<Calls>()?;
    calls.record("greet", ctx, format!("{} {}", greeting.0, msg.n));
    Ok(())
}

#[tokio::test]
async fn attribute_handlers_run_and_read_endpoint_state() {
    let fx = fixture().await;
    let calls = Calls::default();
    let pings = endpoint(&fx, "pings")
        .state(Greeting("hello"))
        .state(calls.clone())
        .handler(greet)
        .start()
        .await
        .unwrap();
    pings.bus().send(&Ping { n: 1 }).await.unwrap();
    eventually("greet", || async { calls.len() == 1 }).await;
    assert_eq!(calls.all()[0].payload, "hello 1");
    assert_eq!(courier::Handler::name(&greet), "endpoint::greet");
    pings.shutdown().await.unwrap();
}

#[tokio::test]
async fn misconfigured_endpoints_are_refused_with_a_reason() {
    let fx = fixture().await;
    let no_transport = courier::Endpoint::builder("x")
        .handler(greet)
        .start()
        .await
        .unwrap_err();
    assert!(no_transport.to_string().contains("transport"), "{no_transport}");
    let zero = endpoint(&fx, "x")
        .concurrency(0)
        .handler(greet)
        .start()
        .await
        .unwrap_err();
    assert!(zero.to_string().contains("concurrency"), "{zero}");
    let none = endpoint(&fx, "x").start().await.unwrap_err();
    assert!(none.to_string().contains("handler"), "{none}");
    let bad_name = endpoint(&fx, "bad name").handler(greet).start().await.unwrap_err();
    assert!(matches!(bad_name.kind(), courier::ErrorKind::InvalidEntityName { .. }));

    #[derive(Debug, serde::Serialize, serde::Deserialize, courier::Message)]
    #[message(name = "test.Ping")]
    struct Impostor;
    let clash = endpoint(&fx, "x")
        .handler(greet)
        .handler(handler_fn("impostor", |_m: Impostor, _ctx: &mut Context| ok()))
        .start()
        .await
        .unwrap_err();
    assert!(clash.to_string().contains("test.Ping"), "{clash}");
    let both = Routes::new().send::<Ping>("a").event_on::<Ping>("b");
    let err = endpoint(&fx, "x")
        .routes(both)
        .handler(greet)
        .start()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("both"), "{err}");
}

#[tokio::test]
async fn trace_context_continues_across_endpoints() {
    let fx = fixture().await;
    let calls = Calls::default();
    let c = calls.clone();
    let sales = endpoint(&fx, "sales")
        .handler(handler_fn("place", move |m: PlaceOrder, ctx: &mut Context| {
            c.record("place", ctx, String::new());
            ctx.send(&Ping { n: m.id }).unwrap();
            ok()
        }))
        .start()
        .await
        .unwrap();
    let pings = start(&fx, "pings", recording::<Ping>("ping", &calls)).await;
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    sales
        .bus()
        .send_envelope(
            "sales",
            PlaceOrder { id: 1 }
                .to_envelope()
                .unwrap()
                .with_property(courier::TRACEPARENT, parent),
        )
        .await
        .unwrap();
    eventually("both hops", || async { calls.len() == 2 }).await;
    let place = &calls.of("place")[0];
    let ping = &calls.of("ping")[0];
    assert_eq!(place.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(ping.trace_id, place.trace_id, "the trace continues");
    assert_ne!(place.span_id, "00f067aa0ba902b7", "each handling is a new span");
    assert_eq!(
        ping.traceparent.as_deref(),
        Some(format!("00-{}-{}-01", place.trace_id, place.span_id).as_str()),
        "the message carries its sender's span as parent"
    );
    sales.shutdown().await.unwrap();
    pings.shutdown().await.unwrap();
}

#[tokio::test]
async fn one_span_per_message_and_events_on_retry_and_dead_letter() {
    let capture = tracing_capture::Capture::default();
    let _guard = tracing::subscriber::set_default(capture.subscriber());
    let fx = fixture().await;
    let sales = endpoint(&fx, "sales")
        .recoverability(RetryPolicy::default().immediate(1).delayed([]))
        .handler(handler_fn("nope", |_m: PlaceOrder, _ctx: &mut Context| {
            fail(HandlerError::msg("nope"))
        }))
        .start()
        .await
        .unwrap();
    let id = sales.bus().send(&PlaceOrder { id: 1 }).await.unwrap();
    wait_counts(&fx.transport, "sales", |c| c.dead_lettered == 1).await;
    sales.shutdown().await.unwrap();
    let spans = capture.spans("message");
    assert_eq!(spans.len(), 2, "one span per delivery: {spans:?}");
    for (i, s) in spans.iter().enumerate() {
        assert_eq!(s.get("message_id").map(String::as_str), Some(id.as_str()));
        assert_eq!(s.get("message_type").map(String::as_str), Some("test.PlaceOrder"));
        assert_eq!(s.get("queue").map(String::as_str), Some("sales"));
        assert_eq!(s.get("delivery_count"), Some(&(i + 1).to_string()));
        assert_eq!(s.get("attempt"), Some(&(i + 1).to_string()));
        assert_eq!(s.get("trace_id").map(String::len), Some(32));
    }
    let events = capture.events();
    let retry = events.iter().find(|e| e.message.contains("immediate retry")).unwrap();
    assert_eq!(retry.span.as_deref(), Some("message"));
    assert_eq!(retry.level, tracing::Level::WARN);
    let dead = events.iter().find(|e| e.message.contains("dead-lettered")).unwrap();
    assert_eq!(dead.level, tracing::Level::ERROR);
    assert_eq!(
        dead.fields.get("reason").map(String::as_str),
        Some(reasons::RETRIES_EXHAUSTED)
    );
}

/// Regression: an endpoint reading its queue and a subscription used one shared buffer;
/// a receive waiting on the empty queue held all of it, so events waited for that receive
/// to time out. Here the wait is an hour: the event must still be handled.
#[tokio::test]
async fn a_receive_waiting_on_one_source_never_holds_back_another() {
    let fx = fixture().await;
    let calls = Calls::default();
    let billing = endpoint(&fx, "billing")
        .prefetch(1)
        .receive_wait(Duration::from_secs(3600))
        .handler(recording::<OrderPlaced>("placed", &calls))
        .handler(recording::<PlaceOrder>("place", &calls))
        .start()
        .await
        .unwrap();
    for id in 0..3 {
        billing.bus().publish(&OrderPlaced { id }).await.unwrap();
        eventually("the event", || async { calls.len() == id as usize + 1 }).await;
    }
    billing
        .bus()
        .send_envelope("billing", PlaceOrder { id: 9 }.to_envelope().unwrap())
        .await
        .unwrap();
    eventually("the command", || async { calls.len() == 4 }).await;
    billing.shutdown().await.unwrap();
}
