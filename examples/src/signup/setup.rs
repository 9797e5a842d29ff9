//! The transport and store choices: the embedded broker in a SQLite file with its own
//! store, Postgres as the store, RabbitMQ with Postgres, or the Postgres transport alone
//! (`open`); the routing table
//! every endpoint shares (`routes`); and the scenario parked in the broker so that a
//! later run resumes it (`Scenario`, `find_scenario`, `delete_database`).

use std::error::Error;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use courier::Store;
use courier::prelude::*;
use serde::{Deserialize, Serialize};

use crate::Options;
use crate::SCENARIO_QUEUE;
use crate::audit::Audit;
use crate::startup;
use crate::startup::Startup;
use crate::story::{NewsNote, Timing};
use crate::users::{Arrive, MailDelivered};
use crate::workflow::{
    CodeEntered, EmailConfirmed, LoginRefused, LoginRequested, LoginSucceeded, SendConfirmationMail, SendLoginCode,
    UserActivated, UserRegistered, UserRemoved,
};

/// The routing table every endpoint shares.
pub(crate) fn routes() -> Routes {
    Routes::new()
        .send::<UserRegistered>("accounts")
        .send::<EmailConfirmed>("accounts")
        .send::<LoginRequested>("accounts")
        .send::<CodeEntered>("accounts")
        .send::<Audit>("accounts")
        .send::<SendConfirmationMail>("mailer")
        .send::<SendLoginCode>("mailer")
        .send::<Arrive>("users")
        .send::<MailDelivered>("users")
        .event::<UserActivated>()
        .event::<UserRemoved>()
        .event::<LoginSucceeded>()
        .event::<LoginRefused>()
        .event::<NewsNote>()
}

/// The scenario, parked in [`SCENARIO_QUEUE`] so that a later run finds it.
#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "signup.Scenario")]
pub(crate) struct Scenario {
    /// Makes the user ids of this scenario unique (a Postgres store outlives the broker
    /// file that `--fresh` deletes).
    pub(crate) id: String,
    /// When the first user arrived.
    pub(crate) started_at: DateTime<Utc>,
    /// The time factor.
    pub(crate) timing: Timing,
    /// Where the sagas live: `sqlite` (the broker's file) or `postgres`.
    pub(crate) store: String,
}

impl Scenario {
    pub(crate) fn user_id(&self, name: &str) -> String {
        format!("{name}-{}", self.id)
    }
}

/// The broker and the store, as the options say.
pub(crate) async fn open(
    options: &Options,
    start: &Startup,
) -> Result<(Arc<dyn Transport>, Arc<dyn Store>, &'static str, String, String), Box<dyn Error>> {
    #[cfg(feature = "servers")]
    if let Some(opened) = open_servers(options, start).await? {
        return Ok(opened);
    }
    if options.fresh {
        delete_database(&options.db)?;
    }
    let broker = start.step(startup::BROKER_FILE, Embedded::open(&options.db)).await?;
    let broker_text = format!("{} (embedded, SQLite)", options.db.display());
    let (store, store_kind, store_text): (Arc<dyn Store>, &str, String) = match &options.postgres {
        #[cfg(feature = "servers")]
        Some(url) => {
            let store = start
                .step(startup::POSTGRES, courier::PostgresStore::connect(url))
                .await?;
            start.step(startup::MIGRATIONS, store.migrate()).await?;
            (Arc::new(store), "postgres", "Postgres (schema courier)".to_owned())
        }
        _ => (
            Arc::new(broker.store()),
            "sqlite",
            "the broker's own file (one SQLite transaction per message)".to_owned(),
        ),
    };
    Ok((Arc::new(broker), store, store_kind, store_text, broker_text))
}

/// RabbitMQ with the Postgres store, or the Postgres transport alone, as the options say
/// (`None`: neither was asked for). Built with the feature `servers`.
#[cfg(feature = "servers")]
#[allow(clippy::type_complexity)]
async fn open_servers(
    options: &Options,
    start: &Startup,
) -> Result<Option<(Arc<dyn Transport>, Arc<dyn Store>, &'static str, String, String)>, Box<dyn Error>> {
    use courier::{AmqpTransport, PostgresStore, PostgresTransport};
    if options.transport.is_some() {
        let Some(pg) = &options.postgres else {
            return Err("--transport postgres needs a database: set DATABASE_URL or --postgres".into());
        };
        let postgres = PostgresTransport::builder(pg.clone()).migrate(false).open();
        let store = start.step(startup::POSTGRES, PostgresStore::connect(pg)).await?;
        start.step(startup::MIGRATIONS, store.migrate()).await?;
        let postgres = start.step(startup::POSTGRES, postgres).await?;
        let transport: Arc<dyn Transport> = Arc::new(postgres.clone());
        if options.fresh {
            delete_queues(&transport).await?;
            // The runs' news topic, with the subscriptions killed runs left.
            if let Some(topic) = routes().topic_of(<NewsNote as Message>::NAME) {
                match transport.delete(&EntityPath::queue(topic)).await {
                    Ok(()) => {}
                    Err(e) if matches!(e.kind(), courier::ErrorKind::EntityNotFound { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        let store_text = "Postgres (schema courier), one transaction per message with the queues".to_owned();
        return Ok(Some((
            transport,
            Arc::new(postgres.store()),
            "postgres",
            store_text,
            "Postgres (the Postgres transport)".to_owned(),
        )));
    }
    if let Some(url) = &options.rabbitmq {
        let Some(pg) = &options.postgres else {
            return Err("RabbitMQ needs the Postgres store (it holds the scheduled messages): \
                        set DATABASE_URL or --postgres"
                .into());
        };
        let store = start.step(startup::POSTGRES, PostgresStore::connect(pg)).await?;
        start.step(startup::MIGRATIONS, store.migrate()).await?;
        let rabbit = AmqpTransport::builder(url.clone())
            .schedules(&store)
            .connection_name("signup")
            .open();
        let rabbit = start.step(startup::RABBITMQ, rabbit).await?;
        let text = format!("RabbitMQ ({rabbit:?}), scheduled messages in Postgres");
        let transport: Arc<dyn Transport> = Arc::new(rabbit);
        if options.fresh {
            delete_queues(&transport).await?;
        }
        let store_text = "Postgres (schema courier), with inbox + outbox beside RabbitMQ".to_owned();
        return Ok(Some((transport, Arc::new(store), "postgres", store_text, text)));
    }
    Ok(None)
}

#[cfg(feature = "servers")]
/// Deletes the example's queues (`--fresh` on a server broker).
async fn delete_queues(transport: &Arc<dyn Transport>) -> Result<(), Box<dyn Error>> {
    for queue in ["users", "mailer", "accounts", SCENARIO_QUEUE] {
        match transport.delete(&EntityPath::queue(queue)).await {
            Ok(()) => {}
            Err(e) if matches!(e.kind(), courier::ErrorKind::EntityNotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Deletes the broker's database files, unless another process holds the database.
pub(crate) fn delete_database(db: &Path) -> Result<(), Box<dyn Error>> {
    let with = |suffix: &str| {
        let mut name = db.as_os_str().to_owned();
        name.push(suffix);
        PathBuf::from(name)
    };
    // The broker holds `<db>.lock` while it runs (see `Embedded::open`); hold it too while
    // deleting, so that a running program's database is never pulled from under it.
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(with(".lock"))?;
    match lock.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            return Err(format!("{} is in use by another process", db.display()).into());
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(e.into()),
    }
    for path in [db.to_owned(), with("-wal"), with("-shm")] {
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("cannot delete {}: {e}", path.display()).into()),
        }
    }
    Ok(())
}

/// The scenario parked in the broker by an earlier run, if any (none after `--fresh`,
/// which deleted it: RabbitMQ would wait a second for it).
pub(crate) async fn find_scenario(
    transport: &Arc<dyn Transport>,
    fresh: bool,
) -> Result<Option<Scenario>, Box<dyn Error>> {
    // Read many times over the runs, never handled: a high max delivery count.
    let options = QueueOptions::default().max_delivery_count(10_000);
    transport.create_queue(SCENARIO_QUEUE, &options).await?;
    if fresh {
        return Ok(None);
    }
    let path = EntityPath::queue(SCENARIO_QUEUE);
    if transport.capabilities().bends("S6.1").is_none() {
        let parked = transport.peek(&path, 0, 1).await?;
        return match parked.first() {
            Some(message) => Ok(Some(Scenario::from_envelope(&message.envelope)?)),
            None => Ok(None),
        };
    }
    // A broker that cannot browse (RabbitMQ): take the parked message and put it back.
    let receiver = transport.receiver(&path).await?;
    let mut got = receiver.receive(1, Duration::from_secs(1)).await?;
    match got.pop() {
        Some(delivery) => {
            let scenario = Scenario::from_envelope(&delivery.message().envelope);
            delivery.abandon().await?;
            Ok(Some(scenario?))
        }
        None => Ok(None),
    }
}
