//! A small typed client for the few Consul agent endpoints the tiers use (register, pass a TTL check,
//! maintenance, deregister, healthy instances with blocking queries), over the HTTP/1.1 client of the hyper we
//! already build, plain or HTTPS with rustls (a CA, and a client certificate when the agent verifies them). One
//! connection per request: the calls are few (a check pass every few seconds, one long poll per watch), and a
//! fresh connection can never be a stale one after the agent restarts.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;

use super::catalog::{BlockingIndex, IndexChange, Instance, MAX_HEALTH_BODY, Registration, parse_health};

/// How to reach the local agent.
#[derive(Clone, Debug, Default)]
pub struct ConsulSettings {
    /// `host:port` of its HTTP(S) API.
    pub addr: String,
    /// ACL token, sent as `X-Consul-Token`.
    pub token: Option<String>,
    /// Datacenter to query (`dc=`); the agent's own when unset.
    pub datacenter: Option<String>,
    /// HTTPS: the CA that signed the agent's certificate.
    pub ca_file: Option<PathBuf>,
    /// HTTPS: a client certificate and key, for an agent with `verify_incoming_https`.
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

/// The client.
#[derive(Clone)]
pub struct ConsulClient {
    settings: ConsulSettings,
    tls: Option<tokio_rustls::TlsConnector>,
}

impl std::fmt::Debug for ConsulClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsulClient").field("addr", &self.settings.addr).field("https", &self.tls.is_some()).finish()
    }
}

/// Timeout of a call that does not block (registration, check updates).
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

impl ConsulClient {
    /// A client for `settings` (reads the CA and client certificate files now).
    pub fn new(settings: ConsulSettings) -> Result<ConsulClient> {
        let tls = match &settings.ca_file {
            None => None,
            Some(ca) => Some(tls_connector(ca, settings.client_cert.as_ref())?),
        };
        Ok(ConsulClient { settings, tls })
    }

    /// `PUT /v1/agent/service/register`.
    pub async fn register(&self, registration: &Registration) -> Result<()> {
        let body = registration.body()?;
        self.expect_ok("PUT", "/v1/agent/service/register", body).await
    }

    /// Pass a TTL check with a note (its output).
    pub async fn pass(&self, check_id: &str, note: &str) -> Result<()> {
        let path = format!("/v1/agent/check/pass/{}?note={}", escape(check_id), escape(note));
        self.expect_ok("PUT", &path, Vec::new()).await
    }

    /// Put a service in maintenance (out of `?passing` answers) or take it out.
    pub async fn maintenance(&self, service_id: &str, enable: bool, reason: &str) -> Result<()> {
        let path =
            format!("/v1/agent/service/maintenance/{}?enable={enable}&reason={}", escape(service_id), escape(reason));
        self.expect_ok("PUT", &path, Vec::new()).await
    }

    /// `PUT /v1/agent/service/deregister/ID`.
    pub async fn deregister(&self, service_id: &str) -> Result<()> {
        self.expect_ok("PUT", &format!("/v1/agent/service/deregister/{}", escape(service_id)), Vec::new()).await
    }

    /// The datacenters the agent knows, nearest first (Consul sorts them by estimated round-trip time from its
    /// servers: its own comes first).
    pub async fn datacenters(&self) -> Result<Vec<String>> {
        let (status, _, body) = self.call("GET", "/v1/catalog/datacenters", Vec::new(), CALL_TIMEOUT).await?;
        if status != 200 {
            bail!("consul answered {status} to GET /v1/catalog/datacenters: {}", String::from_utf8_lossy(&body));
        }
        let dcs: Vec<String> = serde_json::from_slice(&body).context("consul's datacenter list")?;
        Ok(dcs)
    }

    /// The passing instances of `service` in datacenter `dc` (one plain query, no blocking).
    pub async fn passing_in(&self, service: &str, dc: &str) -> Result<Vec<Instance>> {
        let path = format!("/v1/health/service/{}?passing&dc={}", escape(service), escape(dc));
        let (status, _, body) = self.call("GET", &path, Vec::new(), CALL_TIMEOUT).await?;
        if status != 200 {
            bail!("consul answered {status} to GET {path}: {}", String::from_utf8_lossy(&body));
        }
        Ok(parse_health(&body)?)
    }

    /// The instances of `service` (only those whose every check passes when `passing_only`: `?passing`), as a
    /// blocking query on `index` (which it advances) waiting up to `wait` for a change. On an error the index is
    /// forgotten, so the next call is a full list.
    pub async fn instances(
        &self,
        service: &str,
        passing_only: bool,
        index: &mut BlockingIndex,
        wait: Duration,
    ) -> Result<(IndexChange, Vec<Instance>)> {
        let mut query: Vec<String> = Vec::new();
        if passing_only {
            query.push("passing".into());
        }
        if let Some(dc) = &self.settings.datacenter {
            query.push(format!("dc={}", escape(dc)));
        }
        query.push(index.query(wait));
        query.retain(|q| !q.is_empty());
        let path = format!("/v1/health/service/{}?{}", escape(service), query.join("&"));
        // Consul adds up to wait/16 of jitter to a blocking query.
        let answer = self.call("GET", &path, Vec::new(), CALL_TIMEOUT + wait + wait / 16).await;
        let (status, header, body) = match answer {
            Ok(a) => a,
            Err(e) => {
                index.reset();
                return Err(e);
            }
        };
        if status != 200 {
            index.reset();
            bail!("consul answered {status} to GET {path}: {}", String::from_utf8_lossy(&body));
        }
        let change = index.update(header.as_deref());
        Ok((change, parse_health(&body)?))
    }

    async fn expect_ok(&self, method: &str, path: &str, body: Vec<u8>) -> Result<()> {
        let (status, _, answer) = self.call(method, path, body, CALL_TIMEOUT).await?;
        if status != 200 {
            bail!("consul answered {status} to {method} {path}: {}", String::from_utf8_lossy(&answer));
        }
        Ok(())
    }

    /// One request on a fresh connection: status, `X-Consul-Index`, body (at most [`MAX_HEALTH_BODY`]).
    async fn call(
        &self,
        method: &str,
        path: &str,
        body: Vec<u8>,
        limit: Duration,
    ) -> Result<(u16, Option<String>, Bytes)> {
        let addr = &self.settings.addr;
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, addr.as_str())
            .header(hyper::header::CONTENT_TYPE, "application/json");
        if let Some(token) = &self.settings.token {
            request = request.header("x-consul-token", token.as_str());
        }
        let request = request.body(Full::new(Bytes::from(body))).context("building a consul request")?;
        let exchange = async {
            let mut sender = crate::http_client::connect(addr, self.tls.as_ref())
                .await
                .with_context(|| format!("the consul agent at {addr}"))?;
            let response = sender.send_request(request).await.context("a request to consul")?;
            let status = response.status().as_u16();
            let index = response.headers().get("x-consul-index").and_then(|v| v.to_str().ok()).map(str::to_owned);
            let body = Limited::new(response.into_body(), MAX_HEALTH_BODY)
                .collect()
                .await
                .map_err(|e| anyhow!("reading consul's answer: {e}"))?
                .to_bytes();
            Ok::<_, anyhow::Error>((status, index, body))
        };
        tokio::time::timeout(limit, exchange)
            .await
            .map_err(|_| anyhow!("no answer from the consul agent at {addr} within {limit:?}"))?
    }
}

fn tls_connector(ca: &Path, client: Option<&(PathBuf, PathBuf)>) -> Result<tokio_rustls::TlsConnector> {
    let builder = rustls::ClientConfig::builder().with_root_certificates(crate::pem::roots(ca)?);
    let config = match client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let (chain, key) = crate::pem::chain_and_key(cert, key)?;
            builder.with_client_auth_cert(chain, key).context("the consul client certificate")?
        }
    };
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// Percent-encode everything but unreserved characters (RFC 3986), for path segments and query values.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn escaping_keeps_unreserved_characters_only() {
        assert_eq!(super::escape("service:worker-0"), "service%3Aworker-0");
        assert_eq!(super::escape("load: 2 running/é"), "load%3A%202%20running%2F%C3%A9");
    }
}
