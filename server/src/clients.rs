//! Client addresses as the caps count them: each address, and the network
//! it belongs to (its /24 for IPv4, its /64 for IPv6), so that one host
//! with many addresses (an IPv6 /64 is one host's, and a /24 is one
//! subnet's) cannot take what a cap per address alone would let it.
//! Pure, and a leaf: the listener's connection caps and the served bodies'
//! memory budget both use it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The network `ip` is counted in: its /24 (IPv4, an IPv4-mapped IPv6
/// address included, as a dual-stack socket reports IPv4 peers) or its /64
/// (IPv6).
pub fn network(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(a) => IpAddr::V4(Ipv4Addr::from(u32::from(a) & 0xffff_ff00)),
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(v4) => network(IpAddr::V4(v4)),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(a) & (u128::MAX << 64))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_table() {
        #[rustfmt::skip]
        let cases = [
            ("10.1.2.3", "10.1.2.0"),
            ("10.1.2.255", "10.1.2.0"),
            ("127.0.1.7", "127.0.1.0"),
            ("::ffff:10.1.2.3", "10.1.2.0"),
            ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::"),
            ("2001:db8:1:2::1", "2001:db8:1:2::"),
            ("::1", "::"),
        ];
        for (ip, want) in cases {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(network(ip), want.parse::<IpAddr>().unwrap(), "{ip}");
        }
    }
}
