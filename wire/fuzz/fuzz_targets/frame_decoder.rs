//! Feeds arbitrary bytes, in arbitrary chunkings, through the frame decoder and the message decoder.
//!
//! Properties: nothing panics; every decoded message passes its own checks; re-encoding a decoded message and
//! decoding it again gives the same message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zl_wire::{Encoder, FrameDecoder, HARD_MAX_PAYLOAD, Message};

fuzz_target!(|data: &[u8]| {
    // The first byte picks a chunk size, so splits across frame boundaries are explored too.
    let Some((&chunk, rest)) = data.split_first() else { return };
    let chunk = usize::from(chunk).max(1);
    let mut decoder = FrameDecoder::new(64 * 1024);
    let mut encoder = Encoder::new(HARD_MAX_PAYLOAD);
    for piece in rest.chunks(chunk) {
        let mut input = piece;
        loop {
            match decoder.decode(&mut input) {
                Ok(Some(frame)) => {
                    if let Ok(msg) = Message::decode(&frame) {
                        msg.check().expect("decoded messages pass their own checks");
                        let bytes = encoder.encode(&msg).expect("decoded messages re-encode");
                        let mut again = FrameDecoder::new(HARD_MAX_PAYLOAD);
                        let mut input = &bytes[..];
                        let frame = again.decode(&mut input).expect("re-encoded frame decodes").expect("complete");
                        assert_eq!(Message::decode(&frame).expect("re-encoded message decodes"), msg);
                    }
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
    let _ = decoder.finish();
});
