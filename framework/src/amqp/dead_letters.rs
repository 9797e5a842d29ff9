//! The dead letters of a RabbitMQ queue for the operations API ([`AmqpAdmin`]): listing,
//! showing, resubmitting and deleting them, read from the queue's `<queue>::dlq` where
//! they stay.
//!
//! * **Reading moves nothing.** A listing, a show, `all_dead_letters` (a dry run's or a
//!   confirmation page's count) read the DLQ with a [`Browse`]: nothing is acknowledged,
//!   and RabbitMQ gives every message back to the head of the DLQ, in order, when the
//!   reading ends or is cut. A page after `n` reads the DLQ from its head until it has a
//!   page of numbers above `n`: its cost grows with its depth (about 20,000 dead letters a
//!   second here), not with a store.
//! * **Numbers.** A dead letter is numbered the first time a reading meets it, in queue
//!   order, and keeps its number (`catalog.rs`): its identity is a 63-bit FNV-1a hash of
//!   its `x-courier-sequence-number` (if any), message id (the bytes received), AMQP
//!   timestamp and body, what a redelivery does not change.
//! * **Resubmit** reads the DLQ from its head, and for each dead letter asked for
//!   publishes a copy to the queue the DLQ belongs to (a subscription's own queue, not
//!   the topic) with publisher confirms, and once a window of copies is confirmed takes
//!   those dead letters from the DLQ (acknowledges them). The copy is the message
//!   received, byte for byte (a message id that is not UTF-8 stays those bytes, so the
//!   receiver refuses it again with its reason), without the failure and dead-letter
//!   headers, with a new sequence number and enqueued time, and with its time-to-live
//!   again, counted from the resubmit. A crash between the confirms and the
//!   acknowledgements leaves at most a window in both places, with the same message ids,
//!   never in neither; a copy that fails leaves its dead letter in the DLQ. **Delete**
//!   takes them without a copy.
//! * **Parked rows**: dead letters an earlier Courier moved into the schedule store are
//!   listed with the others and changed from the store (`parked.rs`).

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, ShortString};

use super::admin::{AmqpAdmin, ResubmitTo};
use super::browse::{Browse, Held};
use super::catalog::Numbered;
use super::parked::{Parked, Seen};
use super::publish::finish;
use super::schedule::ScheduleStore;
use super::seal::{self, DeadLetterKey};
use super::wire::{
    self, H_DEAD_LETTER_DESCRIPTION, H_DEAD_LETTER_REASON, H_DEAD_LETTER_SOURCE, H_DEAD_LETTER_TIME_TO_LIVE, H_DEATH,
    H_DELIVERY_COUNT, H_ENQUEUED_TIME, H_SEQUENCE_NUMBER, H_TIME_TO_LIVE,
};
use crate::admin::model::{failure_chain, failure_text};
use crate::admin::{AdminError, AdminResult, BatchOutcome, BodyView, DeadLetter, DeadLetterSummary, MAX_PAGE, Page};
use crate::error::ErrorKind;
use crate::message::SequenceNumber;
use crate::recoverability::headers;

/// How many dead letters a reading numbers in one statement, and how many rows of parked
/// dead letters a resubmit or delete reads or deletes at a time.
pub(super) const BATCH: usize = 500;

/// How many copies a resubmit publishes before it waits for their confirms: also the most
/// messages an interrupted resubmit can leave in both places.
const WINDOW: usize = 500;

/// The identity of a dead letter, the same at every delivery of it: a 63-bit FNV-1a hash
/// of its `x-courier-sequence-number` (if any), message id (the bytes received), AMQP
/// timestamp and body. Not the sequence number alone: two processes can stamp the same
/// one (microseconds of their clocks), and two different messages must never be taken
/// for one.
pub(super) fn identify(p: &BasicProperties, body: &[u8]) -> i64 {
    let stamped = p
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get(H_SEQUENCE_NUMBER))
        .and_then(wire::int)
        .unwrap_or(0);
    // FNV-1a, 64 bits: stable across versions and processes (std's hasher is not).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    eat(&stamped.to_le_bytes());
    eat(p.message_id().as_ref().map_or(&b""[..], received_bytes));
    eat(&[0xff]);
    eat(&p.timestamp().unwrap_or(0).to_le_bytes());
    eat(&[0xff]);
    eat(body);
    i64::try_from(h & (i64::MAX as u64)).unwrap_or(i64::MAX)
}

/// The bytes of a short string as RabbitMQ delivered them.
fn received_bytes(s: &ShortString) -> &[u8] {
    s.invalid_utf8().unwrap_or(s.as_str().as_bytes())
}

/// A short string as an operator reads it: its text, or, when the bytes received are not
/// UTF-8, those bytes with each one that is not UTF-8 as `\xNN` (and `\` as `\\`), so two
/// different ids never show as one.
pub(super) fn shown(s: &ShortString) -> String {
    crate::admin::model::shown_bytes(received_bytes(s))
}

/// How many times the message was delivered before it was dead-lettered: the endpoint's
/// failure header when it wrote one, else 0 (RabbitMQ keeps no count across the move; the
/// DLQ's own delivery count rises with every reading, so it is not shown).
fn attempts_of(properties: &crate::message::Properties) -> u32 {
    match properties.get(headers::FAILURE_ATTEMPTS) {
        Some(crate::PropertyValue::Int(n)) => u32::try_from(*n).unwrap_or(0),
        _ => 0,
    }
}

/// The reason of a dead letter whose record has no valid seal and that RabbitMQ did not
/// dead-letter itself (no `x-death`): a producer wrote it, or published it straight into
/// the DLQ, or a transport without a schedule store moved it (`seal.rs`).
const UNVERIFIED_REASON: &str = "Unverified";
const UNVERIFIED_DESCRIPTION: &str = "no valid seal of Courier's on this dead letter's record: a producer may have written \
     it or published the message straight into the dead-letter queue (or its transport had no schedule store to seal it); \
     what it carried is among its headers, marked (unverified)";

/// A dead letter as the admin reads it (`seal::as_read`), decoded: the record is Courier's
/// only with a valid seal; otherwise RabbitMQ's `x-death`, else [`UNVERIFIED_REASON`].
fn decode_read(p: &BasicProperties, body: Vec<u8>, now: DateTime<Utc>, check: &Check<'_>) -> wire::Decoded {
    let (read, verified) = seal::as_read(p, check.queue, check.key);
    let mut m = wire::decode(&read, body, true, false, None, now);
    if !verified {
        // RabbitMQ's `x-death` names the queue it dead-lettered from; one a producer wrote
        // may name anything.
        m.broker.dead_letter_source = m.broker.dead_letter_source.filter(|s| s == check.queue);
        if m.broker.dead_letter_reason.is_none() {
            m.broker.dead_letter_reason = Some(UNVERIFIED_REASON.to_owned());
            m.broker.dead_letter_description = Some(UNVERIFIED_DESCRIPTION.to_owned());
        }
    }
    m
}

/// The failure's text of a decoded dead letter ([`failure_text`]); none for an unverified
/// one (its description says why there is none to show).
fn error_of(headers: &crate::message::Properties, broker: &crate::message::BrokerProperties) -> Option<String> {
    if broker.dead_letter_reason.as_deref() == Some(UNVERIFIED_REASON) {
        return None;
    }
    failure_text(headers, broker.dead_letter_description.as_deref())
}

/// What checks the seals of a queue's dead letters: the queue and its key, if the schedule
/// store keeps a secret for it (none: nothing of this queue was sealed).
pub(super) struct Check<'a> {
    pub(super) queue: &'a str,
    pub(super) key: Option<&'a DeadLetterKey>,
    /// Where a resubmit would send it, when shown in full (`None` in a listing).
    pub(super) resubmit: Option<&'a ResubmitTo>,
}

/// What a listing shows of a dead letter delivered from its DLQ.
fn seen(p: &BasicProperties, body: &[u8], now: DateTime<Utc>, check: &Check<'_>) -> Seen {
    // The body is not needed to decode the headers.
    let m = decode_read(p, Vec::new(), now, check);
    let error = error_of(&m.envelope.properties, &m.broker);
    Seen {
        identity: identify(p, body),
        delivery_count: attempts_of(&m.envelope.properties),
        message_id: p.message_id().as_ref().map_or(m.envelope.message_id, shown),
        message_type: p.kind().as_ref().map(shown).or(m.envelope.message_type),
        reason: m.broker.dead_letter_reason,
        description: m.broker.dead_letter_description,
        error,
        enqueued_at: m.broker.enqueued_time,
        size: body.len(),
    }
}

/// A dead letter in full, from its properties and body.
fn in_full(
    queue: &str,
    sequence_number: SequenceNumber,
    p: &BasicProperties,
    body: Vec<u8>,
    now: DateTime<Utc>,
    check: &Check<'_>,
) -> DeadLetter {
    let body_size = body.len();
    let view = BodyView::decode(&body);
    let m = decode_read(p, body, now, check);
    let mut headers_ = m.envelope.properties;
    // A header whose name is not UTF-8 is no property of the envelope: shown under its
    // bytes in hex, so that an operator sees it (it is why the receiver refused it).
    if let Some(h) = p.headers() {
        for (k, v) in h {
            if let Some(raw) = k.invalid_utf8() {
                let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
                let value = wire::property(v).unwrap_or_else(|| crate::PropertyValue::from(format!("{v:?}")));
                headers_.insert(format!("(not UTF-8, hex {hex})"), value);
            }
        }
    }
    let error = error_of(&headers_, &m.broker);
    let error_chain = failure_chain(&headers_, m.broker.dead_letter_description.as_deref());
    DeadLetter {
        queue: queue.to_owned(),
        sequence_number,
        message_id: p.message_id().as_ref().map_or(m.envelope.message_id, shown),
        message_type: p.kind().as_ref().map(shown).or(m.envelope.message_type),
        correlation_id: p.correlation_id().as_ref().map(shown).or(m.envelope.correlation_id),
        causation_id: m.envelope.causation_id,
        content_type: p.content_type().as_ref().map(shown).or(m.envelope.content_type),
        session_id: m.envelope.session_id,
        enqueued_at: m.broker.enqueued_time,
        delivery_count: attempts_of(&headers_),
        reason: m.broker.dead_letter_reason,
        description: m.broker.dead_letter_description,
        source: m.broker.dead_letter_source,
        error,
        error_chain,
        headers: crate::admin::model::without_seals(headers_),
        body_size,
        body: view,
        resubmit_refused: check.resubmit.and_then(|to| to.target(p).err()),
    }
}

/// The time-to-live a dead letter had, in milliseconds: what Courier kept when it moved
/// it, else its own header (RabbitMQ's dead-lettering keeps headers), else the
/// `original-expiration` RabbitMQ recorded in `x-death`.
fn time_to_live_of(p: &BasicProperties) -> Option<i64> {
    let h = p.headers().as_ref()?.inner();
    let header = |k: &str| h.get(k).and_then(wire::int);
    let death = || match h.get(H_DEATH) {
        Some(AMQPValue::FieldArray(a)) => a.as_slice().iter().find_map(|d| match d {
            AMQPValue::FieldTable(t) => match t.inner().get("original-expiration") {
                Some(AMQPValue::LongString(s)) => std::str::from_utf8(s.as_bytes()).ok()?.parse().ok(),
                Some(AMQPValue::ShortString(s)) => s.as_str().parse().ok(),
                _ => None,
            },
            _ => None,
        }),
        _ => None,
    };
    header(H_DEAD_LETTER_TIME_TO_LIVE)
        .or_else(|| header(H_TIME_TO_LIVE))
        .or_else(death)
        .filter(|ms| wire::time_to_live_of(*ms).is_some())
}

/// A reading of a DLQ that numbers (or only identifies) what it meets.
pub(super) struct Scan<'a> {
    store: &'a ScheduleStore,
    queue: String,
    /// The key that checks the seals of the queue's dead letters, if it has one.
    key: Option<DeadLetterKey>,
    browse: Option<Browse<'a>>,
    numbering: bool,
    started: DateTime<Utc>,
    now: DateTime<Utc>,
    met: Vec<i64>,
}

/// A dead letter met by a [`Scan`].
pub(super) struct Item {
    pub(super) identity: i64,
    /// Its number, when the scan numbers.
    pub(super) number: Option<Numbered>,
    pub(super) seen: Seen,
    pub(super) held: Held,
}

impl<'a> Scan<'a> {
    /// How many dead letters the DLQ held when the scan began.
    pub(super) fn count(&self) -> u64 {
        self.browse.as_ref().map_or(0, Browse::count)
    }

    /// Up to `at_most` more dead letters, in queue order; none at the end.
    pub(super) async fn batch(&mut self, admin: &AmqpAdmin, at_most: usize) -> AdminResult<Vec<Item>> {
        let Some(browse) = self.browse.as_mut() else {
            return Ok(Vec::new());
        };
        let mut items = Vec::new();
        while items.len() < at_most.max(1) {
            match browse.next().await.map_err(|e| admin.failed(e))? {
                Some(held) => {
                    let check = Check {
                        queue: &self.queue,
                        key: self.key.as_ref(),
                        resubmit: None,
                    };
                    let seen = seen(&held.delivery.properties, &held.delivery.data, self.now, &check);
                    items.push(Item {
                        identity: seen.identity,
                        number: None,
                        seen,
                        held,
                    });
                }
                None => break,
            }
        }
        if self.numbering && !items.is_empty() {
            let seen: Vec<Seen> = items.iter().map(|i| i.seen.clone()).collect();
            let numbers = self
                .store
                .number_seen(&self.queue, &seen, self.now)
                .await
                .map_err(|e| admin.failed(e))?;
            for item in &mut items {
                item.number = numbers.get(&item.identity).copied();
                if let Some(n) = item.number {
                    self.met.push(n.number);
                }
            }
        }
        Ok(items)
    }

    /// Takes a dead letter out of the DLQ.
    pub(super) async fn take(&self, admin: &AmqpAdmin, item: &Item) -> AdminResult<()> {
        match &self.browse {
            Some(b) => b.take(&item.held).await.map_err(|e| admin.failed(e)),
            None => Ok(()),
        }
    }

    /// Gives back what was not taken. A numbering scan that met the whole DLQ forgets the
    /// numbers of dead letters it did not meet (they left the DLQ another way).
    pub(super) async fn close(mut self, admin: &AmqpAdmin) -> AdminResult<()> {
        let Some(browse) = self.browse.take() else {
            return Ok(());
        };
        let complete = browse.complete();
        browse.close().await;
        if self.numbering && complete {
            self.store
                .forget_unmet(&self.queue, &self.met, self.started)
                .await
                .map_err(|e| admin.failed(e))?;
        }
        Ok(())
    }
}

impl AmqpAdmin {
    /// Starts reading the DLQ `dlq` of `queue` (nothing to read when there is none).
    async fn scan<'a>(
        &'a self,
        store: &'a ScheduleStore,
        queue: &str,
        dlq: &str,
        numbering: bool,
    ) -> AdminResult<Scan<'a>> {
        let now = self.now_utc();
        let key = self.reading_key(store, queue).await?;
        let browse = Browse::open(self.connector(), dlq).await.map_err(|e| self.failed(e))?;
        Ok(Scan {
            store,
            queue: queue.to_owned(),
            key,
            browse,
            numbering,
            // A row numbered in the same millisecond as the start is not forgotten.
            started: now - chrono::Duration::milliseconds(1),
            now,
            met: Vec::new(),
        })
    }

    /// A page of the dead letters of `name` numbered after `after`: the parked ones from
    /// the store, the others read from the DLQ's head until a page is found.
    pub(super) async fn page(
        &self,
        name: &str,
        after: SequenceNumber,
        limit: u32,
    ) -> AdminResult<Page<DeadLetterSummary>> {
        let store = self.store()?;
        let (queue, dlq) = self.dlq_of(name).await?;
        let limit = usize::try_from(limit.clamp(1, MAX_PAGE)).unwrap_or(50);
        let want = i64::try_from(limit + 1).unwrap_or(i64::MAX);
        let mut items = store
            .parked_page(&queue, after, want)
            .await
            .map_err(|e| self.failed(e))?;
        let parked = store.parked_count(&queue).await.map_err(|e| self.failed(e))?;
        let mut scan = self.scan(store, &queue, &dlq, true).await?;
        let waiting = scan.count();
        let mut listed = HashSet::new();
        let mut fresh = 0;
        let read = async {
            loop {
                let batch = scan.batch(self, (limit + 1 - fresh).min(BATCH)).await?;
                if batch.is_empty() {
                    break;
                }
                for item in batch {
                    let Some(n) = item.number.filter(|n| n.in_rabbitmq && n.number > after) else {
                        continue;
                    };
                    if listed.insert(n.number) {
                        items.push(item.seen.summary(n.number));
                        fresh += 1;
                    }
                }
                if fresh > limit {
                    break;
                }
            }
            AdminResult::Ok(())
        }
        .await;
        scan.close(self).await?;
        read?;
        items.sort_by_key(|d| d.sequence_number);
        Ok(Page::of(items, limit, parked + waiting))
    }

    /// The dead letters of `name` numbered `numbers`, in full, and the numbers not found:
    /// one reading of the DLQ for all of them.
    pub(super) async fn in_full(
        &self,
        name: &str,
        numbers: &[SequenceNumber],
    ) -> AdminResult<(Vec<DeadLetter>, Vec<SequenceNumber>)> {
        let store = self.store()?;
        let (queue, dlq) = self.dlq_of(name).await?;
        let now = self.now_utc();
        let mut found: HashMap<SequenceNumber, DeadLetter> = HashMap::new();
        let mut wanted: HashMap<i64, SequenceNumber> = HashMap::new();
        let key = self.reading_key(store, &queue).await?;
        let to = self.resubmit_to(&queue).await?;
        let check = Check {
            queue: &queue,
            key: key.as_ref(),
            resubmit: Some(&to),
        };
        for chunk in numbers.chunks(BATCH) {
            let rows = store.numbered(&queue, chunk).await.map_err(|e| self.failed(e))?;
            let parked: Vec<i64> = rows.iter().filter(|r| !r.in_rabbitmq).map(|r| r.number).collect();
            for p in store.parked(&queue, &parked).await.map_err(|e| self.failed(e))? {
                found.insert(p.id, in_full(name, p.id, &p.properties, p.body, now, &check));
            }
            wanted.extend(rows.iter().filter(|r| r.in_rabbitmq).map(|r| (r.identity, r.number)));
        }
        if !wanted.is_empty() {
            let mut scan = self.scan(store, &queue, &dlq, false).await?;
            let read = async {
                while found.len() < numbers.len() {
                    let batch = scan.batch(self, BATCH).await?;
                    if batch.is_empty() {
                        break;
                    }
                    for item in batch {
                        if let Some(&n) = wanted.get(&item.identity) {
                            let d = item.held.delivery;
                            found
                                .entry(n)
                                .or_insert_with(|| in_full(name, n, &d.properties, d.data, now, &check));
                        }
                    }
                    if wanted.values().all(|n| found.contains_key(n)) {
                        break;
                    }
                }
                AdminResult::Ok(())
            }
            .await;
            scan.close(self).await?;
            read?;
        }
        let mut out = Vec::new();
        let mut missing = Vec::new();
        let mut asked = HashSet::new();
        for &n in numbers {
            if !asked.insert(n) {
                continue;
            }
            match found.remove(&n) {
                Some(d) => out.push(d),
                None => missing.push(n),
            }
        }
        Ok((out, missing))
    }

    /// The key that checks the seals of `queue`'s dead letters: made from the secret the
    /// schedule store keeps for it, read only (none: nothing of the queue was sealed).
    async fn reading_key(&self, store: &ScheduleStore, queue: &str) -> AdminResult<Option<DeadLetterKey>> {
        let secret = store.find_secret(queue).await.map_err(|e| self.failed(e))?;
        secret
            .map(|s| DeadLetterKey::new(&s))
            .transpose()
            .map_err(|e| self.failed(e))
    }

    /// Every dead letter's number of `name`, in order: the DLQ read whole (and given back).
    pub(super) async fn every_number(&self, name: &str) -> AdminResult<Vec<SequenceNumber>> {
        let store = self.store()?;
        let (queue, dlq) = self.dlq_of(name).await?;
        let mut numbers: Vec<i64> = store.parked_ids(&queue).await.map_err(|e| self.failed(e))?;
        let mut scan = self.scan(store, &queue, &dlq, true).await?;
        let read = async {
            loop {
                let batch = scan.batch(self, BATCH).await?;
                if batch.is_empty() {
                    break;
                }
                numbers.extend(
                    batch
                        .iter()
                        .filter_map(|i| i.number.filter(|n| n.in_rabbitmq))
                        .map(|n| n.number),
                );
            }
            AdminResult::Ok(())
        }
        .await;
        scan.close(self).await?;
        read?;
        numbers.sort_unstable();
        numbers.dedup();
        Ok(numbers)
    }

    /// The properties of a resubmitted copy: those of the dead letter (the bytes received)
    /// without what its failure and dead-lettering added, with a new sequence number and
    /// enqueued time, and its time-to-live again (counted from now).
    fn republished(&self, p: &BasicProperties) -> BasicProperties {
        let mut headers = FieldTable::default();
        if let Some(old) = p.headers() {
            for (k, v) in old {
                let key = k.as_str();
                let added = k.invalid_utf8().is_none()
                    && (headers::is_failure_header(key)
                        || [
                            H_DEAD_LETTER_REASON,
                            H_DEAD_LETTER_DESCRIPTION,
                            H_DEAD_LETTER_SOURCE,
                            H_DEAD_LETTER_TIME_TO_LIVE,
                            super::seal::H_DEAD_LETTER_SEAL,
                        ]
                        .contains(&key)
                        || [
                            H_DEATH,
                            H_DELIVERY_COUNT,
                            H_SEQUENCE_NUMBER,
                            H_ENQUEUED_TIME,
                            H_TIME_TO_LIVE,
                        ]
                        .contains(&key)
                        || key.starts_with("x-first-death-")
                        || key.starts_with("x-last-death-"));
                if !added {
                    headers.insert(k.clone(), v.clone());
                }
            }
        }
        let now = self.now_utc();
        headers.insert(
            H_SEQUENCE_NUMBER.into(),
            AMQPValue::LongLongInt(self.next_sequence_number()),
        );
        headers.insert(H_ENQUEUED_TIME.into(), AMQPValue::LongLongInt(wire::millis(now)));
        let mut copy = p.clone();
        if let Some(ms) = time_to_live_of(p) {
            headers.insert(H_TIME_TO_LIVE.into(), AMQPValue::LongLongInt(ms));
            copy = copy.with_expiration(ShortString::from(ms.to_string()));
        }
        copy.with_headers(headers)
            .with_timestamp(u64::try_from(now.timestamp()).unwrap_or(0))
    }

    /// Publishes copies of parked `rows` to `queue` (confirmed, in windows of [`WINDOW`]),
    /// and deletes each window's confirmed rows in one transaction. Returns (done, failed).
    async fn move_back(
        &self,
        store: &ScheduleStore,
        queue: &str,
        rows: &[Parked],
    ) -> AdminResult<(Vec<SequenceNumber>, Vec<(SequenceNumber, String)>)> {
        let (mut done, mut failed) = (Vec::new(), Vec::new());
        let to = self.resubmit_to(queue).await?;
        for window in rows.chunks(WINDOW) {
            let mut pending = Vec::with_capacity(window.len());
            for p in window {
                let target = match to.target(&p.properties) {
                    Ok(t) => t,
                    Err(why) => {
                        failed.push((p.id, why));
                        continue;
                    }
                };
                let confirm = self
                    .publish_copy(&target, self.republished(&p.properties), &p.body)
                    .await?;
                pending.push((p.id, target, confirm));
            }
            let mut confirmed = Vec::with_capacity(pending.len());
            let mut missing = false;
            for (id, target, confirm) in pending {
                match finish(&target, confirm).await {
                    Ok(()) => confirmed.push(id),
                    Err(e) if matches!(e.kind(), ErrorKind::EntityNotFound { .. }) => missing = true,
                    Err(e) => failed.push((id, e.to_string())),
                }
            }
            // Only now leave the table: a crash before this commit leaves them in both.
            store.unpark(queue, &confirmed).await.map_err(|e| self.failed(e))?;
            done.extend(confirmed);
            if missing {
                return Err(AdminError::not_found(format!("queue {queue}")));
            }
        }
        Ok((done, failed))
    }

    /// Resubmits (or deletes) the dead letters of `name` numbered `numbers`.
    pub(super) async fn change(
        &self,
        name: &str,
        numbers: &[SequenceNumber],
        resubmit: bool,
    ) -> AdminResult<BatchOutcome> {
        let store = self.store()?;
        let (queue, dlq) = self.dlq_of(name).await?;
        let mut asked = HashSet::new();
        let wanted: Vec<SequenceNumber> = numbers.iter().copied().filter(|s| asked.insert(*s)).collect();
        let mut outcome = BatchOutcome::default();
        let mut targets: HashMap<i64, SequenceNumber> = HashMap::new();
        for chunk in wanted.chunks(BATCH) {
            let rows = store.numbered(&queue, chunk).await.map_err(|e| self.failed(e))?;
            let parked: Vec<i64> = rows.iter().filter(|r| !r.in_rabbitmq).map(|r| r.number).collect();
            if resubmit {
                let rows = store.parked(&queue, &parked).await.map_err(|e| self.failed(e))?;
                let (done, failed) = self.move_back(store, &queue, &rows).await?;
                outcome.done.extend(done);
                outcome.failed.extend(failed);
            } else {
                outcome
                    .done
                    .extend(store.unpark(&queue, &parked).await.map_err(|e| self.failed(e))?);
            }
            targets.extend(rows.iter().filter(|r| r.in_rabbitmq).map(|r| (r.identity, r.number)));
        }
        if !targets.is_empty() {
            let (done, failed) = self
                .take_from_dlq(store, &queue, &dlq, targets.clone(), resubmit)
                .await?;
            // Forgotten once taken; a number not met in the DLQ is gone (another program
            // took it): forgotten too, and reported as not found.
            let all: Vec<i64> = targets.values().copied().collect();
            let failed_numbers: HashSet<i64> = failed.iter().map(|(n, _)| *n).collect();
            let forget: Vec<i64> = all.into_iter().filter(|n| !failed_numbers.contains(n)).collect();
            for chunk in forget.chunks(BATCH) {
                store.unpark(&queue, chunk).await.map_err(|e| self.failed(e))?;
            }
            outcome.done.extend(done);
            outcome.failed.extend(failed);
        }
        let settled: HashSet<i64> = outcome
            .done
            .iter()
            .copied()
            .chain(outcome.failed.iter().map(|(n, _)| *n))
            .collect();
        outcome.not_found = wanted.into_iter().filter(|s| !settled.contains(s)).collect();
        outcome.done.sort_unstable();
        Ok(outcome)
    }

    /// Reads the DLQ from its head and takes the dead letters of `targets` (identity to
    /// number): for a resubmit once their copies are confirmed, in windows. Returns the
    /// numbers done and those that failed (left in the DLQ).
    async fn take_from_dlq(
        &self,
        store: &ScheduleStore,
        queue: &str,
        dlq: &str,
        mut targets: HashMap<i64, SequenceNumber>,
        resubmit: bool,
    ) -> AdminResult<(Vec<SequenceNumber>, Vec<(SequenceNumber, String)>)> {
        let to = self.resubmit_to(queue).await?;
        let mut scan = self.scan(store, queue, dlq, false).await?;
        let mut done = Vec::new();
        let mut failed = Vec::new();
        let run = async {
            while !targets.is_empty() {
                let batch = scan.batch(self, WINDOW).await?;
                if batch.is_empty() {
                    break;
                }
                let mut pending = Vec::new();
                for item in batch {
                    let Some(n) = targets.remove(&item.identity) else {
                        continue;
                    };
                    if resubmit {
                        let d = &item.held.delivery;
                        // Left in the DLQ, with why, when it has nowhere to go.
                        let target = match to.target(&d.properties) {
                            Ok(t) => t,
                            Err(why) => {
                                failed.push((n, why));
                                continue;
                            }
                        };
                        let confirm = self
                            .publish_copy(&target, self.republished(&d.properties), &d.data)
                            .await?;
                        pending.push((n, item, Some((target, confirm))));
                    } else {
                        pending.push((n, item, None));
                    }
                }
                let mut missing = false;
                for (n, item, confirm) in pending {
                    let published = match confirm {
                        Some((target, c)) => finish(&target, c).await,
                        None => Ok(()),
                    };
                    match published {
                        // Only now out of the DLQ: a crash before leaves it in both.
                        Ok(()) => {
                            scan.take(self, &item).await?;
                            done.push(n);
                        }
                        Err(e) if matches!(e.kind(), ErrorKind::EntityNotFound { .. }) => missing = true,
                        Err(e) => failed.push((n, e.to_string())),
                    }
                }
                if missing {
                    return Err(AdminError::not_found(format!("queue {queue}")));
                }
            }
            AdminResult::Ok(())
        }
        .await;
        scan.close(self).await?;
        run?;
        Ok((done, failed))
    }
}
