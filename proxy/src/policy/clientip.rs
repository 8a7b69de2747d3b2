//! The client's address: the TCP peer, unless the peer is a trusted proxy; then the right-most
//! `X-Forwarded-For` hop that is not itself a trusted proxy.

use std::net::IpAddr;

use toolgate_config::Cidr;

fn parse_hop(hop: &str) -> Option<IpAddr> {
    let hop = hop.trim();
    if let Ok(ip) = hop.parse() {
        return Some(ip);
    }
    // `[v6]:port` or `v4:port`
    if let Some(rest) = hop.strip_prefix('[') {
        return rest.split(']').next()?.parse().ok();
    }
    hop.rsplit_once(':').and_then(|(h, _)| h.parse().ok())
}

/// The client IP for `peer` given the `X-Forwarded-For` values (in order) and the trusted CIDRs.
pub fn client_ip<'a>(
    peer: IpAddr,
    forwarded_for: impl DoubleEndedIterator<Item = &'a str>,
    trusted: &[Cidr],
) -> IpAddr {
    let is_trusted = |ip: IpAddr| trusted.iter().any(|c| c.contains(ip));
    if !is_trusted(peer) {
        return peer;
    }
    let mut last = peer;
    for value in forwarded_for.rev() {
        for hop in value.rsplit(',') {
            match parse_hop(hop) {
                Some(ip) if is_trusted(ip) => last = ip,
                Some(ip) => return ip,
                None => return last,
            }
        }
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn untrusted_peers_are_the_client_whatever_they_claim() {
        let trusted: Vec<Cidr> = vec!["10.0.0.0/8".parse().unwrap()];
        assert_eq!(
            client_ip(ip("203.0.113.9"), ["1.2.3.4"].into_iter(), &trusted),
            ip("203.0.113.9")
        );
    }

    #[test]
    fn trusted_peers_yield_the_right_most_untrusted_hop() {
        let trusted: Vec<Cidr> = vec!["10.0.0.0/8".parse().unwrap()];
        // The client forged the left-most entry; the proxy appended the real address.
        assert_eq!(
            client_ip(
                ip("10.0.0.5"),
                ["6.6.6.6, 198.51.100.7, 10.0.0.9"].into_iter(),
                &trusted
            ),
            ip("198.51.100.7")
        );
        assert_eq!(
            client_ip(ip("10.0.0.5"), ["6.6.6.6", "198.51.100.7:5555"].into_iter(), &trusted),
            ip("198.51.100.7")
        );
        assert_eq!(client_ip(ip("10.0.0.5"), std::iter::empty(), &trusted), ip("10.0.0.5"));
        assert_eq!(
            client_ip(ip("10.0.0.5"), ["garbage, 10.0.0.7"].into_iter(), &trusted),
            ip("10.0.0.7")
        );
    }
}
