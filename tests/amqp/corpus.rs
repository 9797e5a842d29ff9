//! The bad-input corpus every transport shares (`courier_tests::corpus`), published by a
//! raw AMQP producer (frames written by hand, so nothing a client library would refuse is
//! lost on the way), handled by an endpoint with a Postgres store, a plain handler and a
//! saga with a timeout.

use std::sync::Arc;
use std::time::Duration;

use courier::{Endpoint, EntityPath, QueueOptions, Transport};
use courier_tests::corpus::{self as shared, Header, Id, Producer, Raw};
use courier_tests::rabbit::amqp_url;
use courier_tests::raw_amqp::{Confirm, Field, RawProperties, RawPublisher};

use super::support::*;

/// The AMQP properties of `raw`; `Err` when AMQP cannot carry it (a short string over
/// 255 bytes: no frame can hold it; a scheduled time).
fn properties(raw: &Raw) -> Result<RawProperties, String> {
    if raw.scheduled.is_some() {
        return Err("AMQP has no scheduled time a producer sets".into());
    }
    let headers = raw
        .all_headers()
        .into_iter()
        .map(|(k, v)| {
            let v = match v {
                Header::Text(s) => Field::Bytes(s.into_bytes()),
                Header::Int(i) => Field::I64(i),
            };
            (k.into_bytes(), v)
        })
        .collect();
    let short = [
        &raw.correlation_id,
        &raw.message_id(),
        &raw.message_type,
        &raw.content_type,
    ];
    if let Some(long) = short
        .iter()
        .copied()
        .flatten()
        .find(|s| s.len() > shared::AMQP_SHORT_STRING)
    {
        return Err(format!("a short string of {} bytes", long.len()));
    }
    Ok(RawProperties {
        content_type: raw.content_type.clone().map(String::into_bytes),
        headers: Some(headers),
        delivery_mode: Some(2),
        correlation_id: raw.correlation_id.clone().map(String::into_bytes),
        message_id: match raw.id {
            Id::Missing => None,
            _ => raw.message_id().map(String::into_bytes),
        },
        kind: raw.message_type.clone().map(String::into_bytes),
        reply_to: None,
    })
}

/// Issue 18, point 3, on RabbitMQ.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_corpus_published_raw_is_dead_lettered_case_by_case_and_the_valid_messages_are_handled_once() {
    let (db, store) = database().await;
    let name = unique("corpus");
    let transport = rabbit(&store, None).await;
    transport.create_queue(&name, &QueueOptions::default()).await.unwrap();
    let corpus = shared::corpus();
    let mut raw = RawPublisher::connect(&amqp_url().await).await.unwrap();
    let mut refused = Vec::new();
    for (case, message) in corpus.sequence(Producer::RawAmqp) {
        if let Some((correlation, state)) = case.and_then(|c| c.saga_row) {
            sqlx::query(
                "INSERT INTO courier.saga (saga_type, correlation, state, version, created_at, updated_at) \
                 VALUES ('corpus.Booking', $1, $2::jsonb, 1, now(), now())",
            )
            .bind(correlation)
            .bind(state)
            .execute(store.pool())
            .await
            .unwrap();
        }
        let Ok(p) = properties(message) else {
            refused.push(message.label.clone());
            continue;
        };
        let confirm = raw.publish("", name.as_bytes(), &p, &message.body).await.unwrap();
        assert_eq!(confirm, Confirm::Ack, "{}", message.label);
    }

    let seen = shared::Seen::default();
    let endpoint = shared::endpoint(
        Endpoint::builder(name.clone())
            .transport(transport.clone())
            .store(Arc::new(store.clone())),
        &name,
        &seen,
    )
    .start()
    .await
    .unwrap();
    let path = EntityPath::queue(&name);
    let (handled, want_dead) = shared::totals(&corpus, Producer::RawAmqp);
    let settled = shared::settle(|| async {
        let c = transport.counts(&path).await.unwrap();
        seen.calls().len() >= handled && c.active == 0 && c.dead_lettered >= want_dead as u64
    })
    .await;
    // RabbitMQ cannot browse: the dead-letter queue is drained.
    let dlq = transport.receiver(&path.clone().dead_letter()).await.unwrap();
    let mut dead = Vec::new();
    loop {
        let got = dlq.receive(16, Duration::from_millis(500)).await.unwrap();
        if got.is_empty() {
            break;
        }
        for d in got {
            dead.push(d.message().clone());
            d.complete().await.unwrap();
        }
    }
    let outcome = shared::Outcome {
        calls: seen.calls(),
        dead,
        refused,
    };
    for line in shared::check(&corpus, Producer::RawAmqp, &outcome) {
        eprintln!("{line}");
    }
    let c = transport.counts(&path).await.unwrap();
    assert!(settled, "nothing left in the queue: {c:?}");
    let sagas: Vec<String> = sqlx::query_scalar("SELECT correlation FROM courier.saga")
        .fetch_all(store.pool())
        .await
        .unwrap();
    assert_eq!(sagas, [shared::BROKEN_BOOKING]);
    let timeouts: i64 = sqlx::query_scalar("SELECT count(*) FROM courier.saga_timeout")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(timeouts, 0, "no timeout left");
    assert_eq!(c.scheduled, 0, "no scheduled message left");
    endpoint.shutdown().await.unwrap();
    cleanup(&transport, &name).await;
    db.drop_now().await;
}
