//! The names of a session queue's partitions (docs/rabbitmq.md, "Sessions"): which
//! partition a session id goes to ([`partition_of`], FNV-1a modulo the count, stable
//! across processes, versions and languages), the partition queues' names and how to
//! recognise one. The hubs that consume them are `sessions.rs`.

use super::sessions::SESSION_PARTITIONS;

/// The partition of `session_id` among `partitions`: 64-bit FNV-1a of its UTF-8 bytes,
/// modulo the count. Stable across processes, versions and languages (the docs give it).
pub(crate) fn partition_of(session_id: &str, partitions: u16) -> u16 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in session_id.bytes() {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let n = u64::from(partitions.max(1));
    u16::try_from(hash % n).unwrap_or(0)
}

/// The RabbitMQ queue of partition `index` of the session queue `queue`.
pub(crate) fn partition_queue(queue: &str, index: u16, partitions: u16) -> String {
    format!("{queue}::session-{index}-of-{partitions}")
}

/// Whether `name` is the name of a partition queue ([`partition_queue`]).
pub(crate) fn is_partition_queue(name: &str) -> bool {
    let Some((queue, rest)) = name.rsplit_once("::session-") else {
        return false;
    };
    let Some((index, count)) = rest.split_once("-of-") else {
        return false;
    };
    let number = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    !queue.is_empty() && number(index) && count == SESSION_PARTITIONS.to_string()
}

/// Every partition queue of `queue`.
pub(crate) fn partition_queues(queue: &str) -> Vec<String> {
    (0..SESSION_PARTITIONS)
        .map(|i| partition_queue(queue, i, SESSION_PARTITIONS))
        .collect()
}

/// The queue a message of `session_id` sent to the session queue `queue` goes to.
pub(crate) fn queue_for(queue: &str, session_id: &str) -> String {
    partition_queue(queue, partition_of(session_id, SESSION_PARTITIONS), SESSION_PARTITIONS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_partition_of_a_session_is_stable() {
        // FNV-1a 64 of "" is its offset basis; of "a", 0xaf63dc4c8601ec8c.
        assert_eq!(
            partition_of("", 16),
            u16::try_from(0xcbf2_9ce4_8422_2325_u64 % 16).unwrap()
        );
        assert_eq!(
            partition_of("a", 16),
            u16::try_from(0xaf63_dc4c_8601_ec8c_u64 % 16).unwrap()
        );
        assert_eq!(partition_of("customer-42", 1), 0);
        assert_eq!(queue_for("orders", "a"), format!("orders::session-{}-of-16", 0xcu16));
    }

    #[test]
    fn a_partition_queue_is_recognised_by_its_name() {
        assert!(is_partition_queue(&partition_queue("orders", 3, SESSION_PARTITIONS)));
        assert!(is_partition_queue(&queue_for("a::session-1-of-16", "x")));
        for name in [
            "orders",
            "orders::dlq",
            "orders::session-3-of-8",
            "orders::session--of-16",
            "orders::session-x-of-16",
            "::session-3-of-16",
            "orders::session-hubs",
        ] {
            assert!(!is_partition_queue(name), "{name}");
        }
    }

    #[test]
    fn sessions_spread_over_the_partitions() {
        let mut seen = [0u32; 16];
        for i in 0..1600 {
            let p = partition_of(&format!("customer-{i}"), 16);
            if let Some(n) = seen.get_mut(usize::from(p)) {
                *n += 1;
            }
        }
        assert!(seen.iter().all(|&n| (50..=150).contains(&n)), "{seen:?}");
    }
}
