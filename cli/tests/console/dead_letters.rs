//! Dead letters in the browser: a resubmit handled by the running endpoint, and markup in
//! a dead letter shown as text.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use courier::admin::EmbeddedAdmin;
use fantoccini::Locator;

use crate::browser::Browser;
use crate::fixture::*;

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
