//! Optional export of the tiers' tracing spans to an OpenTelemetry collector over OTLP/HTTP (JSON), off by default:
//! set `ZL_OTLP_ENDPOINT` (e.g. `http://127.0.0.1:4318`, a collector or agent next to the process; plain HTTP).
//! Only zerolayer's own spans are exported (the frontend's `request`, the orchestrator's `route`, the worker's
//! `generate`), each a child of the W3C trace it belongs to, so a collector shows one request across the three
//! tiers under the trace id the client sent or the frontend started.

use std::sync::Mutex;

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, TracerProvider};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Registry;
use zl_common::trace::TraceContext;

/// The bridge layer, over the registry.
pub type OtelLayer = tracing_opentelemetry::OpenTelemetryLayer<Registry, opentelemetry_sdk::trace::Tracer>;

/// The exporter's provider (flushed at exit) and the runtime its batches leave on: a thread of its own, so the
/// bridge exists before the tier's runtime does (the subscriber is installed first) and export never competes
/// with serving.
static PROVIDER: Mutex<Option<(SdkTracerProvider, tokio::runtime::Runtime)>> = Mutex::new(None);

/// The crates whose spans are exported, at debug level whatever `ZL_LOG` says.
pub(crate) fn targets() -> tracing_subscriber::filter::Targets {
    let debug = tracing::Level::DEBUG;
    tracing_subscriber::filter::Targets::new()
        .with_target("zl_frontend", debug)
        .with_target("zl_orchestrator", debug)
        .with_target("zl_worker", debug)
}

/// The bridge layer when `ZL_OTLP_ENDPOINT` is set; `None` (nothing exported) otherwise or when it cannot start.
pub(crate) fn layer_from_env() -> Option<OtelLayer> {
    let endpoint = std::env::var("ZL_OTLP_ENDPOINT").ok().filter(|e| !e.trim().is_empty())?;
    let service = std::env::args()
        .next()
        .and_then(|a| std::path::Path::new(&a).file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "zerolayer".into());
    match start(&endpoint, &service) {
        Ok(layer) => Some(layer),
        Err(e) => {
            eprintln!("{service}: OTLP export to {endpoint} not started: {e:#}");
            None
        }
    }
}

fn start(endpoint: &str, service: &str) -> anyhow::Result<OtelLayer> {
    let endpoint = endpoint.trim_end_matches('/');
    if !endpoint.starts_with("http://") {
        anyhow::bail!("ZL_OTLP_ENDPOINT must be an http:// URL (a collector or agent next to the process)");
    }
    let url = if endpoint.ends_with("/v1/traces") { endpoint.to_owned() } else { format!("{endpoint}/v1/traces") };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpJson)
        .with_endpoint(url)
        .build()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("otlp-export")
        .enable_all()
        .build()?;
    let _entered = runtime.enter();
    let processor = opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor::builder(
        exporter,
        opentelemetry_sdk::runtime::Tokio,
    )
    .build();
    let resource = opentelemetry_sdk::Resource::builder().with_service_name(service.to_owned()).build();
    let provider = SdkTracerProvider::builder().with_span_processor(processor).with_resource(resource).build();
    let tracer = provider.tracer("zerolayer");
    drop(_entered);
    *zl_common::sync::lock(&PROVIDER) = Some((provider, runtime));
    Ok(tracing_opentelemetry::layer().with_tracer(tracer))
}

/// Send what is buffered and stop exporting (at the end of the process).
pub(crate) fn shutdown() {
    if let Some((provider, runtime)) = zl_common::sync::lock(&PROVIDER).take() {
        let _ = provider.shutdown();
        runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    }
}

/// Make `span` a child of the W3C `traceparent` it serves; returns the span's own context (trace id, span id)
/// while spans are exported, so the caller can pass it on as the parent of the next tier's span.
pub fn adopt(span: &tracing::Span, traceparent: &str) -> Option<TraceContext> {
    let caller = TraceContext::parse(traceparent)?;
    zl_common::sync::lock(&PROVIDER).as_ref()?;
    let remote = SpanContext::new(
        TraceId::from_hex(&caller.trace_id).ok()?,
        SpanId::from_hex(&caller.span_id).ok()?,
        TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    );
    span.set_parent(opentelemetry::Context::new().with_remote_span_context(remote)).ok()?;
    let own = span.context().span().span_context().clone();
    own.is_valid().then(|| TraceContext {
        trace_id: own.trace_id().to_string(),
        span_id: own.span_id().to_string(),
        flags: 1,
    })
}
