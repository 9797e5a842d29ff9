//! The property of `pg_row_property` (issue 30, "Make the class impossible") on the
//! embedded broker's file: no row another program writes into `courier_message` (while no
//! broker has the file open, as docs/embedded-broker.md says) stops the broker, stops a
//! queue, breaks a send, hides the message behind it or sits where no receive looks.
//!
//! The table is `STRICT`, with `CHECK` constraints for what no Courier sender writes
//! (`migrations/sqlite/20261129000002_embedded_row_checks.sql`; docs/embedded-broker.md,
//! "Rows written by another program"). The generator writes every value of the columns'
//! own types (NULLs, the extremes of every integer, times in microseconds near the virtual
//! clock's now, near the 100-year horizon and at `i64::MIN`/`MAX`, every state 0-4 and
//! others, text that is not UTF-8, empty, 128/129-byte and 1-MiB texts and bodies,
//! properties of any JSON shape), and in a third of the cases values of other types too
//! (a real, a text or a blob where an integer belongs, a blob in a text column, a text as
//! the body, NULL in a NOT NULL column): those the table refuses, which is a legal
//! outcome, so the other two thirds keep most rows for the broker to handle. Row ids are
//! `entity << 40 | seq` and the entity's `next_seq` is raised past the row, as
//! `tests/endpoint/corpus.rs` writes them; a case may also break that (an id of another
//! entity, a sequence number the broker will hand out next, the last one there is).
//!
//! Each case opens the broker on one file (kept for the run), creates the entities (a
//! queue, a topic with a subscription, or a queue that requires sessions), closes it,
//! writes the row with SQL, opens the broker again, sends a valid message through it, and
//! receives (PeekLock, completing what it gets; `accept_session(Next)` on the session
//! queue), moves the virtual clock 15 s and receives again. The oracle is
//! `pg_row_property`'s: the row is refused by SQLite (a constraint), or received, or
//! dead-lettered with a reason and a description, or scheduled within 100 years, or
//! locked until at most the lock duration + 5 min (the broker's own lock), or deferred
//! and got by `receive_deferred`; the valid message is received exactly once; the broker
//! opens; no receive fails; nothing is lost. A row of an entity that does not exist is
//! not judged (no queue holds it), but must not stop anything either.
//!
//! ```text
//! cargo test -p courier-tests --test transport embedded_row_property    # 300 cases, ~12 s
//! COURIER_FUZZ_CASES=20000 cargo test -p courier-tests --test transport \
//!     embedded_row_property -- --nocapture                            # a long run, ~12 min
//! ```
//!
//! `COURIER_ROW_SEED` and `COURIER_ROW_SURVEY` work as in `pg_row_property`. Each class it
//! found on the tree of 2026-11-28 has a regression test in `embedded_odd_rows.rs` (or,
//! for a file written before the table's rules, `framework/src/embedded/engine/opening.rs`).
//!
//! The files:
//!
//! * `row.rs`: the generated row (every column of `courier_message`, each a value of any
//!   SQLite type) and how it is written into the file;
//! * `strategy.rs`: the generator of rows;
//! * `env.rs`: the environment shared by the cases (the file, the clock, the tally) and the
//!   entities of a case, made and removed;
//! * `case.rs`: one case (the row written, the broker opened, the receives) and the oracle
//!   that judges what is left;
//! * this file: the test.

mod case;
mod env;
mod row;
mod strategy;

// What the files here use of `pg_row_property` (its generator, receives, oracle's classes
// and runner), imported once for all of them.
use super::pg_row_property::{
    Failure, HORIZON_DAYS, Json, LOCK_GRACE_MS, MAX_TTL, Outcome, PAST_ONE_PERIOD, Seen, Shape, Target, abbreviate,
    cases, class, fail, offset, properties, round, run, runtime, shape, take_deferred, target, text_value,
};

use env::Env;
use strategy::row;

/// The property on the embedded broker's file (see the module's doc).
#[test]
fn any_row_written_into_the_file_is_refused_received_dead_lettered_or_explained_and_the_valid_message_is_received_once()
{
    let rt = runtime();
    let env = Env::new();
    let started = std::time::Instant::now();
    let result = run("embedded_row_property", cases(300), row(), |row| {
        let outcome = rt.block_on(env.case(row))?;
        match &outcome.refused {
            Some(code) => env.count(format!("refused ({code})")),
            None if outcome.received > 0 => env.count("received"),
            None => {}
        }
        for end in &outcome.ends {
            env.count(*end);
        }
        Ok(())
    });
    eprintln!(
        "embedded_row_property: {:.1} s; outcomes: {:?}",
        started.elapsed().as_secs_f64(),
        env.tally.lock().unwrap()
    );
    if let Err(report) = result {
        panic!("{report}");
    }
}
