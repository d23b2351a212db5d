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
}
