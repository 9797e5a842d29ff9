//! The outbox side of an endpoint with a store: dispatching stored messages (keeping their
//! ids), deleting dispatched rows in batches, and moving aside rows the transport refuses
//! for good (`Store::dead_letter_outbox`), so that no row is retried forever and none
//! blocks the rows behind it. The workers that sweep rows left behind and delete
//! dispatched ones on a schedule are `workers/outbox_sweeper.rs` and
//! `workers/outbox_cleaner.rs`; they, the handling of a message and a redelivery all take
//! rows through the ledger (`ledger.rs`) before sending them.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::Shared;
use crate::endpoint::bus::{describe_refusal, refused_for_good};
use crate::endpoint::otel;
use crate::endpoint::recoverability::reasons;
use crate::error::{Error, Result};
use crate::logtext::Escaped;
use crate::store::OutboxMessage;
use crate::transport::Sender;

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
    if stored.is_empty() {
        return Ok(());
    }
    let ids: Vec<i64> = stored.iter().map(|m| m.id).collect();
    let span = otel::dispatch_span(
        shared.bus.system(),
        stored.iter().map(|m| (m.destination.as_str(), &m.envelope)),
    );
    let dispatched = otel::instrument(dispatch_taken(shared, stored), span).await;
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
            "{}; moved to the outbox's dead letters",
            Escaped(&description)
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
pub(super) const OUTBOX_DELETE_EVERY: Duration = Duration::from_millis(20);

/// Deletes the dispatched rows the ledger holds, in batches of [`OUTBOX_DELETE_BATCH`]
/// (`workers/outbox_cleaner.rs` says when; the shutdown calls it last).
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
