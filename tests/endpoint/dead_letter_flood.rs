//! A flood of dead-letterings gives a handful of log lines with the right counts, not a
//! line per message (issue 31, point 8): the first dead-lettering of a queue and reason is
//! logged in full, the others are counted, and each window of the endpoint's clock (10 s)
//! ends with one summary line giving their count and the first and last message id.

use std::time::Duration;

use courier::recoverability::reasons;
use courier::{Envelope, SenderOptions};

use crate::support::{Calls, PlaceOrder, endpoint, eventually, fixture, recording, wait_counts};
use crate::tracing_capture::{Capture, CapturedEvent};

/// The summary lines among `events`.
fn summaries(events: &[CapturedEvent]) -> Vec<&CapturedEvent> {
    events
        .iter()
        .filter(|e| e.message.contains("more of this queue and reason"))
        .collect()
}

fn count_of(e: &CapturedEvent) -> u64 {
    e.fields.get("count").and_then(|c| c.parse().ok()).unwrap_or(0)
}

// One thread: the endpoint's tasks and its log limiter's summary task log to this
// test's subscriber.
#[tokio::test]
async fn a_thousand_dead_letterings_of_one_reason_give_a_handful_of_lines_with_their_counts() {
    let capture = Capture::default();
    let _guard = tracing::subscriber::set_default(capture.subscriber());
    let fx = fixture().await;
    let name = "flood";
    let calls = Calls::default();
    let running = endpoint(&fx, name)
        .handler(recording::<PlaceOrder>("place", &calls))
        .start()
        .await
        .unwrap();
    let sender = fx.transport.sender(name, SenderOptions::default()).await.unwrap();
    // One bad producer: 1,000 messages of a type no handler knows.
    let all: Vec<Envelope> = (0..1000)
        .map(|i| {
            Envelope::json(&serde_json::json!({ "n": i }))
                .unwrap()
                .with_message_type("test.Nobody")
                .with_message_id(format!("flood-{i:04}"))
        })
        .collect();
    for batch in all.chunks(100) {
        sender.send_batch(batch.to_vec()).await.unwrap();
    }
    wait_counts(&fx.transport, name, |c| c.dead_lettered == 1000 && c.active == 0).await;
    // Windows of the endpoint's clock end until the summaries hold the other 999 (the
    // last dead-letterings may be counted a moment after the broker has them).
    eventually("summaries counting the other 999", || async {
        fx.clock.advance(Duration::from_secs(10));
        tokio::task::yield_now().await;
        summaries(&capture.events()).iter().map(|e| count_of(e)).sum::<u64>() >= 999
    })
    .await;
    running.shutdown().await.unwrap();

    let events = capture.events();
    let whole: Vec<&CapturedEvent> = events.iter().filter(|e| e.message == "message dead-lettered").collect();
    assert_eq!(whole.len(), 1, "only the first is logged in full: {whole:?}");
    assert_eq!(whole[0].level, tracing::Level::ERROR);
    assert_eq!(
        whole[0].fields.get("reason").map(String::as_str),
        Some(reasons::UNKNOWN_MESSAGE_TYPE)
    );
    let first_id = whole[0].fields.get("message_id").cloned().unwrap_or_default();
    assert!(first_id.starts_with("flood-"), "{first_id}");
    let sums = summaries(&events);
    assert!(
        !sums.is_empty() && sums.len() <= 3,
        "a handful of summary lines: {sums:?}"
    );
    assert_eq!(sums.iter().map(|e| count_of(e)).sum::<u64>(), 999, "{sums:?}");
    for s in &sums {
        assert_eq!(s.level, tracing::Level::ERROR);
        assert_eq!(s.fields.get("queue").map(String::as_str), Some(name));
        assert_eq!(
            s.fields.get("reason").map(String::as_str),
            Some(reasons::UNKNOWN_MESSAGE_TYPE)
        );
        for id in ["first_message_id", "last_message_id"] {
            let id = s.fields.get(id).cloned().unwrap_or_default();
            assert!(id.starts_with("flood-") && id != first_id, "{s:?}");
        }
    }
    // Nothing else floods: every ERROR line is one of these.
    let errors = events.iter().filter(|e| e.level == tracing::Level::ERROR).count();
    assert_eq!(errors, 1 + sums.len(), "{events:?}");
    assert_eq!(calls.len(), 0);
}
