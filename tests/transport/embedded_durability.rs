//! The embedded broker on a file: what survives a killed process and a reopen.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use courier::prelude::*;
use courier::{ErrorKind, MessageState};

const CHILD: &str = env!("CARGO_BIN_EXE_courier-test-child");

fn spawn(mode: &str, db: &std::path::Path, queue: &str) -> std::process::Child {
    Command::new(CHILD)
        .args([mode, db.to_str().unwrap(), queue])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

async fn all_messages(broker: &Embedded, queue: &str) -> Vec<ReceivedMessage> {
    let mut out = Vec::new();
    let mut from = 0;
    loop {
        let page = broker.peek(&EntityPath::queue(queue), from, 1000).await.unwrap();
        let Some(last) = page.last() else { break };
        from = last.sequence_number() + 1;
        out.extend(page);
    }
    out
}

/// S1.1: a process killed (SIGKILL) in the middle of sending loses no message whose send
/// was acknowledged, and the sequence numbers stay gap-free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s1_1_killed_sender_loses_no_acknowledged_message() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("courier.db");
    let mut child = spawn("send", &db, "durable");
    let stdout = child.stdout.take().unwrap();
    let acked = tokio::task::spawn_blocking(move || {
        let mut lines = BufReader::new(stdout).lines();
        let mut acked = Vec::new();
        // Kill in the middle of the stream, then drain what was printed before the kill.
        while let Some(Ok(line)) = lines.next() {
            acked.push(line);
            if acked.len() == 300 {
                child.kill().unwrap();
            }
        }
        child.wait().unwrap();
        acked
    })
    .await
    .unwrap();
    assert!(acked.len() >= 300, "the child acknowledged only {} sends", acked.len());

    let broker = Embedded::open(&db).await.unwrap();
    let stored = all_messages(&broker, "durable").await;
    let ids: std::collections::HashSet<&str> = stored.iter().map(|m| m.message_id()).collect();
    for line in &acked {
        let i = line.strip_prefix("ACK ").unwrap();
        assert!(
            ids.contains(format!("m-{i}").as_str()),
            "acknowledged message m-{i} was lost"
        );
    }
    for (n, m) in stored.iter().enumerate() {
        assert_eq!(m.sequence_number(), n as i64 + 1, "sequence numbers must be gap-free");
        assert_eq!(m.message_id(), format!("m-{n}"));
    }
}

/// S2.7: a lock held by a process that died is released; the message is delivered again
/// with its delivery count kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s2_7_lock_of_killed_process_is_released_on_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("courier.db");
    {
        let broker = Embedded::open(&db).await.unwrap();
        broker.create_queue("work", &QueueOptions::default()).await.unwrap();
        let sender = broker.sender("work", SenderOptions::default()).await.unwrap();
        sender
            .send(Envelope::new("job").with_message_id("job-1"))
            .await
            .unwrap();
        broker.close().await;
    }
    let mut child = spawn("lock", &db, "work");
    let stdout = child.stdout.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        line
    })
    .await
    .unwrap();
    assert_eq!(line.trim(), "LOCKED 1 1");

    let broker = Embedded::open(&db).await.unwrap();
    let receiver = broker.receiver(&EntityPath::queue("work")).await.unwrap();
    let got = receiver.receive(1, Duration::from_secs(5)).await.unwrap();
    assert_eq!(got.len(), 1, "the message locked by the dead process must come back");
    assert_eq!(got[0].message().message_id(), "job-1");
    assert_eq!(got[0].message().delivery_count(), 2);
    got.into_iter().next().unwrap().complete().await.unwrap();
}

/// S3.1 and S5: reopening a file keeps messages, numbering and scheduled messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopen_keeps_messages_sequence_and_schedules() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("courier.db");
    let clock = VirtualClock::starting_now();
    let open = || Embedded::builder().path(&db).clock(Arc::new(clock.clone())).open();
    let scheduled_seq;
    {
        let broker = open().await.unwrap();
        broker.create_queue("q", &QueueOptions::default()).await.unwrap();
        let sender = broker.sender("q", SenderOptions::default()).await.unwrap();
        sender.send(Envelope::new("a")).await.unwrap();
        sender.send(Envelope::new("b")).await.unwrap();
        scheduled_seq = sender
            .schedule(Envelope::new("later"), clock.now() + chrono::Duration::hours(1))
            .await
            .unwrap();
        broker.close().await;
    }
    assert_eq!(scheduled_seq, 3);
    let broker = open().await.unwrap();
    let sender = broker.sender("q", SenderOptions::default()).await.unwrap();
    sender.send(Envelope::new("c")).await.unwrap();
    let stored = all_messages(&broker, "q").await;
    let seqs: Vec<i64> = stored.iter().map(ReceivedMessage::sequence_number).collect();
    assert_eq!(seqs, vec![1, 2, 3, 4]);
    assert_eq!(stored[2].broker.state, MessageState::Scheduled);

    clock.advance(Duration::from_secs(3600));
    let receiver = broker.receiver(&EntityPath::queue("q")).await.unwrap();
    let got = receiver.receive(10, Duration::from_secs(5)).await.unwrap();
    let bodies: Vec<&[u8]> = got.iter().map(|d| d.message().body().as_ref()).collect();
    assert_eq!(bodies, vec![&b"a"[..], b"b", b"c", b"later"]);
    assert_eq!(
        got[3].message().sequence_number(),
        5,
        "activation takes the next sequence number"
    );
}

/// The file is held by one broker at a time: a second open fails with a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_open_of_a_file_in_use_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("courier.db");
    let first = Embedded::open(&db).await.unwrap();
    first.create_queue("q", &QueueOptions::default()).await.unwrap();
    let err = Embedded::open(&db).await.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Storage { .. }), "{err}");
    assert!(err.to_string().contains("another process"), "{err}");
    first.close().await;
    let again = Embedded::open(&db).await.unwrap();
    again.close().await;
}
