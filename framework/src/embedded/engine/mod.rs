//! The embedded broker's engine: one task, on a thread of its own, that owns the SQLite
//! connection and serves every command.
//!
//! Commands that arrive together are served in ONE transaction (group commit), and within
//! it commands of one kind share statements: the sends of a batch are one multi-row
//! INSERT, its completes one DELETE, the receives of one queue one UPDATE. A hundred
//! concurrent sends cost one commit and a couple of statements, which is how pipelined
//! sends (S1.3) become cheap on a single-writer database. Replies are sent only after the
//! commit, so an acknowledged send is durable (S1.1). Receivers that find nothing wait
//! inside the engine and are served as soon as a send, an abandon, an activation or a lock
//! expiry makes a message ready: no polling interval.
//!
//! # Where is X
//!
//! Every file is an `impl Engine` block (or the small types it uses); this one holds only
//! the engine's state and the stored message states.
//!
//! - the loop, group commit, which command goes where: `batch.rs` (`run`, `process`,
//!   `handle`)
//! - the commands the broker's handles send, and the answers held until commit:
//!   `commands.rs`
//! - lending the connection to a store transaction (`EmbeddedStore`): `lease.rs`
//! - what the clock makes due (scheduled messages activated, locks expiring, time to live
//!   running out): `timers.rs` (`maintenance`)
//! - what the broker does with the rows it finds when it opens a file (locks a previous
//!   process left, rows another program wrote: numbered again, dead-lettered, published):
//!   `opening.rs` (`open_file`)
//! - a send, a topic's fan-out, cancelling a scheduled message: `send.rs`
//! - a receive, a receiver waiting for a message, receiving deferred messages:
//!   `receive.rs`
//! - complete, abandon, dead-letter, defer; where a message's lock is renewed:
//!   `settle.rs` (`settle`, `renew`)
//! - accepting a session, a session's lock and state: `sessions.rs`
//! - counting and logging what the broker dead-letters itself, after the commit:
//!   `report.rs`
//! - peek and counts: `browse.rs`
//! - creating, finding and deleting queues, topics and subscriptions: `entities.rs`
//! - row ids, lock tokens, reading a row into a message, SQLite errors: `rows.rs`
//! - the SQL built from literals (columns, filters, multi-row INSERTs): `sql.rs`
//!
//! The engine is reached only through `Command`s on its channel (`embedded/mod.rs`) and
//! the connection it lends (`embedded/store.rs`); nothing outside `embedded/` sees it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use crate::clock::Clock;

#[macro_use]
mod sql;
mod batch;
mod browse;
mod commands;
mod entities;
mod lease;
mod opening;
mod put_back;
mod receive;
mod report;
mod rows;
mod send;
mod sessions;
mod settle;
mod timers;

pub(crate) use self::commands::{
    AcceptRequest, Command, EntityInfo, Finish, Kind, Lease, LockRef, ReceiveMode, ReceiveRequest, SessionKey,
    SessionOp,
};
use self::lease::Conn;
use self::receive::Waiter;
pub(crate) use self::rows::{micros, read_token, storage_error};

/// Message states as stored.
const READY: i64 = 0;
const SCHEDULED: i64 = 1;
const DEFERRED: i64 = 2;
const DEAD: i64 = 3;
const LOCKED: i64 = 4;

/// The engine's state, apart from the connection.
struct State {
    clock: Arc<dyn Clock>,
    epoch: u32,
    entities: HashMap<i64, EntityInfo>,
    by_name: HashMap<(i64, String), i64>,
    subscriptions: HashMap<i64, Vec<i64>>,
    dirty_seq: HashSet<i64>,
    waiters: HashMap<i64, VecDeque<Waiter>>,
    touched: HashSet<i64>,
    /// Clock times (µs) at which something is due: a scheduled message, a lock or a
    /// session lock expiring, a time-to-live running out.
    next_scheduled: Option<i64>,
    next_unlock: Option<i64>,
    next_session_unlock: Option<i64>,
    next_expiry: Option<i64>,
    /// Locks handed to receivers that had gone: `(row id, delivery count)`.
    releases: Vec<(i64, i64)>,
    /// The broker's limit on a message's size: a stored message over it (written by
    /// another program) is refused at receipt.
    max_message_size: usize,
    /// What the broker dead-lettered itself in the current transaction (expired, over the
    /// max delivery count, refused), counted and logged once it commits (`report.rs`).
    dead: Vec<report::DeadNote>,
    /// Which of them are logged in full (`loglimit.rs`).
    dead_log: crate::loglimit::LogLimiter,
}

pub(crate) struct Engine {
    conn: Conn,
    state: State,
    /// Held while the engine runs (the file's lock, the checkpointer's stop signal).
    guards: Vec<Box<dyn std::any::Any + Send>>,
}
