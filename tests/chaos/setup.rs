//! What a chaos run runs on: the six configurations, the servers (this machine's, or
//! containers of the run's own, which it may restart; for `rabbitmq-cluster` a cluster of
//! three RabbitMQ containers), how a worker process opens its transport and store, and
//! how the driver reads the outcome from the databases.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use courier::{
    AmqpTransport, Embedded, EndpointBuilder, EntityCounts, EntityPath, PostgresStore, PostgresTransport, QueueOptions,
    SqliteStore, Store, Transport,
};
use courier_tests::cluster::Cluster;
use courier_tests::pg::{PgServer, TestDatabase};
use sqlx::{PgPool, SqlitePool};
use testcontainers_modules::testcontainers::{ContainerAsync, GenericImage};

use crate::workflow::{self, Sql};
use crate::{Error, fail};

/// The lock duration of the chaos queues: a paused worker is paused past it.
pub const LOCK: Duration = Duration::from_secs(5);

/// What the endpoint runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Config {
    /// The embedded broker's file, which is also the store: one process.
    Embedded,
    /// The embedded broker's file and a SQLite store file of its own: one process.
    Sqlite,
    /// RabbitMQ with a Postgres store: several processes compete.
    Rabbitmq,
    /// The Postgres transport with its one-transaction store (`PostgresTransport::store`):
    /// several processes compete on the same database.
    Postgres,
    /// RabbitMQ with a Postgres store, the endpoint on a session queue (`sessions.rs`):
    /// several processes share its partitions.
    RabbitmqSessions,
    /// The `rabbitmq` workload on a cluster of three RabbitMQ nodes (containers of the
    /// run's own) that loses the workers' node, stopped, then paused (`cluster_run.rs`).
    RabbitmqCluster,
}

impl Config {
    /// Whether several worker processes may run at once.
    pub fn competing(self) -> bool {
        matches!(
            self,
            Config::Rabbitmq | Config::Postgres | Config::RabbitmqSessions | Config::RabbitmqCluster
        )
    }

    /// Whether the run has a Postgres database (whose connections can be ended).
    pub fn on_postgres(self) -> bool {
        matches!(
            self,
            Config::Rabbitmq | Config::Postgres | Config::RabbitmqSessions | Config::RabbitmqCluster
        )
    }

    /// Whether the transport is RabbitMQ.
    pub fn on_rabbitmq(self) -> bool {
        matches!(
            self,
            Config::Rabbitmq | Config::RabbitmqSessions | Config::RabbitmqCluster
        )
    }

    /// The name on the command line (`rabbitmq-sessions`).
    pub fn name(self) -> String {
        clap::ValueEnum::to_possible_value(&self).map_or_else(String::new, |v| v.get_name().to_owned())
    }

    fn sql(self) -> Sql {
        match self {
            Config::Rabbitmq | Config::Postgres | Config::RabbitmqSessions | Config::RabbitmqCluster => Sql::Postgres,
            Config::Embedded | Config::Sqlite => Sql::Sqlite,
        }
    }
}

/// How a worker process finds its transport and store (its command-line arguments).
#[derive(Debug, Clone, clap::Args)]
pub struct Place {
    /// The configuration.
    #[arg(long, value_enum)]
    pub config: Config,
    /// The endpoint's queue.
    #[arg(long)]
    pub queue: String,
    /// The embedded broker's file.
    #[arg(long)]
    pub broker: Option<PathBuf>,
    /// The SQLite store's file (`sqlite`).
    #[arg(long)]
    pub store: Option<PathBuf>,
    /// The AMQP URL (`rabbitmq`; for `rabbitmq-cluster` one URL naming the three nodes).
    #[arg(long)]
    pub amqp: Option<String>,
    /// The Postgres URL (`rabbitmq`, `postgres`).
    #[arg(long)]
    pub postgres: Option<String>,
}

impl Place {
    /// The arguments that give this place to a worker.
    pub fn args(&self) -> Vec<String> {
        let mut args = vec![
            "--config".to_owned(),
            self.config.name(),
            "--queue".to_owned(),
            self.queue.clone(),
        ];
        let pairs = [
            ("--broker", self.broker.as_ref().map(|p| p.display().to_string())),
            ("--store", self.store.as_ref().map(|p| p.display().to_string())),
            ("--amqp", self.amqp.clone()),
            ("--postgres", self.postgres.clone()),
        ];
        for (flag, value) in pairs {
            if let Some(value) = value {
                args.push(flag.to_owned());
                args.push(value);
            }
        }
        args
    }

    fn need<'a, T: ?Sized>(&self, what: &str, value: Option<&'a T>) -> Result<&'a T, Error> {
        value.ok_or_else(|| Error(format!("the {:?} configuration needs --{what}", self.config)))
    }

    /// Opens the transport and the store (a worker, or the driver before and after).
    pub async fn open(&self) -> Result<(Arc<dyn Transport>, Arc<dyn Store>), Error> {
        match self.config {
            Config::Embedded => {
                let broker = Embedded::open(self.need("broker", self.broker.as_deref())?).await?;
                let store: Arc<dyn Store> = Arc::new(broker.store());
                Ok((Arc::new(broker), store))
            }
            Config::Sqlite => {
                let broker = Embedded::open(self.need("broker", self.broker.as_deref())?).await?;
                let store = SqliteStore::open(self.need("store", self.store.as_deref())?).await?;
                Ok((Arc::new(broker), Arc::new(store)))
            }
            Config::Rabbitmq | Config::RabbitmqSessions | Config::RabbitmqCluster => {
                let (transport, store) = self.open_amqp().await?;
                Ok((transport, Arc::new(store)))
            }
            Config::Postgres => {
                // The driver applied the migrations before any worker started.
                let transport = PostgresTransport::builder(self.need("postgres", self.postgres.as_deref())?)
                    .migrate(false)
                    .open()
                    .await?;
                let store = transport.store();
                Ok((Arc::new(transport), Arc::new(store)))
            }
        }
    }

    /// Opens the RabbitMQ transport, named `chaos-<process id>` (as RabbitMQ lists its
    /// connection), and the Postgres store.
    pub async fn open_amqp(&self) -> Result<(Arc<AmqpTransport>, PostgresStore), Error> {
        let store = PostgresStore::connect(self.need("postgres", self.postgres.as_deref())?).await?;
        let transport = AmqpTransport::builder(self.need("amqp", self.amqp.as_deref())?.to_owned())
            .schedules(&store)
            .connection_name(connection_name(std::process::id()))
            .open()
            .await?;
        Ok((Arc::new(transport), store))
    }

    /// The endpoint every worker runs.
    pub fn endpoint(&self, transport: Arc<dyn Transport>, store: Arc<dyn Store>) -> EndpointBuilder {
        let builder = courier::Endpoint::builder(&self.queue);
        // RabbitMQ has no lock duration (a delivery stays with its consumer until its
        // channel closes): the default options, which it accepts.
        let builder = if self.config.on_rabbitmq() {
            builder
        } else {
            builder.queue_options(QueueOptions::default().lock_duration(LOCK))
        };
        builder
            .transport(transport)
            .store(store)
            .routes(workflow::routes(&self.queue))
            .state(self.config.sql())
            .saga::<workflow::Flow>()
            .handler(workflow::work)
            .concurrency(8)
            .shutdown_timeout(Duration::from_secs(10))
    }
}

/// The name of the RabbitMQ connection of the process `pid`.
pub fn connection_name(pid: u32) -> String {
    format!("chaos-{pid}")
}

/// The database the effects, sagas and timeouts are read from.
pub enum Db {
    /// A SQLite file (the broker's, or the store's own).
    Sqlite(SqlitePool),
    /// The run's Postgres database.
    Postgres(PgPool),
}

impl Db {
    /// Runs `sql` (statements separated by `;`).
    pub async fn exec(&self, sql: &str) -> Result<(), Error> {
        match self {
            Db::Sqlite(pool) => {
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned())).execute(pool).await?;
            }
            Db::Postgres(pool) => {
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned())).execute(pool).await?;
            }
        }
        Ok(())
    }

    /// One number from `sql`.
    pub async fn count(&self, sql: &str) -> Result<i64, Error> {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        Ok(match self {
            Db::Sqlite(pool) => sqlx::query_scalar(sql).fetch_one(pool).await?,
            Db::Postgres(pool) => sqlx::query_scalar(sql).fetch_one(pool).await?,
        })
    }

    /// The one text column of each row of `sql`.
    pub async fn lines(&self, sql: &str) -> Result<Vec<String>, Error> {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        Ok(match self {
            Db::Sqlite(pool) => sqlx::query_scalar(sql).fetch_all(pool).await?,
            Db::Postgres(pool) => sqlx::query_scalar(sql).fetch_all(pool).await?,
        })
    }

    /// The effect rows, counted by key and step.
    pub async fn effects(&self) -> Result<Vec<(String, String, i64)>, Error> {
        const SQL: &str = "SELECT key, step, COUNT(*) FROM chaos_effects GROUP BY key, step";
        Ok(match self {
            Db::Sqlite(pool) => sqlx::query_as(SQL).fetch_all(pool).await?,
            Db::Postgres(pool) => sqlx::query_as(SQL).fetch_all(pool).await?,
        })
    }

    /// The rows of `sql`: a text, an integer and a count (Postgres).
    pub async fn pairs(&self, sql: &str) -> Result<Vec<(String, i32, i64)>, Error> {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        match self {
            Db::Postgres(pool) => Ok(sqlx::query_as(sql).fetch_all(pool).await?),
            Db::Sqlite(_) => fail("only on Postgres"),
        }
    }

    /// Where Courier's own tables are: `courier.` on Postgres, `courier_` on SQLite.
    pub fn courier_table(&self, name: &str) -> String {
        match self {
            Db::Sqlite(_) => format!("courier_{name}"),
            Db::Postgres(_) => format!("courier.{name}"),
        }
    }

    /// Ends every other connection to the run's database (Postgres): a dropped
    /// connection as the workers see it. Returns how many were ended.
    pub async fn terminate_others(&self) -> Result<i64, Error> {
        match self {
            Db::Postgres(pool) => Ok(sqlx::query_scalar(
                "SELECT COUNT(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = current_database() AND pid <> pg_backend_pid()) AS ended",
            )
            .fetch_one(pool)
            .await?),
            Db::Sqlite(_) => Ok(0),
        }
    }
}

/// A RabbitMQ the run controls through `rabbitmqctl`: on this machine, or in its own
/// container (`docker exec`).
pub struct Rabbit {
    /// The run's URL (on a virtual host of its own, so its connections can be closed
    /// without touching anyone else's).
    pub url: String,
    vhost: String,
    container: Option<ContainerAsync<GenericImage>>,
}

impl Rabbit {
    async fn ctl(&self, args: &[&str]) -> Result<String, Error> {
        let mut command = match &self.container {
            Some(c) => {
                let mut command = tokio::process::Command::new("docker");
                command.args(["exec", c.id(), "rabbitmqctl"]);
                command
            }
            None => tokio::process::Command::new("rabbitmqctl"),
        };
        let out = command
            .args(args)
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(|e| Error(format!("cannot run rabbitmqctl {}: {e}", args.join(" "))))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            fail(format!(
                "rabbitmqctl {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// Closes every connection of the run's virtual host.
    pub async fn close_connections(&self) -> Result<(), Error> {
        self.ctl(&[
            "close_all_connections",
            "--vhost",
            &self.vhost,
            "chaos: connection dropped",
        ])
        .await
        .map(|_| ())
    }

    /// The queues of the run's virtual host: name, messages ready, unacknowledged, and
    /// consumers.
    pub async fn list_queues(&self) -> Result<Vec<(String, u64, u64, u64)>, Error> {
        let out = self
            .ctl(&[
                "-q",
                "list_queues",
                "-p",
                &self.vhost,
                "--no-table-headers",
                "name",
                "messages_ready",
                "messages_unacknowledged",
                "consumers",
            ])
            .await?;
        let mut queues = Vec::new();
        for line in out.lines().filter(|l| !l.trim().is_empty()) {
            let cols: Vec<&str> = line.split('\t').collect();
            let number = |i: usize| cols.get(i).and_then(|c| c.trim().parse::<u64>().ok());
            match (cols.first(), number(1), number(2), number(3)) {
                (Some(name), Some(ready), Some(unacked), Some(consumers)) => {
                    queues.push(((*name).to_owned(), ready, unacked, consumers));
                }
                _ => return fail(format!("rabbitmqctl list_queues printed an unexpected line: {line}")),
            }
        }
        Ok(queues)
    }

    /// Stops the broker's application for `pause` and starts it again (only a broker of
    /// the run's own).
    pub async fn restart(&self, pause: Duration) -> Result<(), Error> {
        if self.container.is_none() {
            return fail("the RabbitMQ is not the run's own: pass --own-servers to restart it");
        }
        self.ctl(&["stop_app"]).await?;
        tokio::time::sleep(pause).await;
        self.ctl(&["start_app"]).await.map(|_| ())
    }

    async fn remove(&self) {
        let _ = self.ctl(&["delete_vhost", &self.vhost]).await;
    }
}

/// A database of the run's own, migrated (Courier's store and transport tables): on a
/// Postgres container of the run's own (`own_servers`, restartable), else on
/// `DATABASE_URL`'s server. Returns the owned server and database, or the borrowed
/// database, its URL and a store on it.
async fn postgres_database(
    own_servers: bool,
) -> Result<
    (
        Option<(PgServer, TestDatabase)>,
        Option<TestDatabase>,
        String,
        PostgresStore,
    ),
    Error,
> {
    let (pg, pg_shared, url) = if own_servers {
        let server = PgServer::container().await;
        let database = server.database().await;
        let url = database.url();
        (Some((server, database)), None, url)
    } else {
        let database = TestDatabase::create().await;
        let url = database.url();
        (None, Some(database), url)
    };
    let store = PostgresStore::connect(&url).await?;
    store.migrate().await?;
    Ok((pg, pg_shared, url, store))
}

/// The run's servers and files, made by [`Setup::make`] and removed by [`Setup::remove`].
pub struct Setup {
    /// Where the workers find things.
    pub place: Place,
    /// The effects, sagas and timeouts.
    pub db: Db,
    /// The run's RabbitMQ (`rabbitmq`).
    pub rabbit: Option<Rabbit>,
    /// The run's RabbitMQ cluster (`rabbitmq-cluster`).
    pub cluster: Option<Cluster>,
    /// The Postgres server (`rabbitmq`, `postgres`): restartable when the run owns it.
    pg: Option<(PgServer, TestDatabase)>,
    /// Postgres servers not the run's own are only borrowed.
    pg_shared: Option<TestDatabase>,
    _dir: tempfile::TempDir,
}

impl Setup {
    /// Makes what `config` needs, with a queue name of the run's own. With `own_servers`,
    /// Postgres and RabbitMQ run in containers started here (so they can be restarted);
    /// otherwise on `DATABASE_URL` and `AMQP_URL`, this machine's servers (controlled with
    /// its `rabbitmqctl`), which are never restarted.
    pub async fn make(config: Config, own_servers: bool) -> Result<Self, Error> {
        let dir = tempfile::tempdir().map_err(|e| Error(format!("a temporary directory: {e}")))?;
        let run = uuid::Uuid::new_v4().simple().to_string();
        let queue = format!("chaos-{}", &run[..8]);
        let mut place = Place {
            config,
            queue,
            broker: None,
            store: None,
            amqp: None,
            postgres: None,
        };
        let mut setup = match config {
            Config::Embedded | Config::Sqlite => {
                let broker = dir.path().join("broker.db");
                // The broker makes its schema (and the embedded store's) when it opens.
                Embedded::open(&broker).await?.close().await;
                let effects_in = if config == Config::Sqlite {
                    let path = dir.path().join("store.db");
                    let store = SqliteStore::open(&path).await?;
                    store.migrate().await?;
                    place.store = Some(path.clone());
                    path
                } else {
                    broker.clone()
                };
                place.broker = Some(broker);
                let pool = SqliteStore::open(&effects_in).await?.pool().clone();
                Setup {
                    place,
                    db: Db::Sqlite(pool),
                    rabbit: None,
                    cluster: None,
                    pg: None,
                    pg_shared: None,
                    _dir: dir,
                }
            }
            Config::Postgres => {
                if !own_servers && std::env::var_os("DATABASE_URL").is_none() {
                    return fail(
                        "the postgres configuration runs on a database of its own on DATABASE_URL's server, \
                         or on a container of its own with --own-servers: set DATABASE_URL, or pass --own-servers",
                    );
                }
                let (pg, pg_shared, database, store) = postgres_database(own_servers).await?;
                place.postgres = Some(database);
                Setup {
                    place,
                    db: Db::Postgres(store.pool().clone()),
                    rabbit: None,
                    cluster: None,
                    pg,
                    pg_shared,
                    _dir: dir,
                }
            }
            Config::Rabbitmq | Config::RabbitmqSessions => {
                if !own_servers
                    && (std::env::var_os("AMQP_URL").is_none() || std::env::var_os("DATABASE_URL").is_none())
                {
                    // The run drops connections with this machine's `rabbitmqctl`: it must
                    // be the broker AMQP_URL names, not a container of someone else's.
                    return fail(
                        "the rabbitmq configurations run on AMQP_URL and DATABASE_URL (this machine's servers), \
                         or on containers of its own with --own-servers: set both, or pass --own-servers",
                    );
                }
                let (pg, pg_shared, database, store) = postgres_database(own_servers).await?;
                let (base, container) = if own_servers {
                    let (url, container) = courier_tests::rabbit::own_broker().await;
                    (url, Some(container))
                } else {
                    (courier_tests::rabbit::amqp_url().await, None)
                };
                let vhost = format!("chaos-{}", &run[..8]);
                let url = match base.rsplit_once('/') {
                    Some((server, _)) => format!("{server}/{vhost}"),
                    None => return fail(format!("not an AMQP URL with a virtual host: {base}")),
                };
                let rabbit = Rabbit { url, vhost, container };
                rabbit.ctl(&["add_vhost", &rabbit.vhost]).await?;
                rabbit
                    .ctl(&["set_permissions", "-p", &rabbit.vhost, "guest", ".*", ".*", ".*"])
                    .await?;
                place.amqp = Some(rabbit.url.clone());
                place.postgres = Some(database);
                Setup {
                    place,
                    db: Db::Postgres(store.pool().clone()),
                    rabbit: Some(rabbit),
                    cluster: None,
                    pg,
                    pg_shared,
                    _dir: dir,
                }
            }
            Config::RabbitmqCluster => {
                if !courier_tests::containers::engine_answers() {
                    return fail(
                        "the rabbitmq-cluster configuration runs a RabbitMQ cluster of three containers and no Docker \
                         engine answers: start one (dockerd; scripts/test.sh starts one) and set DOCKER_HOST, e.g. \
                         DOCKER_HOST=unix:///run/courier-test-docker.sock",
                    );
                }
                // On DATABASE_URL's server (a database of the run's own), else or with
                // --own-servers on a Postgres container; the Postgres is never restarted.
                let (pg, pg_shared, database, store) = postgres_database(own_servers).await?;
                // The fixture panics when a node cannot start or join (a port taken
                // meanwhile, an image that cannot be built): a setup error here.
                let cluster = tokio::spawn(Cluster::start()).await.map_err(|e| {
                    let why = e.try_into_panic().ok().and_then(|p| {
                        p.downcast_ref::<String>()
                            .cloned()
                            .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    });
                    Error(format!(
                        "the RabbitMQ cluster did not start: {}",
                        why.unwrap_or_else(|| "its task ended".to_owned())
                    ))
                })?;
                place.amqp = Some(cluster.url(&format!("?heartbeat={}", crate::cluster_run::HEARTBEAT)));
                place.postgres = Some(database);
                Setup {
                    place,
                    db: Db::Postgres(store.pool().clone()),
                    rabbit: None,
                    cluster: Some(cluster),
                    pg,
                    pg_shared,
                    _dir: dir,
                }
            }
        };
        setup.db.exec(config.sql().create_effects()).await?;
        setup.place.config = config;
        Ok(setup)
    }

    /// Whether Postgres can be restarted (a server of the run's own).
    pub fn pg_restartable(&self) -> bool {
        self.pg.is_some()
    }

    /// Restarts the run's own Postgres (its container: stopped, then started).
    pub async fn restart_postgres(&self) -> Result<(), Error> {
        match &self.pg {
            Some((server, _)) => {
                server.restart().await;
                Ok(())
            }
            None => fail("the Postgres is not the run's own: pass --own-servers to restart it"),
        }
    }

    /// The queue's counts, through a transport opened for the purpose (the workers are
    /// stopped: the embedded file has one process at a time).
    pub async fn queue_counts(&self) -> Result<EntityCounts, Error> {
        Ok(self.queue_left().await?.0)
    }

    /// The queue's counts, and the messages left in it (at most five, read without
    /// locking them) as `id (type), state, deliveries, enqueued at, scheduled for, the
    /// courier headers` lines: what a failed run shows of what stayed.
    pub async fn queue_left(&self) -> Result<(EntityCounts, Vec<String>), Error> {
        let (transport, _) = self.place.open().await?;
        let path = EntityPath::queue(self.place.queue.clone());
        let counts = transport.counts(&path).await;
        let left = if counts.as_ref().is_ok_and(|c| c.active + c.scheduled + c.deferred > 0) {
            transport
                .peek(&path, courier::SequenceNumber::default(), 5)
                .await
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        transport.close().await;
        let lines = left
            .iter()
            .map(|m| {
                let headers: Vec<String> = m
                    .envelope
                    .properties
                    .iter()
                    .filter(|(k, _)| k.starts_with("courier."))
                    .map(|(k, v)| format!("{k}={v:?}"))
                    .collect();
                format!(
                    "{} ({}), {:?}, {} deliveries, enqueued {}, scheduled {:?}, {}",
                    m.envelope.message_id,
                    m.envelope.message_type.as_deref().unwrap_or("no type"),
                    m.broker.state,
                    m.broker.delivery_count,
                    m.broker.enqueued_time,
                    m.envelope.scheduled_enqueue_time,
                    headers.join(" ")
                )
            })
            .collect();
        Ok((counts?, lines))
    }

    /// Removes what the run made on shared servers (its database, its virtual host).
    pub async fn remove(self) {
        if let Some(rabbit) = &self.rabbit {
            rabbit.remove().await;
        }
        if let Some(cluster) = self.cluster {
            cluster.remove().await;
        }
        if let Some(database) = self.pg_shared {
            database.drop_now().await;
        }
        if let Some((_, database)) = self.pg {
            database.drop_now().await;
        }
    }
}
