//! A child process for the durability tests: it works on an embedded broker file and
//! reports each step on stdout, until the test kills it with SIGKILL.
//!
//! `courier-test-child send <db> <queue>`: sends messages `m-0`, `m-1`, ... one at a time
//! and prints `ACK <i>` after each acknowledged send.
//! `courier-test-child lock <db> <queue>`: receives one message in PeekLock mode, prints
//! `LOCKED <sequence number> <delivery count>` and waits to be killed.
//! `courier-test-child endpoint <db> <queue>`: runs an endpoint whose handler of
//! [`courier_tests::CrashJob`] always fails, under [`courier_tests::crash_policy`]; prints
//! `ATTEMPT <attempt> <delayed retries>` per call and `SCHEDULED` once the delayed retry
//! is in the broker and the original completed, then waits to be killed.

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::time::Duration;

use courier::prelude::*;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (mode, db, queue) = (args[1].as_str(), &args[2], &args[3]);
    let broker = Embedded::open(db).await.expect("open broker");
    broker.create_queue(queue, &QueueOptions::default()).await.unwrap();
    let mut out = std::io::stdout().lock();
    match mode {
        "send" => {
            let sender = broker.sender(queue, SenderOptions::default()).await.unwrap();
            for i in 0u64.. {
                sender
                    .send(Envelope::new(vec![b'x'; 1024]).with_message_id(format!("m-{i}")))
                    .await
                    .unwrap();
                writeln!(out, "ACK {i}").unwrap();
                out.flush().unwrap();
            }
        }
        "lock" => {
            let receiver = broker.receiver(&EntityPath::queue(queue)).await.unwrap();
            let got = receiver.receive(1, Duration::from_secs(10)).await.unwrap();
            let m = got[0].message();
            writeln!(out, "LOCKED {} {}", m.sequence_number(), m.delivery_count()).unwrap();
            out.flush().unwrap();
            std::future::pending::<()>().await;
        }
        "endpoint" => {
            #[courier::handler]
            async fn always_fails(
                _job: courier_tests::CrashJob,
                ctx: &mut courier::Context,
            ) -> Result<(), HandlerError> {
                let mut out = std::io::stdout().lock();
                writeln!(out, "ATTEMPT {} {}", ctx.attempt(), ctx.delayed_retries()).unwrap();
                out.flush().unwrap();
                Err(HandlerError::msg("the job always fails"))
            }
            let broker = std::sync::Arc::new(broker);
            let transport: std::sync::Arc<dyn Transport> = broker.clone();
            let _running = Endpoint::builder(queue.as_str())
                .transport(transport)
                .recoverability(courier_tests::crash_policy())
                .handler(always_fails)
                .start()
                .await
                .unwrap();
            loop {
                let c = broker.counts(&EntityPath::queue(queue)).await.unwrap();
                if c.scheduled == 1 && c.active == 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            writeln!(out, "SCHEDULED").unwrap();
            out.flush().unwrap();
            std::future::pending::<()>().await;
        }
        other => panic!("unknown mode {other}"),
    }
}
