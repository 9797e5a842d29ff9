//! The operations API's errors: what an operator's command can meet, each saying whether
//! trying again can help, so a tool maps them to exit codes a script relies on.

use crate::error::{Error, ErrorKind};

/// What an operation of [`courier::admin`](crate::admin) can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// The queue, message, saga instance or timeout does not exist (or no longer: another
    /// operator or a receiver took it first). Look again with a list command.
    #[error("{what} not found")]
    NotFound {
        /// What was looked for.
        what: String,
    },
    /// The operation is not possible here; the text says why and what to do instead.
    #[error("refused: {reason}")]
    Refused {
        /// Why, and what to do.
        reason: String,
    },
    /// The broker or database cannot be reached. Check that it runs and the address; a
    /// retry can help.
    #[error("cannot reach {what}: {source}")]
    Unavailable {
        /// What could not be reached (never with a password).
        what: String,
        /// The cause.
        #[source]
        source: Box<Error>,
    },
    /// A value given to build the admin cannot be used (a malformed URL); the text says
    /// what is wrong, never with a password. Trying again cannot help: fix the value.
    #[error("invalid {what}: {reason}")]
    Invalid {
        /// What the value was for.
        what: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The broker or store failed the operation; [`Error::is_transient`] says whether a
    /// retry can help. Nothing was changed (operations are atomic per message).
    #[error(transparent)]
    Failed(Box<Error>),
}

impl From<Error> for AdminError {
    fn from(e: Error) -> Self {
        failed(e)
    }
}

/// `e` as [`AdminError::Failed`], or, when a table of Courier's is missing (a database
/// that is not the application's, or one its migrations never ran on), a refusal that
/// says so and what to do.
fn failed(e: Error) -> AdminError {
    match missing_table(&e) {
        Some(table) => AdminError::Refused {
            reason: format!(
                "this database has no table {table}: it is not (yet) a database of Courier's. Name the \
                 database the application's store and transport use, and start the application once \
                 there (it applies Courier's migrations); to apply them without it, see docs/stores.md, \
                 \"Schema\" (on Postgres the schema `courier` must exist first, and the migrations table \
                 is `courier.migrations`, not sqlx's default)"
            ),
        },
        None => AdminError::Failed(Box::new(e)),
    }
}

/// The table a failed statement named that does not exist: Postgres' SQLSTATE 42P01
/// (`relation "courier.saga" does not exist`), SQLite's `no such table: courier_saga`.
fn missing_table(e: &Error) -> Option<String> {
    let db = std::error::Error::source(e)?
        .downcast_ref::<sqlx::Error>()?
        .as_database_error()?;
    let message = db.message();
    if db.code().as_deref() == Some("42P01") {
        let name = message.split('"').nth(1).unwrap_or(message);
        return Some(name.to_owned());
    }
    message.strip_prefix("no such table: ").map(str::to_owned)
}

impl AdminError {
    /// Whether trying again later can succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            AdminError::NotFound { .. } | AdminError::Refused { .. } | AdminError::Invalid { .. } => false,
            // Unreachable is worth another try, unless the broker or database answered
            // with a refusal (a login refused: fix the URL).
            AdminError::Unavailable { source, .. } => {
                source.is_transient() || matches!(source.kind(), crate::ErrorKind::Connection { .. })
            }
            AdminError::Failed(e) => e.is_transient(),
        }
    }

    pub(crate) fn not_found(what: impl Into<String>) -> Self {
        AdminError::NotFound { what: what.into() }
    }

    pub(crate) fn refused(reason: impl Into<String>) -> Self {
        AdminError::Refused { reason: reason.into() }
    }

    /// A failed statement of Courier's tables (the message says what was being done).
    /// Cannot reach `what` (shown without a password).
    pub(crate) fn unavailable(what: impl Into<String>, source: Error) -> Self {
        AdminError::Unavailable {
            what: what.into(),
            source: Box::new(source),
        }
    }

    pub(crate) fn db(what: &'static str, e: sqlx::Error) -> Self {
        failed(crate::store::db_error(what, e))
    }

    /// An error of the library mapped to what an operator acts on.
    pub(crate) fn from_error(e: Error) -> Self {
        match e.kind() {
            ErrorKind::EntityNotFound { path } => AdminError::NotFound { what: path.clone() },
            ErrorKind::Closed => AdminError::Refused {
                reason: "the broker is closed".into(),
            },
            _ => failed(e),
        }
    }
}

/// The result of an operation.
pub type AdminResult<T> = std::result::Result<T, AdminError>;
