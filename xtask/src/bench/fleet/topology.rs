//! The fleet's network: a hub namespace holding one bridge, the server's
//! namespace and one namespace per node plugged into it, each node's link
//! shaped with `tc netem` (its download rate and a one-way delay each way).
//! Everything goes away on drop.

use anyhow::{Context, Result};
use oscontent_testkit::netns::{attach, NetNs};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

/// Every namespace the fleet benchmark creates starts with this.
const PREFIX: &str = "oscf-";
const BRIDGE: &str = "br0";
/// The interface name inside every member namespace.
pub const DEV: &str = "eth0";
/// The server's address and port on the fleet's network.
pub const SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
pub const SERVER_PORT: u16 = 8080;

/// How each node's link is shaped.
#[derive(Debug, Clone)]
pub struct Shaping {
    /// tc rate toward the node (its download), e.g. `1gbit`.
    pub rate: String,
    /// One-way delay, applied in both directions.
    pub delay: Duration,
}

/// The network of one run.
#[derive(Debug)]
pub struct Fleet {
    pub server: NetNs,
    pub nodes: Vec<NetNs>,
    // Dropped last: the bridge outlives the members plugged into it.
    _hub: NetNs,
}

/// Node `i`'s address: 10.77.(1 + i / 250).(1 + i % 250).
pub fn node_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, 1 + (i / 250) as u8, 1 + (i % 250) as u8)
}

pub fn server_addr() -> SocketAddr {
    SocketAddr::from((SERVER_IP, SERVER_PORT))
}

impl Fleet {
    /// The hub, the server and `n` shaped nodes (at most 1,000).
    pub fn create(n: usize, shaping: &Shaping) -> Result<Fleet> {
        anyhow::ensure!(n <= 1000, "at most 1,000 nodes, asked for {n}");
        let hub = NetNs::create(PREFIX, "hub")?;
        hub.add_bridge(BRIDGE)?;
        let server = NetNs::create(PREFIX, "srv")?;
        attach(
            &hub,
            BRIDGE,
            "srv",
            &server,
            DEV,
            &format!("{SERVER_IP}/16"),
        )
        .context("plugging the server in")?;
        let mut nodes = Vec::with_capacity(n);
        for i in 0..n {
            super::super::check_interrupted()?;
            let node = NetNs::create(PREFIX, &format!("n{i}"))?;
            let port = format!("n{i}");
            attach(
                &hub,
                BRIDGE,
                &port,
                &node,
                DEV,
                &format!("{}/16", node_ip(i)),
            )
            .with_context(|| format!("plugging node {i} in"))?;
            // The hub's port sends what the node downloads; the node's own
            // interface sends its requests.
            hub.shape(&port, Some(&shaping.rate), Some(shaping.delay))?;
            node.shape(DEV, None, Some(shaping.delay))?;
            nodes.push(node);
        }
        Ok(Fleet {
            server,
            nodes,
            _hub: hub,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_addresses_are_distinct_and_off_the_server() {
        let ips: std::collections::BTreeSet<Ipv4Addr> = (0..1000).map(node_ip).collect();
        assert_eq!(ips.len(), 1000);
        assert!(!ips.contains(&SERVER_IP));
        assert_eq!(node_ip(0), Ipv4Addr::new(10, 77, 1, 1));
        assert_eq!(node_ip(250), Ipv4Addr::new(10, 77, 2, 1));
    }
}
