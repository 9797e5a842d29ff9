//! The Postgres transport for the tests: one database per test process (created on the
//! server of [`crate::pg`], migrated once), shared by the tests of the process, which stay
//! apart by their own queue and topic names; each fixture opens a transport of its own
//! on a virtual clock. The database lives in a static and is never dropped by its process:
//! a later test process drops it once this one has ended (its name carries the host and
//! the process id, see [`crate::pg::PgServer::database`]).

use std::sync::Arc;

use courier::conformance::Fixture;
use courier::{Clock, PostgresTransport, VirtualClock};
use sqlx::postgres::PgConnectOptions;
use tokio::sync::OnceCell;

use crate::pg::TestDatabase;

static DATABASE: OnceCell<PgConnectOptions> = OnceCell::const_new();

/// The options of this process's transport database, migrated.
///
/// # Panics
/// When no Postgres is available or the migrations fail (a test failure).
#[allow(clippy::expect_used)]
pub async fn database() -> PgConnectOptions {
    DATABASE
        .get_or_init(|| async {
            let db = TestDatabase::create().await;
            let pool = db.pool().await;
            courier::Store::migrate(&courier::PostgresStore::from_pool(pool.clone()))
                .await
                .expect("migrate the transport database");
            pool.close().await;
            db.options.clone()
        })
        .await
        .clone()
}

/// A Postgres transport on the process's database, reading `clock`.
///
/// # Panics
/// When it cannot be opened (a test failure).
#[allow(clippy::expect_used)]
pub async fn transport(clock: &VirtualClock) -> PostgresTransport {
    let options = database().await;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(6)
        .connect_with(options)
        .await
        .expect("connect to the transport database");
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    PostgresTransport::from_pool(pool)
        .clock(shared)
        .migrate(false)
        .open()
        .await
        .expect("open the Postgres transport")
}

/// The conformance fixture: a Postgres transport on a virtual clock.
pub async fn pg_fixture() -> Fixture {
    let clock = VirtualClock::starting_now();
    let transport = transport(&clock).await;
    Fixture::new(Arc::new(transport), clock)
}
