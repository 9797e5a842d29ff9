//! The application's own schema next to Courier's in a SQLite file: its migrations (the
//! `sqlx::migrate!` of the user's crate) applied with a check that they keep their own
//! migrations table, and an error that names the migration that failed.
//!
//! Used by [`EmbeddedBuilder::migrations`](crate::EmbeddedBuilder::migrations) (applied
//! when the broker opens its file) and [`SqliteStore::run_migrations`].

use std::ops::Deref;

use sqlx::migrate::{Migrate, MigrateError, Migrator};

use super::sqlite::SqliteStore;
use crate::error::{Error, ErrorKind, Result};

/// The prefix of Courier's tables in a SQLite file; the application's migrations table
/// must not carry it.
const COURIER_PREFIX: &str = "courier_";

/// Refuses a migrator whose migrations table is Courier's or looks like one of Courier's
/// tables (`courier_*`): the two sets of migrations would read each other's versions.
pub(crate) fn check(migrator: &Migrator) -> Result<()> {
    let table = migrator.table_name.as_ref();
    if table.to_ascii_lowercase().starts_with(COURIER_PREFIX) {
        return Err(Error::new(ErrorKind::InvalidOptions {
            reason: format!(
                "the application's migrations table is {table:?}: tables named courier_* are Courier's \
                 (its own migrations are in courier_migrations); keep sqlx's default _sqlx_migrations or \
                 choose another name"
            ),
        }));
    }
    Ok(())
}

/// Applies the application's `migrator` (after [`check`]) on `conn`; `place` names the
/// database in errors.
///
/// # Errors
/// [`ErrorKind::InvalidOptions`] from [`check`]; [`ErrorKind::Storage`] naming the
/// migration (version and description) that failed or does not match what the file
/// recorded.
pub(crate) async fn apply<'a, A>(migrator: &Migrator, conn: A, place: &str) -> Result<()>
where
    A: sqlx::Acquire<'a>,
    <A::Connection as Deref>::Target: Migrate,
{
    check(migrator)?;
    migrator.run(conn).await.map_err(|e| failed(migrator, place, e))
}

/// The error of a failed run of the application's migrations.
fn failed(migrator: &Migrator, place: &str, e: MigrateError) -> Error {
    let name = |version: i64| {
        migrator
            .iter()
            .find(|m| m.version == version)
            .map_or_else(|| format!("{version}"), |m| format!("{version} ({})", m.description))
    };
    let (detail, transient) = match &e {
        MigrateError::ExecuteMigration(source, version) => (
            format!(
                "the application's migration {} failed on {place}: {source}",
                name(*version)
            ),
            is_busy(source),
        ),
        MigrateError::Execute(source) => (
            format!("cannot apply the application's migrations to {place}: {source}"),
            is_busy(source),
        ),
        MigrateError::VersionMismatch(version) => (
            format!(
                "the application's migration {} was applied to {place} before and has been changed since: \
                 add a new migration instead of editing an applied one",
                name(*version)
            ),
            false,
        ),
        MigrateError::VersionMissing(version) => (
            format!(
                "{place} has the application's migration {version} applied, which is not among the migrations \
                 given (an older build, or another application's file?)"
            ),
            false,
        ),
        other => (
            format!("cannot apply the application's migrations to {place}: {other}"),
            false,
        ),
    };
    Error::with_source(ErrorKind::Storage { detail, transient }, e)
}

/// SQLite's "busy" and "locked": another writer held the file; a later try can succeed.
fn is_busy(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if matches!(d.code().as_deref(), Some("5" | "6" | "517" | "261" | "262")))
}

impl SqliteStore {
    /// Applies the application's own migrations (`sqlx::migrate!("./migrations")` in your
    /// crate) to the store's file, next to Courier's tables. Idempotent: what was applied
    /// is recorded in the migrator's own table (sqlx's default `_sqlx_migrations`), never
    /// in Courier's `courier_migrations`. Run it at start-up, before the endpoints start.
    ///
    /// ```no_run
    /// use courier::Store;
    /// use courier::sqlx::migrate::Migrator;
    ///
    /// // `migrations` is `sqlx::migrate!("./migrations")`, your crate's own.
    /// async fn open_store(migrations: Migrator) -> Result<courier::SqliteStore, courier::Error> {
    ///     let store = courier::SqliteStore::open("app.db").await?;
    ///     store.migrate().await?;                 // Courier's tables
    ///     store.run_migrations(&migrations).await?; // yours
    ///     Ok(store)
    /// }
    /// ```
    ///
    /// # Errors
    /// [`ErrorKind::InvalidOptions`] if the migrator's table is named `courier_*`;
    /// [`ErrorKind::Storage`] naming the migration that failed, or that was applied
    /// before and has changed since.
    pub async fn run_migrations(&self, migrator: &Migrator) -> Result<()> {
        apply(migrator, self.pool(), "the SQLite store").await
    }
}
