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

/// Frontends' internal metrics addresses by their API address (their `/metrics` is never on the API port).
static FRONTENDS: std::sync::Mutex<Vec<(std::net::SocketAddr, std::net::SocketAddr)>> =
    std::sync::Mutex::new(Vec::new());

/// Note that the frontend serving the API on `http` serves its metrics on `metrics`.
pub fn frontend_at(http: std::net::SocketAddr, metrics: std::net::SocketAddr) {
    let mut all = FRONTENDS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    all.retain(|(h, _)| *h != http);
    all.push((http, metrics));
}

/// The `/metrics` text of the frontend whose API is at `http` (started by this crate's helpers or `zl up`).
pub fn frontend_metrics(http: std::net::SocketAddr) -> String {
    let at = FRONTENDS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .find(|(h, _)| *h == http)
        .map(|p| p.1);
    let at = at.unwrap_or_else(|| panic!("no metrics address is known for the frontend at {http}"));
    metrics(at).unwrap_or_else(|| panic!("the frontend's metrics at {at} do not answer"))
}
