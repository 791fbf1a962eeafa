//! Who a client is, for the limits counted per client: an IPv4 address,
//! or an IPv6 address's /64 (one subscriber's network: a host on it picks
//! any of its 2^64 addresses at will, so counting single IPv6 addresses
//! would limit no one).

use std::net::{IpAddr, Ipv6Addr};

/// The key a client's limits are counted under: an IPv4 address as it is
/// (an IPv4-mapped IPv6 address as its IPv4), an IPv6 address's /64.
pub fn client_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_network_is_one_client_and_an_ipv4_address_is_one() {
        let key = |s: &str| client_key(s.parse().unwrap());
        assert_eq!(key("2001:db8:1:2::1"), key("2001:db8:1:2:ffff:1:2:3"));
        assert_ne!(key("2001:db8:1:2::1"), key("2001:db8:1:3::1"));
        assert_eq!(key("::ffff:192.0.2.7"), key("192.0.2.7"));
        assert_ne!(key("192.0.2.7"), key("192.0.2.8"));
        assert_eq!(key("2001:db8:1:2::1").to_string(), "2001:db8:1:2::");
    }
}
