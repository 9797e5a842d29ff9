//! Sharing a session queue's partitions among the processes that consume it.
//!
//! Every process's hub consumes every partition of a session queue, and RabbitMQ makes
//! one consumer of each partition active (single active consumer): the one that came
//! first. A process started after another would wait with nothing to do for as long as
//! the first one lives. So each hub, every [`BALANCE_EVERY`], counts the processes and
//! the partitions it is the active consumer of (those it received a delivery of since it
//! last consumed them). It counts the processes by a roll call: a queue
//! `<queue>::session-hubs` that every hub consumes and nobody sends to (auto-deleted with
//! the last hub), whose consumer count RabbitMQ gives (a partition's count says nothing:
//! RabbitMQ counts only its active consumer). Above its fair share (the partitions
//! divided by the processes, rounded up) it drains the excess, those it holds the fewest
//! messages of first: no session of a draining partition is leased anew, and once the
//! last lease of one ends the hub stops consuming it. RabbitMQ requeues what the hub held of it, in order, and
//! hands the partition to the next waiting consumer, another process's; the hub consumes
//! it again a second later, behind the others, as a waiting consumer that takes over
//! should they go away.
//!
//! A session's order holds through a hand-over: its next message is delivered to the
//! new holder only once the old one settled or gave back everything it had out. A hub
//! learns it is active on a partition only from a delivery, so an idle partition is
//! never handed over (it costs nothing where it is).

use std::sync::Arc;
use std::time::Duration;

use futures_lite::StreamExt;
use lapin::Channel;
use lapin::options::{BasicConsumeOptions, BasicQosOptions, BasicRejectOptions, QueueDeclareOptions};
use lapin::types::FieldTable;

use super::Inner;
use super::sessions::{Hub, SESSION_PARTITIONS};

/// How often a hub compares the partitions it is active on with its fair share.
pub(crate) const BALANCE_EVERY: Duration = Duration::from_secs(2);

/// The most partitions of `partitions` one of `processes` consumers should be active
/// on: the partitions divided by the processes, rounded up (all of them for one).
pub(crate) fn fair_share(partitions: usize, processes: u32) -> usize {
    let processes = usize::try_from(processes.max(1)).unwrap_or(usize::MAX);
    partitions.div_ceil(processes)
}

/// Which of the partitions a hub is `active` on (and not already `draining`) it gives
/// up to keep `fair` of them: the excess, those it holds the fewest messages of (`held`)
/// first, by index among equals.
pub(crate) fn to_drain(active: &[bool], draining: &[bool], held: &[usize], fair: usize) -> Vec<u16> {
    let keeping: Vec<usize> = (0..active.len())
        .filter(|&i| active.get(i).copied().unwrap_or(false) && !draining.get(i).copied().unwrap_or(false))
        .collect();
    let Some(excess) = keeping.len().checked_sub(fair).filter(|&n| n > 0) else {
        return Vec::new();
    };
    let mut by_held = keeping;
    by_held.sort_by_key(|&i| (held.get(i).copied().unwrap_or(0), i));
    by_held
        .into_iter()
        .take(excess)
        .filter_map(|i| u16::try_from(i).ok())
        .collect()
}

/// The balance of one hub, until it stops.
pub(crate) async fn balance(inner: Arc<Inner>, hub: Arc<Hub>) {
    let roll = roll_call(&hub.queue);
    let mut presence: Option<(Channel, lapin::Consumer)> = None;
    loop {
        if presence.as_ref().is_none_or(|(c, _)| !c.status().connected()) {
            presence = answer_roll_call(&inner, &roll).await;
        }
        let sleep = tokio::time::sleep(BALANCE_EVERY);
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                () = hub.stop.cancelled() => {
                    if let Some((c, _)) = presence.take().filter(|(c, _)| c.status().connected()) {
                        let _ = c.close(200, "OK".into()).await;
                    }
                    return;
                }
                () = &mut sleep => break,
                next = next_of(&mut presence) => match next {
                    // Nobody sends to the roll call; what another program put there goes.
                    Some(Ok(d)) => {
                        inner.conn.acked(d.acker.reject(BasicRejectOptions { requeue: false })).await;
                    }
                    Some(Err(_)) | None => {
                        presence = None;
                        break;
                    }
                },
            }
        }
        if inner.conn.is_closed() {
            return;
        }
        if inner.stop_idle_hub(&hub) {
            tracing::debug!(queue = %hub.queue, "no session accepted for a while: the partitions go to the other processes");
            continue;
        }
        let Some(processes) = processes(&inner, &roll).await else {
            continue;
        };
        let mut state = hub.lock();
        let active: Vec<bool> = state.partitions.iter().map(|p| p.active).collect();
        let draining: Vec<bool> = state.partitions.iter().map(|p| p.draining).collect();
        let held = state.held();
        let fair = fair_share(usize::from(SESSION_PARTITIONS), processes);
        let drain = to_drain(&active, &draining, &held, fair);
        for &index in &drain {
            if let Some(p) = state.partition_mut(index) {
                p.draining = true;
            }
        }
        drop(state);
        if !drain.is_empty() {
            tracing::debug!(queue = %hub.queue, processes, fair, partitions = ?drain,
                "this process is active on more partitions than its share; it hands some over");
            hub.changed.notify_waiters();
        }
    }
}

/// The next delivery of the roll call's consumer; never, without one.
async fn next_of(presence: &mut Option<(Channel, lapin::Consumer)>) -> Option<lapin::Result<lapin::message::Delivery>> {
    match presence {
        Some((_, consumer)) => consumer.next().await,
        None => std::future::pending().await,
    }
}

/// The roll call of the session queue `queue`: a queue nobody sends to, that every hub
/// of `queue` consumes (without a single active consumer), so its consumer count is the
/// number of hubs. A partition's own count says nothing: RabbitMQ counts only its active
/// consumer there. Auto-deleted once the last hub has gone.
pub(crate) fn roll_call(queue: &str) -> String {
    format!("{queue}::session-hubs")
}

/// Declares the roll call `roll` and consumes it; `None` when RabbitMQ refused (the next
/// round tries again).
async fn answer_roll_call(inner: &Inner, roll: &str) -> Option<(Channel, lapin::Consumer)> {
    let channel = inner.conn.channel().await.ok()?;
    let declared = channel
        .queue_declare(
            roll.into(),
            QueueDeclareOptions {
                auto_delete: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await;
    let consumed = match declared {
        Ok(_) => {
            let _ = channel.basic_qos(1, BasicQosOptions::default()).await;
            channel
                .basic_consume(
                    roll.into(),
                    format!("courier-hub-{}", uuid::Uuid::new_v4().simple()).as_str().into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await
        }
        Err(e) => Err(e),
    };
    match consumed {
        Ok(consumer) => Some((channel, consumer)),
        Err(e) => {
            tracing::warn!(queue = %roll, error = %e, "cannot answer the roll call of a session queue's processes; trying again");
            if channel.status().connected() {
                let _ = channel.close(200, "OK".into()).await;
            }
            None
        }
    }
}

/// How many hubs consume the session queue whose roll call is `roll`. `None` when
/// RabbitMQ did not say (the next round asks again).
async fn processes(inner: &Inner, roll: &str) -> Option<u32> {
    match inner.conn.passive_declare(roll).await {
        Ok(Ok(q)) => Some(q.consumer_count()),
        Ok(Err(_)) | Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fair_share_rounds_up() {
        assert_eq!(fair_share(16, 0), 16);
        assert_eq!(fair_share(16, 1), 16);
        assert_eq!(fair_share(16, 2), 8);
        assert_eq!(fair_share(16, 3), 6);
        assert_eq!(fair_share(16, 4), 4);
        assert_eq!(fair_share(16, 40), 1);
    }

    #[test]
    fn the_excess_with_the_fewest_messages_is_drained() {
        let active = [true, true, true, false, true];
        let draining = [false, false, false, false, true];
        let held = [5, 0, 2, 9, 0];
        // Keeping 0, 1, 2 (4 is draining already): one over a share of 2.
        assert_eq!(to_drain(&active, &draining, &held, 2), vec![1]);
        assert_eq!(to_drain(&active, &draining, &held, 1), vec![1, 2]);
        assert_eq!(to_drain(&active, &draining, &held, 3), Vec::<u16>::new());
        assert_eq!(to_drain(&[false; 4], &[false; 4], &[0; 4], 0), Vec::<u16>::new());
    }
}
