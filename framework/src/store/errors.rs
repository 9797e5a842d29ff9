//! The naming of storage errors: a database's error (sqlx's) becomes a storage error
//! ([`ErrorKind::Storage`]) that says what the database said, escaped, with its SQLSTATE or
//! SQLite error code, and is transient when retrying can help (a serialization failure or
//! a deadlock, SQLite busy or locked, an I/O error, a pool timeout); and the unit tests of
//! that naming.

use crate::error::{Error, ErrorKind};
use crate::logtext::Escaped;

/// Maps a database error to a storage error, transient when retrying can help. Its detail
/// is `context: cause`, the cause as [`db_cause`] says it, so a log line that prints the
/// error (`error = %e`) shows what the database said; the sqlx error stays the source.
pub(crate) fn db_error(context: &'static str, e: sqlx::Error) -> Error {
    let transient = matches!(
        e,
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed
    ) || matches!(&e, sqlx::Error::Database(d) if is_transient_code(d.code().as_deref()));
    Error::with_source(
        ErrorKind::Storage {
            detail: format!("{context}: {}", db_cause(&e)),
            transient,
        },
        e,
    )
}

/// What the database said: for an error it raised, its message and its code
/// (`interval out of range (SQLSTATE 22008)`, `UNIQUE constraint failed: t.id (SQLite
/// error 1555)`), else the error's text. Escaped ([`Escaped`]): a database's message can
/// quote a value that a producer wrote (`invalid input syntax for type uuid: "..."`).
pub(crate) fn db_cause(e: &sqlx::Error) -> String {
    let text = match e {
        sqlx::Error::Database(d) => match d.code() {
            Some(code) if d.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() => {
                format!("{} (SQLite error {code})", d.message())
            }
            Some(code) => format!("{} (SQLSTATE {code})", d.message()),
            None => d.message().to_owned(),
        },
        other => other.to_string(),
    };
    Escaped(&text).to_string()
}

/// Postgres serialization failures, deadlocks and aborted transactions (a new one can
/// succeed), SQLite busy and locked.
fn is_transient_code(code: Option<&str>) -> bool {
    matches!(
        code,
        Some("40001" | "40P01" | "55P03" | "57P01" | "25P02" | "5" | "6" | "517" | "261" | "262")
    )
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::error::Error as _;

    use sqlx::Connection as _;

    use super::db_error;
    use crate::error::ErrorKind;

    /// An error raised by a database: what Postgres sends, without a server.
    #[derive(Debug)]
    struct Raised {
        code: &'static str,
        message: &'static str,
    }

    impl std::fmt::Display for Raised {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.message)
        }
    }

    impl std::error::Error for Raised {}

    impl sqlx::error::DatabaseError for Raised {
        fn message(&self) -> &str {
            self.message
        }
        fn code(&self) -> Option<Cow<'_, str>> {
            Some(Cow::Borrowed(self.code))
        }
        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }

    fn raised(code: &'static str, message: &'static str) -> sqlx::Error {
        sqlx::Error::Database(Box::new(Raised { code, message }))
    }

    #[test]
    fn a_storage_error_says_what_the_database_said_and_keeps_it_as_its_source() {
        let e = db_error(
            "cannot activate scheduled or expired messages",
            raised("22008", "interval out of range"),
        );
        assert_eq!(
            e.kind().to_string(),
            "storage error: cannot activate scheduled or expired messages: interval out of range (SQLSTATE 22008)"
        );
        assert!(e.to_string().starts_with(&e.kind().to_string()), "{e}");
        assert!(!e.is_transient());
        let source = e.source().and_then(|s| s.downcast_ref::<sqlx::Error>());
        assert!(
            matches!(source, Some(sqlx::Error::Database(d)) if d.code().as_deref() == Some("22008")),
            "{source:?}"
        );
        let e = db_error("cannot claim", raised("40001", "could not serialize access"));
        assert!(e.is_transient());
        assert!(
            e.to_string()
                .contains("cannot claim: could not serialize access (SQLSTATE 40001)"),
            "{e}"
        );
    }

    #[test]
    fn an_error_the_database_did_not_raise_is_named_by_its_text() {
        let e = db_error("cannot read the outbox", sqlx::Error::PoolTimedOut);
        assert_eq!(
            e.kind().to_string(),
            format!("storage error: cannot read the outbox: {}", sqlx::Error::PoolTimedOut)
        );
        assert!(e.is_transient());
    }

    #[test]
    fn a_database_message_quoting_a_producer_s_text_is_escaped() {
        let e = db_error(
            "cannot receive messages",
            raised(
                "22P02",
                "invalid input syntax for type uuid: \"x\u{1b}[2J\r\n\u{202e}\"",
            ),
        );
        let ErrorKind::Storage { detail, .. } = e.kind() else {
            panic!("{e}");
        };
        assert_eq!(
            detail,
            "cannot receive messages: invalid input syntax for type uuid: \"x\\u{1b}[2J\\r\\n\\u{202e}\" (SQLSTATE 22P02)"
        );
    }

    #[tokio::test]
    async fn a_sqlite_error_is_named_by_its_sqlite_code() {
        let mut conn = sqlx::SqliteConnection::connect("sqlite::memory:").await.unwrap();
        sqlx::query("CREATE TABLE t (id INTEGER PRIMARY KEY)")
            .execute(&mut conn)
            .await
            .unwrap();
        let insert = || sqlx::query("INSERT INTO t (id) VALUES (1)");
        insert().execute(&mut conn).await.unwrap();
        let e = db_error("cannot insert", insert().execute(&mut conn).await.unwrap_err());
        assert_eq!(
            e.kind().to_string(),
            "storage error: cannot insert: UNIQUE constraint failed: t.id (SQLite error 1555)"
        );
    }
}
