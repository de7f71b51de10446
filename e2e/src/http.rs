//! Plain HTTP/1.1 to the frontend on loopback: whole responses and streamed (SSE) ones, with no client library
//! between the test and the bytes.

/// An HTTP response read whole.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    /// Status code.
    pub status: u16,
    /// Headers, names lowercased.
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked.
    pub body: String,
}

impl HttpResponse {
    /// The first header of this name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// An HTTP/1.1 response whose body is read as it arrives (a stream).
#[derive(Debug)]
pub struct HttpStream {
    /// Status code.
    pub status: u16,
    /// Headers, names lowercased.
    pub headers: Vec<(String, String)>,
    reader: std::io::BufReader<std::net::TcpStream>,
    chunked: bool,
    left: usize,
    done: bool,
}

impl HttpStream {
    /// The first header of this name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// The next piece of the body (`None` at its end or on an error).
    pub fn next_piece(&mut self) -> Option<String> {
        use std::io::{BufRead, Read};
        if self.done {
            return None;
        }
        if !self.chunked {
            let mut buf = vec![0u8; 4096];
            let n = self.reader.read(&mut buf).ok().filter(|n| *n > 0)?;
            return Some(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        if self.left == 0 {
            let mut line = String::new();
            self.reader.read_line(&mut line).ok()?;
            if line.trim().is_empty() {
                line.clear();
                self.reader.read_line(&mut line).ok()?;
            }
            self.left = usize::from_str_radix(line.trim(), 16).ok()?;
            if self.left == 0 {
                self.done = true;
                return None;
            }
        }
        let mut buf = vec![0u8; self.left];
        self.reader.read_exact(&mut buf).ok()?;
        self.left = 0;
        Some(String::from_utf8_lossy(&buf).into_owned())
    }

    /// The rest of the body.
    pub fn rest(&mut self) -> String {
        let mut out = String::new();
        while let Some(piece) = self.next_piece() {
            out.push_str(&piece);
        }
        out
    }
}

/// Send one HTTP/1.1 request and read the status and headers; the body is left to read.
pub fn http_stream(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Option<HttpStream> {
    use std::io::{BufRead, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(120))).ok()?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).ok()?;
    let mut reader = std::io::BufReader::new(s);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let status = line.split(' ').nth(1)?.parse().ok()?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        reader.read_line(&mut line).ok()?;
        let Some((k, v)) = line.trim_end().split_once(':') else { break };
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
    }
    let chunked = headers.iter().any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    Some(HttpStream { status, headers, reader, chunked, left: 0, done: false })
}

/// One HTTP/1.1 request, read whole.
pub fn request(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Option<HttpResponse> {
    let mut stream = http_stream(addr, method, path, headers, body)?;
    let body = stream.rest();
    Some(HttpResponse { status: stream.status, headers: stream.headers, body })
}

/// One HTTP/1.1 request; the status and the body (`None` if nothing answered).
pub fn http(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Option<(u16, String)> {
    request(addr, method, path, headers, body).map(|r| (r.status, r.body))
}

/// Whether the frontend at `http_addr` is ready and has a healthy worker to route to (its `/readyz` says both:
/// readiness alone does not wait for workers).
pub fn serving(http_addr: std::net::SocketAddr) -> bool {
    request(http_addr, "GET", "/readyz", &[], "").is_some_and(|r| {
        r.status == 200
            && serde_json::from_str::<serde_json::Value>(&r.body)
                .is_ok_and(|v| v["serving_workers"].as_u64().is_some_and(|n| n > 0))
    })
}

/// One Anthropic Messages request (greedy, 2 tokens) for `model` with `content` through the frontend at
/// `http_addr`, with API key `key`: its status (0 when nothing answered). Any other status than 200 is printed
/// with its body, so that a test that fails shows why.
pub fn ask_messages(http_addr: std::net::SocketAddr, key: &str, model: &str, content: &str) -> u16 {
    let body = serde_json::json!({
        "model": model, "max_tokens": 2, "temperature": 0,
        "messages": [{"role": "user", "content": content}],
    })
    .to_string();
    let r = request(http_addr, "POST", "/v1/messages", &[("x-api-key", key)], &body);
    if let Some(r) = &r
        && r.status != 200
    {
        eprintln!("{content:?}: {} {}", r.status, r.body);
    }
    r.map_or(0, |r| r.status)
}
