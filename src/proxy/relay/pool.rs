//! The prefill pool: the only places the relay sends a leg to. llm-d's routing sidecar, with
//! its SSRF protection on, sends legs only to the pods of its InferencePool; the relay keeps
//! the same rule whatever the routing sidecar's setting, so a request cannot make it reach
//! anything else. The pool is configured (`prefill_pool`): pod addresses, CIDR ranges, or the
//! DNS name of a headless Service that selects the prefill pods, resolved again every few
//! seconds, each with the port the prefill pods serve on.

use ipnet::IpNet;
use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// How often the DNS names of the pool are resolved again (a pod that starts is in the
/// headless Service's answer within seconds).
pub const RESOLVE_EVERY: Duration = Duration::from_secs(5);

/// Longest DNS name a pool member may have.
const MAX_NAME_BYTES: usize = 253;

/// One member of the pool, as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolMember {
    /// One pod: `10.1.2.3:8000`.
    Address(SocketAddr),
    /// Every address of a range at one port: `10.1.0.0/16:8000`.
    Range(IpNet, u16),
    /// Every address a DNS name resolves to (a headless Service), at one port:
    /// `qwen-prefill.llm-d.svc.cluster.local:8000`.
    Name(String, u16),
}

impl PoolMember {
    /// Reads `address:port`, `cidr:port` or `dns-name:port` (IPv6 in brackets).
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let wrong = || format!("`{text}` is not a pod address, CIDR range or DNS name with a port, like 10.1.2.3:8000");
        let (host, port) = text.rsplit_once(':').ok_or_else(wrong)?;
        let port: u16 = port.parse().ok().filter(|p| *p != 0).ok_or_else(wrong)?;
        let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(Self::Address(SocketAddr::new(ip, port)));
        }
        if host.contains('/') {
            return host
                .parse::<IpNet>()
                .map(|net| Self::Range(net.trunc(), port))
                .map_err(|_| wrong());
        }
        let label_ok =
            |l: &str| !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        let name = host.strip_suffix('.').unwrap_or(host);
        if name.len() > MAX_NAME_BYTES || !name.split('.').all(label_ok) {
            return Err(wrong());
        }
        Ok(Self::Name(name.to_ascii_lowercase(), port))
    }
}

impl std::fmt::Display for PoolMember {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Address(address) => write!(f, "{address}"),
            Self::Range(net, port) if net.addr().is_ipv6() => write!(f, "[{net}]:{port}"),
            Self::Range(net, port) => write!(f, "{net}:{port}"),
            Self::Name(name, port) => write!(f, "{name}:{port}"),
        }
    }
}

/// The pool the relay sends legs to: its configured members, and what its names resolve to.
#[derive(Debug)]
pub struct PrefillPool {
    members: Vec<PoolMember>,
    /// The addresses each name (by its place among the members) resolved to last: a name
    /// that fails keeps its last good answer.
    resolved: RwLock<HashMap<usize, HashSet<SocketAddr>>>,
}

impl PrefillPool {
    /// A pool of `members`; its names resolve once [`PrefillPool::resolve`] runs.
    pub fn new(members: Vec<PoolMember>) -> Arc<Self> {
        Arc::new(Self {
            members,
            resolved: RwLock::default(),
        })
    }

    /// Whether a leg may be sent to `target`: one of the pool's pods.
    pub fn allows(&self, target: SocketAddr) -> bool {
        let target = SocketAddr::new(target.ip().to_canonical(), target.port());
        self.members.iter().any(|member| match member {
            PoolMember::Address(address) => *address == target,
            PoolMember::Range(net, port) => *port == target.port() && net.contains(&target.ip()),
            PoolMember::Name(..) => false,
        }) || self
            .resolved
            .read()
            .expect("pool lock")
            .values()
            .any(|addresses| addresses.contains(&target))
    }

    /// Whether any member is a DNS name, to be resolved again and again.
    pub fn has_names(&self) -> bool {
        self.members.iter().any(|m| matches!(m, PoolMember::Name(..)))
    }

    /// Resolves every name of the pool now; a name that fails keeps its last answer.
    pub async fn resolve(&self) {
        for (place, member) in self.members.iter().enumerate() {
            let PoolMember::Name(name, port) = member else {
                continue;
            };
            match tokio::net::lookup_host((name.as_str(), *port)).await {
                Ok(found) => {
                    let addresses: HashSet<SocketAddr> = found
                        .map(|a| SocketAddr::new(a.ip().to_canonical(), a.port()))
                        .collect();
                    debug!(%name, pods = addresses.len(), "a prefill_pool name resolved");
                    self.resolved.write().expect("pool lock").insert(place, addresses);
                }
                Err(error) => {
                    warn!(%name, %error, "a prefill_pool name did not resolve: its last addresses stay in the pool");
                }
            }
        }
    }

    /// Resolves the names every [`RESOLVE_EVERY`] until `shutdown`.
    pub async fn keep_resolved(self: Arc<Self>, shutdown: CancellationToken) {
        if !self.has_names() {
            return;
        }
        loop {
            self.resolve().await;
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(RESOLVE_EVERY) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(members: &[&str]) -> Arc<PrefillPool> {
        PrefillPool::new(members.iter().map(|m| PoolMember::parse(m).unwrap()).collect())
    }

    #[test]
    fn members_are_addresses_ranges_or_names_each_with_a_port() {
        for (text, shown) in [
            ("10.1.2.3:8000", "10.1.2.3:8000"),
            ("[fd00::5]:8000", "[fd00::5]:8000"),
            ("10.1.7.9/16:8000", "10.1.0.0/16:8000"),
            ("[fd00::/64]:8000", "[fd00::/64]:8000"),
            (
                "Qwen-Prefill.llm-d.svc.cluster.local.:8000",
                "qwen-prefill.llm-d.svc.cluster.local:8000",
            ),
        ] {
            assert_eq!(PoolMember::parse(text).unwrap().to_string(), shown);
        }
        for wrong in [
            "10.1.2.3",
            "10.1.2.3:0",
            "10.1.2.3:99999",
            "10.1.0.0/40:8000",
            "http://prefill:8000",
            "pre fill:8000",
            "a..b:8000",
            "",
        ] {
            let error = PoolMember::parse(wrong).unwrap_err();
            assert!(error.contains("like 10.1.2.3:8000"), "{wrong}: {error}");
        }
    }

    #[test]
    fn a_leg_may_go_only_to_a_pod_of_the_pool_at_its_port() {
        let pool = pool(&["10.1.2.3:8000", "10.2.0.0/16:8000"]);
        for allowed in ["10.1.2.3:8000", "10.2.200.7:8000", "[::ffff:10.1.2.3]:8000"] {
            assert!(pool.allows(allowed.parse().unwrap()), "{allowed}");
        }
        for refused in [
            "10.1.2.3:22",
            "10.1.2.4:8000",
            "10.2.200.7:9000",
            "10.3.0.1:8000",
            "127.0.0.1:8000",
        ] {
            assert!(!pool.allows(refused.parse().unwrap()), "{refused}");
        }
    }

    #[tokio::test]
    async fn a_name_admits_what_it_resolves_to_and_keeps_its_last_answer_when_it_fails() {
        let pool = pool(&["localhost:8000"]);
        assert!(!pool.allows("127.0.0.1:8000".parse().unwrap()), "not resolved yet");
        pool.resolve().await;
        assert!(pool.allows("127.0.0.1:8000".parse().unwrap()));
        assert!(!pool.allows("127.0.0.1:8001".parse().unwrap()), "its port only");
        let never = self::pool(&["no-such-host.invalid:8000"]);
        never.resolve().await;
        assert!(!never.allows("127.0.0.1:8000".parse().unwrap()));
    }
}
