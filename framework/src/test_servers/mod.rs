//! Real servers for your integration tests: a fresh Postgres database per test
//! ([`postgres_database`]) and, with the `amqp` feature, a fresh RabbitMQ virtual host per
//! test ([`rabbitmq_vhost`]), each dropped by the test when it is done.
//!
//! Where the servers come from, in this order:
//!
//! 1. `DATABASE_URL` / `AMQP_URL`, when set (your team's servers). A vhost is created with
//!    `rabbitmqctl`, so on `AMQP_URL` only for a broker on this machine.
//! 2. A Docker engine that answers `docker info`: one container per test process, on a
//!    host port Docker picks, labelled `courier.test.owner=<process id>`. The image is
//!    `COURIER_TEST_POSTGRES_IMAGE` / `COURIER_TEST_RABBITMQ_IMAGE` when set, else the one
//!    named with [`set_postgres_image`] / [`set_rabbitmq_image`], else the official
//!    `postgres:17-alpine` / `rabbitmq:3.13-management` (which need a registry).
//! 3. The servers on this machine's default ports: Postgres on 127.0.0.1:5432 as user
//!    `postgres`, RabbitMQ on 127.0.0.1:5672 as `guest` (with `rabbitmqctl` for vhosts).
//!
//! Which one a test binary uses is said once per process and server, when it is chosen:
//! a line on standard error (`courier::test_servers: Postgres: ...`), which the test
//! harness shows with the output of a failing test (or with `--nocapture`), and the same
//! as an `INFO` event of target `courier::test_servers` for a test that logs. Passwords
//! are never shown.
//!
//! A vhost also names the broker's management HTTP API ([`TestVhost::management_url`]):
//! `RABBITMQ_MANAGEMENT_URL` beside `AMQP_URL`, else port 15672 of the broker's host
//! (the container's, published on a host port of its own), with the AMQP user and
//! password. It answers only where the management plugin is on: in the official
//! `-management` images, and on a broker where `rabbitmq-plugins enable
//! rabbitmq_management` was run.
//!
//! # Cleanup
//!
//! A test drops what it made ([`TestDatabase::drop_database`], [`TestVhost::delete`]);
//! what a failed or killed test left is dropped by a later one. Names carry the host and
//! the id of the process that made them (`courier_test_<host>_<pid>_<random>`, vhosts with
//! `-`), and each new database or vhost drops first, on the same server, those of this
//! host whose process has ended. A container is removed when its test process ends,
//! however it ends (a watcher started with it: [`remove_when_process_ends`]), and any
//! labelled container of an ended process when the next one is started.
//!
//! The `docker` and `rabbitmqctl` commands are run as child processes; nothing here
//! talks to Docker's API directly.
//!
//! # Examples
//!
//! A test of an endpoint with its store on Postgres, in a database of its own (with the
//! `amqp` feature, [`rabbitmq_vhost`] likewise gives it a virtual host to open an
//! `AmqpTransport` on: `AmqpTransport::builder(vhost.url())`). The guide
//! `docs/testing.md` ("On real servers") has a saga tested on both.
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use courier::prelude::*;
//! use courier::test_servers::postgres_database;
//! use courier::{PostgresStore, Store};
//! # #[derive(serde::Serialize, serde::Deserialize, courier::Message)]
//! # struct Charge;
//! # #[courier::handler]
//! # async fn charge(_m: Charge, _ctx: &mut Context) -> Result<(), HandlerError> { Ok(()) }
//!
//! #[tokio::test]
//! async fn charges_once() -> Result<(), Box<dyn std::error::Error>> {
//!     let db = postgres_database().await?;          // DATABASE_URL, a container, or localhost
//!     let store = Arc::new(PostgresStore::connect(&db.url()).await?);
//!     store.migrate().await?;
//!     let broker = Embedded::in_memory().await?;
//!     let billing = Endpoint::builder("billing").transport(broker).store(store.clone())
//!         .handler(charge).start().await?;
//!     // ... send, then assert on what the handler wrote through store.pool() ...
//!     billing.shutdown().await?;
//!     store.pool().close().await;
//!     db.drop_database().await?;                    // a failed test leaves it to a later one
//!     Ok(())
//! }
//! # fn main() {}
//! ```

use std::str::FromStr;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{ConnectOptions, Connection};
use tokio::sync::OnceCell;

mod docker;
mod owner;

#[cfg(feature = "amqp")]
use docker::run;
use docker::{docker_answers, start_container};
pub use owner::remove_when_process_ends;
use owner::{DATABASE_PREFIX, ended_here, unique_name};

/// Why a test server could not be provided.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// No server to use: no URL, no Docker engine, none on the default port.
    #[error("no {what} for the tests: {hint}")]
    NoServer {
        /// Postgres or RabbitMQ.
        what: &'static str,
        /// What to set up.
        hint: &'static str,
    },
    /// A command (`docker`, `rabbitmqctl`) failed or could not run.
    #[error("`{command}` failed: {output}")]
    Command {
        /// The command line.
        command: String,
        /// What it said.
        output: String,
    },
    /// The server did not accept connections in time after its container started.
    #[error("{what} in container {container} did not accept connections within {seconds} s")]
    NotReady {
        /// Postgres or RabbitMQ.
        what: &'static str,
        /// The container's id.
        container: String,
        /// How long it was given.
        seconds: u64,
    },
    /// The URL given is not usable.
    #[error("{variable} is not a usable URL: {reason}")]
    BadUrl {
        /// The environment variable.
        variable: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A statement on the Postgres server failed.
    #[error("Postgres: {0}")]
    Postgres(#[from] sqlx::Error),
}

impl ServerError {
    /// Whether trying again may help (a server still starting, a command that failed for
    /// a reason outside the tests); `false` when something must be set up or fixed first.
    pub fn is_transient(&self) -> bool {
        match self {
            ServerError::NoServer { .. } | ServerError::BadUrl { .. } => false,
            ServerError::Command { .. } | ServerError::NotReady { .. } => true,
            ServerError::Postgres(e) => matches!(
                e,
                sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed
            ),
        }
    }
}

/// The label on every container started here: the id of the process that started it.
pub const OWNER_LABEL: &str = "courier.test.owner";

const READY_WITHIN: Duration = Duration::from_secs(120);

/// The images named in code.
static POSTGRES_IMAGE: Mutex<Option<String>> = Mutex::new(None);
#[cfg(feature = "amqp")]
static RABBITMQ_IMAGE: Mutex<Option<String>> = Mutex::new(None);

/// Names the Postgres image the test containers start from (`name:tag`), in place of
/// `postgres:17-alpine`: e.g. one built on a machine without a registry. The image must
/// honour `POSTGRES_USER` / `POSTGRES_PASSWORD` and listen on 5432, as the official one
/// does. `COURIER_TEST_POSTGRES_IMAGE`, when set, wins. Call it before the first
/// [`postgres_database`] of the process: its container is started once.
pub fn set_postgres_image(reference: &str) {
    *POSTGRES_IMAGE.lock().unwrap_or_else(PoisonError::into_inner) = Some(reference.to_owned());
}

/// Names the RabbitMQ image the test containers start from (`name:tag`), in place of
/// `rabbitmq:3.13-management`. The image must let `guest` in from outside on 5672 and
/// have `rabbitmqctl`; [`TestVhost::management_url`] answers if it has the management
/// plugin on, on 15672. `COURIER_TEST_RABBITMQ_IMAGE`, when set, wins. Call it before the first
/// [`rabbitmq_vhost`] of the process.
#[cfg(feature = "amqp")]
pub fn set_rabbitmq_image(reference: &str) {
    *RABBITMQ_IMAGE.lock().unwrap_or_else(PoisonError::into_inner) = Some(reference.to_owned());
}

/// The image to start: `variable`'s, else the one set in code (`set`), else `default`.
fn image(variable: &str, set: &Mutex<Option<String>>, default: &str) -> String {
    std::env::var(variable).ok().unwrap_or_else(|| {
        set.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .unwrap_or_else(|| default.to_owned())
    })
}

/// A database created for one test on the test Postgres server. Drop it with
/// [`TestDatabase::drop_database`]; one a failed test left is dropped by a later test
/// (see [Cleanup](crate::test_servers#cleanup)).
#[derive(Debug, Clone)]
pub struct TestDatabase {
    name: String,
    options: PgConnectOptions,
    admin: PgConnectOptions,
}

impl TestDatabase {
    /// Its name: `courier_test_`, 8 hex digits naming this host, the id of the process
    /// that made it and 16 random hex digits, joined by `_`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A URL that connects to it (e.g. for `PostgresStore::connect`).
    pub fn url(&self) -> String {
        self.options.to_url_lossy().to_string()
    }

    /// Options that connect to it.
    pub fn options(&self) -> PgConnectOptions {
        self.options.clone()
    }

    /// A pool of at most `max` connections to it.
    ///
    /// # Errors
    /// When the server refuses the connection.
    pub async fn pool(&self, max: u32) -> Result<PgPool, ServerError> {
        Ok(PgPoolOptions::new()
            .max_connections(max)
            .connect_with(self.options.clone())
            .await?)
    }

    /// Drops the database, closing the connections still open to it.
    ///
    /// # Errors
    /// When the server cannot be reached or refuses.
    pub async fn drop_database(self) -> Result<(), ServerError> {
        let mut conn = self.admin.connect().await?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
            self.name
        )))
        .execute(&mut conn)
        .await?;
        conn.close().await?;
        Ok(())
    }
}

static POSTGRES: OnceCell<PgConnectOptions> = OnceCell::const_new();

/// Creates a fresh database for one test on the test Postgres server (see the module
/// docs for where it runs).
///
/// # Errors
/// [`ServerError::NoServer`] when there is no server; the server's or Docker's error
/// otherwise.
pub async fn postgres_database() -> Result<TestDatabase, ServerError> {
    let admin = POSTGRES
        .get_or_try_init(|| async {
            let (options, source) = postgres_server().await?;
            announce("Postgres", &source);
            Ok::<_, ServerError>(options)
        })
        .await?;
    postgres_database_on(admin).await
}

/// Creates a fresh database on the Postgres server `admin` connects to, as a user who may
/// create databases: a server your tests started themselves (e.g. with testcontainers).
/// Named and cleaned up as [`postgres_database`]'s are: the databases of this host's ended
/// test processes on that server are dropped first (best effort).
///
/// # Errors
/// When the server cannot be reached or refuses to create the database.
pub async fn postgres_database_on(admin: &PgConnectOptions) -> Result<TestDatabase, ServerError> {
    let name = unique_name(DATABASE_PREFIX, '_');
    let mut conn = admin.connect().await?;
    drop_ended_databases(&mut conn).await;
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
        .execute(&mut conn)
        .await?;
    conn.close().await?;
    Ok(TestDatabase {
        options: admin.clone().database(&name),
        name,
        admin: admin.clone(),
    })
}

/// Drops the test databases of this host whose process has ended (best effort: a
/// database another user owns stays).
async fn drop_ended_databases(conn: &mut sqlx::PgConnection) {
    let Ok(names) =
        sqlx::query_scalar::<_, String>("SELECT datname FROM pg_database WHERE starts_with(datname::text, $1)")
            .bind(DATABASE_PREFIX)
            .fetch_all(&mut *conn)
            .await
    else {
        return;
    };
    for name in names.iter().filter(|n| ended_here(n, DATABASE_PREFIX, '_')) {
        let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
        )))
        .execute(&mut *conn)
        .await;
    }
}

/// Says once which server a test binary uses (see the module docs): on standard error,
/// where the test harness shows it with a test's output, and as an `INFO` event.
fn announce(what: &str, source: &str) {
    tracing::info!(target: "courier::test_servers", server = what, source, "test server chosen");
    eprintln!("courier::test_servers: {what}: {source}");
}

/// `user@host:port/database` of `options`: no password.
fn pg_address(options: &PgConnectOptions) -> String {
    format!(
        "{}@{}:{}/{}",
        options.get_username(),
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or("postgres")
    )
}

/// The server, and in words where it comes from.
async fn postgres_server() -> Result<(PgConnectOptions, String), ServerError> {
    if let Ok(url) = std::env::var("DATABASE_URL") {
        let options = PgConnectOptions::from_str(&url).map_err(|e| ServerError::BadUrl {
            variable: "DATABASE_URL",
            reason: e.to_string(),
        })?;
        let source = format!(
            "DATABASE_URL ({}); a database per test is made there",
            pg_address(&options)
        );
        return Ok((options, source));
    }
    if docker_answers().await {
        let image = image("COURIER_TEST_POSTGRES_IMAGE", &POSTGRES_IMAGE, "postgres:17-alpine");
        let (id, ports) = start_container(
            &image,
            &["5432"],
            &["-e", "POSTGRES_PASSWORD=postgres", "-e", "POSTGRES_USER=postgres"],
        )
        .await?;
        let port = ports.first().copied().unwrap_or(5432);
        let options = PgConnectOptions::new()
            .host("127.0.0.1")
            .port(port)
            .username("postgres")
            .password("postgres")
            .database("postgres");
        // The official image restarts its server once after initialisation: a query that
        // succeeds twice, a moment apart, is on the final server.
        let deadline = tokio::time::Instant::now() + READY_WITHIN;
        let mut successes = 0;
        while successes < 2 {
            successes = match options.connect().await {
                Ok(conn) => {
                    let _ = conn.close().await;
                    successes + 1
                }
                Err(_) => 0,
            };
            if tokio::time::Instant::now() > deadline {
                return Err(ServerError::NotReady {
                    what: "Postgres",
                    container: id,
                    seconds: READY_WITHIN.as_secs(),
                });
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let source = format!(
            "container {} from image {image} ({}), removed when this process ends",
            short(&id),
            pg_address(&options)
        );
        return Ok((options, source));
    }
    let local = PgConnectOptions::new()
        .host("127.0.0.1")
        .port(5432)
        .username("postgres")
        .database("postgres");
    match local.connect().await {
        Ok(conn) => {
            let _ = conn.close().await;
            let source = format!(
                "the server on this machine's default port ({}): no DATABASE_URL, no Docker engine",
                pg_address(&local)
            );
            Ok((local, source))
        }
        Err(_) => Err(ServerError::NoServer {
            what: "Postgres",
            hint: "set DATABASE_URL, or start a Docker engine, or a server on 127.0.0.1:5432 (user postgres)",
        }),
    }
}

/// The first 12 characters of a container id, as `docker ps` shows it.
fn short(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

/// A virtual host created for one test on the test RabbitMQ. Delete it with
/// [`TestVhost::delete`]; one a failed test left is deleted by a later test (see
/// [Cleanup](crate::test_servers#cleanup)).
#[cfg(feature = "amqp")]
#[derive(Debug, Clone)]
pub struct TestVhost {
    name: String,
    url: String,
    broker: Broker,
}

#[cfg(feature = "amqp")]
impl TestVhost {
    /// Its name: `courier-test-`, 8 hex digits naming this host, the id of the process
    /// that made it and 16 random hex digits, joined by `-`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The AMQP URL of the virtual host (for `AmqpTransport::builder`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The URL of the broker's management HTTP API, with the broker user's credentials
    /// (`http://guest:guest@127.0.0.1:15672`), e.g. for `AmqpAdmin::with_management`
    /// (which takes the vhost from the AMQP URL). See the [module docs](crate::test_servers)
    /// for where it comes from; it answers only where the management plugin is on.
    pub fn management_url(&self) -> &str {
        &self.broker.management
    }

    /// Deletes the virtual host with its queues and exchanges.
    ///
    /// # Errors
    /// When `rabbitmqctl delete_vhost` fails.
    pub async fn delete(self) -> Result<(), ServerError> {
        self.broker.rabbitmqctl(&["delete_vhost", &self.name]).await.map(drop)
    }
}

/// Where `rabbitmqctl` runs: on this machine or in the container.
#[cfg(feature = "amqp")]
#[derive(Debug, Clone)]
struct Broker {
    /// `amqp://user:password@host:port` (no vhost).
    base: String,
    user: String,
    /// The management API: `http://user:password@host:port`.
    management: String,
    container: Option<String>,
}

#[cfg(feature = "amqp")]
impl Broker {
    /// Runs `rabbitmqctl` with `args`; its output.
    async fn rabbitmqctl(&self, args: &[&str]) -> Result<String, ServerError> {
        let mut command: Vec<String> = match &self.container {
            Some(id) => vec!["docker".into(), "exec".into(), id.clone(), "rabbitmqctl".into()],
            None => vec!["rabbitmqctl".into()],
        };
        command.extend(args.iter().map(|a| (*a).to_owned()));
        run(command).await
    }

    /// Deletes the test vhosts of this host whose process has ended (best effort).
    async fn delete_ended_vhosts(&self) {
        let Ok(listing) = self.rabbitmqctl(&["list_vhosts", "--silent", "name"]).await else {
            return;
        };
        for name in listing.lines().map(str::trim) {
            if owner::ended_here(name, owner::VHOST_PREFIX, '-') {
                let _ = self.rabbitmqctl(&["delete_vhost", name]).await;
            }
        }
    }
}

#[cfg(feature = "amqp")]
static RABBITMQ: OnceCell<Broker> = OnceCell::const_new();

/// Creates a fresh virtual host for one test on the test RabbitMQ (see the module docs
/// for where it runs), with every permission for the broker's user.
///
/// # Errors
/// [`ServerError::NoServer`] when there is no broker, or `AMQP_URL` names a broker on
/// another machine; the broker's or Docker's error otherwise.
#[cfg(feature = "amqp")]
pub async fn rabbitmq_vhost() -> Result<TestVhost, ServerError> {
    let broker = RABBITMQ
        .get_or_try_init(|| async {
            let (broker, source) = rabbitmq_server().await?;
            announce("RabbitMQ", &source);
            Ok::<_, ServerError>(broker)
        })
        .await?
        .clone();
    let name = unique_name(owner::VHOST_PREFIX, '-');
    broker.delete_ended_vhosts().await;
    broker.rabbitmqctl(&["add_vhost", &name]).await?;
    broker
        .rabbitmqctl(&["set_permissions", "-p", &name, &broker.user, ".*", ".*", ".*"])
        .await?;
    Ok(TestVhost {
        url: format!("{}/{name}", broker.base),
        name,
        broker,
    })
}

/// The broker, and in words where it comes from.
#[cfg(feature = "amqp")]
async fn rabbitmq_server() -> Result<(Broker, String), ServerError> {
    if let Ok(url) = std::env::var("AMQP_URL") {
        let bad = |reason: &str| ServerError::BadUrl {
            variable: "AMQP_URL",
            reason: reason.to_owned(),
        };
        let rest = url
            .strip_prefix("amqp://")
            .or_else(|| url.strip_prefix("amqps://"))
            .ok_or_else(|| bad("not amqp:// or amqps://"))?;
        let authority = rest.split('/').next().unwrap_or(rest);
        let (user, host) = match authority.rsplit_once('@') {
            Some((credentials, host)) => (credentials.split(':').next().unwrap_or("guest"), host),
            None => ("guest", authority),
        };
        let hostname = host.rsplit_once(':').map_or(host, |(h, _)| h);
        let management = std::env::var("RABBITMQ_MANAGEMENT_URL").unwrap_or_else(|_| {
            let credentials = authority.rsplit_once('@').map_or("guest:guest", |(c, _)| c);
            format!("http://{credentials}@{hostname}:15672")
        });
        if !matches!(hostname, "127.0.0.1" | "localhost" | "[::1]") {
            return Err(ServerError::NoServer {
                what: "RabbitMQ vhost",
                hint: "AMQP_URL names a broker on another machine; test vhosts are made with rabbitmqctl on \
                       this one: unset AMQP_URL to use a container, or run the tests on the broker's host",
            });
        }
        let scheme_len = url.len() - rest.len();
        let source = format!(
            "AMQP_URL ({}{user}@{host}); a vhost per test is made there with rabbitmqctl",
            &url[..scheme_len]
        );
        let broker = Broker {
            base: format!("{}{authority}", &url[..scheme_len]),
            user: user.to_owned(),
            management,
            container: None,
        };
        return Ok((broker, source));
    }
    if docker_answers().await {
        let image = image(
            "COURIER_TEST_RABBITMQ_IMAGE",
            &RABBITMQ_IMAGE,
            "rabbitmq:3.13-management",
        );
        let (id, ports) = start_container(&image, &["5672", "15672"], &[]).await?;
        let (port, management) = match ports[..] {
            [port, management] => (port, management),
            _ => (5672, 15672),
        };
        // Ready when rabbitmqctl answers for a booted node.
        let deadline = tokio::time::Instant::now() + READY_WITHIN;
        let broker = Broker {
            base: format!("amqp://guest:guest@127.0.0.1:{port}"),
            user: "guest".into(),
            management: format!("http://guest:guest@127.0.0.1:{management}"),
            container: Some(id.clone()),
        };
        while broker.rabbitmqctl(&["await_startup", "--timeout", "5"]).await.is_err() {
            if tokio::time::Instant::now() > deadline {
                return Err(ServerError::NotReady {
                    what: "RabbitMQ",
                    container: id,
                    seconds: READY_WITHIN.as_secs(),
                });
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let source = format!(
            "container {} from image {image} (amqp://guest@127.0.0.1:{port}), removed when this process ends",
            short(&id)
        );
        return Ok((broker, source));
    }
    if tokio::net::TcpStream::connect("127.0.0.1:5672").await.is_ok() {
        let broker = Broker {
            base: "amqp://guest:guest@127.0.0.1:5672".into(),
            user: "guest".into(),
            management: "http://guest:guest@127.0.0.1:15672".into(),
            container: None,
        };
        let source = "the broker on this machine's default port (amqp://guest@127.0.0.1:5672): no AMQP_URL, no \
                      Docker engine"
            .to_owned();
        return Ok((broker, source));
    }
    Err(ServerError::NoServer {
        what: "RabbitMQ",
        hint: "set AMQP_URL, or start a Docker engine, or a broker on 127.0.0.1:5672 (with rabbitmqctl)",
    })
}
