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

/// Whether the node's vital tasks run (liveness), in the shape of [`Readiness`].
pub type Liveness = Readiness;

/// The probes a status endpoint answers.
#[derive(Clone)]
pub struct Probes {
    /// `/readyz`.
    pub ready: Readiness,
    /// `/healthz`.
    pub live: Liveness,
}

/// The answer to one request.
fn answer(path: &str, render: &(dyn Fn() -> String + Send + Sync), probes: &Probes) -> Response<Full<Bytes>> {
    let json = |status: &str, key: &str, text: String| serde_json::json!({ "status": status, key: text }).to_string();
    let ready = &probes.ready;
    match path {
        "/metrics" => respond(StatusCode::OK, "text/plain; version=0.0.4", render()),
        "/healthz" => match (probes.live)() {
            Ok(what) => respond(StatusCode::OK, "application/json", json("ok", "process", what)),
            Err(why) => respond(StatusCode::SERVICE_UNAVAILABLE, "application/json", json("failed", "reason", why)),
        },
        "/readyz" => match ready() {
            Ok(what) => respond(StatusCode::OK, "application/json", json("ready", "detail", what)),
            Err(why) => respond(StatusCode::SERVICE_UNAVAILABLE, "application/json", json("not ready", "reason", why)),
        },
        _ => respond(StatusCode::NOT_FOUND, "text/plain", "not found: try /metrics, /healthz or /readyz\n".into()),
    }
}

/// Record metrics and serve `/metrics`, `/healthz` and `/readyz` on `addr` (HTTP/1.1) from now on; alive while
/// the process serves.
pub async fn serve(addr: SocketAddr, ready: Readiness) -> Result<()> {
    serve_probes(addr, Probes { ready, live: Arc::new(|| Ok("serving".into())) }).await
}

/// [`serve`] with a liveness check of its own.
pub async fn serve_probes(addr: SocketAddr, probes: Probes) -> Result<()> {
    let render = crate::metrics_renderer()?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("starting the metrics and status endpoint on {addr}"))?;
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let (render, probes) = (render.clone(), probes.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                    let response = answer(request.uri().path(), &*render, &probes);
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
        let live: Liveness = Arc::new(|| Ok("serving".into()));
        let ready = Probes { ready: Arc::new(|| Ok("leader 1".into())), live: live.clone() };
        let not_ready = Probes { ready: Arc::new(|| Err("no leader yet".into())), live };
        assert_eq!(answer("/metrics", &render, &ready).status(), StatusCode::OK);
        assert_eq!(answer("/healthz", &render, &not_ready).status(), StatusCode::OK, "alive even when not ready");
        assert_eq!(answer("/readyz", &render, &ready).status(), StatusCode::OK);
        assert_eq!(answer("/readyz", &render, &not_ready).status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(answer("/other", &render, &ready).status(), StatusCode::NOT_FOUND);
        // A vital task died (an orchestrator's Raft task): liveness fails, so the kubelet restarts the process.
        let dead =
            Probes { ready: Arc::new(|| Ok("leader 1".into())), live: Arc::new(|| Err("Raft task stopped".into())) };
        assert_eq!(answer("/healthz", &render, &dead).status(), StatusCode::SERVICE_UNAVAILABLE);
    }

    /// Latency histograms are Prometheus histograms, which `histogram_quantile` aggregates across pods (summaries
    /// cannot be added up).
    #[tokio::test]
    async fn latency_metrics_render_as_histograms_with_buckets() {
        let render = crate::metrics_renderer().unwrap();
        metrics::histogram!("zl_frontend_ttft_seconds", "model" => "m").record(0.2);
        metrics::histogram!("zl_frontend_billing_unit").record(0.35);
        let text = render();
        assert!(text.contains("# TYPE zl_frontend_ttft_seconds histogram"), "{text}");
        assert!(text.contains("zl_frontend_ttft_seconds_bucket{model=\"m\",le=\"0.25\"} 1"), "{text}");
        assert!(text.contains("zl_frontend_billing_unit_bucket{le=\"0.4\"} 1"), "{text}");
        assert!(!text.contains("quantile="), "no summaries: {text}");
    }
}
