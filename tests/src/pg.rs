//! A Postgres database of its own for each test, on the server `DATABASE_URL` names, or
//! else in a Postgres container started with testcontainers (one per test process, see
//! [`crate::containers`]) when a Docker engine answers.

use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{ConnectOptions, Connection};
use testcontainers_modules::testcontainers::core::{IntoContainerPort, WaitFor};
use testcontainers_modules::testcontainers::runners::AsyncRunner;
use testcontainers_modules::testcontainers::{ContainerAsync, GenericImage, ImageExt};
use tokio::sync::OnceCell;

use crate::containers::{self, Server};

/// A Postgres server the tests create databases on.
pub struct PgServer {
    /// Options that connect to its `postgres` database as a user who may create databases.
    pub admin: PgConnectOptions,
    /// The container it runs in, when the tests started it.
    pub container: Option<ContainerAsync<GenericImage>>,
}

static SHARED: OnceCell<PgServer> = OnceCell::const_new();

impl PgServer {
    /// The server of this test process: `DATABASE_URL`'s, else a container shared by the
    /// process's tests.
    ///
    /// # Panics
    /// When neither is available, saying in one line what to do.
    #[allow(clippy::expect_used, clippy::panic)]
    pub async fn shared() -> &'static PgServer {
        SHARED
            .get_or_init(|| async {
                if let Ok(url) = std::env::var("DATABASE_URL") {
                    PgServer {
                        admin: PgConnectOptions::from_str(&url).expect("DATABASE_URL is a Postgres URL"),
                        container: None,
                    }
                } else if containers::engine_answers() {
                    Self::container().await
                } else {
                    panic!(
                        "{}",
                        containers::nothing_there("Postgres", "DATABASE_URL", "postgres://user@host:5432/db")
                    );
                }
            })
            .await
    }

    /// A server in a container of its own (for a test that restarts it), whatever
    /// `DATABASE_URL` says. Its host port is fixed, so a restart keeps it.
    ///
    /// # Panics
    /// When the container cannot start.
    #[allow(clippy::expect_used)]
    pub async fn container() -> PgServer {
        containers::remove_orphans();
        let (name, tag) = containers::image(Server::Postgres).unwrap_or_else(|e| panic_with(&e));
        let port = containers::free_port().expect("a free port");
        let container = GenericImage::new(name, tag)
            .with_exposed_port(5432.tcp())
            // The readiness line on stderr is the server's; the one on stdout is the
            // entrypoint's (or, in the official image, the final server's after the
            // temporary one of initialisation): both mean TCP connections are accepted.
            .with_wait_for(WaitFor::message_on_stderr(
                "database system is ready to accept connections",
            ))
            .with_wait_for(WaitFor::message_on_stdout(
                "database system is ready to accept connections",
            ))
            .with_env_var("POSTGRES_USER", "postgres")
            .with_env_var("POSTGRES_PASSWORD", "postgres")
            .with_env_var("POSTGRES_DB", "postgres")
            .with_cmd(["-c", "fsync=off", "-c", "max_connections=300"])
            .with_mapped_port(port, 5432.tcp())
            .with_label(containers::OWNER_LABEL, containers::owner())
            .with_container_name(containers::watched_name())
            .with_startup_timeout(std::time::Duration::from_secs(120))
            .start()
            .await
            .unwrap_or_else(|e| panic_with(&format!("start the Postgres container: {e}")));
        let host = container
            .get_host()
            .await
            .unwrap_or_else(|e| panic_with(&format!("the Postgres container's host: {e}")))
            .to_string();
        let admin = PgConnectOptions::new()
            .host(&host)
            .port(port)
            .username("postgres")
            .password("postgres")
            .database("postgres");
        PgServer {
            admin,
            container: Some(container),
        }
    }

    /// Stops the server's container and starts it again: connections drop, data stays.
    /// Returns once it accepts connections again.
    ///
    /// # Panics
    /// When the server is not a container of the tests', or does not come back in 60 s.
    #[allow(clippy::expect_used, clippy::panic)]
    pub async fn restart(&self) {
        let container = self
            .container
            .as_ref()
            .expect("only a container the tests started is restarted");
        container.stop().await.expect("stop the Postgres container");
        container.start().await.expect("start the Postgres container again");
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
        while self.admin.connect().await.is_err() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "Postgres did not come back within 60 s"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    /// Creates a fresh database on this server, with `courier::test_servers`'s names
    /// (the host and the id of this process in them): the databases of this host's test
    /// processes that have ended are dropped first, on this server.
    pub async fn database(&self) -> TestDatabase {
        let db = courier::test_servers::postgres_database_on(&self.admin)
            .await
            .unwrap_or_else(|e| panic_with(&format!("create the test database: {e}")));
        TestDatabase {
            options: db.options(),
            name: db.name().to_owned(),
            admin: self.admin.clone(),
        }
    }
}

#[allow(clippy::panic)]
fn panic_with(message: &str) -> ! {
    panic!("{message}")
}

/// A database created for one test, dropped by [`TestDatabase::drop_now`], or else by a
/// later test process once this one has ended (see [`PgServer::database`]).
pub struct TestDatabase {
    /// Options that connect to it.
    pub options: PgConnectOptions,
    /// Its name (`courier_test_<host>_<pid>_<random>`).
    pub name: String,
    admin: PgConnectOptions,
}

impl TestDatabase {
    /// Creates a fresh database on [`PgServer::shared`].
    ///
    /// # Panics
    /// When neither `DATABASE_URL` nor a Docker engine is available, saying so.
    pub async fn create() -> Self {
        PgServer::shared().await.database().await
    }

    /// A URL of the test database (for a child process).
    pub fn url(&self) -> String {
        self.options.to_url_lossy().to_string()
    }

    /// A pool on the test database.
    #[allow(clippy::expect_used)]
    pub async fn pool(&self) -> PgPool {
        PgPoolOptions::new()
            .max_connections(8)
            .connect_with(self.options.clone())
            .await
            .expect("connect to the test database")
    }

    /// Drops the database (connections to it are closed by force).
    pub async fn drop_now(self) {
        if let Ok(mut conn) = self.admin.connect().await {
            let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            )))
            .execute(&mut conn)
            .await;
            let _ = conn.close().await;
        }
    }
}
