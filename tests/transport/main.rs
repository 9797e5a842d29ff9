//! Transport tests: the conformance suite on every transport, and what is particular to
//! the embedded broker (durability across a killed process, reopening a file) and to the
//! Postgres transport.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod embedded_durability;
mod embedded_engine;
mod pg_corpus;
mod pg_foreign;
mod pg_one_transaction;
mod pg_transport;
mod pg_unit_of_work;

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
