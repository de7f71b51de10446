//! The status endpoint of every tier, on its internal metrics address (the frontend also answers `/healthz` and
//! `/readyz`, never `/metrics`, on its public API port): `/metrics` (Prometheus text), `/healthz` (the process serves: liveness) and
//! `/readyz` (200 when the node is ready for its part of the traffic, 503 with the reason otherwise: what load
//! balancers and Kubernetes readiness probes ask).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

/// Whether the node is ready: `Ok(what it is doing)` or `Err(why not)`.
pub type Readiness = Arc<dyn Fn() -> Result<String, String> + Send + Sync>;

fn respond(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response.headers_mut().insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}

/// The answer to one request.
fn answer(path: &str, render: &(dyn Fn() -> String + Send + Sync), ready: &Readiness) -> Response<Full<Bytes>> {
    let json = |status: &str, key: &str, text: String| serde_json::json!({ "status": status, key: text }).to_string();
    match path {
        "/metrics" => respond(StatusCode::OK, "text/plain; version=0.0.4", render()),
        "/healthz" => respond(StatusCode::OK, "application/json", json("ok", "process", "serving".into())),
        "/readyz" => match ready() {
            Ok(what) => respond(StatusCode::OK, "application/json", json("ready", "detail", what)),
            Err(why) => respond(StatusCode::SERVICE_UNAVAILABLE, "application/json", json("not ready", "reason", why)),
        },
        _ => respond(StatusCode::NOT_FOUND, "text/plain", "not found: try /metrics, /healthz or /readyz\n".into()),
    }
}

/// Record metrics and serve `/metrics`, `/healthz` and `/readyz` on `addr` (HTTP/1.1) from now on.
pub async fn serve(addr: SocketAddr, ready: Readiness) -> Result<()> {
    let render = crate::metrics_renderer()?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("starting the metrics and status endpoint on {addr}"))?;
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let (render, ready) = (render.clone(), ready.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                    let response = answer(request.uri().path(), &*render, &ready);
                    async move { Ok::<_, Infallible>(response) }
                });
                let _ =
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_answer_as_probes_expect() {
        let render = || "zl_up 1\n".to_owned();
        let ready: Readiness = Arc::new(|| Ok("leader 1".into()));
        let not_ready: Readiness = Arc::new(|| Err("no leader yet".into()));
        assert_eq!(answer("/metrics", &render, &ready).status(), StatusCode::OK);
        assert_eq!(answer("/healthz", &render, &not_ready).status(), StatusCode::OK, "alive even when not ready");
        assert_eq!(answer("/readyz", &render, &ready).status(), StatusCode::OK);
        assert_eq!(answer("/readyz", &render, &not_ready).status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(answer("/other", &render, &ready).status(), StatusCode::NOT_FOUND);
    }
}
