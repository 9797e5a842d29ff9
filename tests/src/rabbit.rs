//! A RabbitMQ for the tests: the server `AMQP_URL` names, or else one started once per
//! test process with testcontainers when a Docker engine answers. Tests share it and
//! stay apart by their own queue and exchange names. Its management HTTP API is at
//! [`management_url`].

use std::sync::Arc;

use courier::conformance::Fixture;
use courier::test_servers::TestVhost;
use courier::{
    AmqpTransport, Clock, Context, Endpoint, EndpointBuilder, HandlerError, PostgresStore, Routes, ScheduleStore,
    SqliteStore, Store, VirtualClock,
};
use serde::{Deserialize, Serialize};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use testcontainers_modules::testcontainers::core::{IntoContainerPort, WaitFor};
use testcontainers_modules::testcontainers::runners::AsyncRunner;
use testcontainers_modules::testcontainers::{ContainerAsync, GenericImage, ImageExt};
use tokio::sync::OnceCell;

use crate::containers::{self, Server};

/// The test broker: its AMQP URL, its management API's URL, and the container.
struct Shared {
    amqp: String,
    management: String,
    _container: Option<ContainerAsync<GenericImage>>,
}

static BROKER: OnceCell<Shared> = OnceCell::const_new();

/// The AMQP URL of the test broker: `AMQP_URL`, else a RabbitMQ container shared by the
/// test process (see [`crate::containers`]) when a Docker engine answers.
///
/// # Panics
/// When neither is available, saying in one line what to do.
pub async fn amqp_url() -> String {
    shared().await.amqp.clone()
}

/// The URL of the test broker's management HTTP API, with its credentials
/// (`http://guest:guest@host:port`): the container's, whose image has the plugin on;
/// with `AMQP_URL`, `RABBITMQ_MANAGEMENT_URL`, else port 15672 of `AMQP_URL`'s host with
/// its user and password (the plugin must be on there: `rabbitmq-plugins enable
/// rabbitmq_management`).
///
/// # Panics
/// As [`amqp_url`].
pub async fn management_url() -> String {
    shared().await.management.clone()
}

#[allow(clippy::panic)]
async fn shared() -> &'static Shared {
    BROKER
        .get_or_init(|| async {
            if let Ok(amqp) = std::env::var("AMQP_URL") {
                let management = std::env::var("RABBITMQ_MANAGEMENT_URL").unwrap_or_else(|_| management_beside(&amqp));
                Shared {
                    amqp,
                    management,
                    _container: None,
                }
            } else if containers::engine_answers() {
                let (amqp, management, container) = start_container().await;
                Shared {
                    amqp,
                    management,
                    _container: Some(container),
                }
            } else {
                panic!(
                    "{}",
                    containers::nothing_there("RabbitMQ", "AMQP_URL", "amqp://user:password@host:5672/%2f")
                );
            }
        })
        .await
}

/// `amqp://user:password@host:5672/vhost` -> `http://user:password@host:15672`.
fn management_beside(amqp: &str) -> String {
    let rest = amqp.split_once("://").map_or(amqp, |(_, r)| r);
    let authority = rest.split(['/', '?']).next().unwrap_or(rest);
    let (userinfo, host_port) = match authority.rsplit_once('@') {
        Some((u, h)) => (format!("{u}@"), h),
        None => (String::new(), authority),
    };
    let host = match host_port.rsplit_once(':') {
        Some((h, p)) if !p.contains(']') => h,
        _ => host_port,
    };
    format!("http://{userinfo}{host}:15672")
}

/// A RabbitMQ container of the caller's own (the chaos harness restarts it), whatever
/// `AMQP_URL` says: its URL and the container, which stops when dropped.
///
/// # Panics
/// When the container cannot start.
pub async fn own_broker() -> (String, ContainerAsync<GenericImage>) {
    let (amqp, _management, container) = start_container().await;
    (amqp, container)
}

/// Starts a RabbitMQ container with its AMQP port and its management port on fixed host
/// ports (a restart keeps them), returning their URLs.
#[allow(clippy::panic)]
async fn start_container() -> (String, String, ContainerAsync<GenericImage>) {
    containers::remove_orphans();
    let (name, tag) = containers::image(Server::RabbitMq).unwrap_or_else(|e| panic!("{e}"));
    let port = containers::free_port().unwrap_or_else(|e| panic!("no free port: {e}"));
    let management = loop {
        let p = containers::free_port().unwrap_or_else(|e| panic!("no free port: {e}"));
        if p != port {
            break p;
        }
    };
    let container = GenericImage::new(name, tag)
        .with_exposed_port(5672.tcp())
        .with_exposed_port(15672.tcp())
        // Logged once the node has booted, its plugins started and its listeners accept
        // connections (the official image says the same, with the number of plugins
        // after it).
        .with_wait_for(WaitFor::message_on_stdout("Server startup complete"))
        .with_mapped_port(port, 5672.tcp())
        .with_mapped_port(management, 15672.tcp())
        .with_label(containers::OWNER_LABEL, containers::owner())
        .with_container_name(containers::watched_name())
        .with_startup_timeout(std::time::Duration::from_secs(120))
        .start()
        .await
        .unwrap_or_else(|e| panic!("start the RabbitMQ container: {e}"));
    let host = container
        .get_host()
        .await
        .unwrap_or_else(|e| panic!("the RabbitMQ container's host: {e}"));
    (
        format!("amqp://guest:guest@{host}:{port}/%2f"),
        format!("http://guest:guest@{host}:{management}"),
        container,
    )
}

/// A SQLite store in memory (one connection that never closes), migrated.
#[allow(clippy::expect_used)]
pub async fn memory_store() -> SqliteStore {
    let options: SqliteConnectOptions = "sqlite::memory:".parse().expect("an in-memory SQLite URL");
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .idle_timeout(None)
        .max_lifetime(None)
        .connect_with(options)
        .await
        .expect("open SQLite in memory");
    let store = SqliteStore::from_pool(pool);
    store.migrate().await.expect("migrate");
    store
}

/// A RabbitMQ transport on a virtual clock, holding scheduled messages in `schedules`.
#[allow(clippy::expect_used)]
pub async fn transport(clock: &VirtualClock, schedules: ScheduleStore) -> AmqpTransport {
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    AmqpTransport::builder(amqp_url().await)
        .clock(shared)
        .schedules(schedules)
        .open()
        .await
        .expect("connect to RabbitMQ")
}

/// The conformance fixture: scheduled messages in SQLite, locks lost by dropping the
/// connection.
pub async fn amqp_fixture() -> Fixture {
    let clock = VirtualClock::starting_now();
    let store = memory_store().await;
    let transport = Arc::new(transport(&clock, ScheduleStore::from(&store)).await);
    let mut fx = Fixture::new(transport.clone(), clock);
    fx.lose_locks = Some(Arc::new(move || {
        let t = transport.clone();
        Box::pin(async move { t.sever_connection().await })
    }));
    fx
}

/// A RabbitMQ of a test's own, which it may restart without touching a broker other
/// tests use: a container of its own when a Docker engine answers (whatever `AMQP_URL`
/// says), else a virtual host of its own on the broker `AMQP_URL` names (made with
/// `courier::test_servers::rabbitmq_vhost`, so that broker must be on this machine, with
/// `rabbitmqctl`).
pub struct RestartableBroker {
    url: String,
    own: Own,
}

enum Own {
    Container(Box<ContainerAsync<GenericImage>>),
    Vhost(TestVhost),
}

impl RestartableBroker {
    /// Starts the container or makes the vhost.
    ///
    /// # Panics
    /// Without an engine and without `AMQP_URL`, or when the vhost cannot be made, saying
    /// why.
    #[allow(clippy::panic)]
    pub async fn start() -> Self {
        if containers::engine_answers() {
            let (url, _management, container) = start_container().await;
            return RestartableBroker {
                url,
                own: Own::Container(Box::new(container)),
            };
        }
        if std::env::var_os("AMQP_URL").is_none() {
            panic!(
                "{}",
                containers::nothing_there("RabbitMQ", "AMQP_URL", "amqp://user:password@host:5672/%2f")
            );
        }
        let vhost = courier::test_servers::rabbitmq_vhost()
            .await
            .unwrap_or_else(|e| panic!("a vhost of the test's own on AMQP_URL's broker: {e}"));
        RestartableBroker {
            url: vhost.url().to_owned(),
            own: Own::Vhost(vhost),
        }
    }

    /// Its AMQP URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Whether it is a container (restarted for real) rather than a vhost.
    pub fn is_container(&self) -> bool {
        matches!(self.own, Own::Container(_))
    }

    /// A restart as the test's clients see it. The container: stopped, started again
    /// after `pause` (durable queues and their messages stay). The vhost: the broker
    /// closes every connection to it, again and again during `pause` (reconnections too),
    /// with `rabbitmqctl close_all_connections -p <vhost>`, the close a client gets when
    /// the broker shuts down; connections to other vhosts are not touched.
    ///
    /// # Panics
    /// When the container cannot be stopped or started, or `rabbitmqctl` fails.
    #[allow(clippy::expect_used, clippy::panic)]
    pub async fn restart(&self, pause: std::time::Duration) {
        match &self.own {
            Own::Container(c) => {
                c.stop().await.expect("stop the RabbitMQ container");
                tokio::time::sleep(pause).await;
                c.start().await.expect("start the RabbitMQ container again");
            }
            Own::Vhost(vhost) => {
                let until = tokio::time::Instant::now() + pause;
                loop {
                    let out = tokio::process::Command::new("rabbitmqctl")
                        .args(["close_all_connections", "-p", vhost.name(), "courier restart test"])
                        .output()
                        .await
                        .unwrap_or_else(|e| panic!("rabbitmqctl close_all_connections did not run: {e}"));
                    assert!(
                        out.status.success(),
                        "rabbitmqctl close_all_connections failed: {}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                    if tokio::time::Instant::now() >= until {
                        return;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
            }
        }
    }

    /// Removes the container or deletes the vhost.
    pub async fn remove(self) {
        match self.own {
            Own::Container(c) => {
                let _ = c.rm().await;
            }
            Own::Vhost(v) => {
                let _ = v.delete().await;
            }
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "amqp.Job")]
/// A job of the RabbitMQ endpoint tests.
pub struct Job {
    /// Its number.
    pub n: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "amqp.JobDone")]
/// Published when a job is done.
pub struct JobDone {
    /// The job.
    pub n: u32,
}

/// The handler of the RabbitMQ endpoint tests: records the job in its Postgres
/// transaction (no unique key: a second effect of the same job would show as a second
/// row) and publishes `JobDone`.
#[courier::handler]
pub async fn work(job: Job, ctx: &mut Context) -> Result<(), HandlerError> {
    let instance = ctx.state::<Instance>()?.0;
    let tx = ctx.transaction::<sqlx::Postgres>()?;
    sqlx::query("INSERT INTO effects (n, instance) VALUES ($1, $2)")
        .bind(i64::from(job.n))
        .bind(i64::from(instance))
        .execute(&mut *tx)
        .await?;
    ctx.publish(&JobDone { n: job.n })?;
    Ok(())
}

/// Which endpoint instance handled a job.
#[derive(Clone, Copy)]
pub struct Instance(
    /// Its number.
    pub u32,
);

/// The routes of the job endpoints: jobs to `queue`, `JobDone` on `done_topic`.
pub fn job_routes(queue: &str, done_topic: &str) -> Routes {
    Routes::new().send::<Job>(queue).event_on::<JobDone>(done_topic)
}

/// An endpoint named `name` that runs [`work`] on RabbitMQ with a Postgres store.
pub fn job_endpoint(
    name: &str,
    transport: Arc<AmqpTransport>,
    store: &PostgresStore,
    instance: u32,
) -> EndpointBuilder {
    Endpoint::builder(name)
        .transport(transport)
        .store(Arc::new(store.clone()))
        .routes(job_routes(name, &format!("{name}-done")))
        .handler(work)
        .state(Instance(instance))
        .shutdown_timeout(std::time::Duration::from_secs(10))
}
