//! Every page in the browser, checked (and saved as a screenshot when asked), and the
//! error pages.

use std::sync::Arc;
use std::time::Duration;

use courier::admin::{EmbeddedAdmin, QueueAdmin, StoreAdmin};
use courier::{Embedded, Envelope, QueueOptions, SenderOptions, Transport, VirtualClock};
use courier_cli::console::Console;
use fantoccini::Locator;

use crate::browser::Browser;
use crate::fixture::*;
use crate::http::{csrf_of, http, sparkline_points};

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
    b.wait_for_url("correlation=1043").await;
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
