//! Real servers for your integration tests: a fresh Postgres database per test
//! ([`postgres_database`]) and, with the `amqp` feature, a fresh RabbitMQ virtual host per
//! test ([`rabbitmq_vhost`]), each dropped by the test when it is done.
//!
//! Where the servers come from, in this order:
//!
//! 1. `DATABASE_URL` / `AMQP_URL`, when set (your team's servers). A vhost is created with
//!    `rabbitmqctl`, so on `AMQP_URL` only for a broker on this machine.
//! 2. A Docker engine that answers `docker info`: one container per test process, from
//!    `COURIER_TEST_POSTGRES_IMAGE` (default `postgres:17-alpine`) or
//!    `COURIER_TEST_RABBITMQ_IMAGE` (default `rabbitmq:3.13`), on a host port Docker picks,
//!    labelled `courier.test.owner=<process id>`; the containers of processes that have
//!    ended are removed when the next test process starts one.
//! 3. The servers on this machine's default ports: Postgres on 127.0.0.1:5432 as user
//!    `postgres`, RabbitMQ on 127.0.0.1:5672 as `guest` (with `rabbitmqctl` for vhosts).
//!
//! The `docker` and `rabbitmqctl` commands are run as child processes; nothing here
//! talks to Docker's API directly.

use std::process::Command;
use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{ConnectOptions, Connection};
use tokio::sync::OnceCell;

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

/// A database created for one test on the test Postgres server. Drop it with
/// [`TestDatabase::drop_database`] (a test that fails leaves it behind: its name is
/// unique, so later runs are not disturbed).
#[derive(Debug, Clone)]
pub struct TestDatabase {
    name: String,
    options: PgConnectOptions,
    admin: PgConnectOptions,
}

impl TestDatabase {
    /// Its name (`test_` and 32 hex digits).
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
    let admin = POSTGRES.get_or_try_init(postgres_server).await?.clone();
    let name = format!("test_{}", uuid::Uuid::new_v4().simple());
    let mut conn = admin.connect().await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
        .execute(&mut conn)
        .await?;
    conn.close().await?;
    Ok(TestDatabase {
        options: admin.clone().database(&name),
        name,
        admin,
    })
}

async fn postgres_server() -> Result<PgConnectOptions, ServerError> {
    if let Ok(url) = std::env::var("DATABASE_URL") {
        return PgConnectOptions::from_str(&url).map_err(|e| ServerError::BadUrl {
            variable: "DATABASE_URL",
            reason: e.to_string(),
        });
    }
    if docker_answers().await {
        let image = std::env::var("COURIER_TEST_POSTGRES_IMAGE").unwrap_or_else(|_| "postgres:17-alpine".into());
        let (id, port) = start_container(
            &image,
            "5432",
            &["-e", "POSTGRES_PASSWORD=postgres", "-e", "POSTGRES_USER=postgres"],
        )
        .await?;
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
        return Ok(options);
    }
    let local = PgConnectOptions::new()
        .host("127.0.0.1")
        .port(5432)
        .username("postgres")
        .database("postgres");
    match local.connect().await {
        Ok(conn) => {
            let _ = conn.close().await;
            Ok(local)
        }
        Err(_) => Err(ServerError::NoServer {
            what: "Postgres",
            hint: "set DATABASE_URL, or start a Docker engine, or a server on 127.0.0.1:5432 (user postgres)",
        }),
    }
}

/// A virtual host created for one test on the test RabbitMQ. Delete it with
/// [`TestVhost::delete`].
#[cfg(feature = "amqp")]
#[derive(Debug, Clone)]
pub struct TestVhost {
    name: String,
    url: String,
    broker: Broker,
}

#[cfg(feature = "amqp")]
impl TestVhost {
    /// Its name (`test-` and 32 hex digits).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The AMQP URL of the virtual host (for `AmqpTransport::builder`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Deletes the virtual host with its queues and exchanges.
    ///
    /// # Errors
    /// When `rabbitmqctl delete_vhost` fails.
    pub async fn delete(self) -> Result<(), ServerError> {
        self.broker.rabbitmqctl(&["delete_vhost", &self.name]).await
    }
}

/// Where `rabbitmqctl` runs: on this machine or in the container.
#[cfg(feature = "amqp")]
#[derive(Debug, Clone)]
struct Broker {
    /// `amqp://user:password@host:port` (no vhost).
    base: String,
    user: String,
    container: Option<String>,
}

#[cfg(feature = "amqp")]
impl Broker {
    async fn rabbitmqctl(&self, args: &[&str]) -> Result<(), ServerError> {
        let mut command: Vec<String> = match &self.container {
            Some(id) => vec!["docker".into(), "exec".into(), id.clone(), "rabbitmqctl".into()],
            None => vec!["rabbitmqctl".into()],
        };
        command.extend(args.iter().map(|a| (*a).to_owned()));
        run(command).await.map(drop)
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
    let broker = RABBITMQ.get_or_try_init(rabbitmq_server).await?.clone();
    let name = format!("test-{}", uuid::Uuid::new_v4().simple());
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

#[cfg(feature = "amqp")]
async fn rabbitmq_server() -> Result<Broker, ServerError> {
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
        if !matches!(hostname, "127.0.0.1" | "localhost" | "[::1]") {
            return Err(ServerError::NoServer {
                what: "RabbitMQ vhost",
                hint: "AMQP_URL names a broker on another machine; test vhosts are made with rabbitmqctl on \
                       this one: unset AMQP_URL to use a container, or run the tests on the broker's host",
            });
        }
        let scheme_len = url.len() - rest.len();
        return Ok(Broker {
            base: format!("{}{authority}", &url[..scheme_len]),
            user: user.to_owned(),
            container: None,
        });
    }
    if docker_answers().await {
        let image = std::env::var("COURIER_TEST_RABBITMQ_IMAGE").unwrap_or_else(|_| "rabbitmq:3.13".into());
        let (id, port) = start_container(&image, "5672", &[]).await?;
        // Ready when rabbitmqctl answers for a booted node.
        let deadline = tokio::time::Instant::now() + READY_WITHIN;
        let broker = Broker {
            base: format!("amqp://guest:guest@127.0.0.1:{port}"),
            user: "guest".into(),
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
        return Ok(broker);
    }
    if tokio::net::TcpStream::connect("127.0.0.1:5672").await.is_ok() {
        return Ok(Broker {
            base: "amqp://guest:guest@127.0.0.1:5672".into(),
            user: "guest".into(),
            container: None,
        });
    }
    Err(ServerError::NoServer {
        what: "RabbitMQ",
        hint: "set AMQP_URL, or start a Docker engine, or a broker on 127.0.0.1:5672 (with rabbitmqctl)",
    })
}

/// Whether `docker info` succeeds.
async fn docker_answers() -> bool {
    run(vec!["docker".into(), "info".into()]).await.is_ok()
}

/// Starts a container of `image` with `port` published on a host port Docker picks;
/// returns its id and that port. Removes first the test containers of ended processes.
async fn start_container(image: &str, port: &str, extra: &[&str]) -> Result<(String, u16), ServerError> {
    remove_orphans().await;
    let mut command: Vec<String> = ["docker", "run", "-d", "-p"].iter().map(|s| (*s).to_owned()).collect();
    command.push(format!("127.0.0.1::{port}"));
    command.push("--label".into());
    command.push(format!("{OWNER_LABEL}={}", std::process::id()));
    command.extend(extra.iter().map(|s| (*s).to_owned()));
    command.push(image.to_owned());
    let id = run(command).await?.trim().to_owned();
    let mapped = run(vec!["docker".into(), "port".into(), id.clone(), format!("{port}/tcp")]).await?;
    let host_port = mapped
        .lines()
        .find_map(|line| line.rsplit_once(':').and_then(|(_, p)| p.trim().parse::<u16>().ok()))
        .ok_or_else(|| ServerError::Command {
            command: format!("docker port {id} {port}/tcp"),
            output: mapped.clone(),
        })?;
    Ok((id, host_port))
}

/// Removes the labelled containers whose process has ended (best effort).
async fn remove_orphans() {
    // Whether a process runs is read from /proc: without it, nothing is removed.
    if !std::path::Path::new("/proc/self").exists() {
        return;
    }
    let format = format!("{{{{.ID}}}} {{{{.Label \"{OWNER_LABEL}\"}}}}");
    let Ok(listing) = run(vec![
        "docker".into(),
        "ps".into(),
        "-a".into(),
        "--filter".into(),
        format!("label={OWNER_LABEL}"),
        "--format".into(),
        format,
    ])
    .await
    else {
        return;
    };
    for line in listing.lines() {
        let Some((id, pid)) = line.split_once(' ') else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = run(vec![
                "docker".into(),
                "rm".into(),
                "-f".into(),
                "-v".into(),
                id.to_owned(),
            ])
            .await;
        }
    }
}

/// Runs a command to its end; its stdout when it succeeds.
async fn run(command: Vec<String>) -> Result<String, ServerError> {
    let line = command.join(" ");
    let result = tokio::task::spawn_blocking(move || {
        let (program, args) = command.split_first().map_or(("", &[][..]), |(p, a)| (p.as_str(), a));
        Command::new(program).args(args).output()
    })
    .await;
    match result {
        Ok(Ok(out)) if out.status.success() => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
        Ok(Ok(out)) => Err(ServerError::Command {
            command: line,
            output: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        }),
        Ok(Err(e)) => Err(ServerError::Command {
            command: line,
            output: e.to_string(),
        }),
        Err(e) => Err(ServerError::Command {
            command: line,
            output: e.to_string(),
        }),
    }
}
