//! RabbitMQ's management HTTP API, read by [`AmqpAdmin`](super::AmqpAdmin) when it is
//! given its address ([`AmqpAdmin::with_management`](super::AmqpAdmin::with_management),
//! `courier --rabbitmq-management URL`): how many messages consumers hold
//! unacknowledged, which AMQP 0-9-1 does not tell.
//!
//! * **One request a listing**: `GET /api/queues/{vhost}?columns=name,vhost,messages_unacknowledged,head_message_timestamp`
//!   (the vhost of the AMQP URL, percent-encoded: `%2F` for `/`), whatever the number of
//!   queues; `columns` keeps the answer to those fields (RabbitMQ 3.10 accepts it).
//! * **What it gives.** `messages_unacknowledged` for every queue type: `LOCKED`.
//!   `head_message_timestamp` (the AMQP `timestamp` property of the queue's head message,
//!   in seconds) only for a **classic** queue whose head is in memory: RabbitMQ 3.10 does
//!   not have the field at all for a **quorum** queue, and Courier's queues are quorum
//!   queues, so their oldest age stays unknown. It is not guessed, and the head message is
//!   not peeked: a `basic.get` and a requeue would count as a delivery and bring the
//!   message nearer its `x-delivery-limit`.
//! * **How fresh.** The API answers from statistics the broker collects every
//!   `collect_statistics_interval` (5 s by default): `LOCKED` can be that old, while
//!   `ACTIVE` (a passive `queue.declare`) is current. A queue younger than one interval has
//!   no statistics yet (counted as 0).
//! * **Credentials** are the URL's (`http://user:password@host:15672`), sent as HTTP Basic
//!   authentication; without any in the URL, the AMQP URL's user and password. The user
//!   needs one of the `management`, `monitoring` or `administrator` tags.
//! * **A cluster**: several addresses separated by commas
//!   (`http://rabbit-1:15672,http://rabbit-2:15672`), the API of any node lists the whole
//!   cluster's queues; a listing asks them in order and the first that answers gives it
//!   (a node that cannot be reached or does not answer in time passes the turn to the next;
//!   a refusal or an error status does not, as every node would give the same).
//! * **Plain HTTP only**: an `https://` address is refused when the admin is built
//!   (HTTPS management endpoints are not supported yet).
//! * **A failure never fails a listing.** Each request has 5 s (connecting included); when
//!   the API cannot be reached or answers an error, the listing has the AMQP counts alone
//!   and a warning says why and what to do (enable the plugin, check the address or the
//!   credentials).

use std::collections::HashMap;
use std::str::FromStr;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use http_body_util::{BodyExt, Empty, Limited};
use hyper::header::{ACCEPT, AUTHORIZATION, HeaderValue};
use hyper::{Request, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};
use serde::Deserialize;

/// How long one request may take, connecting included.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(5);

/// The largest answer read (about 200,000 queues with the columns asked for).
const MAX_BODY: usize = 32 << 20;

/// The fields asked for.
const COLUMNS: &str = "name,vhost,messages_unacknowledged,head_message_timestamp";

/// What a path segment keeps unencoded: RFC 3986's unreserved characters.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// The statistics of one queue, as far as the API gives them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct QueueStats {
    /// Messages delivered to consumers and not acknowledged yet.
    pub(crate) unacknowledged: Option<u64>,
    /// The AMQP timestamp of the head message (classic queues only).
    pub(crate) head_timestamp: Option<DateTime<Utc>>,
}

/// Why the API gave no statistics.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum ManagementError {
    /// No answer within [`TIMEOUT`].
    #[error("no answer within {} s", TIMEOUT.as_secs())]
    Timeout,
    /// The request could not be made: no connection, or the connection failed.
    #[error("the request failed: {0}")]
    Request(#[source] hyper_util::client::legacy::Error),
    /// The request could not be built.
    #[error("the request cannot be built: {0}")]
    Build(#[source] hyper::http::Error),
    /// 401 or 403: the credentials were refused, or the user may not use the API.
    #[error("the credentials were refused ({0})")]
    Refused(StatusCode),
    /// Another status than 200.
    #[error("it answered {0}")]
    Status(StatusCode),
    /// The answer's body could not be read (or was larger than 32 MiB).
    #[error("its answer cannot be read: {0}")]
    Body(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The answer is not the JSON array of queues expected.
    #[error("its answer is not the expected JSON: {0}")]
    Json(#[source] serde_json::Error),
}

impl ManagementError {
    /// The error with its causes (`client error (Connect): tcp connect error: Connection
    /// refused`), for the warning.
    pub(crate) fn with_causes(&self) -> String {
        let mut text = self.to_string();
        let mut cause = std::error::Error::source(self);
        while let Some(c) = cause {
            let line = c.to_string();
            if !text.ends_with(&line) {
                text.push_str(": ");
                text.push_str(&line);
            }
            cause = c.source();
        }
        text
    }

    /// What the operator can do about it.
    pub(crate) fn hint(&self) -> &'static str {
        match self {
            ManagementError::Timeout | ManagementError::Request(_) => {
                "check that the management plugin is on (rabbitmq-plugins enable rabbitmq_management) and that the \
                 URL names its listener (port 15672 by default)"
            }
            ManagementError::Refused(_) => {
                "check the credentials (in the URL, else the AMQP URL's) and that the user has the management, \
                 monitoring or administrator tag"
            }
            ManagementError::Status(_) | ManagementError::Json(_) | ManagementError::Build(_) => {
                "check that the URL is the management API's address (http://host:15672, with the path prefix if \
                 one is configured) and that the AMQP URL's virtual host exists"
            }
            ManagementError::Body(_) => "try again; if it persists, check the management plugin's logs",
        }
    }
}

/// A client of the management API of one virtual host, on one node or several.
pub(crate) struct Management {
    client: Client<HttpConnector, Empty<Bytes>>,
    /// One per address given, in that order.
    targets: Vec<Target>,
    /// The virtual host (decoded), to keep only its queues.
    vhost: String,
    /// The addresses without their passwords, for logs and `describe()`.
    pub(crate) display: String,
}

/// One address of the management API.
struct Target {
    /// The queues request: `http://host:port[/prefix]/api/queues/{vhost}?columns=...`.
    queues: Uri,
    /// `Basic ...`, marked sensitive.
    authorization: HeaderValue,
}

/// The parts of a management URL.
#[derive(Debug, PartialEq, Eq)]
struct Address {
    /// User and password (percent-decoded), when the URL has them.
    credentials: Option<(String, String)>,
    /// `host[:port]`.
    host_port: String,
    /// The path prefix, without a trailing `/` (empty for none).
    prefix: String,
    /// The URL with `***` for its password.
    display: String,
}

const EXAMPLE: &str = "http://user:password@rabbit:15672";

/// Reads a management URL: `http://[user:password@]host[:port][/prefix]`.
fn parse(url: &str) -> Result<Address, String> {
    let url = url.trim();
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(format!("it is not a URL; it should look like {EXAMPLE}"));
    };
    if scheme.eq_ignore_ascii_case("https") {
        return Err(
            "HTTPS management endpoints are not supported yet: give the plain http:// address of the \
                    management listener (port 15672 by default)"
                .into(),
        );
    }
    if !scheme.eq_ignore_ascii_case("http") {
        return Err(format!("its scheme is {scheme}://, not http:// (e.g. {EXAMPLE})"));
    }
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    // Nothing after the authority is shown: a password with an unencoded `/`, `?` or `#`
    // would be cut there and part of it would land in the path.
    if tail.contains('@') {
        return Err(
            "it has an @ after its host: a user or password with /, ?, # or @ must be percent-encoded \
                    (%2F, %3F, %23, %40)"
                .into(),
        );
    }
    if tail.contains(['?', '#']) {
        return Err(format!(
            "it has a query or a fragment (?... or #...): give the address alone, e.g. {EXAMPLE}"
        ));
    }
    let (userinfo, host_port) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    check_host_port(host_port)?;
    let credentials = match userinfo {
        None => None,
        Some(u) => {
            let (user, password) = u.split_once(':').ok_or_else(|| {
                format!("it names a user without a password: give both ({EXAMPLE}), or neither to use the AMQP URL's")
            })?;
            Some((decode(user, "user")?, decode(password, "password")?))
        }
    };
    let prefix = tail.trim_end_matches('/').to_owned();
    let shown_user = userinfo
        .map(|u| format!("{}:***@", u.split(':').next().unwrap_or("")))
        .unwrap_or_default();
    Ok(Address {
        credentials,
        display: format!("http://{shown_user}{host_port}{prefix}"),
        host_port: host_port.to_owned(),
        prefix,
    })
}

fn check_host_port(host_port: &str) -> Result<(), String> {
    let (host, port) = if let Some(v6) = host_port.strip_prefix('[') {
        let (inside, after) = v6
            .split_once(']')
            .ok_or_else(|| "its IPv6 host has no closing ]".to_owned())?;
        if inside.is_empty() {
            return Err("it has no host".into());
        }
        match after {
            "" => (inside, None),
            p => (
                inside,
                Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| "its IPv6 host is not followed by :port".to_owned())?,
                ),
            ),
        }
    } else {
        match host_port.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (host_port, None),
        }
    };
    if host.is_empty() {
        return Err(format!("it has no host (e.g. {EXAMPLE})"));
    }
    if let Some(p) = port
        && !matches!(p.parse::<u16>(), Ok(n) if n > 0)
    {
        return Err("its port is not a number from 1 to 65535".into());
    }
    Ok(())
}

fn decode(text: &str, what: &str) -> Result<String, String> {
    percent_decode_str(text)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| format!("its {what} is not UTF-8 once percent-decoded"))
}

impl Management {
    /// A client for the management API at `url`, for the virtual host of `amqp_url` (and
    /// its user and password when `url` has none). The error says what is wrong with
    /// `url`, without its password.
    pub(crate) fn new(url: &str, amqp_url: &str) -> Result<Self, String> {
        let amqp = lapin::uri::AMQPUri::from_str(amqp_url)
            .map_err(|_| "the AMQP URL cannot be read for its virtual host and credentials".to_owned())?;
        let vhost = amqp.vhost.clone();
        let mut targets = Vec::new();
        let mut shown = Vec::new();
        for one in url.split(',') {
            if one.trim().is_empty() {
                return Err(format!(
                    "it has an empty address in its list: separate the addresses by single commas \
                     (e.g. {EXAMPLE},http://rabbit-2:15672)"
                ));
            }
            let address = parse(one)?;
            let (user, password) = address.credentials.clone().unwrap_or_else(|| {
                (
                    amqp.authority.userinfo.username.clone(),
                    amqp.authority.userinfo.password.clone(),
                )
            });
            let queues = format!(
                "http://{}{}/api/queues/{}?columns={COLUMNS}",
                address.host_port,
                address.prefix,
                utf8_percent_encode(&vhost, SEGMENT)
            );
            let queues =
                Uri::from_str(&queues).map_err(|e| format!("{} is not a usable address: {e}", address.display))?;
            let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
            let mut authorization = HeaderValue::from_str(&format!("Basic {token}"))
                .map_err(|_| "its credentials cannot be sent in an HTTP header".to_owned())?;
            authorization.set_sensitive(true);
            targets.push(Target { queues, authorization });
            shown.push(address.display);
        }
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(TIMEOUT));
        // One request a listing, seconds apart at best: no connection is kept.
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(0)
            .build(connector);
        Ok(Self {
            client,
            targets,
            vhost,
            display: shown.join(", "),
        })
    }

    /// The statistics of the virtual host's queues, by name: one request, at most
    /// [`TIMEOUT`].
    /// With several addresses, one after the other until one answers (each at most
    /// [`TIMEOUT`]); the error is the last one's.
    pub(crate) async fn queues(&self) -> Result<HashMap<String, QueueStats>, ManagementError> {
        let mut last = ManagementError::Timeout;
        for target in &self.targets {
            match tokio::time::timeout(TIMEOUT, self.fetch(target)).await {
                Ok(Ok(stats)) => return Ok(stats),
                Ok(Err(e @ ManagementError::Request(_))) => last = e,
                Err(_) => last = ManagementError::Timeout,
                Ok(Err(e)) => return Err(e),
            }
        }
        Err(last)
    }

    async fn fetch(&self, target: &Target) -> Result<HashMap<String, QueueStats>, ManagementError> {
        let request = Request::get(target.queues.clone())
            .header(AUTHORIZATION, target.authorization.clone())
            .header(ACCEPT, "application/json")
            .body(Empty::new())
            .map_err(ManagementError::Build)?;
        let response = self.client.request(request).await.map_err(ManagementError::Request)?;
        match response.status() {
            StatusCode::OK => {}
            s @ (StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) => return Err(ManagementError::Refused(s)),
            s => return Err(ManagementError::Status(s)),
        }
        let body = Limited::new(response.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(ManagementError::Body)?
            .to_bytes();
        let rows: Vec<Row> = serde_json::from_slice(&body).map_err(ManagementError::Json)?;
        Ok(stats_of(rows, &self.vhost))
    }
}

/// A queue as the API lists it (the fields asked for; a queue without statistics yet
/// lacks the counts).
#[derive(Debug, Deserialize)]
struct Row {
    name: String,
    #[serde(default)]
    vhost: Option<String>,
    #[serde(default)]
    messages_unacknowledged: Option<serde_json::Value>,
    #[serde(default)]
    head_message_timestamp: Option<serde_json::Value>,
}

fn stats_of(rows: Vec<Row>, vhost: &str) -> HashMap<String, QueueStats> {
    rows.into_iter()
        .filter(|r| r.vhost.as_deref().is_none_or(|v| v == vhost))
        .map(|r| {
            let stats = QueueStats {
                unacknowledged: r.messages_unacknowledged.as_ref().and_then(serde_json::Value::as_u64),
                head_timestamp: r
                    .head_message_timestamp
                    .as_ref()
                    .and_then(serde_json::Value::as_i64)
                    .and_then(|s| DateTime::from_timestamp(s, 0)),
            };
            (r.name, stats)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_url_gives_its_credentials_host_and_prefix_and_shows_no_password() {
        let a = parse("http://ops:s%40cret@rabbit:15672/").unwrap();
        assert_eq!(a.credentials, Some(("ops".into(), "s@cret".into())));
        assert_eq!(a.host_port, "rabbit:15672");
        assert_eq!(a.prefix, "");
        assert_eq!(a.display, "http://ops:***@rabbit:15672");
        let a = parse("HTTP://[::1]:15672/rabbitmq//").unwrap();
        assert_eq!((a.credentials, a.prefix.as_str()), (None, "/rabbitmq"));
        assert_eq!(a.display, "http://[::1]:15672/rabbitmq");
    }

    #[test]
    fn a_bad_url_says_what_is_wrong_without_the_password() {
        for (url, says) in [
            ("https://u:hunter2@rabbit:15671", "HTTPS"),
            ("amqp://u:hunter2@rabbit:5672", "not http://"),
            ("rabbit:15672", "not a URL"),
            ("http://u:hunter2@rabbit:99999", "port"),
            ("http://u:hun/ter2@rabbit:15672", "percent-encoded"),
            ("http://u:12/34@rabbit:15672", "percent-encoded"),
            ("http://u:hun?ter2@rabbit:15672", "percent-encoded"),
            ("http://u:hunter2@:15672", "no host"),
            ("http://u@rabbit:15672", "without a password"),
            ("http://u:hunter2@rabbit:15672/?x=1", "query"),
            ("http://u:hunter2@[::1:15672", "closing ]"),
        ] {
            let e = parse(url).unwrap_err();
            assert!(e.contains(says), "{url}: {e}");
            assert!(!e.contains("ter2") && !e.contains("34"), "{url}: {e}");
        }
    }

    #[test]
    fn the_vhost_and_the_amqp_credentials_are_used() {
        let m = Management::new("http://rabbit:15672", "amqp://app:pw@rabbit:5672/%2f").unwrap();
        assert_eq!(
            m.targets[0].queues.to_string(),
            format!("http://rabbit:15672/api/queues/%2F?columns={COLUMNS}")
        );
        let expected = base64::engine::general_purpose::STANDARD.encode("app:pw");
        assert_eq!(
            m.targets[0].authorization.to_str().unwrap(),
            format!("Basic {expected}")
        );
        assert!(m.targets[0].authorization.is_sensitive());
        let m = Management::new("http://ops:x@rabbit:15672/mgmt", "amqp://app:pw@rabbit/prod%20eu").unwrap();
        assert!(
            m.targets[0]
                .queues
                .to_string()
                .starts_with("http://rabbit:15672/mgmt/api/queues/prod%20eu?")
        );
        let expected = base64::engine::general_purpose::STANDARD.encode("ops:x");
        assert_eq!(
            m.targets[0].authorization.to_str().unwrap(),
            format!("Basic {expected}")
        );
        assert_eq!(m.display, "http://ops:***@rabbit:15672/mgmt");
    }

    #[test]
    fn several_addresses_are_asked_in_order_with_the_first_amqp_nodes_vhost() {
        let m = Management::new(
            "http://rabbit-1:15672, http://ops:x@rabbit-2:15672",
            "amqp://app:pw@rabbit-1:5672/prod",
        )
        .unwrap();
        let queues: Vec<String> = m.targets.iter().map(|t| t.queues.to_string()).collect();
        assert_eq!(
            queues,
            [
                format!("http://rabbit-1:15672/api/queues/prod?columns={COLUMNS}"),
                format!("http://rabbit-2:15672/api/queues/prod?columns={COLUMNS}")
            ]
        );
        assert_eq!(m.display, "http://rabbit-1:15672, http://ops:***@rabbit-2:15672");
        let e = Management::new("http://rabbit-1:15672,,http://rabbit-2:15672", "amqp://app:pw@r/%2f")
            .err()
            .unwrap();
        assert!(e.contains("empty address"), "{e}");
    }

    #[tokio::test]
    async fn an_address_that_cannot_be_reached_passes_the_turn_to_the_next() {
        // A listener that answers as the API does, and a port where nothing listens.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let up = listener.local_addr().unwrap();
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let down = closed.local_addr().unwrap();
        drop(closed);
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buf = vec![0; 4096];
            let _ = socket.read(&mut buf).await.unwrap();
            let body = r#"[{"name":"orders","vhost":"/","messages_unacknowledged":2}]"#;
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            socket.write_all(answer.as_bytes()).await.unwrap();
        });
        let m = Management::new(&format!("http://{down},http://{up}"), "amqp://app:pw@r/%2f").unwrap();
        let stats = m.queues().await.unwrap();
        assert_eq!(stats["orders"].unacknowledged, Some(2));
    }

    #[test]
    fn rows_give_unacknowledged_counts_and_head_timestamps_where_present() {
        // As RabbitMQ 3.10.8 answers: a quorum queue has no head_message_timestamp; a
        // queue without statistics yet has only its name; another vhost's is left out.
        let rows: Vec<Row> = serde_json::from_str(
            r#"[
                {"name":"orders","vhost":"/","messages_unacknowledged":3},
                {"name":"legacy","vhost":"/","messages_unacknowledged":0,"head_message_timestamp":1700000000},
                {"name":"fresh","vhost":"/"},
                {"name":"orders","vhost":"other","messages_unacknowledged":9}
            ]"#,
        )
        .unwrap();
        let stats = stats_of(rows, "/");
        assert_eq!(stats.len(), 3);
        assert_eq!(stats["orders"].unacknowledged, Some(3));
        assert_eq!(stats["orders"].head_timestamp, None);
        assert_eq!(
            stats["legacy"].head_timestamp,
            DateTime::from_timestamp(1_700_000_000, 0)
        );
        assert_eq!(stats["fresh"], QueueStats::default());
    }
}
