//! Transport tests: the conformance suite on every transport, and what is particular to
//! the embedded broker (durability across a killed process, reopening a file) and to the
//! Postgres transport.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod embedded_durability;
mod embedded_engine;
mod embedded_odd_rows;
mod embedded_row_property;
mod pg_any_envelope;
mod pg_corpus;
mod pg_foreign;
mod pg_listen;
mod pg_odd_rows;
mod pg_one_transaction;
mod pg_pool;
mod pg_publish_new_topic;
mod pg_row_property;
mod pg_send_function;
mod pg_send_path;
mod pg_transport;
mod pg_unit_of_work;
mod pg_wake;

/// A Postgres database of its own with the application's table `effects` (one row per
/// handler effect), for the tests of the one-transaction unit of work.
async fn database_with_effects() -> (courier_tests::pg::TestDatabase, sqlx::PgPool) {
    let db = courier_tests::pg::TestDatabase::create().await;
    let pool = db.pool().await;
    sqlx::query("CREATE TABLE effects (n bigint NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    (db, pool)
}

/// The conformance suite (docs/semantics.md S1-S6) on the embedded broker.
mod embedded_conformance {
    courier::conformance_suite!(courier_tests::embedded_fixture);
}

/// The conformance suite on RabbitMQ (`AMQP_URL`, or testcontainers): the rules it bends
/// are declared and their substitutes checked.
mod amqp_conformance {
    courier::conformance_suite!(courier_tests::rabbit::amqp_fixture);
}

/// The conformance suite on the Postgres transport (`DATABASE_URL`, or testcontainers):
/// the rule it bends (S3.1) is declared and its substitute checked.
mod pg_conformance {
    courier::conformance_suite!(courier_tests::pg_transport::pg_fixture);
}
