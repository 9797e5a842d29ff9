//! A Postgres database of its own for each test: started with testcontainers where a
//! Docker engine is reachable, otherwise on the server `DATABASE_URL` names.

use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{ConnectOptions, Connection};
use testcontainers_modules::postgres::Postgres;
use testcontainers_modules::testcontainers::runners::AsyncRunner;
use testcontainers_modules::testcontainers::{ContainerAsync, ImageExt};

/// The Postgres version testcontainers starts.
pub const POSTGRES_TAG: &str = "17-alpine";

/// A database created for one test, dropped by [`TestDatabase::drop_now`].
pub struct TestDatabase {
    /// Options that connect to it.
    pub options: PgConnectOptions,
    /// Its name (`courier_t_` and a random suffix).
    pub name: String,
    admin: PgConnectOptions,
    _container: Option<ContainerAsync<Postgres>>,
}

/// Whether a Docker engine answers on `DOCKER_HOST` or the default socket.
pub fn docker_reachable() -> bool {
    match std::env::var("DOCKER_HOST") {
        Ok(host) if host.starts_with("tcp://") => host
            .trim_start_matches("tcp://")
            .parse::<std::net::SocketAddr>()
            .is_ok_and(|a| std::net::TcpStream::connect_timeout(&a, std::time::Duration::from_millis(500)).is_ok()),
        Ok(host) => std::os::unix::net::UnixStream::connect(host.trim_start_matches("unix://")).is_ok(),
        Err(_) => std::os::unix::net::UnixStream::connect("/var/run/docker.sock").is_ok(),
    }
}

impl TestDatabase {
    /// Creates a fresh database.
    ///
    /// # Panics
    /// When neither a Docker engine nor `DATABASE_URL` is available, saying so.
    #[allow(clippy::expect_used, clippy::panic)]
    pub async fn create() -> Self {
        let (admin, container) = if docker_reachable() {
            let container = Postgres::default()
                .with_tag(POSTGRES_TAG)
                .start()
                .await
                .expect("start Postgres with testcontainers");
            let port = container.get_host_port_ipv4(5432).await.expect("the container's port");
            let host = container.get_host().await.expect("the container's host").to_string();
            let admin = PgConnectOptions::new()
                .host(&host)
                .port(port)
                .username("postgres")
                .password("postgres")
                .database("postgres");
            (admin, Some(container))
        } else if let Ok(url) = std::env::var("DATABASE_URL") {
            (
                PgConnectOptions::from_str(&url).expect("DATABASE_URL is a Postgres URL"),
                None,
            )
        } else {
            panic!(
                "these tests need Postgres: either a reachable Docker engine (testcontainers starts \
                 postgres:{POSTGRES_TAG}) or DATABASE_URL=postgres://user@host:5432/db naming a server \
                 where the user may create databases"
            );
        };
        let name = format!("courier_t_{}", uuid::Uuid::new_v4().simple());
        let mut conn = admin.connect().await.expect("connect to Postgres");
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await
            .expect("create the test database");
        conn.close().await.ok();
        Self {
            options: admin.clone().database(&name),
            name,
            admin,
            _container: container,
        }
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
