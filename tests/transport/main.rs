//! Transport tests: the conformance suite on every transport, and what is particular to
//! the embedded broker (durability across a killed process, reopening a file).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod embedded_durability;
mod embedded_engine;

/// The conformance suite (SEMANTICS.md S1-S6) on the embedded broker.
mod embedded_conformance {
    courier::conformance_suite!(courier_tests::embedded_fixture);
}
