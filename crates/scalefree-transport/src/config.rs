//! Reading tunables from the environment (every default is listed in docs/config.md).

/// Parses `4096`, `64K`, `1M`, `2G` (binary units).
pub fn parse_bytes(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, mult) = match s.chars().last()? {
        'K' | 'k' => (&s[..s.len() - 1], 1usize << 10),
        'M' | 'm' => (&s[..s.len() - 1], 1 << 20),
        'G' | 'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.trim().parse::<usize>().ok().map(|n| n * mult)
}

/// A byte size from environment variable `name`, or `default`.
pub fn env_bytes(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| parse_bytes(&v)).unwrap_or(default)
}

/// A switch that is on unless environment variable `name` says `0`, `off` or `no`.
pub fn env_switch(name: &str) -> bool {
    !matches!(std::env::var(name).ok().as_deref().map(str::trim), Some("0" | "off" | "no"))
}

/// The network interface to use between hosts (`SCALEFREE_IFNAME`), if the user chose one.
pub fn ifname() -> Option<String> {
    std::env::var("SCALEFREE_IFNAME").ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
}

/// The IPv4 address of interface `name` (else its first IPv6 one).
pub fn interface_ip(name: &str) -> crate::Result<std::net::IpAddr> {
    let mut found: Vec<String> = Vec::new();
    let mut v6 = None;
    unsafe {
        let mut ifa: *mut libc::ifaddrs = std::ptr::null_mut();
        if libc::getifaddrs(&mut ifa) != 0 {
            return Err(crate::Error::last_os("getifaddrs"));
        }
        let mut p = ifa;
        let mut v4 = None;
        while !p.is_null() {
            let a = &*p;
            p = a.ifa_next;
            if a.ifa_addr.is_null() {
                continue;
            }
            let n = std::ffi::CStr::from_ptr(a.ifa_name).to_string_lossy().into_owned();
            if n != name {
                if !found.contains(&n) {
                    found.push(n);
                }
                continue;
            }
            match (*a.ifa_addr).sa_family as i32 {
                libc::AF_INET => {
                    let sin = &*(a.ifa_addr as *const libc::sockaddr_in);
                    v4.get_or_insert(std::net::IpAddr::V4(std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))));
                }
                libc::AF_INET6 => {
                    let sin6 = &*(a.ifa_addr as *const libc::sockaddr_in6);
                    v6.get_or_insert(std::net::IpAddr::V6(std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr)));
                }
                _ => {}
            }
        }
        libc::freeifaddrs(ifa);
        if let Some(ip) = v4.or(v6) {
            return Ok(ip);
        }
    }
    Err(crate::Error::InvalidArgument(format!(
        "SCALEFREE_IFNAME={name}: no such interface with an IP address here (interfaces: {})",
        found.join(", ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("64K"), Some(65536));
        assert_eq!(parse_bytes(" 2M "), Some(2 << 20));
        assert_eq!(parse_bytes("7"), Some(7));
        assert_eq!(parse_bytes("x"), None);
        assert_eq!(parse_bytes(""), None);
    }

    #[test]
    fn interfaces() {
        assert!(interface_ip("lo").unwrap().is_loopback());
        let e = interface_ip("no-such-if0").unwrap_err().to_string();
        assert!(e.contains("no-such-if0") && e.contains("lo"), "{e}");
    }
}
