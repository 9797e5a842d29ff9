//! Message versions on plain handlers (issue 13, point 9): the `Bus` stamps a type's
//! version, an older body reaches every handler of its type upcast, and a newer one is
//! dead-lettered at once with the reason, no handler having run. (Sagas, on the three
//! stores: `tests/saga/versions.rs`.)

use courier::recoverability::{headers, reasons};
use courier::serde_json::{Value, json};
use courier::version::headers::MESSAGE_VERSION;
use courier::{Context, Envelope, PropertyValue, UpcastError};
use serde::{Deserialize, Serialize};

use crate::support::*;

/// Version 1 was `{"seconds": 90}`.
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "versions.Delay", version = 2, upcast = Self::upcast)]
struct Delay {
    millis: u64,
}

impl Delay {
    fn upcast(from: u32, mut body: Value) -> Result<Value, UpcastError> {
        match from {
            1 => {
                let seconds = body
                    .get_mut("seconds")
                    .map(Value::take)
                    .and_then(|s| s.as_u64())
                    .ok_or_else(|| UpcastError::invalid("a version-1 Delay has `seconds`"))?;
                Ok(json!({ "millis": seconds * 1000 }))
            }
            _ => Err(UpcastError::unsupported(from)),
        }
    }
}

/// Records the message and the version header it arrived with.
fn delay_handler(name: &'static str, calls: &Calls) -> FnHandler<Delay> {
    let calls = calls.clone();
    handler_fn(name, move |m: Delay, ctx: &mut Context| {
        let version = ctx.header(MESSAGE_VERSION).map(ToString::to_string);
        calls.record(name, ctx, format!("{} {version:?}", m.millis));
        ok()
    })
}

#[tokio::test]
async fn an_older_body_reaches_every_handler_upcast() {
    let fx = fixture().await;
    let calls = Calls::default();
    let timers = endpoint(&fx, "timers")
        .handler(delay_handler("first", &calls))
        .handler(delay_handler("second", &calls))
        .start()
        .await
        .unwrap();
    let v1 = Envelope::json(&json!({"seconds": 90}))
        .unwrap()
        .with_message_type("versions.Delay");
    timers.bus().send_envelope("timers", v1).await.unwrap();
    eventually("both handlers", || async { calls.len() == 2 }).await;
    for call in calls.all() {
        assert_eq!(call.payload, "90000 None", "{}", call.handler);
    }

    // A current one, sent through the bus, carries its version.
    timers
        .bus()
        .send_with(&Delay { millis: 5 }, courier::SendOptions::new().to("timers"))
        .await
        .unwrap();
    eventually("both handlers again", || async { calls.len() == 4 }).await;
    assert_eq!(calls.of("first")[1].payload, "5 Some(\"2\")");
    assert_eq!(timers.stats().dead_lettered, 0);
    timers.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_newer_body_is_dead_lettered_at_once() {
    let fx = fixture().await;
    let calls = Calls::default();
    let timers = endpoint(&fx, "timers")
        .handler(delay_handler("first", &calls))
        .start()
        .await
        .unwrap();
    let v3 = Envelope::json(&json!({"millis": 1, "jitter": 3}))
        .unwrap()
        .with_message_type("versions.Delay")
        .with_property(MESSAGE_VERSION, PropertyValue::Int(3));
    timers.bus().send_envelope("timers", v3).await.unwrap();
    // The clock never moves: a retried failure would wait for its delayed retry.
    eventually("the dead letter", || async { timers.stats().dead_lettered == 1 }).await;
    let dead = dead_letters(&fx.transport, "timers").await;
    assert_eq!(
        dead[0].broker.dead_letter_reason.as_deref(),
        Some(reasons::UNSUPPORTED_MESSAGE_VERSION)
    );
    let description = dead[0].broker.dead_letter_description.as_deref().unwrap_or("");
    assert!(
        description.contains("versions.Delay message of version 3") && description.contains("versions up to 2"),
        "{description}"
    );
    assert_eq!(int_prop(&dead[0], headers::FAILURE_ATTEMPTS), 1, "no retry");
    assert_eq!(calls.len(), 0, "no handler ran");
    timers.shutdown().await.unwrap();
}
