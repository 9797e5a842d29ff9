//! Sending: the sends of a batch become as few multi-row INSERTs as possible; a topic's
//! message is copied to each subscription; a scheduled message can be cancelled.
//!
//! Holds: `send_all`, `rows_for_send`, `insert_rows`, `cancel` and `flush_sequences`
//! (the entities' next sequence numbers, written once per batch). The checks a sender
//! makes before a message is accepted live in `embedded/mod.rs` (`check_envelope`).

use crate::error::{Error, ErrorKind, Result};
use crate::message::{Envelope, SequenceNumber};

use super::commands::{Outcome, SendCommand, outcome};
use super::rows::{NewRow, Sql, row_id};
use super::sql::INSERTS;
use super::{Engine, READY, SCHEDULED, State};

impl Engine {
    /// Serves the sends of a batch with as few INSERT statements as possible.
    pub(super) async fn send_all(&mut self, sends: Vec<SendCommand>, now: i64, outcomes: &mut Vec<Outcome>) -> Sql {
        if sends.is_empty() {
            return Ok(());
        }
        let mut rows = Vec::new();
        for (entity, messages, reply) in sends {
            let result = self.rows_for_send(entity, messages, now, &mut rows);
            match reply {
                Some(reply) => outcomes.push(outcome(reply, result)),
                None => {
                    if let Err(e) = result {
                        tracing::warn!(error = %e, "a pre-settled send failed; its sender is not told (S1.5)");
                    }
                }
            }
        }
        self.insert_rows(&rows).await
    }

    pub(super) fn rows_for_send(
        &mut self,
        entity: i64,
        messages: Vec<Envelope>,
        now: i64,
        rows: &mut Vec<NewRow>,
    ) -> Result<Vec<SequenceNumber>> {
        let info = self.state.entity(entity)?.clone();
        let first = self.state.alloc_seq(entity, messages.len() as i64)?;
        let seqs: Vec<SequenceNumber> = (first..first + messages.len() as i64).collect();
        for (seq, msg) in seqs.iter().zip(messages) {
            self.state.rows_for(&info, *seq, msg, now, rows);
        }
        Ok(seqs)
    }

    pub(super) async fn insert_rows(&mut self, rows: &[NewRow]) -> Sql {
        // A copy written dead-lettered (a session subscription and no session id, a
        // scheduled or taken message refused) is the broker's own dead-lettering.
        for r in rows {
            if let Some(d) = &r.dead {
                let id = r.fields.message_id.as_str();
                let description = d.description.as_deref().unwrap_or_default();
                self.state.dead_lettered(&d.source, &d.reason, 1, id, id, description);
            }
        }
        let mut rest = rows;
        while !rest.is_empty() {
            let Some((n, sql)) = INSERTS.iter().find(|(n, _)| *n <= rest.len()) else {
                break;
            };
            let (chunk, tail) = rest.split_at(*n);
            rest = tail;
            let sql: &'static str = sql.as_str();
            let mut q = sqlx::query(sql);
            for r in chunk {
                let f = &r.fields;
                q = q
                    .bind(r.id)
                    .bind(r.entity)
                    .bind(r.seq)
                    .bind(r.state)
                    .bind(f.session_id.as_deref())
                    .bind(r.enqueued_at)
                    .bind(r.scheduled_at)
                    .bind(r.expires_at)
                    .bind(r.ttl_ms)
                    .bind(f.message_id.as_str())
                    .bind(f.correlation_id.as_deref())
                    .bind(f.causation_id.as_deref())
                    .bind(f.message_type.as_deref())
                    .bind(f.content_type.as_deref())
                    .bind(f.reply_to.as_deref())
                    .bind(f.properties.as_deref())
                    .bind(r.dead.as_ref().map(|d| d.reason.as_ref()))
                    .bind(r.dead.as_ref().and_then(|d| d.description.as_deref()))
                    .bind(r.dead.as_ref().map(|d| d.source.as_str()))
                    .bind(&f.body[..]);
            }
            q.execute(self.conn.get()?).await?;
        }
        for r in rows {
            match r.state {
                READY => {
                    State::note(&mut self.state.next_expiry, r.expires_at);
                    self.state.touched.insert(r.entity);
                }
                SCHEDULED => State::note(&mut self.state.next_scheduled, r.scheduled_at),
                _ => {
                    self.state.touched.insert(r.entity);
                }
            }
        }
        Ok(())
    }

    pub(super) async fn cancel(&mut self, entity: i64, seq: SequenceNumber) -> Sql<Result<()>> {
        let done = sqlx::query("DELETE FROM courier_message WHERE id = ?1 AND state = 1")
            .bind(row_id(entity, seq))
            .execute(self.conn.get()?)
            .await?;
        Ok(if done.rows_affected() == 1 {
            Ok(())
        } else {
            Err(Error::new(ErrorKind::MessageNotFound {
                sequence_number: seq,
                expected: "scheduled",
            }))
        })
    }

    pub(super) async fn flush_sequences(&mut self) -> Sql {
        for id in std::mem::take(&mut self.state.dirty_seq) {
            if let Some(info) = self.state.entities.get(&id) {
                sqlx::query("UPDATE courier_entity SET next_seq = ?1 WHERE id = ?2")
                    .bind(info.next_seq)
                    .bind(id)
                    .execute(self.conn.get()?)
                    .await?;
            }
        }
        Ok(())
    }
}
