//! Idle HTTP/1.1 connections to peer regions' frontends, by `host:port`: a spilled request reuses one instead of
//! paying a new TCP and TLS handshake across regions. A connection goes back to the pool only once its response
//! body has been read to the end ([`Returning`]); one that closed meanwhile is dropped when taken.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::body::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::client::conn::http1::SendRequest;
use zl_common::sync::lock;

/// The most idle connections kept per peer.
pub const MAX_IDLE_PER_PEER: usize = 16;

type Sender = SendRequest<Full<Bytes>>;

/// The pool.
#[derive(Default)]
pub struct PeerPool {
    idle: Mutex<HashMap<String, Vec<Sender>>>,
}

impl std::fmt::Debug for PeerPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let idle: usize = lock(&self.idle).values().map(Vec::len).sum();
        f.debug_struct("PeerPool").field("idle", &idle).finish()
    }
}

impl PeerPool {
    /// An idle, still open connection to `authority`.
    pub fn take(&self, authority: &str) -> Option<Sender> {
        let mut idle = lock(&self.idle);
        let list = idle.get_mut(authority)?;
        while let Some(sender) = list.pop() {
            if !sender.is_closed() {
                return Some(sender);
            }
        }
        None
    }

    /// Keep `sender` for the next request to `authority` (unless it closed or the pool is full).
    pub fn put(&self, authority: &str, sender: Sender) {
        if sender.is_closed() {
            return;
        }
        let mut idle = lock(&self.idle);
        let list = idle.entry(authority.to_owned()).or_default();
        if list.len() < MAX_IDLE_PER_PEER {
            list.push(sender);
        }
    }

    /// Idle connections to `authority`.
    pub fn idle(&self, authority: &str) -> usize {
        lock(&self.idle).get(authority).map_or(0, Vec::len)
    }
}

/// A response body that gives its connection back to the pool when it has been read to the end (a body dropped
/// before that, by a client that left, takes its connection with it).
pub struct Returning<B> {
    body: B,
    back: Option<(Arc<PeerPool>, String, Sender)>,
}

impl<B> Returning<B> {
    /// `body`, whose end returns `sender` to `pool` under `authority`.
    pub fn new(body: B, pool: Arc<PeerPool>, authority: String, sender: Sender) -> Self {
        Returning { body, back: Some((pool, authority, sender)) }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for Returning<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if let Poll::Ready(None) = polled
            && let Some((pool, authority, sender)) = self.back.take()
        {
            pool.put(&authority, sender);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
