//! A healthy run on RabbitMQ logs no ERROR line, from Courier or from the client library
//! (issue 34): endpoints that start (their queues, a subscription, the routed-queue
//! check), handle, send and publish (to a subscribed topic and to one nobody subscribes
//! to yet), shut down, and the transport closes. lapin logs at ERROR every channel that
//! RabbitMQ closes (a lookup of an entity that is not there) and every connection error
//! (a channel it closes after the connection began to close).
//!
//! And a transport closed right after channels were dropped (a sender's, a receiver's):
//! lapin closes such a channel later, on its own task, and one it closed after the
//! connection began to close put the whole connection in error (`ERROR lapin::channels:
//! Connection error invalid channel state: Closing`); on a current-thread runtime it did
//! every time.
//!
//! lapin logs from its own threads, so only a subscriber of the whole process sees its
//! lines: the test runs itself again as a child process (this test alone) that installs
//! one, and the parent asserts on the child's outcome.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use courier::{
    AmqpTransport, Context, Endpoint, EntityPath, Envelope, HandlerError, QueueOptions, Routes, SenderOptions,
    Transport,
};
use courier_tests::logs::Logs;
use serde::{Deserialize, Serialize};

use crate::support::*;

const CHILD: &str = "COURIER_TEST_QUIET_CHILD";
const NAME: &str = "quiet::a_healthy_run_on_rabbitmq_logs_no_error_line";
const JOBS: u32 = 5;

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "quiet.Work")]
struct Work {
    n: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "quiet.Worked")]
struct Worked {
    n: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "quiet.Audited")]
struct Audited {
    n: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "quiet.Note")]
struct Note {
    n: u32,
}

/// What the second endpoint handled: `Worked` events and `Note` commands.
static HANDLED: AtomicU32 = AtomicU32::new(0);

#[courier::handler]
async fn work(job: Work, ctx: &mut Context) -> Result<(), HandlerError> {
    ctx.publish(&Worked { n: job.n })?;
    ctx.publish(&Audited { n: job.n })?;
    ctx.send(&Note { n: job.n })?;
    Ok(())
}

#[courier::handler]
async fn worked(_event: Worked, _ctx: &mut Context) -> Result<(), HandlerError> {
    HANDLED.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[courier::handler]
async fn note(_note: Note, _ctx: &mut Context) -> Result<(), HandlerError> {
    HANDLED.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[test]
fn a_healthy_run_on_rabbitmq_logs_no_error_line() {
    if std::env::var_os(CHILD).is_some() {
        return child();
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "the run in a child process failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("1 passed"), "the child ran the test: {stdout}");
}

/// The run, in the child: every ERROR event of the process is captured.
fn child() {
    let logs = Logs::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::ERROR)
        .finish();
    tracing::subscriber::set_global_default(subscriber).expect("the child's only subscriber");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(healthy_run());
    drop(runtime);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(close_right_after_drops());
    drop(runtime);
    let errors = logs.text();
    assert!(errors.is_empty(), "ERROR lines in a healthy run:\n{errors}");
}

async fn healthy_run() {
    let (db, store) = database().await;
    let transport = rabbit(&store, None).await;
    let (a, b) = (unique("quiet-a"), unique("quiet-b"));
    let (worked_topic, audited_topic) = (format!("{a}-worked"), format!("{a}-audited"));
    // The subscriber first, as a healthy deployment has it: the queue `a` sends to exists.
    let second = Endpoint::builder(b.as_str())
        .transport(transport.clone())
        .store(Arc::new(store.clone()))
        .routes(Routes::new().event_on::<Worked>(&worked_topic).send::<Note>(&b))
        .handler(worked)
        .handler(note)
        .start()
        .await
        .unwrap();
    let first = Endpoint::builder(a.as_str())
        .transport(transport.clone())
        .store(Arc::new(store.clone()))
        .routes(
            Routes::new()
                .send::<Work>(&a)
                .send::<Note>(&b)
                .event_on::<Worked>(&worked_topic)
                .event_on::<Audited>(&audited_topic),
        )
        .handler(work)
        .start()
        .await
        .unwrap();
    for n in 0..JOBS {
        first.bus().send(&Work { n }).await.unwrap();
    }
    courier_tests::eventually("every event and note handled", || async {
        HANDLED.load(Ordering::SeqCst) >= 2 * JOBS
    })
    .await;
    first.shutdown().await.unwrap();
    second.shutdown().await.unwrap();
    let admin = rabbit(&store, None).await;
    crate::close::close_within_watchdog(transport, 0).await;
    // Only what exists: a lookup of what does not is what this test rules out.
    admin
        .delete(&courier::EntityPath::subscription(&worked_topic, &b))
        .await
        .unwrap();
    for name in [&a, &b, &worked_topic, &audited_topic] {
        admin.delete(&courier::EntityPath::queue(name)).await.unwrap();
    }
    admin.close().await;
    db.drop_now().await;
}

async fn close_right_after_drops() {
    let url = courier_tests::rabbit::amqp_url().await;
    let name = unique("quiet-drop");
    let admin = AmqpTransport::connect(url.clone()).await.unwrap();
    admin.create_queue(&name, &QueueOptions::default()).await.unwrap();
    for run in 0..5 {
        let transport = Arc::new(AmqpTransport::connect(url.clone()).await.unwrap());
        let sender = transport.sender(&name, SenderOptions::default()).await.unwrap();
        sender.send(Envelope::new(b"x".to_vec())).await.unwrap();
        let receiver = transport.receiver(&EntityPath::queue(&name)).await.unwrap();
        for d in receiver.receive(1, Duration::from_secs(10)).await.unwrap() {
            d.complete().await.unwrap();
        }
        drop((sender, receiver));
        crate::close::close_within_watchdog(transport, run).await;
    }
    admin.delete(&EntityPath::queue(&name)).await.unwrap();
    admin.close().await;
}
