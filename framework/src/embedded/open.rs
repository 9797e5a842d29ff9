//! Opening an embedded broker: the builder and its settings, the database connection
//! and its migrations (Courier's, then the application's), the lock file that keeps one
//! broker per file, and the engine's and checkpointer's threads.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{ConnectOptions, Connection};
use tokio::sync::mpsc;

use super::engine::{self, Engine};
use super::reads::{self, DEFAULT_READ_CONNECTIONS};
use super::{DEFAULT_MAX_MESSAGE_SIZE, Durability, Embedded, Shared};
use crate::clock::{Clock, SystemClock};
use crate::error::{Error, ErrorKind, Result};

/// Opens an embedded broker with settings.
#[derive(Debug)]
#[must_use]
pub struct EmbeddedBuilder {
    path: Option<PathBuf>,
    clock: Arc<dyn Clock>,
    durability: Durability,
    max_message_size: usize,
    migrations: Option<Migrator>,
    read_connections: u32,
}

impl Default for EmbeddedBuilder {
    fn default() -> Self {
        Self {
            path: None,
            clock: Arc::new(SystemClock),
            durability: Durability::Normal,
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            migrations: None,
            read_connections: DEFAULT_READ_CONNECTIONS,
        }
    }
}

impl EmbeddedBuilder {
    /// Keeps the broker in this file (created if missing).
    pub fn path(mut self, path: impl AsRef<Path>) -> Self {
        self.path = Some(path.as_ref().to_owned());
        self
    }

    /// Keeps the broker in memory: gone when it closes (for tests).
    pub fn in_memory(mut self) -> Self {
        self.path = None;
        self
    }

    /// Reads time from this clock (a [`VirtualClock`](crate::VirtualClock) in tests).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Sets the durability of commits (file brokers only).
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Sets the largest message accepted, in bytes (body, ids, headers and properties).
    pub fn max_message_size(mut self, bytes: usize) -> Self {
        self.max_message_size = bytes;
        self
    }

    /// Applies the application's own migrations when the broker opens, after Courier's
    /// and before anything else runs: `.migrations(sqlx::migrate!("./migrations"))`. The
    /// tables they create live in the broker's file, where handlers write them in the
    /// message's transaction ([`Embedded::store`]) and [`Embedded::read_pool`] reads them.
    ///
    /// Applied migrations are recorded in the migrator's own table (sqlx's default
    /// `_sqlx_migrations`), never in Courier's `courier_migrations`; reopening the file
    /// applies only the new ones. Name your tables anything but `courier_*`. A second
    /// call replaces the first.
    ///
    /// `sqlx::migrate!` expands to paths under `::sqlx`: it needs `sqlx` among your
    /// crate's dependencies (the version of [`courier::sqlx`](crate::sqlx), with its
    /// `migrate` and `macros` features).
    pub fn migrations(mut self, migrator: Migrator) -> Self {
        self.migrations = Some(migrator);
        self
    }

    /// Sets how many connections [`Embedded::read_pool`] opens at most (default
    /// [`DEFAULT_READ_CONNECTIONS`]; at least 1).
    pub fn read_connections(mut self, connections: u32) -> Self {
        self.read_connections = connections;
        self
    }

    /// Opens the broker: creates or migrates its schema (and applies the application's
    /// [`migrations`](Self::migrations)), releases the locks a previous process left, and
    /// starts its engine on the current tokio runtime.
    ///
    /// # Errors
    /// [`ErrorKind::Storage`] if the file cannot be opened (for example it is in use by
    /// another process) or migrated; for the application's migrations, the error names
    /// the one that failed. [`ErrorKind::InvalidOptions`] for a setting out of range or
    /// an application migrations table named `courier_*`.
    pub async fn open(self) -> Result<Embedded> {
        if self.max_message_size == 0 {
            return Err(Error::new(ErrorKind::InvalidOptions {
                reason: "max_message_size must be at least 1 byte".into(),
            }));
        }
        if self.read_connections == 0 {
            return Err(Error::new(ErrorKind::InvalidOptions {
                reason: "read_connections must be at least 1".into(),
            }));
        }
        if let Some(migrator) = &self.migrations {
            crate::store::app_schema::check(migrator)?;
        }
        // One broker per file: the lock is held as long as the engine runs.
        let owner = self.path.as_deref().map(own_file).transpose()?;
        let options = match &self.path {
            Some(path) => SqliteConnectOptions::new()
                .filename(path)
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(match self.durability {
                    Durability::Normal => SqliteSynchronous::Normal,
                    Durability::Full => SqliteSynchronous::Full,
                })
                // Checkpoints run on a connection of their own (see `checkpointer`), so a
                // commit never waits for one; this only bounds the WAL if that fails.
                .pragma("wal_autocheckpoint", "50000"),
            None => SqliteConnectOptions::from_str("sqlite::memory:").map_err(engine::storage_error)?,
        }
        .busy_timeout(Duration::from_millis(250))
        .statement_cache_capacity(256)
        .foreign_keys(false);
        let mut conn = options.connect().await.map_err(|e| {
            let what = self
                .path
                .as_ref()
                .map_or_else(|| "in-memory database".to_owned(), |p| p.display().to_string());
            Error::with_source(
                ErrorKind::Storage {
                    detail: format!("cannot open {what} (is another process using it?): {e}"),
                    transient: true,
                },
                e,
            )
        })?;
        crate::store::sqlite::migrator().run(&mut conn).await.map_err(|e| {
            Error::with_source(
                ErrorKind::Storage {
                    detail: format!("cannot migrate the embedded broker's schema: {e}"),
                    transient: false,
                },
                e,
            )
        })?;
        if let Some(migrator) = &self.migrations {
            let place = self.path.as_ref().map_or_else(
                || "the in-memory broker".to_owned(),
                |p| format!("the broker's file {}", p.display()),
            );
            crate::store::app_schema::apply(migrator, &mut conn, &place).await?;
        }
        let read_pool = reads::pool(self.path.as_deref(), &options, self.read_connections);
        let epoch = u32::from_be_bytes(uuid::Uuid::new_v4().as_bytes()[..4].try_into().unwrap_or([0, 0, 0, 1]));
        let mut engine = Engine::start(conn, self.clock.clone(), epoch, self.max_message_size).await?;
        if let Some(owner) = owner {
            engine.keep(Box::new(owner));
        }
        if self.path.is_some() {
            engine.keep(Box::new(checkpointer(options.clone())?));
        }
        let (tx, rx) = mpsc::channel(4096);
        // The engine gets a thread and a runtime of its own: every statement is a round trip
        // to SQLite's worker thread, and on a shared runtime each return waits behind the
        // application's tasks. Alone, the engine resumes at once.
        spawn_on_own_thread("courier-embedded", engine.run(rx))?;
        Ok(Embedded {
            shared: Arc::new(Shared {
                tx,
                clock: self.clock,
                epoch,
                max_message_size: self.max_message_size,
                closed: AtomicBool::new(false),
                read_pool,
            }),
        })
    }
}

/// Takes the lock file beside the database (`<file>.lock`); fails if another broker holds it.
fn own_file(path: &Path) -> Result<std::fs::File> {
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    let storage = |detail: String, e: std::io::Error| {
        Error::with_source(
            ErrorKind::Storage {
                detail,
                transient: true,
            },
            e,
        )
    };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&name)
        .map_err(|e| storage(format!("cannot open the lock file {}", Path::new(&name).display()), e))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(Error::new(ErrorKind::Storage {
            detail: format!(
                "{} is in use by another process or broker (its lock file {} is held)",
                path.display(),
                Path::new(&name).display()
            ),
            transient: true,
        })),
        Err(std::fs::TryLockError::Error(e)) => Err(storage(format!("cannot lock {}", Path::new(&name).display()), e)),
    }
}

/// Runs WAL checkpoints on a connection and thread of their own, every 100 ms, until the
/// returned sender is dropped: the engine's commits never wait for a checkpoint's fsync.
fn checkpointer(options: SqliteConnectOptions) -> Result<mpsc::Sender<()>> {
    let (stop, mut stopped) = mpsc::channel::<()>(1);
    spawn_on_own_thread("courier-checkpoint", async move {
        let mut conn = match options.connect().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "the checkpointer cannot connect; SQLite checkpoints on commit instead");
                return;
            }
        };
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            tokio::select! {
                _ = stopped.recv() => break,
                _ = tick.tick() => {
                    if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)").execute(&mut conn).await {
                        tracing::debug!(error = %e, "checkpoint failed; retrying");
                    }
                }
            }
        }
        let _ = conn.close().await;
    })?;
    Ok(stop)
}

/// Runs `work` to completion on a new thread with a single-threaded tokio runtime.
fn spawn_on_own_thread(name: &str, work: impl std::future::Future<Output = ()> + Send + 'static) -> Result<()> {
    let failed = |e: std::io::Error| {
        Error::with_source(
            ErrorKind::Storage {
                detail: format!("cannot start the embedded broker's {name} thread: {e}"),
                transient: true,
            },
            e,
        )
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(failed)?;
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || runtime.block_on(work))
        .map_err(failed)?;
    Ok(())
}
