//! The outbox side of an endpoint with a store: dispatching stored messages (keeping their
//! ids), deleting dispatched rows in batches, sweeping rows left behind, and moving aside
//! rows the transport refuses for good (`Store::dead_letter_outbox`), so that no row is
//! retried forever and none blocks the rows behind it.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Shared;
use crate::endpoint::bus::{describe_refusal, refused_for_good};
use crate::endpoint::recoverability::reasons;
use crate::error::{Error, Result};
use crate::store::OutboxMessage;
use crate::transport::Sender;

/// How often the outbox sweeper looks for messages left behind, and how old they must be
/// (by the endpoint's clock) before it takes them: far older than a dispatch takes.
const OUTBOX_SWEEP_EVERY: Duration = Duration::from_secs(10);
const OUTBOX_LEFT_AFTER: Duration = Duration::from_secs(30);
/// The most rows the sweeper takes at once.
const OUTBOX_SWEEP_BATCH: i64 = 100;

/// Dispatches outbox messages the normal path left behind: a process that died between
/// its commit and its dispatch, whose received message was then dead-lettered or expired
/// instead of coming back. They keep their ids, so a copy is recognised by receivers.
/// Returns 0 (it hands nothing back at shutdown).
pub(super) async fn outbox_sweeper(shared: Arc<Shared>, stop: CancellationToken) -> usize {
    let Some(store) = shared.store.clone() else { return 0 };
    loop {
        let now = shared.clock.now();
        let next = now + chrono::Duration::from_std(OUTBOX_SWEEP_EVERY).unwrap_or(chrono::Duration::MAX);
        let older_than = now - chrono::Duration::from_std(OUTBOX_LEFT_AFTER).unwrap_or(chrono::Duration::zero());
        let read = shared.outbox.read();
        match store.undispatched(&shared.name, older_than, OUTBOX_SWEEP_BATCH).await {
            Ok(left) if !left.is_empty() => {
                let full = i64::try_from(left.len()).unwrap_or(i64::MAX) >= OUTBOX_SWEEP_BATCH;
                // Rows this process took already (a handling or a redelivery sending them,
                // or sent and waiting to be deleted) are not sent again.
                let left = shared.outbox.take_read(read, left, |m| m.id);
                let n = left.len();
                match dispatch_stored(&shared, left).await {
                    Ok(()) if n == 0 => {}
                    Ok(()) => {
                        tracing::warn!(dispatched = n, "dispatched outbox messages left behind");
                        if full {
                            continue;
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "could not dispatch outbox messages left behind"),
                }
            }
            // The ticket goes now, not after the sleep: tombstones are kept while it is out.
            Ok(_) => drop(read),
            Err(e) => {
                drop(read);
                tracing::warn!(error = %e, "could not read the outbox");
            }
        }
        tokio::select! {
            () = stop.cancelled() => return 0,
            () = shared.clock.sleep_until(next) => {}
        }
    }
}

/// Dispatches outbox messages (keeping their ids), one batch per destination, then
/// removes them from the outbox. A failure to remove them only means they may be
/// dispatched again later, with the same ids, which receivers recognise.
///
/// A message the transport refuses for good ([`refused_for_good`]: too large, a field or
/// a schedule out of range, ...) is moved to the store's outbox dead letters with the
/// reason [`reasons::DISPATCH_REFUSED`] and counted; the others go on. A batch refused
/// that way is sent again one message at a time, to find which ones. Any other failure
/// (transient, a missing destination) ends the dispatch with that error: the rows stay
/// and are sent again by a redelivery or the sweeper.
///
/// The rows must have been taken in the ledger (`Shared::outbox`); those not dispatched are
/// given back at the end, so that a redelivery or the sweeper takes them again.
pub(super) async fn dispatch_stored(shared: &Shared, stored: Vec<OutboxMessage>) -> Result<()> {
    let ids: Vec<i64> = stored.iter().map(|m| m.id).collect();
    let dispatched = dispatch_taken(shared, stored).await;
    shared.outbox.give_back_unsent(&ids);
    dispatched
}

async fn dispatch_taken(shared: &Shared, stored: Vec<OutboxMessage>) -> Result<()> {
    let mut groups: Vec<Vec<OutboxMessage>> = Vec::new();
    for m in stored {
        match groups
            .iter_mut()
            .find(|g| g.first().is_some_and(|f| f.destination == m.destination))
        {
            Some(group) => group.push(m),
            None => groups.push(vec![m]),
        }
    }
    for group in groups {
        let Some((destination, is_topic)) = group.first().map(|m| (m.destination.clone(), m.is_topic)) else {
            continue;
        };
        let sender = match shared.bus.sender(&destination, is_topic).await {
            Ok(sender) => sender,
            Err(e) if refused_for_good(&e) => {
                for row in group {
                    set_aside(shared, row, &e).await?;
                }
                continue;
            }
            Err(e) => return Err(e),
        };
        send_group(shared, &*sender, group).await?;
    }
    Ok(())
}

/// Sends the rows of one destination; see [`dispatch_stored`].
async fn send_group(shared: &Shared, sender: &dyn Sender, mut group: Vec<OutboxMessage>) -> Result<()> {
    let sent = if group.len() == 1 {
        match group.first() {
            Some(one) => sender.send(one.envelope.clone()).await,
            None => Ok(()),
        }
    } else {
        // Bodies are reference counted: the copies are cheap.
        sender
            .send_batch(group.iter().map(|m| m.envelope.clone()).collect())
            .await
    };
    let refused = match sent {
        Ok(()) => {
            mark_sent(shared, group.iter().map(|m| m.id));
            return Ok(());
        }
        Err(e) if !refused_for_good(&e.error) => return Err(e.error),
        Err(e) => e,
    };
    if let [_] = group.as_slice() {
        let error = refused.error;
        for row in group {
            set_aside(shared, row, &error).await?;
        }
        return Ok(());
    }
    // The messages handed back were not accepted (a batch that is not all-or-nothing
    // hands back only those); the others were. Try each handed-back one alone.
    let mut again = Vec::new();
    for back in &refused.messages {
        if let Some(i) = group.iter().position(|m| m.envelope.message_id == back.message_id) {
            again.push(group.swap_remove(i));
        }
    }
    mark_sent(shared, group.iter().map(|m| m.id));
    again.sort_by_key(|m| m.id);
    for row in again {
        match sender.send(row.envelope.clone()).await {
            Ok(()) => mark_sent(shared, [row.id]),
            Err(e) if refused_for_good(&e.error) => set_aside(shared, row, &e.error).await?,
            Err(e) => return Err(e.error),
        }
    }
    Ok(())
}

/// Moves one row the transport refused for good to the store's outbox dead letters.
async fn set_aside(shared: &Shared, row: OutboxMessage, error: &Error) -> Result<()> {
    let Some(store) = &shared.store else {
        return Err(Error::new(error.kind().clone()));
    };
    let description = describe_refusal(&row.destination, row.is_topic, &row.envelope, error);
    let moved = store
        .dead_letter_outbox(row.id, reasons::DISPATCH_REFUSED, &description, shared.clock.now())
        .await?;
    if moved {
        shared.stats.outbox_dead_lettered.fetch_add(1, Ordering::Relaxed);
        shared.metrics.outbox_dead_lettered();
        tracing::error!(
            outbox_id = row.id,
            reason = reasons::DISPATCH_REFUSED,
            error = %error,
            "{description}; moved to the outbox's dead letters"
        );
    }
    Ok(())
}

/// Notes rows as dispatched: the cleaner deletes them in batches.
fn mark_sent(shared: &Shared, ids: impl IntoIterator<Item = i64>) {
    if shared.outbox.sent(ids) >= OUTBOX_DELETE_BATCH {
        shared.dispatched_added.notify_one();
    }
}

/// The most dispatched outbox rows deleted in one statement.
const OUTBOX_DELETE_BATCH: usize = 256;
/// How long dispatched outbox rows wait at most to be deleted with others.
const OUTBOX_DELETE_EVERY: Duration = Duration::from_millis(20);

/// Deletes dispatched outbox rows in batches (one statement for many messages instead of
/// one transaction each). A row whose deletion is lost (the process dies first) is sent
/// again by the sweeper with the same id, which receivers' inboxes drop.
pub(super) async fn outbox_cleaner(shared: Arc<Shared>, stop: CancellationToken) -> usize {
    loop {
        tokio::select! {
            () = stop.cancelled() => {
                flush_dispatched(&shared).await;
                return 0;
            }
            () = shared.dispatched_added.notified() => {}
            () = tokio::time::sleep(OUTBOX_DELETE_EVERY) => {}
        }
        flush_dispatched(&shared).await;
    }
}

pub(super) async fn flush_dispatched(shared: &Shared) {
    let Some(store) = &shared.store else { return };
    loop {
        // The rows stay taken until they are gone, so that neither a redelivery nor the
        // sweeper sends them again meanwhile.
        let batch = shared.outbox.to_delete(OUTBOX_DELETE_BATCH);
        if batch.is_empty() {
            return;
        }
        if let Err(e) = store.mark_dispatched(&batch).await {
            // They stay taken and waiting: the next round tries again. Should the process
            // end first, the sweeper of a later one sends them again, with their ids.
            tracing::warn!(error = %e, "dispatched messages stay in the outbox for now; they may be sent again");
            return;
        }
        shared.outbox.deleted(&batch);
    }
}
