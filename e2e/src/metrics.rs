//! The tiers' Prometheus endpoints: fetching them and reading figures.

/// The body of `GET /metrics` from a Prometheus endpoint, or `None` if it is not up.
pub fn metrics(addr: std::net::SocketAddr) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    Some(body)
}

/// The first sample of metric `name` (any labels) in a Prometheus text body.
pub fn gauge(text: &str, name: &str) -> Option<f64> {
    text.lines().filter(|l| l.starts_with(name) && !l.starts_with('#')).find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

/// The sum of every sample of metric `name` in a Prometheus text body.
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' ')))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
