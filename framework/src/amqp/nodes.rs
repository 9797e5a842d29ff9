//! The RabbitMQ nodes a transport may connect to, and which one a new connection tries
//! first.
//!
//! A cluster is given as one URL with several hosts (`amqp://user:password@h1:5672,h2:5673,h3/%2f`:
//! the user, password, virtual host and query are the same for every node, a host without
//! a port gets the scheme's default), as several URLs ([`AmqpBuilder::nodes`]), or both.
//! Each is read into one URL per node here, checked by lapin's own URL reader, so that a
//! bad list fails when the transport is opened, saying what to write instead.
//!
//! The first connection tries the nodes in the order given; after the connection to one
//! is lost, the next connection tries the one after it first, and the lost one last (it
//! is likely the one that went down).

use std::str::FromStr;
use std::time::Duration;

use super::conn::redact;

/// How long one attempt on one node may take when there are several: a node whose
/// container is paused accepts the TCP connection and never answers, and the others must
/// still get their turn within the connect timeout.
pub(crate) const NODE_ATTEMPT: Duration = Duration::from_secs(5);

const EXAMPLE: &str = "amqp://user:password@host1:5672,host2:5672,host3:5672/%2f";

/// One node: its URL with the password (to connect, never shown) and without it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Node {
    pub(crate) url: String,
    pub(crate) display: String,
}

/// The nodes of a transport, at least one, in the order given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Nodes(Vec<Node>);

impl Nodes {
    /// Reads `urls`, each with one host or several separated by commas. The error says
    /// what is wrong and what to write, without the password.
    pub(crate) fn parse<S: AsRef<str>>(urls: &[S]) -> Result<Self, String> {
        let mut nodes: Vec<Node> = Vec::new();
        let mut vhost: Option<(String, String)> = None;
        for url in urls {
            for node in split(url.as_ref().trim())? {
                let parsed = lapin::uri::AMQPUri::from_str(&node.url).map_err(|e| {
                    format!(
                        "the node {} cannot be read: {e}; write it as, e.g., {EXAMPLE}",
                        node.display
                    )
                })?;
                match &vhost {
                    None => vhost = Some((parsed.vhost.clone(), node.display.clone())),
                    Some((first, shown)) if *first != parsed.vhost => {
                        return Err(format!(
                            "the nodes {shown} and {} name different virtual hosts ({first:?} and {:?}): the nodes \
                             of a cluster share their virtual hosts, give the same one in every URL",
                            node.display, parsed.vhost
                        ));
                    }
                    Some(_) => {}
                }
                if !nodes.contains(&node) {
                    nodes.push(node);
                }
            }
        }
        if nodes.is_empty() {
            return Err(format!(
                "no RabbitMQ node is given: give at least one URL, e.g. {EXAMPLE}"
            ));
        }
        Ok(Self(nodes))
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    pub(crate) fn get(&self, i: usize) -> &Node {
        &self.0[i % self.0.len()]
    }

    /// The first node's URL with its password: the user, password and virtual host every
    /// node shares (the management API reads them).
    pub(crate) fn first_url(&self) -> &str {
        &self.0[0].url
    }

    /// Every node, without passwords: one URL, or the list separated by `, `.
    pub(crate) fn display(&self) -> String {
        self.0.iter().map(|n| n.display.as_str()).collect::<Vec<_>>().join(", ")
    }
}

/// The order in which a new connection tries `count` nodes: from the first when `lost` is
/// `None` (no connection yet), else from the one after the node lost, that one last.
pub(crate) fn order(count: usize, lost: Option<usize>) -> impl Iterator<Item = usize> {
    let start = lost.map_or(0, |i| i + 1);
    (0..count).map(move |k| (start + k) % count.max(1))
}

/// `scheme://userinfo@h1,h2/tail` -> one URL per host.
fn split(url: &str) -> Result<Vec<Node>, String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(format!(
            "a RabbitMQ URL has no scheme (amqp:// or amqps://): it is not a URL; write it as one, e.g. {EXAMPLE}"
        ));
    };
    if !scheme.eq_ignore_ascii_case("amqp") && !scheme.eq_ignore_ascii_case("amqps") {
        return Err(format!(
            "{} has the scheme {scheme}://: a RabbitMQ node is amqp:// or amqps:// (e.g. {EXAMPLE})",
            redact(url)
        ));
    }
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((u, h)) => (format!("{u}@"), h),
        None => (String::new(), authority),
    };
    let mut nodes = Vec::new();
    for host in hosts.split(',') {
        let host = host.trim();
        if host.is_empty() {
            return Err(format!(
                "{} has an empty host in its list: separate the hosts by single commas, with no comma at either \
                 end (e.g. {EXAMPLE})",
                redact(url)
            ));
        }
        let one = format!("{scheme}://{userinfo}{host}{tail}");
        nodes.push(Node {
            display: redact(&one),
            url: one,
        });
    }
    Ok(nodes)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn urls(nodes: &Nodes) -> Vec<&str> {
        nodes.0.iter().map(|n| n.url.as_str()).collect()
    }

    #[test]
    fn one_url_with_several_hosts_is_one_url_per_host() {
        let nodes = Nodes::parse(&["amqp://app:s3cret@h1:5672, h2:5673,h3/%2f?heartbeat=5"]).unwrap();
        assert_eq!(
            urls(&nodes),
            [
                "amqp://app:s3cret@h1:5672/%2f?heartbeat=5",
                "amqp://app:s3cret@h2:5673/%2f?heartbeat=5",
                "amqp://app:s3cret@h3/%2f?heartbeat=5"
            ]
        );
        assert_eq!(
            nodes.display(),
            "amqp://app:***@h1:5672/%2f?heartbeat=5, amqp://app:***@h2:5673/%2f?heartbeat=5, \
             amqp://app:***@h3/%2f?heartbeat=5"
        );
        assert_eq!(nodes.first_url(), "amqp://app:s3cret@h1:5672/%2f?heartbeat=5");
    }

    #[test]
    fn several_urls_add_up_and_a_node_named_twice_counts_once() {
        let nodes = Nodes::parse(&[
            "amqp://app:pw@h1:5672/prod",
            "amqps://app:pw@h2:5671,h1:5672/prod",
            "amqp://app:pw@h1:5672/prod",
        ])
        .unwrap();
        assert_eq!(
            urls(&nodes),
            [
                "amqp://app:pw@h1:5672/prod",
                "amqps://app:pw@h2:5671/prod",
                "amqps://app:pw@h1:5672/prod"
            ]
        );
        let one = Nodes::parse(&["amqp://127.0.0.1:5672"]).unwrap();
        assert_eq!(urls(&one), ["amqp://127.0.0.1:5672"]);
    }

    #[test]
    fn a_password_with_a_comma_is_not_a_host_list() {
        let nodes = Nodes::parse(&["amqp://app:a,b@h1,h2/%2f"]).unwrap();
        assert_eq!(urls(&nodes), ["amqp://app:a,b@h1/%2f", "amqp://app:a,b@h2/%2f"]);
    }

    #[test]
    fn a_bad_list_says_what_to_write_without_the_password() {
        let vhosts = ["amqp://u:hunter2@h1/a", "amqp://u:hunter2@h2/b"];
        for (given, says) in [
            (&["amqp://u:hunter2@h1,,h2/%2f"][..], "empty host"),
            (&["amqp://u:hunter2@h1,/%2f"][..], "empty host"),
            (&["amqp://u:hunter2@,h1/%2f"][..], "empty host"),
            (&["http://u:hunter2@h1/%2f"][..], "amqp:// or amqps://"),
            (&["h1:5672,h2:5672"][..], "not a URL"),
            (&["amqp://u:hunter2@h1:notaport/%2f"][..], "cannot be read"),
            (&vhosts[..], "different virtual hosts"),
            (&[][..], "at least one URL"),
        ] {
            let e = Nodes::parse(given).unwrap_err();
            assert!(e.contains(says), "{given:?}: {e}");
            assert!(
                e.contains("e.g.") || e.contains("give"),
                "{given:?} says what to do: {e}"
            );
            assert!(!e.contains("hunter2"), "{given:?}: {e}");
        }
    }

    #[test]
    fn a_new_connection_tries_the_node_after_the_lost_one_first_and_the_lost_one_last() {
        assert_eq!(order(3, None).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(order(3, Some(0)).collect::<Vec<_>>(), [1, 2, 0]);
        assert_eq!(order(3, Some(2)).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(order(1, Some(0)).collect::<Vec<_>>(), [0]);
        assert_eq!(order(1, None).collect::<Vec<_>>(), [0]);
    }
}
