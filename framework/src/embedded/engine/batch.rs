//! The batch loop: the engine's task takes the commands that arrived together and serves
//! them in ONE transaction (group commit), then answers them after the commit.
//!
//! Holds: starting the engine (`start`), the loop (`run`, `gather`, the linger that lets
//! concurrent callers join a batch), one batch (`process`: maintenance first, then the
//! commands, sends, completes and receives each sharing statements), answering
//! (`deliver`), recovery after a rollback and shutting down, and `handle`, which routes
//! one command to the file that serves it. Serving a command is not done here.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use sqlx::sqlite::SqliteConnection;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::clock::Clock;
use crate::entity::SubQueue;
use crate::error::{Error, ErrorKind, Result};
use crate::transport::Settlement;

use super::commands::Lease;
use super::commands::{Command, Outcome, Reply, answer, outcome};
use super::entities::load_entities;
use super::lease::Conn;
use super::receive::Waiter;
use super::rows::{Sql, from_micros, read_token, storage, storage_error};
use super::timers::refresh_due_times;
use super::{Engine, State};

/// The most commands served in one transaction.
pub(super) const MAX_BATCH: usize = 512;
/// Batches of at least this many commands make the engine linger for the next one.
pub(super) const LINGER_AFTER: usize = 4;
/// How long the engine lingers at most.
pub(super) const LINGER: std::time::Duration = std::time::Duration::from_micros(150);

impl Engine {
    /// The engine on `conn`, with the broker's `max_message_size` (a stored message over
    /// it is refused at receipt, as a send refuses it).
    pub(crate) async fn start(
        conn: SqliteConnection,
        clock: Arc<dyn Clock>,
        epoch: u32,
        max_message_size: usize,
    ) -> Result<Self> {
        let state = State {
            clock: clock.clone(),
            epoch,
            entities: HashMap::new(),
            by_name: HashMap::new(),
            subscriptions: HashMap::new(),
            dirty_seq: HashSet::new(),
            waiters: HashMap::new(),
            touched: HashSet::new(),
            next_scheduled: None,
            next_unlock: None,
            next_session_unlock: None,
            next_expiry: None,
            releases: Vec::new(),
            max_message_size,
            dead: Vec::new(),
            dead_log: crate::endpoint::metrics::transport_dead_letter_log(clock.clone()),
        };
        let mut engine = Self {
            conn: Conn(Some(conn)),
            state,
            guards: Vec::new(),
        };
        // Locks a previous process left, rows another program wrote (`opening.rs`).
        engine.open_file().await.map_err(storage_error)?;
        Ok(engine)
    }

    /// Keeps `guard` alive until the engine has closed its connection.
    pub(crate) fn keep(&mut self, guard: Box<dyn std::any::Any + Send>) {
        self.guards.push(guard);
    }

    pub(crate) async fn run(mut self, mut rx: mpsc::Receiver<Command>) {
        let mut batch: Vec<Command> = Vec::with_capacity(MAX_BATCH);
        let mut last_batch = 0;
        loop {
            let wake_clock = self.next_clock_wake();
            let wake_real = self.next_waiter_deadline();
            let clock_sleep = wake_clock.map(|t| self.state.clock.sleep_until(from_micros(t)));
            tokio::select! {
                cmd = rx.recv() => match cmd {
                    Some(c) => batch.push(c),
                    None => break,
                },
                () = async {
                    match clock_sleep { Some(s) => s.await, None => std::future::pending().await }
                } => {}
                () = async {
                    match wake_real { Some(t) => tokio::time::sleep_until(t).await, None => std::future::pending().await }
                } => {}
            }
            self.gather(&mut rx, &mut batch, last_batch);
            last_batch = batch.len();
            let close = batch
                .iter()
                .position(|c| matches!(c, Command::Close { .. }))
                .map(|i| batch.split_off(i));
            let lends: Vec<Reply<Lease>> = batch
                .extract_if(.., |c| matches!(c, Command::Lend { .. }))
                .filter_map(|c| match c {
                    Command::Lend { reply } => Some(reply),
                    _ => None,
                })
                .collect();
            self.process(std::mem::take(&mut batch)).await;
            for reply in lends {
                self.lend(reply).await;
            }
            if let Some(rest) = close {
                self.shut_down(rest, &mut rx).await;
                return;
            }
        }
        self.shut_down(Vec::new(), &mut rx).await;
    }

    /// Takes what else is waiting. When the last batch showed concurrent callers, lingers
    /// a little for more: their commands are on their way, and one commit for all of them
    /// costs far less than one each (group commit).
    pub(super) fn gather(&self, rx: &mut mpsc::Receiver<Command>, batch: &mut Vec<Command>, last_batch: usize) {
        let linger = if last_batch >= LINGER_AFTER {
            LINGER
        } else {
            std::time::Duration::ZERO
        };
        let start = std::time::Instant::now();
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(c) => batch.push(c),
                Err(_) if start.elapsed() < linger && batch.len() < last_batch => std::thread::yield_now(),
                Err(_) => break,
            }
        }
    }

    pub(super) async fn shut_down(mut self, rest: Vec<Command>, rx: &mut mpsc::Receiver<Command>) {
        rx.close();
        let closed = ErrorKind::Closed;
        for (_, waiters) in self.state.waiters.drain() {
            for w in waiters {
                w.fail(|| Error::new(closed.clone()));
            }
        }
        let mut close_replies = Vec::new();
        let mut rest = rest.into_iter().collect::<VecDeque<_>>();
        while let Ok(cmd) = rx.try_recv() {
            rest.push_back(cmd);
        }
        for cmd in rest {
            match cmd {
                Command::Close { reply } => close_replies.push(reply),
                other => other.fail(&closed),
            }
        }
        if let Err(e) = self.conn.close().await {
            tracing::warn!(error = %e, "closing the embedded broker's database failed");
        }
        self.guards.clear();
        for r in close_replies {
            let _ = r.send(());
        }
    }

    pub(super) fn next_clock_wake(&self) -> Option<i64> {
        let s = &self.state;
        [s.next_scheduled, s.next_unlock, s.next_session_unlock, s.next_expiry]
            .into_iter()
            .flatten()
            .min()
    }

    pub(super) fn next_waiter_deadline(&self) -> Option<Instant> {
        self.state
            .waiters
            .values()
            .flat_map(|q| q.iter().filter_map(Waiter::deadline))
            .min()
    }

    pub(super) async fn process(&mut self, batch: Vec<Command>) {
        let mut outcomes: Vec<Outcome> = Vec::with_capacity(batch.len());
        let mut pending: VecDeque<Command> = VecDeque::with_capacity(batch.len());
        for cmd in batch {
            // Given back first (by `maintenance`), so the receives of this batch find them.
            match cmd {
                Command::Release { locks } => self.state.releases.extend(locks),
                other => pending.push_back(other),
            }
        }
        let result: Sql = async {
            sqlx::query("BEGIN IMMEDIATE").execute(self.conn.get()?).await?;
            let now = self.state.now();
            self.maintenance(now).await?;
            // Commands of one kind share statements: sends, completes and receives are
            // gathered and served together after the others, in arrival order.
            let mut sends = Vec::new();
            let mut completes = Vec::new();
            let mut receives = Vec::new();
            while let Some(cmd) = pending.pop_front() {
                match cmd {
                    Command::Send {
                        entity,
                        messages,
                        reply,
                    } => sends.push((entity, messages, reply)),
                    Command::Settle {
                        lock,
                        settlement: Settlement::Complete,
                        reply,
                    } if lock.sub_queue == SubQueue::Main && lock.session.is_none() => completes.push((lock, reply)),
                    Command::Receive(r) => receives.push(r),
                    other => {
                        if let Some(o) = self.handle(other, now).await? {
                            outcomes.push(o);
                        }
                    }
                }
            }
            self.send_all(sends, now, &mut outcomes).await?;
            self.complete_all(completes, now, &mut outcomes).await?;
            self.receive_all(receives, now, &mut outcomes).await?;
            self.serve_waiters(now, &mut outcomes).await?;
            self.flush_sequences().await?;
            sqlx::query("COMMIT").execute(self.conn.get()?).await?;
            Ok(())
        }
        .await;
        match result {
            Ok(()) => {
                self.report_dead();
                self.deliver(outcomes);
            }
            Err(e) => {
                // Rolled back: nothing of it was dead-lettered.
                self.state.dead.clear();
                let kind = storage(&e);
                tracing::error!(error = %e, "embedded broker transaction failed; its commands are answered with an error");
                if let Ok(c) = self.conn.get() {
                    let _ = sqlx::query("ROLLBACK").execute(c).await;
                }
                for o in outcomes {
                    match o {
                        Outcome::Reply(f) => f(Some(&kind)),
                        Outcome::Received { reply, .. } => answer(reply, &kind),
                    }
                }
                for cmd in pending {
                    cmd.fail(&kind);
                }
                self.after_rollback().await;
            }
        }
        self.expire_waiters();
    }

    /// Sends the answers of a committed transaction.
    pub(super) fn deliver(&mut self, outcomes: Vec<Outcome>) {
        for o in outcomes {
            match o {
                Outcome::Reply(f) => f(None),
                Outcome::Received {
                    locked,
                    reply,
                    messages,
                } => {
                    if let Err(Ok(messages)) = reply.send(Ok(messages))
                        && locked
                    {
                        // The receiver went away: give the messages back.
                        for m in messages {
                            if let Some((_, id, dc)) = m.broker.lock_token.and_then(|t| read_token(self.state.epoch, t))
                            {
                                self.state.releases.push((id, dc));
                            }
                        }
                    }
                }
            }
        }
    }

    /// Forgets what a rolled back transaction changed in memory: the cache may hold
    /// entities or sequence numbers of the rolled back work.
    pub(super) async fn after_rollback(&mut self) {
        self.state.dirty_seq.clear();
        self.state.touched.clear();
        let Ok(conn) = self.conn.get() else { return };
        if let Err(e) = load_entities(conn, &mut self.state).await {
            tracing::error!(error = %e, "reloading the embedded broker's entities failed");
        }
        // A row written into the file in a store transaction (a lease) at a number a send
        // was then given fails that send's batch once: its counter moves past it here.
        let synced: Sql = async {
            self.sync_sequences().await?;
            self.flush_sequences().await
        }
        .await;
        if let Err(e) = synced {
            tracing::error!(error = %e, "checking the embedded broker's sequence numbers failed");
        }
        let Ok(conn) = self.conn.get() else { return };
        if let Err(e) = refresh_due_times(conn, &mut self.state).await {
            tracing::error!(error = %e, "reloading the embedded broker's timers failed");
        }
    }

    pub(super) async fn handle(&mut self, cmd: Command, now: i64) -> Sql<Option<Outcome>> {
        Ok(Some(match cmd {
            Command::Create {
                kind,
                topic,
                name,
                options,
                reply,
            } => {
                let r = self.create(kind, topic, name, &options, now).await?;
                outcome(reply, r)
            }
            Command::Delete { path, reply } => {
                let r = self.delete(&path).await?;
                outcome(reply, r)
            }
            Command::Resolve { path, for_send, reply } => outcome(reply, self.resolve(&path, for_send)),
            Command::Send {
                entity,
                messages,
                reply,
            } => {
                let mut outcomes = Vec::new();
                self.send_all(vec![(entity, messages, reply)], now, &mut outcomes)
                    .await?;
                return Ok(outcomes.pop());
            }
            Command::Cancel { entity, seq, reply } => {
                let r = self.cancel(entity, seq).await?;
                outcome(reply, r)
            }
            Command::Receive(req) => {
                let mut outcomes = Vec::new();
                self.receive_all(vec![req], now, &mut outcomes).await?;
                return Ok(outcomes.pop());
            }
            Command::ReceiveDeferred {
                entity,
                seqs,
                session,
                reply,
            } => match self.receive_deferred(entity, &seqs, session.as_ref(), now).await? {
                Ok(messages) => Outcome::Received {
                    locked: true,
                    reply,
                    messages,
                },
                Err(e) => outcome(reply, Err(e)),
            },
            Command::Settle {
                lock,
                settlement,
                reply,
            } => {
                let r = self.settle(&lock, settlement, now).await?;
                outcome(reply, r)
            }
            Command::Renew { lock, reply } => {
                let r = self.renew(&lock, now).await?;
                outcome(reply, r)
            }
            Command::Accept(req) => return self.accept(req, now).await,
            Command::Session { entity, key, op } => return self.session_op(entity, &key, op, now).await,
            Command::Peek {
                entity,
                sub_queue,
                from,
                max,
                reply,
            } => {
                let r = self.peek(entity, sub_queue, from, max, now).await?;
                outcome(reply, r)
            }
            Command::Counts { entity, reply } => {
                let r = self.counts(entity).await?;
                outcome(reply, r)
            }
            Command::Close { reply } => {
                let _ = reply.send(());
                return Ok(None);
            }
            Command::Release { locks } => {
                // `process` takes these out of the batch; here only for completeness.
                self.state.releases.extend(locks);
                return Ok(None);
            }
            Command::Lend { reply } => {
                // `run` takes leases out of the batch before it is processed.
                answer(
                    reply,
                    &ErrorKind::Storage {
                        detail: "a lease cannot be served inside a batch".into(),
                        transient: true,
                    },
                );
                return Ok(None);
            }
        }))
    }
}
