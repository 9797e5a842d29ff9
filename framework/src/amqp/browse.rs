//! Reading a dead-letter queue without taking its messages: what the operations API
//! ([`AmqpAdmin`](super::admin::AmqpAdmin)) lists, shows, counts for a confirmation and
//! runs dry, and where a resubmit or delete finds the messages it takes.
//!
//! RabbitMQ cannot page a queue or read a message in place. A [`Browse`] consumes the DLQ
//! with manual acknowledgements and acknowledges nothing it is not told to
//! ([`Browse::take`]): at the end ([`Browse::close`]) it cancels its consumers and closes
//! its channels in the order it opened them, and RabbitMQ gives every message back to the
//! head of the queue, in the order it had. A crash, a dropped future or a lost connection
//! gives them back too (RabbitMQ returns what a closed channel held): reading moves nothing.
//!
//! A quorum queue hands one consumer at most 2,000 unacknowledged messages (RabbitMQ
//! 3.10), so a browse holds [`PER_CHANNEL`] messages per channel and opens the next
//! channel when one is full; it reads at most what the DLQ held when it began, so the
//! messages dead-lettered meanwhile (at the back) are left for the next reading. The DLQ's
//! own delivery count of a browsed message rises (RabbitMQ counts the return); a DLQ has no
//! delivery limit, and Courier shows the count its endpoint wrote, not that one.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use futures_lite::StreamExt;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Consumer};
use uuid::Uuid;

use super::conn::{Connector, connection_error, reply_code};
use crate::error::Result;

/// How many unacknowledged messages one channel of a browse holds: below the 2,000 a
/// quorum queue hands one consumer.
pub(crate) const PER_CHANNEL: u16 = 1000;

/// How long a browse waits for the next message before it asks the DLQ whether it still
/// has ready messages.
const IDLE: Duration = Duration::from_millis(500);

/// How long [`Browse::close`] waits for RabbitMQ to count what it gave back (another
/// program taking messages from the DLQ meanwhile would keep the count below).
const SETTLE: Duration = Duration::from_secs(5);

/// How many [`IDLE`] waits in a row a browse sits out while the DLQ says it has ready
/// messages, before it ends short (RabbitMQ delivering nothing for 15 s).
const MAX_STALLS: u32 = 30;

/// A message of the DLQ, held (not acknowledged) by a [`Browse`].
pub(crate) struct Held {
    pub(crate) delivery: Delivery,
    /// Which of the browse's channels holds it.
    channel: usize,
}

/// One consuming channel of a browse.
struct Reader {
    channel: Channel,
    tag: String,
    consumer: Consumer,
    /// Delivered and not taken: RabbitMQ delivers no more than the prefetch of them.
    outstanding: AtomicU32,
}

/// A reading of a DLQ that takes nothing it is not told to (module docs).
pub(crate) struct Browse<'a> {
    conn: &'a Connector,
    dlq: String,
    readers: Vec<Reader>,
    /// Every channel opened to read, from the moment it opens (before it consumes): a
    /// browse dropped while it starts a consumer still closes it.
    opened: Vec<Channel>,
    /// What the DLQ held when the browse began: it reads no more.
    count: u64,
    /// The DLQ's consumers when the browse began (another reading, a program consuming it).
    others: u32,
    seen: u64,
    /// How many it took (acknowledged).
    taken: AtomicU64,
    stalls: u32,
}

impl<'a> Browse<'a> {
    /// Starts reading `dlq`; `None` when there is no such queue.
    pub(crate) async fn open(conn: &'a Connector, dlq: &str) -> Result<Option<Self>> {
        let (count, others) = match conn.passive_declare(dlq).await? {
            Ok(q) => (u64::from(q.message_count()), q.consumer_count()),
            Err(e) if reply_code(&e) == Some(404) => return Ok(None),
            Err(e) => return Err(connection_error("cannot look up a dead-letter queue", &e)),
        };
        Ok(Some(Self {
            conn,
            dlq: dlq.to_owned(),
            readers: Vec::new(),
            opened: Vec::new(),
            count,
            others,
            seen: 0,
            taken: AtomicU64::new(0),
            stalls: 0,
        }))
    }

    /// How many messages the DLQ held when the browse began.
    pub(crate) fn count(&self) -> u64 {
        self.count
    }

    /// Whether the browse met every message of the DLQ: it read what the DLQ held at the
    /// start, and nobody else held any of it then.
    pub(crate) fn complete(&self) -> bool {
        self.others == 0 && self.seen >= self.count
    }

    async fn add_reader(&mut self) -> Result<()> {
        let channel = self.conn.channel().await?;
        self.opened.push(channel.clone());
        let left = self.count.saturating_sub(self.seen);
        let prefetch = u16::try_from(left).map_or(PER_CHANNEL, |l| l.clamp(1, PER_CHANNEL));
        channel
            .basic_qos(prefetch, BasicQosOptions::default())
            .await
            .map_err(|e| connection_error("cannot set the prefetch", &e))?;
        let tag = format!("courier-admin-{}", Uuid::new_v4().simple());
        let consumer = channel
            .basic_consume(
                self.dlq.as_str().into(),
                tag.as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| connection_error("cannot read a dead-letter queue", &e))?;
        self.readers.push(Reader {
            channel,
            tag,
            consumer,
            outstanding: AtomicU32::new(0),
        });
        Ok(())
    }

    /// The next message of the DLQ, in queue order, or `None` when the browse has read
    /// what the DLQ held when it began (or the DLQ was deleted, or RabbitMQ delivered
    /// nothing for 15 s while the DLQ said it had ready messages).
    pub(crate) async fn next(&mut self) -> Result<Option<Held>> {
        loop {
            if self.seen >= self.count {
                return Ok(None);
            }
            // The channel holds all it may: it is told to stop consuming (it can be handed
            // nothing more, so nothing is left in flight), and the next one reads on.
            // Taking a message frees room on its channel, so the channel read from goes on
            // until it holds a full prefetch.
            match self.readers.last() {
                Some(r) if r.outstanding.load(Ordering::Relaxed) >= u32::from(PER_CHANNEL) => {
                    let _ = r
                        .channel
                        .basic_cancel(r.tag.as_str().into(), BasicCancelOptions::default())
                        .await;
                    self.add_reader().await?;
                }
                Some(_) => {}
                None => self.add_reader().await?,
            }
            let index = self.readers.len() - 1;
            let Some(reader) = self.readers.last_mut() else {
                return Ok(None);
            };
            match tokio::time::timeout(IDLE, reader.consumer.next()).await {
                Ok(Some(Ok(delivery))) => {
                    reader.outstanding.fetch_add(1, Ordering::Relaxed);
                    self.seen += 1;
                    self.stalls = 0;
                    return Ok(Some(Held {
                        delivery,
                        channel: index,
                    }));
                }
                Ok(Some(Err(e))) => return Err(connection_error("cannot read a dead-letter queue", &e)),
                // The DLQ was deleted, or the channel closed.
                Ok(None) => return Ok(None),
                Err(_) => {
                    self.stalls += 1;
                    let ready = self.ready().await?;
                    // Nothing ready: the rest was taken meanwhile (another operator, an
                    // expiry), or this browse holds it all.
                    if ready == 0 || self.stalls > MAX_STALLS {
                        return Ok(None);
                    }
                }
            }
        }
    }

    async fn ready(&self) -> Result<u64> {
        match self.conn.passive_declare(&self.dlq).await? {
            Ok(q) => Ok(u64::from(q.message_count())),
            Err(e) if reply_code(&e) == Some(404) => Ok(0),
            Err(e) => Err(connection_error("cannot look up a dead-letter queue", &e)),
        }
    }

    /// Takes a held message out of the DLQ (acknowledges it): for good.
    pub(crate) async fn take(&self, held: &Held) -> Result<()> {
        let Some(reader) = self.readers.get(held.channel) else {
            return Ok(());
        };
        reader
            .channel
            .basic_ack(held.delivery.delivery_tag, BasicAckOptions::default())
            .await
            .map_err(|e| connection_error("cannot take a message from a dead-letter queue", &e))?;
        self.taken.fetch_add(1, Ordering::Relaxed);
        reader.outstanding.fetch_sub(1, Ordering::Relaxed);
        Ok(())
    }

    /// Gives back every message held and not taken, to the head of the DLQ in the order it
    /// had: first every consumer is cancelled (a channel still consuming would be handed
    /// what another gives back, out of order), then the channels close in the order they
    /// were opened. A quorum queue applies the returns a moment after the close: this
    /// waits (at most [`SETTLE`]) until the DLQ counts them ready again, so that whoever
    /// reads it next (the operator's next page, a resubmit) finds them there.
    pub(crate) async fn close(mut self) {
        for r in &self.readers {
            let _ = r
                .channel
                .basic_cancel(r.tag.as_str().into(), BasicCancelOptions::default())
                .await;
        }
        let held = !self.opened.is_empty();
        self.readers.clear();
        // Each channel leaves the list once closed: if this future is dropped halfway,
        // the rest are still there for `Drop` to close.
        while let Some(c) = self.opened.first().cloned() {
            let _ = c.close(200, "courier admin: read, nothing taken".into()).await;
            self.opened.remove(0);
        }
        if !held {
            return;
        }
        let back = self.count.saturating_sub(self.taken.load(Ordering::Relaxed));
        let deadline = tokio::time::Instant::now() + SETTLE;
        while tokio::time::Instant::now() < deadline {
            match self.ready().await {
                Ok(ready) if ready < back => tokio::time::sleep(Duration::from_millis(20)).await,
                // Back (or more: new dead letters), or the DLQ cannot be asked: done.
                _ => return,
            }
        }
    }
}

impl Drop for Browse<'_> {
    /// Dropped without [`Browse::close`] (an error, a dropped future): the channels close
    /// in a task of their own, and RabbitMQ gives back what they held.
    fn drop(&mut self) {
        self.readers.clear();
        let readers: Vec<Channel> = self.opened.drain(..).collect();
        if readers.is_empty() {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                for c in readers {
                    let _ = c.close(200, "courier admin: interrupted".into()).await;
                }
            });
        }
    }
}
