//! Reading and writing frames on QUIC streams: the thin async glue between quinn and the sans-IO `FrameDecoder`
//! and `Encoder`. Holds no protocol decisions.

use bytes::{Buf, Bytes, BytesMut};
use quinn::{ReadError, RecvStream, SendStream, VarInt};

use zl_wire::frame::{FrameDecoder, FrameError, RawFrame};
use zl_wire::message::{EncodeError, Encoder, Message, MessageError};

/// Largest chunk taken from quinn at once; bounds what sits in memory beyond the current frame.
const READ_CHUNK: usize = 64 * 1024;

/// Stream reset / stop codes. Part of the protocol.
pub(crate) mod codes {
    use quinn::VarInt;
    /// The call was cancelled (client dropped its response stream, or the server is shutting down).
    pub(crate) const CANCELLED: VarInt = VarInt::from_u32(1);
    /// The peer broke the protocol on this stream.
    pub(crate) const PROTOCOL: VarInt = VarInt::from_u32(2);
    /// Connection closed normally.
    pub(crate) const CLOSE_NORMAL: VarInt = VarInt::from_u32(0);
    /// Connection closed because the handshake failed.
    pub(crate) const CLOSE_HANDSHAKE: VarInt = VarInt::from_u32(3);
}

/// Why reading a frame failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadFailure {
    #[error("bad frame: {0}")]
    Frame(#[from] FrameError),
    #[error("bad {kind} message: {err}")]
    Message { kind: zl_wire::frame::FrameKind, err: MessageError },
    #[error("stream reset by peer (code {0})")]
    Reset(VarInt),
    #[error("connection lost: {0}")]
    Connection(quinn::ConnectionError),
    #[error("stream read failed: {0}")]
    Other(String),
}

impl From<ReadError> for ReadFailure {
    fn from(err: ReadError) -> Self {
        match err {
            ReadError::Reset(code) => ReadFailure::Reset(code),
            ReadError::ConnectionLost(e) => ReadFailure::Connection(e),
            other => ReadFailure::Other(other.to_string()),
        }
    }
}

/// Frames from a receive stream. Cancel-safe: dropping a pending `next_*` future loses no bytes.
pub(crate) struct FrameReader {
    recv: RecvStream,
    decoder: FrameDecoder,
    pending: Bytes,
    ended: bool,
}

impl FrameReader {
    pub(crate) fn new(recv: RecvStream, limit: u32) -> Self {
        FrameReader { recv, decoder: FrameDecoder::new(limit), pending: Bytes::new(), ended: false }
    }

    /// The next frame, or `None` at a clean end of stream.
    pub(crate) async fn next_frame(&mut self) -> Result<Option<RawFrame>, ReadFailure> {
        loop {
            if !self.pending.is_empty() {
                let mut input = &self.pending[..];
                let result = self.decoder.decode(&mut input);
                let consumed = self.pending.len() - input.len();
                self.pending.advance(consumed);
                if let Some(frame) = result? {
                    return Ok(Some(frame));
                }
            }
            if self.ended {
                return Ok(None);
            }
            match self.recv.read_chunk(READ_CHUNK, true).await? {
                Some(chunk) => self.pending = chunk.bytes,
                None => {
                    self.ended = true;
                    self.decoder.finish()?;
                    return Ok(None);
                }
            }
        }
    }

    /// The next frame, verified and decoded.
    pub(crate) async fn next_message(&mut self) -> Result<Option<Message>, ReadFailure> {
        match self.next_frame().await? {
            Some(frame) => {
                Message::decode(&frame).map(Some).map_err(|err| ReadFailure::Message { kind: frame.kind, err })
            }
            None => Ok(None),
        }
    }

    /// Tell the peer to stop sending (we will not read more).
    pub(crate) fn stop(&mut self, code: VarInt) {
        let _ = self.recv.stop(code);
    }
}

/// Why writing a frame failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WriteFailure {
    #[error(transparent)]
    Encode(#[from] EncodeError),
    #[error("stream write failed: {0}")]
    Write(#[from] quinn::WriteError),
}

/// Frames onto a send stream. Writes wait on QUIC flow control, so a slow reader slows the writer down.
pub(crate) struct FrameWriter {
    send: SendStream,
    encoder: Encoder,
    buf: BytesMut,
}

impl FrameWriter {
    pub(crate) fn new(send: SendStream, limit: u32) -> Self {
        FrameWriter { send, encoder: Encoder::new(limit), buf: BytesMut::new() }
    }

    /// Encode (with checks) and write one message.
    pub(crate) async fn write(&mut self, msg: &Message) -> Result<(), WriteFailure> {
        self.buf.clear();
        self.encoder.encode_into(msg, &mut self.buf)?;
        self.send.write_all(&self.buf).await?;
        Ok(())
    }

    /// Finish the stream (FIN) after the last frame.
    pub(crate) fn finish(&mut self) {
        let _ = self.send.finish();
    }

    /// Abandon the stream with `code`.
    pub(crate) fn reset(&mut self, code: VarInt) {
        let _ = self.send.reset(code);
    }

    /// Resolves when the peer stops reading this stream (STOP_SENDING) or the stream is gone.
    pub(crate) fn stopped(&self) -> impl Future<Output = ()> + Send + 'static {
        let stopped = self.send.stopped();
        async move {
            let _ = stopped.await;
        }
    }
}
