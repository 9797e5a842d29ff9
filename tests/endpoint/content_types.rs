//! Content types are matched as media types (issue 30): a JSON body whose content type
//! says `application/json` with parameters or in another case is handled; another media
//! type, a structured-syntax suffix (`+json`) or a charset other than UTF-8 is
//! dead-lettered at once with a reason that says why. Before, anything but the exact
//! text `application/json` was dead-lettered.

use courier::recoverability::reasons;
use courier::{Envelope, Message};

use super::support::*;

#[tokio::test]
async fn json_with_parameters_or_in_another_case_is_handled_and_other_types_are_dead_lettered() {
    let fx = fixture().await;
    let calls = Calls::default();
    let sales = start(&fx, "sales", recording::<PlaceOrder>("place", &calls)).await;
    let bus = sales.bus().clone();
    let handled = [
        ("charset", "application/json; charset=utf-8"),
        ("case", "Application/JSON"),
        ("spaced", "APPLICATION/json ;\tCharset = \"UTF-8\" ; version=2"),
    ];
    let refused = [
        ("text", "text/plain", "text/plain is another media type"),
        (
            "suffix",
            "application/problem+json",
            "application/problem+json is another media type",
        ),
        ("latin1", "application/json; charset=latin1", "JSON is UTF-8"),
        ("malformed", "application/json; charset", "not a media type"),
    ];
    let ids = handled
        .iter()
        .map(|(id, ct)| (id, ct))
        .chain(refused.iter().map(|(id, ct, _)| (id, ct)));
    for (id, content_type) in ids {
        let envelope = Envelope::new(r#"{"id":1}"#)
            .with_message_type(PlaceOrder::NAME)
            .with_content_type(*content_type)
            .with_message_id(*id);
        bus.send_envelope("sales", envelope).await.unwrap();
    }
    wait_counts(&fx.transport, "sales", |c| {
        c.dead_lettered == refused.len() as u64 && c.active == 0
    })
    .await;
    eventually("the JSON bodies handled", || async { calls.len() == handled.len() }).await;

    let mut seen: Vec<_> = calls.all().into_iter().map(|c| c.message_id).collect();
    seen.sort();
    let mut want: Vec<_> = handled.iter().map(|(id, _)| (*id).to_owned()).collect();
    want.sort();
    assert_eq!(seen, want, "each JSON body handled once");
    let dead = dead_letters(&fx.transport, "sales").await;
    assert_eq!(dead.len(), refused.len());
    for (id, _, why) in refused {
        let d = dead
            .iter()
            .find(|d| d.message_id() == id)
            .unwrap_or_else(|| panic!("{id} dead-lettered"));
        assert_eq!(
            d.broker.dead_letter_reason.as_deref(),
            Some(reasons::DESERIALIZATION_FAILED)
        );
        let description = d.broker.dead_letter_description.clone().unwrap_or_default();
        assert!(description.contains(why), "{id}: {description}");
        assert_eq!(d.delivery_count(), 1, "{id} dead-lettered on its first delivery");
    }
    sales.shutdown().await.unwrap();
}
