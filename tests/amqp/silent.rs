//! A node that stops answering without closing its connections (a paused machine, a
//! network that drops packets; issue 36): a send waiting for its confirm fails within the
//! transport's operation timeout with a transient error whose outcome is unknown, instead
//! of waiting for as long as the node stays silent, and the next send, once the node
//! answers again, goes through on a new channel.
//!
//! The silence is a proxy between the transport and RabbitMQ that stops reading, both
//! ways, while frozen; the connection has no heartbeat (`?heartbeat=0`), so nothing else
//! notices it. Before the operation timeout existed, the send waited for ever.

use std::sync::Arc;
use std::time::Duration;

use courier::{AmqpTransport, EntityPath, Envelope, QueueOptions, SenderOptions, Transport};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::support::{broker_parts, unique};

/// A TCP proxy on 127.0.0.1 that forwards both ways until frozen, and again once thawed;
/// frozen, it reads nothing, so what either side writes waits in the socket buffers.
struct FreezingProxy {
    port: u16,
    frozen: Arc<watch::Sender<bool>>,
}

impl FreezingProxy {
    async fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let frozen = Arc::new(watch::Sender::new(false));
        let switch = frozen.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    return;
                };
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::spawn(forward(client_read, server_write, switch.subscribe()));
                tokio::spawn(forward(server_read, client_write, switch.subscribe()));
            }
        });
        FreezingProxy { port, frozen }
    }

    fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    fn thaw(&self) {
        self.frozen.send_replace(false);
    }
}

/// Copies `from` to `to`, reading only while not frozen.
async fn forward(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut frozen: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if frozen.wait_for(|f| !f).await.is_err() {
            return;
        }
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            // Frozen while waiting to read: stop reading until thawed.
            _ = frozen.wait_for(|f| *f) => continue,
        };
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_to_a_node_that_stopped_answering_fails_within_the_operation_timeout_and_the_next_goes_through() {
    let (upstream, userinfo) = broker_parts(&courier_tests::rabbit::amqp_url().await);
    let proxy = FreezingProxy::start(upstream).await;
    let transport = AmqpTransport::builder(format!("amqp://{userinfo}@127.0.0.1:{}/%2f?heartbeat=0", proxy.port))
        .operation_timeout(Duration::from_secs(2))
        .open()
        .await
        .unwrap();
    let queue = unique("q");
    transport.create_queue(&queue, &QueueOptions::default()).await.unwrap();
    let sender = transport.sender(&queue, SenderOptions::default()).await.unwrap();
    sender
        .send(Envelope::new("before").with_message_id("before"))
        .await
        .unwrap();

    proxy.freeze();
    // The guard is far above the operation timeout: it only keeps a regression from
    // hanging the suite.
    let waited = tokio::time::timeout(
        Duration::from_secs(120),
        sender.send(Envelope::new("during").with_message_id("during")),
    )
    .await
    .expect("the send to a silent node was still waiting 120 s later (the operation timeout is 2 s)");
    let e = waited.unwrap_err();
    assert!(e.error.is_transient(), "{e}");
    let text = e.error.to_string();
    assert!(
        text.contains("operation timeout") && text.contains("outcome is unknown") && text.contains("same message id"),
        "the error says what happened and what to do: {text}"
    );
    assert_eq!(e.messages.len(), 1, "the message is handed back");

    // The node answers again: the same message, sent again with its id, goes through on a
    // new channel (the one that waited was closed).
    proxy.thaw();
    sender
        .send(Envelope::new("during").with_message_id("during"))
        .await
        .unwrap();

    // The copy whose outcome was unknown did arrive (it sat in the socket buffers): a
    // receiving endpoint's inbox drops the second by its message id.
    let receiver = transport.receiver(&EntityPath::queue(&queue)).await.unwrap();
    let mut ids = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !(ids.contains(&"before".to_owned()) && ids.contains(&"during".to_owned())) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "received {ids:?}, not both messages"
        );
        for m in receiver.receive(10, Duration::from_secs(1)).await.unwrap() {
            ids.push(m.message().message_id().to_owned());
            m.complete().await.unwrap();
        }
    }
    assert!(
        ids.iter().all(|id| id == "before" || id == "during"),
        "only the messages sent: {ids:?}"
    );
    transport.delete(&EntityPath::queue(&queue)).await.unwrap();
    transport.close().await;
}
