//! `amqps://`: the transport speaks TLS, trusts a private certificate authority given to
//! it, refuses a server it cannot verify, and never shows a password. The local RabbitMQ
//! has no TLS listener, so the test puts a TLS-terminating proxy (a self-signed
//! certificate for `localhost`) in front of its plain port.

use std::sync::Arc;
use std::time::Duration;

use courier::{AmqpTransport, EntityPath, Envelope, ErrorKind, QueueOptions, SenderOptions, Transport};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::support::broker_parts;

/// A TLS proxy on 127.0.0.1 to the plain AMQP port; returns its port and the
/// certificate's PEM.
async fn tls_proxy(upstream: String) -> (u16, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    let cert = params.self_signed(&key).unwrap();
    let pem = cert.pem();
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(cert.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, upstream) = (acceptor.clone(), upstream.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(socket).await else {
                    return;
                };
                let Ok(mut plain) = TcpStream::connect(&upstream).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    (port, pem)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqps_with_a_private_certificate_authority_sends_and_receives() {
    let (upstream, userinfo) = broker_parts(&courier_tests::rabbit::amqp_url().await);
    let (port, pem) = tls_proxy(upstream).await;
    let url = format!("amqps://{userinfo}@localhost:{port}/%2f");

    // Without the authority the server cannot be verified: a connection error in time.
    let e = AmqpTransport::builder(url.clone())
        .connect_timeout(Duration::from_secs(2))
        .open()
        .await
        .unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Connection { .. }), "{e}");

    let transport = AmqpTransport::builder(url)
        .tls_root_certificates(pem)
        .open()
        .await
        .unwrap();
    let queue = format!("tls-{}", uuid::Uuid::new_v4().simple());
    transport.create_queue(&queue, &QueueOptions::default()).await.unwrap();
    let sender = transport.sender(&queue, SenderOptions::default()).await.unwrap();
    sender
        .send(Envelope::new("over tls").with_message_id("tls-1"))
        .await
        .unwrap();
    let receiver = transport.receiver(&EntityPath::queue(&queue)).await.unwrap();
    let got = receiver.receive(1, Duration::from_secs(10)).await.unwrap();
    assert_eq!(got[0].message().message_id(), "tls-1");
    got.into_iter().next().unwrap().complete().await.unwrap();
    transport.delete(&EntityPath::queue(&queue)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_never_shows_in_errors_or_debug_output() {
    let (upstream, _) = broker_parts(&courier_tests::rabbit::amqp_url().await);
    let url = format!("amqp://guest:not-the-s3cret@{upstream}/%2f");
    let builder = AmqpTransport::builder(url.clone()).connect_timeout(Duration::from_secs(1));
    assert!(!format!("{builder:?}").contains("not-the-s3cret"));
    let e = builder.open().await.unwrap_err();
    let shown = format!("{e} {e:?}");
    assert!(!shown.contains("not-the-s3cret"), "{shown}");
    assert!(shown.contains("guest:***@"), "{shown}");
}
