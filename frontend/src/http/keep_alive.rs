//! HTTP/1.1 keep-alive that survives an early answer. A handler may answer before it reads the request body (a
//! bad key, a body over the limit); the body's bytes are then still on the connection, and the server would have
//! to close it. A client that pooled the connection would see its next request fail. So every HTTP/1.x request
//! body goes through a shared slot: after the handler answered, what it left unread is read and dropped (a
//! little, briefly) so the connection stays usable, and if more is left, the response says `Connection: close`.
//! HTTP/2 needs neither: an unread body is one stream's reset, not the connection's.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{HeaderValue, Version, header};
use axum::response::Response;
use http_body::{Body as HttpBody, Frame, SizeHint};
use zl_common::sync::lock;

/// Most unread body bytes read and dropped after an early answer; past this the connection is closed.
const DRAIN_BYTES: usize = 64 * 1024;

/// How long draining may take (the bytes are normally in the socket buffer already).
const DRAIN_TIME: Duration = Duration::from_secs(1);

/// The body as the handler sees it; the middleware keeps the other end.
struct Slot {
    body: Mutex<Option<Body>>,
    ended: AtomicBool,
}

struct Shared(Arc<Slot>);

impl HttpBody for Shared {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let slot = &self.0;
        let mut body = lock(&slot.body);
        let Some(inner) = body.as_mut() else { return Poll::Ready(None) };
        let polled = Pin::new(inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) {
            slot.ended.store(true, Ordering::Relaxed);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        lock(&self.0.body).as_ref().is_none_or(HttpBody::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        lock(&self.0.body).as_ref().map(HttpBody::size_hint).unwrap_or_default()
    }
}

/// The middleware: pass the body through a shared slot, then deal with what the handler left unread.
pub(super) async fn keep_alive(req: Request, next: axum::middleware::Next) -> Response {
    if req.version() > Version::HTTP_11 || req.body().is_end_stream() {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let slot = Arc::new(Slot { body: Mutex::new(Some(body)), ended: AtomicBool::new(false) });
    let mut resp = next.run(Request::from_parts(parts, Body::new(Shared(slot.clone())))).await;
    let unread = lock(&slot.body).take().filter(|b| !slot.ended.load(Ordering::Relaxed) && !b.is_end_stream());
    if let Some(body) = unread
        && !drain(body).await
    {
        metrics::counter!("zl_frontend_connections_closed_unread_total").increment(1);
        resp.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

/// Read and drop what is left of `body`, up to [`DRAIN_BYTES`] within [`DRAIN_TIME`]; whether it all came.
async fn drain(mut body: Body) -> bool {
    let read = async {
        let mut left = DRAIN_BYTES;
        loop {
            match std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
                None => return true,
                Some(Ok(frame)) => {
                    let n = frame.data_ref().map_or(0, Bytes::len);
                    if n > left {
                        return false;
                    }
                    left -= n;
                }
                Some(Err(_)) => return false,
            }
        }
    };
    tokio::time::timeout(DRAIN_TIME, read).await.unwrap_or(false)
}
