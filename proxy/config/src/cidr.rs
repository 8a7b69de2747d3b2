//! CIDR blocks (`10.0.0.0/8`, `fd00::/8`, or a bare address) for `trustedProxies`.

use std::net::IpAddr;
use std::str::FromStr;

/// An IP network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    prefix: u8,
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let net: IpAddr = addr
            .trim()
            .parse()
            .map_err(|_| format!("`{s}` is not an IP address or CIDR block"))?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("`{s}` has an invalid prefix length"))?,
        };
        Ok(Self { net, prefix })
    }
}

impl Cidr {
    /// The block in IPv6 space, IPv4 as IPv4-mapped (`::ffff:0:0/96`): one comparison for
    /// every spelling, so `::ffff:10.0.0.1` contains itself and `10.0.0.1`.
    fn as_v6(&self) -> (u128, u32) {
        match self.net {
            IpAddr::V4(n) => (u128::from(n.to_ipv6_mapped()), 96 + u32::from(self.prefix)),
            IpAddr::V6(n) => (u128::from(n), u32::from(self.prefix)),
        }
    }

    /// Whether `ip` is inside this block. IPv4 and IPv4-mapped IPv6 addresses are the same
    /// address, in the block and in `ip` alike.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V4(a) => u128::from(a.to_ipv6_mapped()),
            IpAddr::V6(a) => u128::from(a),
        };
        let (net, prefix) = self.as_v6();
        let mask = u128::MAX.checked_shl(128 - prefix).unwrap_or(0);
        net & mask == ip & mask
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_contain_their_addresses() {
        let c: Cidr = "10.0.0.0/8".parse().unwrap();
        assert!(c.contains("10.1.2.3".parse().unwrap()));
        assert!(!c.contains("11.0.0.1".parse().unwrap()));
        assert!(c.contains("::ffff:10.0.0.1".parse().unwrap()));
        // Found by the client_ip fuzz target: a mapped address did not contain itself.
        let mapped: Cidr = "::ffff:10.8.0.1".parse().unwrap();
        assert!(mapped.contains("::ffff:10.8.0.1".parse().unwrap()));
        assert!(mapped.contains("10.8.0.1".parse().unwrap()));
        assert!(!mapped.contains("10.8.0.2".parse().unwrap()));
        let mapped_block: Cidr = "::ffff:10.0.0.0/104".parse().unwrap();
        assert!(mapped_block.contains("10.200.0.1".parse().unwrap()));
        assert!(!"fd00::/8"
            .parse::<Cidr>()
            .unwrap()
            .contains("10.0.0.1".parse().unwrap()));
        assert!(!"0.0.0.0/0"
            .parse::<Cidr>()
            .unwrap()
            .contains("fd00::1".parse().unwrap()));
        assert!("0.0.0.0/0"
            .parse::<Cidr>()
            .unwrap()
            .contains("::ffff:1.2.3.4".parse().unwrap()));
        let one: Cidr = "127.0.0.1".parse().unwrap();
        assert!(one.contains("127.0.0.1".parse().unwrap()));
        assert!(!one.contains("127.0.0.2".parse().unwrap()));
        let v6: Cidr = "fd00::/8".parse().unwrap();
        assert!(v6.contains("fd12::1".parse().unwrap()));
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert!("nope".parse::<Cidr>().is_err());
    }
}
