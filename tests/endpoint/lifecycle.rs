//! An endpoint's lifetime around its handlers: graceful shutdown (running handlers finish,
//! prefetched messages go back, a handler past the deadline is stopped and its message
//! comes back), the shutdown report, `run_until`, and locks renewed while a handler runs
//! or lost under it.

use std::sync::Arc;
use std::time::Duration;

use courier::{Context, QueueOptions};
use tokio::sync::Semaphore;

use super::support::*;
use super::tracing_capture;

#[tokio::test]
async fn graceful_shutdown_lets_running_handlers_finish_and_hands_back_the_prefetched() {
    let fx = fixture().await;
    let calls = Calls::default();
    let gate = Arc::new(Semaphore::new(0));
    let sales = endpoint(&fx, "sales")
        .concurrency(2)
        .prefetch(4)
        .handler(gated::<PlaceOrder>("slow", &calls, &gate))
        .start()
        .await
        .unwrap();
    for id in 0..10 {
        sales.bus().send(&PlaceOrder { id }).await.unwrap();
    }
    eventually("two running handlers", || async { calls.len() == 2 }).await;
    // The shutdown begins (one poll), then the running two finish, all before the
    // shutdown is polled again: they still count as finished during the shutdown.
    // (Regression: the count was read after the prefetched were handed back, and missed
    // handlers that finished meanwhile.)
    let mut shutdown = Box::pin(sales.shutdown());
    tokio::select! {
        biased;
        _ = &mut shutdown => panic!("the shutdown cannot end while handlers run"),
        () = std::future::ready(()) => {}
    }
    gate.add_permits(2);
    // Everything not handled is back in the queue, unlocked, at once; the two handled are
    // completed.
    let queue = courier::EntityPath::queue("sales");
    eventually("the two completed and the rest handed back", || async {
        let left = courier::Transport::peek(&*fx.transport, &queue, 0, 100).await.unwrap();
        left.len() == 8 && left.iter().all(|m| m.broker.locked_until.is_none())
    })
    .await;
    let report = shutdown.await.unwrap();
    assert_eq!(report.finished_in_flight, 2);
    assert_eq!(report.interrupted, 0);
    assert_eq!(report.completed, 2);
    assert_eq!(calls.len(), 2, "nothing new started after the shutdown");
    // A new instance handles the rest: nothing was lost, nothing handled twice.
    gate.add_permits(100);
    let again = start(&fx, "sales", recording::<PlaceOrder>("rest", &calls)).await;
    eventually("the rest", || async { calls.len() == 10 }).await;
    let mut ids: Vec<_> = calls.all().iter().map(|c| c.payload.clone()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 10);
    again.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_handler_still_running_at_the_shutdown_deadline_is_stopped_and_its_message_comes_back() {
    let fx = fixture().await;
    let calls = Calls::default();
    let c = calls.clone();
    let sales = endpoint(&fx, "sales")
        .shutdown_timeout(Duration::from_millis(50))
        .handler(handler_fn("stuck", move |_m: PlaceOrder, ctx: &mut Context| {
            c.record("stuck", ctx, String::new());
            let cancel = ctx.cancellation().clone();
            Box::pin(async move {
                // Runs until told to stop, then still does not return.
                cancel.cancelled().await;
                std::future::pending::<()>().await;
                Ok(())
            })
        }))
        .start()
        .await
        .unwrap();
    sales.bus().send(&PlaceOrder { id: 1 }).await.unwrap();
    eventually("the handler", || async { calls.len() == 1 }).await;
    let report = sales.shutdown().await.unwrap();
    assert_eq!(report.interrupted, 1);
    // Its lock expires and the message is delivered again.
    fx.clock.advance(Duration::from_secs(61));
    let again = start(&fx, "sales", recording::<PlaceOrder>("again", &calls)).await;
    eventually("redelivery", || async { calls.len() == 2 }).await;
    assert_eq!(calls.all()[1].delivery_count, 2);
    again.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_lock_is_renewed_while_a_handler_runs_up_to_the_maximum() {
    let fx = fixture().await;
    let calls = Calls::default();
    let gate = Arc::new(Semaphore::new(0));
    let sales = endpoint(&fx, "sales")
        .queue_options(QueueOptions::default().lock_duration(Duration::from_secs(30)))
        .max_lock_renewal(Duration::from_secs(100))
        .handler(gated::<PlaceOrder>("long", &calls, &gate))
        .start()
        .await
        .unwrap();
    sales.bus().send(&PlaceOrder { id: 1 }).await.unwrap();
    eventually("the handler", || async { calls.len() == 1 }).await;
    let locked_until = || async {
        let m = courier::Transport::peek(&*fx.transport, &courier::EntityPath::queue("sales"), 0, 1)
            .await
            .unwrap();
        m[0].broker.locked_until
    };
    // Move 10 s at a time to 90 s: three times the lock duration, renewed each time.
    for _ in 0..9 {
        let now = courier::Clock::now(&fx.clock);
        fx.clock.advance(Duration::from_secs(10));
        eventually("a lock held past now + 5 s", || async {
            locked_until()
                .await
                .is_some_and(|u| u > now + chrono::Duration::seconds(15))
        })
        .await;
    }
    assert_eq!(calls.len(), 1, "no redelivery while renewed");
    // Past the maximum the lock is left to expire: the message is delivered again.
    fx.clock.advance(Duration::from_secs(60));
    eventually("redelivery after the maximum", || async { calls.len() == 2 }).await;
    assert_eq!(calls.all()[1].delivery_count, 2);
    gate.add_permits(10);
    wait_counts(&fx.transport, "sales", |c| c.active == 0).await;
    sales.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_lost_lock_is_reported_and_the_message_handled_again() {
    let capture = tracing_capture::Capture::default();
    let _guard = tracing::subscriber::set_default(capture.subscriber());
    let fx = fixture().await;
    let calls = Calls::default();
    let gate = Arc::new(Semaphore::new(0));
    let sales = endpoint(&fx, "sales")
        .max_lock_renewal(Duration::ZERO)
        .handler(gated::<PlaceOrder>("slow", &calls, &gate))
        .start()
        .await
        .unwrap();
    sales.bus().send(&PlaceOrder { id: 1 }).await.unwrap();
    eventually("first call", || async { calls.len() == 1 }).await;
    fx.clock.advance(Duration::from_secs(61));
    eventually("second call", || async { calls.len() == 2 }).await;
    gate.add_permits(2);
    wait_counts(&fx.transport, "sales", |c| c.active == 0).await;
    sales.shutdown().await.unwrap();
    assert!(
        capture
            .events()
            .iter()
            .any(|e| e.message.contains("lock lost before completion")),
        "{:?}",
        capture.events()
    );
}

/// Regression: the shutdown report counted handlers that had finished long before the
/// shutdown as "finished in flight".
#[tokio::test]
async fn the_shutdown_report_counts_only_handlers_running_at_shutdown() {
    let fx = fixture().await;
    let calls = Calls::default();
    let sales = start(&fx, "sales", recording::<PlaceOrder>("place", &calls)).await;
    for id in 0..3 {
        sales.bus().send(&PlaceOrder { id }).await.unwrap();
    }
    eventually("all done", || async {
        let s = sales.stats();
        s.completed == 3 && s.running == 0
    })
    .await;
    let report = sales.shutdown().await.unwrap();
    assert_eq!(
        (report.finished_in_flight, report.interrupted, report.completed),
        (0, 0, 3)
    );
}

/// `run_until` shuts down gracefully when its signal fires (here a channel; in a service,
/// `tokio::signal::ctrl_c()`).
#[tokio::test]
async fn run_until_stops_gracefully_on_the_signal() {
    let fx = fixture().await;
    let calls = Calls::default();
    let sales = start(&fx, "sales", recording::<PlaceOrder>("place", &calls)).await;
    let bus = sales.bus().clone();
    let (signal, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(sales.run_until(async move {
        let _ = stopped.await;
    }));
    bus.send(&PlaceOrder { id: 1 }).await.unwrap();
    eventually("the handler", || async { calls.len() == 1 }).await;
    assert!(!running.is_finished());
    signal.send(()).unwrap();
    let report = running.await.unwrap().unwrap();
    assert_eq!(report.completed, 1);
    // Stopped: a message sent now waits in the queue.
    bus.send(&PlaceOrder { id: 2 }).await.unwrap();
    wait_counts(&fx.transport, "sales", |c| c.active == 1).await;
    assert_eq!(calls.len(), 1);
}

/// An endpoint held in a struct stops through `&self` (`RunningEndpoint::stop`), with no
/// `Option` to take: the stop is the graceful shutdown, a second and a concurrent call
/// answer the first's report, the endpoint's numbers stay readable, and it receives
/// nothing more (issue 34).
#[tokio::test]
async fn an_endpoint_held_in_a_struct_stops_through_a_shared_reference() {
    struct Fixture {
        sales: courier::RunningEndpoint,
    }
    let fx = fixture().await;
    let calls = Calls::default();
    let held = Fixture {
        sales: start(&fx, "sales", recording::<PlaceOrder>("held", &calls)).await,
    };
    held.sales.bus().send(&PlaceOrder { id: 1 }).await.unwrap();
    eventually("the first handled", || async { calls.len() == 1 }).await;

    let (first, second) = tokio::join!(held.sales.stop(), held.sales.stop());
    let first = first.unwrap();
    assert_eq!(first.completed, 1);
    assert_eq!(second.unwrap(), first, "a concurrent stop answers the same report");
    assert_eq!(held.sales.stop().await.unwrap(), first, "and so does a later one");
    assert_eq!(held.sales.stats().completed, 1, "its numbers stay readable");

    held.sales.bus().send(&PlaceOrder { id: 2 }).await.unwrap();
    let queue = courier::EntityPath::queue("sales");
    eventually("the second waits in the queue", || async {
        courier::Transport::peek(&*fx.transport, &queue, 0, 10)
            .await
            .unwrap()
            .len()
            == 1
    })
    .await;
    assert_eq!(calls.len(), 1, "a stopped endpoint handles nothing more");
}
