//! The request parser on arbitrary bytes, whole and split in two at a point the input
//! chooses: it must return commands or a protocol error, never panic or loop.
#![no_main]
use bytes::BytesMut;
use kite::protocol::parse::{ParseLimits, RequestParser};
use libfuzzer_sys::fuzz_target;

fn drain(parser: &mut RequestParser, buf: &mut BytesMut, limits: &ParseLimits) -> bool {
    for _ in 0..100_000 {
        match parser.next_command(buf, limits) {
            Ok(Some(args)) => assert!(!args.is_empty() || buf.len() < 1 << 30),
            Ok(None) => return true,
            Err(_) => return false,
        }
    }
    true
}

fuzz_target!(|data: &[u8]| {
    let limits = ParseLimits { max_bulk_len: 1 << 20 };
    let mut parser = RequestParser::default();
    parser.set_auth_required(data.first().is_some_and(|b| b & 1 == 1));
    let split = data.first().map_or(0, |&b| b as usize).min(data.len());
    let mut buf = BytesMut::from(&data[..split]);
    if drain(&mut parser, &mut buf, &limits) {
        buf.extend_from_slice(&data[split..]);
        drain(&mut parser, &mut buf, &limits);
    }
});
